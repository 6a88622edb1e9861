/**
 * Claiming, decoupled from concurrency. Handlers take jobs from a local buffer of jobs this
 * worker has already claimed (they hold leases, so they are heartbeated like running ones,
 * and released at shutdown); the claimer keeps that buffer filled for the next
 * PREFETCH_WINDOW_MS of work at the rate jobs are finishing, with claims sized for
 * throughput rather than for the slots free right now, and up to MAX_CLAIMS_IN_FLIGHT claims
 * running while handlers run. Jobs that take seconds get no prefetch to speak of (their rate
 * is low), so a buffered job waits a fraction of a second, not a handler's whole run; a job
 * that waits in the buffer longer than a fraction of its lease is given back (see Worker).
 *
 * A queue whose starts are limited by a rate (paced) gets no prefetch: its jobs are claimed only
 * for handler slots free now, and start as they arrive. The rate is counted at the claim, so a
 * job buffered behind busy handlers would start up to a prefetch window later than counted, in
 * the next window's starts (measured: 24-30 handler starts in a second at 20/s, 4 processes).
 *
 * Measured on 2 cores with no-op handlers: a claim that asked only for free slots and waited
 * for reports made throughput about `concurrency` jobs per two round trips (868 jobs/s at
 * concurrency 10, against 13,208 for graphile-worker's local queue).
 */
import type { Logger } from "../logger.js";
import type { ClaimedJob } from "../jobs/types.js";
import type { Metrics } from "../metrics.js";
import { MAX_CLAIM_BATCH, type WorkerSettings } from "./options.js";
import type { Outage } from "./outage.js";
import type { WorkerTransport } from "./transport.js";

/** Keep this much work (at the current finishing rate) claimed ahead of the handlers. */
export const PREFETCH_WINDOW_MS = 250;
/** At most this many jobs buffered beyond the running ones. */
export const MAX_PREFETCH = 2 * MAX_CLAIM_BATCH;
/**
 * Claims running at once. One is always on its way while handlers run; a second one from the
 * same worker only walked past the first one's locked rows (SKIP LOCKED): the claim cost 9.4
 * µs a row with two in flight against 8.1 with one, and the drain was 10% slower.
 */
export const MAX_CLAIMS_IN_FLIGHT = 1;
const ERROR_BACKOFF_MIN_MS = 100;
/** A failed claim is retried at least this often: back within a second of the database. */
const ERROR_BACKOFF_MAX_MS = 1_000;
const RATE_SAMPLE_MS = 100;

export interface ClaimerHost {
  /** Jobs claimed and not yet started (buffered), and handlers running now. */
  buffered(): number;
  running(): number;
  /** Jobs whose end is still being reported (they hold leases too). */
  reporting(): number;
  /** Takes claimed jobs; `sentAt` is when their claim was sent (the lease's start, as far as this process knows). */
  deliver(jobs: ClaimedJob[], sentAt: number): void;
  /** The queue had nothing more for us. */
  idle(): void;
  /**
   * What to claim from now: the queues not paused, which of them go through flow control, and
   * which of those are paced (a rate limits their starts: claimed only for free slots).
   */
  queues(): { queues: string[]; flowQueues: string[]; pacedQueues: string[] };
  /** A claim found a queue paused that the worker's view did not know of. */
  queuesStale(): void;
}

export class Claimer {
  private stopped = true;
  private inFlight = 0;
  /** Jobs asked for by claims in flight. */
  private asked = 0;
  /** The last claim found fewer jobs than asked: wait for a NOTIFY or the poll interval. */
  private drained = false;
  /**
   * The last claim made without the paced queues (no slot was free) found fewer jobs than asked:
   * no more such claims until a wake-up; a freed slot still claims the paced ones.
   */
  private unpacedDrained = false;
  private pollTimer?: NodeJS.Timeout;
  private errorTimer?: NodeJS.Timeout;
  private errorDelay = ERROR_BACKOFF_MIN_MS;
  private claims = new Set<Promise<void>>();
  /** Counts wake-ups: a claim that comes back short says "drained" only if none came since it was sent. */
  private wakes = 0;
  private finished = 0;
  private rate = 0;
  private rateSampledAt = performance.now();
  private rateSampledFinished = 0;
  private readonly maxBatch: number;
  /** Another dispatch (NATS) claims for this worker: no polling until it gives up. */
  private paused = false;
  /** Claims sent so far: where the next claim starts in the list of flow queues (each gets its turn first). */
  private claimsSent = 0;
  /** The last claim was held back by a flow limit: a slot this worker frees may let the next through. */
  private limited = false;
  /** The worker cannot vouch for itself now (its liveness session is gone): no claims at all. */
  private held = false;

