/**
 * A worker's view of flow control (docs/flow-control.md): which of its queues are paused, and
 * which are claimed through claim_flow() (limited, keyed or held). The database decides every
 * limit in the claim itself, so a stale view never exceeds one: the plain claim refuses a flow
 * queue, and claim_flow() refuses a paused one. The view decides only what to ask for, and
 * which buffered jobs to give back when their queue is paused.
 *
 * Refreshed at once on the settings notification (`!queues` on the worker's channel) and on
 * every new session (a notification sent while the session was down is lost), so a worker on
 * the database polls only every REFRESH_NOTIFIED_MS. A transport without notifications (a
 * remote worker) polls every REFRESH_BUFFERED_MS while it holds buffered jobs (a pause must
 * reach them within a second) and every REFRESH_IDLE_MS otherwise.
 */
import type { Logger } from "../logger.js";
import type { QueueSettings } from "../store/index.js";
import type { WorkerTransport } from "./transport.js";

export const REFRESH_BUFFERED_MS = 500;
export const REFRESH_IDLE_MS = 2_000;
/** With notifications (a worker on the database), polling is only a safety net. */
export const REFRESH_NOTIFIED_MS = 10_000;

export class FlowView {
  private settings = new Map<string, QueueSettings>();
  private timer?: NodeJS.Timeout;
  private inFlight?: Promise<void>;
  private again = false;
  private stopped = false;
  /** Until the first read succeeds, every queue is asked for through claim_flow (always correct). */
  private known = false;
  private readAt = -Infinity;

  constructor(
    private readonly transport: WorkerTransport,
    private readonly queues: readonly string[],
    private readonly holdsBuffered: () => boolean,
    /** The paused set or the flow set changed. */
    private readonly changed: () => void,
    private readonly logger: Logger,
  ) {}

  async start(): Promise<void> {
    await this.refresh();
    this.schedule();
  }

  stop(): void {
    this.stopped = true;
    clearTimeout(this.timer);
  }

  /** Reads the settings now (coalesced: one read in flight, one more queued behind it). */
  refresh(): Promise<void> {
    if (this.inFlight) {
      this.again = true;
      return this.inFlight;
    }
    this.inFlight = this.read().finally(() => {
      this.inFlight = undefined;
      if (this.again && !this.stopped) {
        this.again = false;
        void this.refresh();
      }
    });
    return this.inFlight;
  }

  isPaused(queue: string): boolean {
    return this.settings.get(queue)?.paused ?? false;
  }

  /** The worker's queues it may claim from now (not paused). */
  claimable(): string[] {
    return this.queues.filter((q) => !this.isPaused(q));
  }

  /** Of those, the ones claimed through claim_flow(). */
  flowQueues(): string[] {
    if (!this.known) return this.claimable();
    return this.claimable().filter((q) => this.settings.get(q)?.flow ?? false);
  }

  /**
   * Of those, the ones whose starts are limited by a rate (the queue's or its keys'): claimed
   * only for free handler slots, never into the buffer, so each job starts as it is counted.
   */
  pacedQueues(): string[] {
    if (!this.known) return this.claimable();
    return this.flowQueues().filter((q) => {
      const s = this.settings.get(q);
      return s?.rate != null || s?.keyRate != null;
    });
  }

  private async read(): Promise<void> {
    let rows: QueueSettings[];
    this.readAt = performance.now();
    try {
      rows = await this.transport.queueSettings();
    } catch (err) {
      this.logger.debug({ err: String(err) }, "could not read queue settings; keeping the last ones");
      return;
    }
    const next = new Map(rows.filter((r) => this.queues.includes(r.name)).map((r) => [r.name, r]));
    const before = this.signature();
    this.settings = next;
    const wasKnown = this.known;
    this.known = true;
    if (!wasKnown || this.signature() !== before) this.changed();
  }

  private signature(): string {
    return this.queues
      .map((q) => {
        const s = this.settings.get(q);
        return `${s?.paused ? "p" : ""}${s?.flow ? "f" : ""}${s?.rate || s?.keyRate ? "r" : ""}`;
      })
      .join(",");
  }

  private schedule(): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => {
      const since = performance.now() - this.readAt;
      const due = this.transport.notifiesQueueSettings ? since >= REFRESH_NOTIFIED_MS : this.holdsBuffered() || since >= REFRESH_IDLE_MS;
      void (due ? this.refresh() : Promise.resolve()).finally(() => this.schedule());
    }, REFRESH_BUFFERED_MS);
    this.timer.unref();
  }
}
