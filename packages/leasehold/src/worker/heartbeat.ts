/**
 * Heartbeats: one statement per tick renews the leases of all the worker's in-flight jobs
 * (buffered, running, or being reported), carries their latest progress and checkpoints, and
 * refreshes the worker's own row (so the database knows it is alive even with no jobs).
 *
 * - A job the beat no longer matches lost its lease (reaped, re-claimed, finished): the
 *   worker is told why, and aborts or drops it.
 * - A job whose cancel was requested is handed to the worker to cancel.
 * - If beats keep failing (database unreachable), each job is given up a safety margin
 *   before its lease could run out, measured on this process's monotonic clock from when
 *   the last successful renewal was *sent*: the worker trusts its lease less than the
 *   database does.
 * - Every beat's delay (from when it was due to when its renewal was confirmed) goes into a
 *   histogram the database keeps per worker, which `leasehold doctor` turns into a lease
 *   recommendation.
 */
import type { AttemptSteps } from "./steps.js";
import type { MaxRunList } from "./limits.js";
import type { Logger } from "../logger.js";
import type { ClaimedJob } from "../jobs/types.js";
import type { LostLeaseReason } from "../errors.js";
import type { Metrics } from "../metrics.js";
import type { AbortReason } from "./context.js";
import type { Outage } from "./outage.js";
import type { StaleRefusal } from "../store/index.js";
import { recordRefusals, type WorkerTransport } from "./transport.js";

/**
 * A durable handler's sleep or wait ends its attempt in its own statement: "suspending" while it
 * runs (a beat that then misses the job is not a lost lease), "suspended" once the job sleeps, or
 * "cancelled" if a cancel request ended the job instead.
 */
export type AttemptSuspension = "suspending" | "suspended" | "cancelled";

export interface InFlight {
  job: ClaimedJob;
  /** attemptKey(job), made once at the claim: the worker's maps are keyed by it. */
  key?: string;
  /**
   * The handler's abort signal, made when a handler first reads `ctx.signal` (most no-op and
   * short handlers never do; one per job measured ~4% of a worker's CPU at 40,000 jobs/s).
   */
  controller?: AbortController;
  /** Set when the attempt is aborted, whether or not its signal was made yet. */
  abortedWith?: Error;
  /** Monotonic ms at which the last successful claim or beat for this job was sent. */
  renewedAt: number;
  /** "buffered": claimed, not started; "running": the handler runs; "reporting": its end is being written. */
  phase: "buffered" | "running" | "reporting";
  /** Monotonic ms: when it was claimed, when its handler started, its last progress. */
  claimedAt: number;
  startedAt?: number;
  lastProgressAt?: number;
  /** The limits this attempt runs under (the job's own, else its task's). */
  progressTimeoutMs: number | null;
  maxRunMs: number | null;
  /** The timer of an attempt with a progress timeout; one under a maximum run time only waits in a shared list instead. */
  limitTimer?: NodeJS.Timeout;
  limitList?: MaxRunList;
  /** Set once the lease is known to be gone: the handler's end is not reported. */
  lostReason?: AbortReason;
  progressJson?: string;
  checkpointJson?: string;
  /** Set when the database refused this attempt's progress or checkpoint: it ends as a failure. */
  refusedValue?: string;
  /** Set when the handler broke out of ctx.transaction's transaction: it ends as a failure. */
  transactionMisuse?: Error;
  /** Set when the attempt met an error no retry can fix (ctx.transaction on a remote worker): a failure is final. */
  permanent?: boolean;
  /** Set when ctx.fencedWrite was refused (a newer claim wrote first): it ends as superseded. */
  superseded?: string;
  /** What the handler returned: the job's result if the attempt succeeds (checked when reported). */
  returned?: unknown;
  /**
   * ctx.transaction: "committing" while its completion runs (a beat that then misses the job
   * is not a lost lease: the job is being finished), "committed" once it is finished.
   */
  within?: "committing" | "committed" | AttemptSuspension;
  /** Durable steps of this attempt (worker/steps.ts), made at its first step. */
  steps?: AttemptSteps;
}

/**
 * In-flight entries are keyed by job *and* attempt: a worker whose lease expired (it hung,
 * or was cut off) can claim the same job again while the old attempt's handler still runs.
 */
