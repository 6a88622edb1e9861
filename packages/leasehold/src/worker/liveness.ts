/**
 * The worker's side of its liveness session (which holds its liveness lock): while it is gone
 * nothing starts and nothing is claimed; if it is not back within half the grace the watchdog
 * waits before recovering this worker's jobs, the worker gives them all up first: running
 * handlers are aborted (liveness_lost), buffered jobs are dropped and released once the
 * session is back.
 */
import type { Logger } from "../logger.js";
import type { AbortReason } from "./context.js";
import type { InFlight } from "./heartbeat.js";

export interface LivenessHost {
  /** Whether the worker runs (not stopping or stopped): only then does the session matter. */
  started(): boolean;
  /** The session is gone: no claims until it is back. */
  lost(): void;
  /** Every attempt the worker holds. */
  attempts(): Iterable<InFlight>;
  drop(entry: InFlight, reason: AbortReason): void;
  abort(entry: InFlight, reason: AbortReason): void;
  /** The session is back: `givenUp` (buffered attempts dropped with it) are released, and jobs are claimed and started again. */
  back(givenUp: InFlight[]): void;
}

export class LivenessWatch {
  /** Monotonic ms at which the session was lost, while it is gone. */
  private lostAt?: number;
  private timer?: NodeJS.Timeout;
  /** Monotonic ms of the last give-up: a claim sent before it must not start. */
  private lastGaveUpAt = -Infinity;
  /** Buffered attempts given up with the session: released once it is back. */
  private givenUp: InFlight[] = [];

  constructor(
    private readonly host: LivenessHost,
    private readonly graceMs: number | null,
    private readonly logger: Logger,
  ) {}

  /** The session is gone now: nothing starts, nothing is claimed. */
  get lost(): boolean {
    return this.lostAt !== undefined;
  }

  /** Monotonic ms of the last give-up on the session (-Infinity if none). */
  get gaveUpAt(): number {
    return this.lastGaveUpAt;
  }

  /** The session went down or came back; `lateByMs`: how long it may have been gone before this process noticed. */
  changed(state: "up" | "down", lateByMs = 0): void {
    const grace = this.graceMs;
    if (grace === null || !this.host.started()) return;
    if (state === "down") {
      if (this.lostAt !== undefined) return;
      this.lostAt = performance.now();
      this.host.lost();
      this.logger.warn({ graceMs: grace }, "liveness session lost; giving up this worker's jobs unless it is back in time");
      // The session may have ended on the server before this process noticed (it was silent,
      // or this process was stopped): only what is left of half the grace remains. Waking from
      // a freeze to a dead session, that is nothing: the watchdog may already have recovered
      // the jobs, so the handlers stop now.
      this.timer = setTimeout(() => this.giveUp(), Math.max(0, Math.floor(grace / 2) - lateByMs));
      this.timer.unref();
      return;
    }
    clearTimeout(this.timer);
    if (this.lostAt === undefined) return;
    this.logger.info({ downMs: Math.round(performance.now() - this.lostAt) }, "liveness session back");
    this.lostAt = undefined;
    const givenUp = this.givenUp;
    this.givenUp = [];
    this.host.back(givenUp);
  }

  /** The worker stops: a pending give-up is cancelled. */
  stop(): void {
    clearTimeout(this.timer);
  }

  private giveUp(): void {
    if (this.lostAt === undefined || !this.host.started()) return;
    this.lastGaveUpAt = performance.now();
    const entries = [...this.host.attempts()];
    this.logger.warn({ jobs: entries.length }, "liveness session not back within half its grace: aborting this worker's attempts");
    for (const e of entries) {
      // An attempt committing its ctx.transaction (or suspending) is stopped too: its commit may
      // have died with the session, and the watchdog hands the job on regardless. The fence
      // still decides whether a commit that does land counts. One already committed is done.
      if (e.lostReason || e.within === "committed") continue;
      if (e.phase === "buffered") {
        this.host.drop(e, "liveness_lost");
        this.givenUp.push(e);
      } else if (e.phase === "running") this.host.abort(e, "liveness_lost");
    }
  }
}