  constructor(
    private readonly host: ClaimerHost,
    private readonly transport: WorkerTransport,
    private readonly workerId: string,
    private readonly settings: WorkerSettings,
    private readonly tasks: string[],
    private readonly metrics: Metrics,
    private readonly outage: Outage,
    private readonly logger: Logger,
  ) {
    this.maxBatch = Math.min(MAX_CLAIM_BATCH, transport.maxClaimBatch ?? MAX_CLAIM_BATCH);
  }

  start(): void {
    this.stopped = false;
    this.kick();
  }

  /** Stops claiming and waits for claims in flight (their jobs are delivered). */
  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.pollTimer);
    clearTimeout(this.errorTimer);
    while (this.claims.size > 0) await Promise.all([...this.claims]);
  }

  /**
   * Pauses polling (another dispatch claims), or resumes it with a claim at once. Queues under
   * flow control are still polled: only the flow claim may take their jobs (dispatch by id
   * refuses them).
   */
  setPaused(paused: boolean): void {
    this.paused = paused;
    if (paused) clearTimeout(this.pollTimer);
    else this.wake();
  }

  /**
   * Holds every claim (polling or not) while the worker's liveness session is gone: the
   * watchdog may be about to recover whatever this worker holds, so it must not take more.
   */
  setHeld(held: boolean): void {
    this.held = held;
    if (!held) this.kick();
  }

  /** Jobs may be ready (a NOTIFY, a reconnect): claim even if the last claim came back short. */
  wake(): void {
    if (this.paused && this.host.queues().flowQueues.length === 0) return;
    this.wakes++;
    this.drained = false;
    this.unpacedDrained = false;
    clearTimeout(this.pollTimer);
    this.kick();
  }

  /** A handler ended: its slot is free, and it counts toward the finishing rate. */
  jobFinished(): void {
    this.finished++;
    this.kick();
  }

  /**
   * A report landed: a slot of a limited queue is free in the database only now (its lease is
   * gone), so a claim held back by the limit may go through.
   */
  reportLanded(): void {
    if (this.limited) this.wake();
    else this.kick();
  }

  /** Jobs to hold (running + buffered) for the current rate: the concurrency, plus prefetch. */
  target(): number {
    const now = performance.now();
    const elapsed = now - this.rateSampledAt;
    if (elapsed >= RATE_SAMPLE_MS) {
      const sample = ((this.finished - this.rateSampledFinished) * 1000) / elapsed;
      // Weighted toward the new sample; a long idle gap decays the rate at once.
      this.rate = elapsed > 5 * RATE_SAMPLE_MS ? sample : 0.6 * sample + 0.4 * this.rate;
      this.rateSampledAt = now;
      this.rateSampledFinished = this.finished;
    }
    const prefetch = Math.min(MAX_PREFETCH, Math.ceil((this.rate * PREFETCH_WINDOW_MS) / 1000));
    return this.settings.concurrency + prefetch;
  }

  /** Starts claims while the buffer is short of the target, up to MAX_CLAIMS_IN_FLIGHT. */
  kick(): void {
    while (!this.stopped && !this.held && !this.drained && !this.errorTimer && this.inFlight < MAX_CLAIMS_IN_FLIGHT) {
      if (this.paused && this.host.queues().flowQueues.length === 0) return;
      // While reports cannot get through (a half-open connection), finished jobs keep their
      // leases: stop claiming once more than `concurrency` of them wait, so leases held stay
      // bounded.
      if (this.host.reporting() > this.settings.concurrency) return;
      const target = this.target();
      const want = target - this.host.buffered() - this.host.running() - this.asked;
      // With a claim already on its way, a second one must be worth its round trip.
      const worthIt = this.inFlight === 0 ? 1 : Math.min(this.maxBatch / 4, this.settings.concurrency);
      if (want < worthIt) return;
      // While more jobs are buffered than the handlers can start, wait until half the prefetch
      // is missing: a claim as soon as one job was taken asked for what a round trip used up,
      // so each of 4 processes sharing a queue sent claims (and completions) a quarter the size.
      const prefetch = target - this.settings.concurrency;
      if (this.host.buffered() > this.settings.concurrency && want < Math.min(this.maxBatch, prefetch / 2)) return;
      // Paced queues only for slots free now: without one, the claim leaves them out. The view
      // is read only here, once a claim is due: kick() runs at every job's end.
      const view = this.host.queues();
      const free = want - prefetch;
      const paced = free >= 1 ? [] : view.pacedQueues;
      const claimed = this.claimed(view, paced);
      if (paced.length > 0) {
        if (claimed.queues.length === 0 || this.unpacedDrained) return;
        this.claim(Math.min(want, this.maxBatch), claimed, true);
      } else {
        this.claim(Math.min(view.pacedQueues.length > 0 ? free : want, this.maxBatch), claimed, false);
      }
    }
  }

  /** The claim's queues: without `leftOut`; while another dispatch claims the plain ones, only flow queues. */
  private claimed(view: ReturnType<ClaimerHost["queues"]>, leftOut: string[]): { queues: string[]; flowQueues: string[] } {
    const flowQueues = view.flowQueues.filter((q) => !leftOut.includes(q));
    return { queues: (this.paused ? view.flowQueues : view.queues).filter((q) => !leftOut.includes(q)), flowQueues };
  }

  /** Claims up to `limit` jobs from `view`'s queues; `pacedLeftOut`: the paced queues were left out (no slot is free for them). */
  private claim(limit: number, view: { queues: string[]; flowQueues: string[] }, pacedLeftOut: boolean): void {
    this.inFlight++;
    this.asked += limit;
    const sentAt = performance.now();
    const wakesAtSend = this.wakes;
    const queues = view.queues;
    const turn = this.claimsSent++ % Math.max(1, view.flowQueues.length);
    const flowQueues = [...view.flowQueues.slice(turn), ...view.flowQueues.slice(0, turn)];
    const done = this.transport
      .claim({ queues, flowQueues, limit, workerId: this.workerId, leaseMs: this.settings.leaseMs, tasks: this.tasks })
      .then(
        (jobs) => {
          this.metrics.claimDuration.observe((performance.now() - sentAt) / 1000);
          this.outage.ok();
          this.errorDelay = ERROR_BACKOFF_MIN_MS;
          if (jobs.length > 0) this.host.deliver(jobs, sentAt);
          this.limited = jobs.retryInMs !== undefined;
          if (jobs.paused) this.host.queuesStale();
          // A wake-up while this claim ran may be for jobs its snapshot did not see.
          if (jobs.length < limit && !this.stopped && this.wakes === wakesAtSend && pacedLeftOut) {
            // Only the queues claimed ahead are drained: a freed slot still claims the paced ones.
            this.unpacedDrained = true;
            this.host.idle();
            clearTimeout(this.pollTimer);
            this.pollTimer = setTimeout(() => this.wake(), this.settings.pollIntervalMs);
          } else if (jobs.length < limit && !this.stopped && this.wakes === wakesAtSend) {
            // The queue is drained for now, or a flow limit held the claim back: sleep until a
            // NOTIFY, the poll interval, or the moment the limit may let a claim through.
            this.drained = true;
            this.host.idle();
            clearTimeout(this.pollTimer);
            const sleepMs = Math.min(this.settings.pollIntervalMs, jobs.retryInMs ?? Infinity);
            this.pollTimer = setTimeout(() => this.wake(), sleepMs);
          }
        },
        (err: unknown) => {
          this.outage.failed("claim", err);
          this.logger.debug({ err: String(err) }, "claim failed; retrying");
          this.errorTimer = setTimeout(() => {
            this.errorTimer = undefined;
            this.kick();
          }, this.errorDelay);
          this.errorDelay = Math.min(this.errorDelay * 2, ERROR_BACKOFF_MAX_MS);
        },
      )
      .finally(() => {
        this.inFlight--;
        this.asked -= limit;
        this.claims.delete(done);
        this.kick();
      });
    this.claims.add(done);
  }
}