export function attemptKey(job: { id: string; attempt: number }): string {
  return `${job.id}:${job.attempt}`;
}

/** The handler set progress or a checkpoint that no beat has carried yet. */
export function hasUnsentValues(e: InFlight): boolean {
  return e.progressJson !== undefined || e.checkpointJson !== undefined;
}

/**
 * How long before its lease could run out (by this process's clock) a worker gives up an
 * attempt: half a beat interval, and at least a tenth of the lease.
 */
export function renewalMargin(leaseMs: number, heartbeatMs: number): number {
  const beatMs = Math.min(heartbeatMs, leaseMs / 3);
  return Math.max(beatMs / 2, leaseMs / 10);
}

/**
 * Whether this process can still vouch for the lease of `e` at monotonic time `now`: its last
 * confirmed renewal (or its claim) was sent less than the lease minus the margin ago. Checked
 * before a buffered attempt starts, and on a timer for the ones running.
 */
export function canVouchFor(e: InFlight, heartbeatMs: number, now: number): boolean {
  return now - e.renewedAt <= e.job.leaseMs - renewalMargin(e.job.leaseMs, heartbeatMs);
}

/** Upper bounds (ms) of the beat delay histogram's buckets; the last bucket is everything above. */
export const BEAT_DELAY_BUCKETS_MS = [5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000];

/** Retry a failed beat this soon rather than waiting a whole interval. */
const FAILED_BEAT_RETRY_MS = 500;

export interface HeartbeatHost {
  /** The lease of `entry` is gone (`reason` says why). */
  lost(entry: InFlight, reason: LostLeaseReason): void;
  /** A user asked to cancel this job. */
  cancelRequested(entry: InFlight): void;
  /** The database refused this attempt's progress or checkpoint. */
  refused(entry: InFlight, why: string): void;
  /** The lease could not be renewed in time and may run out: stop the attempt. */
  unrenewable(entry: InFlight): void;
}

export class Heartbeater {
  private timer?: NodeJS.Timeout;
  private checkTimer?: NodeJS.Timeout;
  private beating?: Promise<void>;
  private stopped = false;
  private nextBeatAt = Infinity;
  private readonly delays = new Array<number>(BEAT_DELAY_BUCKETS_MS.length + 1).fill(0);

  constructor(
    private readonly inFlight: Map<string, InFlight>,
    private readonly host: HeartbeatHost,
    private readonly transport: WorkerTransport,
    private readonly workerId: string,
    private readonly leaseMs: number,
    private readonly heartbeatMs: number,
    private readonly metrics: Metrics,
    private readonly outage: Outage,
    private readonly logger: Logger,
  ) {}

  start(): void {
    this.schedule(this.interval());
    const check = Math.max(50, Math.min(1_000, Math.floor(this.leaseMs / 20)));
    this.checkTimer = setInterval(() => this.checkRenewals(), check);
    this.checkTimer.unref();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    clearInterval(this.checkTimer);
    await this.beating;
  }

  /** Beat now (e.g. a test, or a job with a short lease just started). */
  beatNow(): Promise<void> {
    clearTimeout(this.timer);
    return this.tick();
  }

