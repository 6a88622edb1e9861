/**
 * Heartbeats: one statement per tick renews the leases of all the worker's in-flight
 * jobs and carries their latest progress and checkpoint.
 *
 * - A job the beat no longer matches lost its lease (reaped, re-claimed, finished):
 *   its handler is aborted with a reason that says which.
 * - A job whose cancel was requested is aborted with reason "cancelled".
 * - If beats keep failing (database unreachable), each handler is aborted a safety margin
 *   before its lease could run out, measured on this process's monotonic clock from when
 *   the last successful renewal was *sent*: the worker trusts its lease less than the
 *   database does.
 */
import type { Logger } from "pino";
import type { ClaimedJob } from "../jobs/types.js";
import type { Metrics } from "../metrics.js";
import type { AbortReason } from "./context.js";
import type { WorkerTransport } from "./transport.js";

export interface InFlight {
  job: ClaimedJob;
  controller: AbortController;
  /** Monotonic ms at which the last successful claim or beat for this job was sent. */
  renewedAt: number;
  /** "running": the handler runs; "reporting": its end is being written. */
  phase: "running" | "reporting";
  /** Set once the lease is known to be gone: the handler's end is not reported. */
  lostReason?: AbortReason;
  progressJson?: string;
  checkpointJson?: string;
  /** Set when the database refused this attempt's progress or checkpoint: it ends as a failure. */
  refusedValue?: string;
}

/**
 * In-flight entries are keyed by job *and* attempt: a worker whose lease expired (it hung,
 * or was cut off) can claim the same job again while the old attempt's handler still runs.
 */
export function attemptKey(job: { id: string; attempt: number }): string {
  return `${job.id}:${job.attempt}`;
}

/** Retry a failed beat this soon rather than waiting a whole interval. */
const FAILED_BEAT_RETRY_MS = 500;

export class Heartbeater {
  private timer?: NodeJS.Timeout;
  private deadlineTimer?: NodeJS.Timeout;
  private beating?: Promise<void>;
  private stopped = false;
  private nextBeatAt = Infinity;

  constructor(
    private readonly inFlight: Map<string, InFlight>,
    private readonly transport: WorkerTransport,
    private readonly workerId: string,
    private readonly leaseMs: number,
    private readonly heartbeatMs: number,
    private readonly abort: (entry: InFlight, reason: AbortReason) => void,
    private readonly metrics: Metrics,
    private readonly logger: Logger,
  ) {}

  start(): void {
    this.schedule(this.interval());
    const check = Math.max(50, Math.min(1_000, Math.floor(this.leaseMs / 20)));
    this.deadlineTimer = setInterval(() => this.abortUnrenewable(), check);
    this.deadlineTimer.unref();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    clearInterval(this.deadlineTimer);
    await this.beating;
  }

  /** Beat now (e.g. a test, or a job with a short lease just started). */
  beatNow(): Promise<void> {
    clearTimeout(this.timer);
    return this.tick();
  }

  /** The configured interval, or faster if an in-flight job has a shorter lease of its own. */
  private interval(): number {
    let ms = this.heartbeatMs;
    for (const e of this.inFlight.values()) ms = Math.min(ms, Math.floor(e.job.leaseMs / 3));
    return ms;
  }

  private schedule(ms: number): void {
    if (this.stopped) return;
    clearTimeout(this.timer);
    this.nextBeatAt = performance.now() + ms;
    this.timer = setTimeout(() => void this.tick(), ms);
  }

  /**
   * A job just started: if its own lease needs a beat before the one scheduled (the timer was
   * set for longer leases), beat sooner, or its lease would run out before the first beat.
   */
  jobStarted(leaseMs: number): void {
    const within = Math.floor(leaseMs / 3);
    if (performance.now() + within < this.nextBeatAt) this.schedule(within);
  }

  private tick(): Promise<void> {
    if (this.beating) return this.beating;
    this.beating = this.beat().finally(() => {
      this.beating = undefined;
    });
    return this.beating;
  }

  private async beat(): Promise<void> {
    // At most one live entry per job: a re-claim marks the older attempt lost (Worker.runJob),
    // so results keyed by job id below are unambiguous.
    const entries = [...this.inFlight.values()].filter((e) => !e.lostReason);
    if (entries.length === 0) return this.schedule(this.interval());
    const sentAt = performance.now();
    const beats = entries.map((e) => ({
      id: e.job.id,
      attempt: e.job.attempt,
      progressJson: e.progressJson ?? null,
      checkpointJson: e.checkpointJson ?? null,
    }));
    let result;
    try {
      result = await this.transport.heartbeat({ workerId: this.workerId, leaseMs: this.leaseMs, beats });
    } catch (err) {
      this.metrics.heartbeats.inc({ result: "error" });
      this.logger.warn({ err: String(err), jobs: entries.length }, "heartbeat failed; retrying");
      return this.schedule(Math.min(FAILED_BEAT_RETRY_MS, this.interval()));
    }
    this.metrics.heartbeats.inc({ result: "ok" });
    for (const [i, e] of entries.entries()) {
      const renewed = result.renewed.get(e.job.id);
      if (!renewed) continue;
      e.renewedAt = sentAt;
      // Sent values are stored; keep only what the handler set after this beat was sent.
      if (e.progressJson === beats[i]!.progressJson) e.progressJson = undefined;
      if (e.checkpointJson === beats[i]!.checkpointJson) e.checkpointJson = undefined;
      if (renewed.cancelRequested && e.phase === "running") this.abort(e, "cancelled");
      const refused = result.refused?.get(e.job.id);
      if (refused !== undefined) {
        e.progressJson = e.checkpointJson = undefined;
        e.refusedValue = refused;
        this.logger.warn({ jobId: e.job.id, attempt: e.job.attempt, err: refused }, "progress refused; failing this attempt");
        if (e.phase === "running") this.abort(e, "progress_refused");
      }
    }
    if (result.lost.length > 0) await this.handleLost(entries.filter((e) => result.lost.includes(e.job.id)));
    this.schedule(this.interval());
  }

  private async handleLost(entries: InFlight[]): Promise<void> {
    const reasons = await this.transport
      .describeLost(entries.map((e) => ({ id: e.job.id, attempt: e.job.attempt })))
      .catch(() => new Map());
    for (const e of entries) {
      // The handler may have finished and its completion committed while the beat was in
      // flight: then the reporter owns the outcome.
      if (this.inFlight.get(attemptKey(e.job)) !== e || e.phase !== "running") continue;
      const reason = reasons.get(e.job.id)?.reason ?? "missing";
      this.metrics.staleReports.inc({ kind: "heartbeat", reason });
      e.lostReason = reason;
      this.abort(e, reason);
    }
  }

  private abortUnrenewable(): void {
    const now = performance.now();
    for (const e of this.inFlight.values()) {
      if (e.phase !== "running" || e.lostReason || e.controller.signal.aborted) continue;
      const beatMs = Math.min(this.heartbeatMs, e.job.leaseMs / 3);
      const margin = Math.max(beatMs / 2, e.job.leaseMs / 10);
      if (now - e.renewedAt > e.job.leaseMs - margin) {
        this.logger.warn({ jobId: e.job.id, attempt: e.job.attempt }, "lease could not be renewed in time; aborting handler");
        this.abort(e, "renewal_failed");
      }
    }
  }
}