  /**
   * Stores what `entry`'s handler set since the last beat (progress, a checkpoint) before its
   * end is reported: a checkpoint saved just before a throw must reach the retry, and a
   * finished job keep its last progress. Beats now (one beat carries every job ending in the
   * same turn), and once more if the beat in flight was sent before the values were set. If
   * beats fail, the end is reported anyway: the values are lost, never the end.
   */
  async sendPending(entry: InFlight): Promise<void> {
    for (let i = 0; i < 2 && !this.stopped && !entry.lostReason && hasUnsentValues(entry); i++) {
      await this.beatNow();
    }
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
   * Jobs were claimed: if one's own lease needs a beat before the one scheduled (the timer was
   * set for longer leases), beat sooner, or its lease would run out before the first beat.
   */
  jobsClaimed(leaseMs: number): void {
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
    const dueAt = Math.min(this.nextBeatAt, performance.now());
    // Results come back by job id, so at most one attempt per job is sent: the newest. An
    // older attempt this worker still holds (its end is being reported after a limit, and the
    // job was claimed again) no longer has a lease to renew.
    const newest = new Map<string, InFlight>();
    for (const e of this.inFlight.values()) {
      if (e.lostReason) continue;
      const other = newest.get(e.job.id);
      if (!other || other.job.attempt < e.job.attempt) newest.set(e.job.id, e);
    }
    const entries = [...newest.values()];
    const sentAt = performance.now();
    const beats = entries.map((e) => ({
      id: e.job.id,
      attempt: e.job.attempt,
      progressJson: e.progressJson ?? null,
      checkpointJson: e.checkpointJson ?? null,
    }));
    let result;
    try {
      result = await this.transport.heartbeat({
        workerId: this.workerId,
        leaseMs: this.leaseMs,
        beats,
        inFlight: this.inFlight.size,
        beatDelays: this.delays,
      });
    } catch (err) {
      this.metrics.heartbeats.inc({ result: "error" });
      if (entries.length > 0) this.metrics.heartbeatLeases.inc({ outcome: "error" }, entries.length);
      this.outage.failed("heartbeat", err);
      return this.schedule(Math.min(FAILED_BEAT_RETRY_MS, this.interval()));
    }
    const now = performance.now();
    this.outage.ok();
    this.metrics.heartbeats.inc({ result: "ok" });
    this.metrics.heartbeatDuration.observe((now - sentAt) / 1000);
    this.recordDelay(now - dueAt);
    let renewedCount = 0;
    for (const [i, e] of entries.entries()) {
      const renewed = result.renewed.get(e.job.id);
      if (!renewed) continue;
      renewedCount++;
      e.renewedAt = sentAt;
      // Sent values are stored; keep only what the handler set after this beat was sent.
      if (e.progressJson === beats[i]!.progressJson) e.progressJson = undefined;
      if (e.checkpointJson === beats[i]!.checkpointJson) e.checkpointJson = undefined;
      if (renewed.cancelRequested) {
        this.metrics.heartbeatLeases.inc({ outcome: "cancelled" });
        this.host.cancelRequested(e);
      }
      const refused = result.refused?.get(e.job.id);
      if (refused !== undefined) {
        e.progressJson = e.checkpointJson = undefined;
        this.host.refused(e, refused);
      }
    }
    if (renewedCount > 0) this.metrics.heartbeatLeases.inc({ outcome: "renewed" }, renewedCount);
    if (result.lost.length > 0) {
      const lost = new Set(result.lost);
      await this.handleLost(entries.filter((e) => lost.has(e.job.id)));
    }
    this.schedule(this.interval());
  }

  private recordDelay(ms: number): void {
    let i = BEAT_DELAY_BUCKETS_MS.findIndex((bound) => ms <= bound);
    if (i < 0) i = BEAT_DELAY_BUCKETS_MS.length;
    this.delays[i]!++;
  }

  private async handleLost(entries: InFlight[]): Promise<void> {
    const reasons = await this.transport.describeLost(entries.map((e) => ({ id: e.job.id, attempt: e.job.attempt }))).catch(() => new Map());
    const refused: StaleRefusal[] = [];
    for (const e of entries) {
      // The handler may have finished and its completion committed while the beat was in
      // flight: then the reporter owns the outcome.
      if (this.inFlight.get(e.key ?? attemptKey(e.job)) !== e || e.phase === "reporting" || e.lostReason || e.within) continue;
      const reason: LostLeaseReason = reasons.get(e.job.id)?.reason ?? "missing";
      this.metrics.heartbeatLeases.inc({ outcome: "lost" });
      this.metrics.fencingRejections.inc({ kind: "heartbeat", reason });
      refused.push({ jobId: e.job.id, attempt: e.job.attempt, workerId: this.workerId, kind: "heartbeat", reason });
      this.host.lost(e, reason);
    }
    recordRefusals(this.transport, refused);
  }

  private checkRenewals(): void {
    const now = performance.now();
    for (const e of this.inFlight.values()) {
      if (e.phase === "reporting" || e.lostReason || e.abortedWith) continue;
      if (!canVouchFor(e, this.heartbeatMs, now)) {
        this.logger.warn({ jobId: e.job.id, attempt: e.job.attempt }, "lease could not be renewed in time; giving up the attempt");
        this.host.unrenewable(e);
      }
    }
  }
}
