/**
 * The producer: enqueues the run's jobs at a steady pace over the fault window, plus bursts
 * at 1.5x the drain rate when the burst fault asks, and whatever is left at the end.
 * Enqueues survive restarts and terminated connections: a failed batch is sent again, and
 * each job's unique key ("chaos-<seq>") keeps a batch that did land from landing twice while
 * its jobs are unfinished. A share of the jobs go as graphs and batches (workload.ts makeUnits).
 */
import type pg from "pg";
import type { Leasehold, NewJob } from "../packages/leasehold/src/index.js";
import type { ChaosOptions } from "./config.js";
import { makeUnits, type Unit } from "./workload.js";

const TICK_MS = 100;
const BATCH = 200;
/** The share of the jobs paced over the window; the rest feeds bursts and the tail. */
const STEADY_SHARE = 0.7;

export class Producer {
  private next = 0;
  private startedAt = 0;
  private boostUntil = 0;
  private boostRate = 0;
  private boostCredit = 0;
  private boostLeft = 0;
  private lastTick = Date.now();
  private stopped = false;
  private loop?: Promise<void>;
  /** Enqueue calls that failed and were sent again. */
  retries = 0;
  /** Bursts in the fault plan: they share the jobs the steady pace leaves. */
  burstsPlanned = 1;
  /** Called with the plain jobs of each enqueue call that landed (their durable jobs' events are then due). */
  onLanded: (jobs: NewJob[]) => void = () => {};

  constructor(
    private readonly lh: Leasehold,
    private readonly options: ChaosOptions,
    private readonly random: () => number,
    private readonly log: (line: string) => void,
  ) {}

  get enqueued(): number {
    return this.next;
  }

  start(): void {
    this.startedAt = Date.now();
    this.loop = this.run();
  }

  /**
   * Enqueues at `rate` jobs/s on top of the steady pace for up to `ms`, within this burst's
   * share of the jobs; returns how many jobs and for how long.
   */
  boost(rate: number, ms: number): { jobs: number; durationMs: number } {
    const share = Math.round((this.options.jobs * (1 - STEADY_SHARE)) / Math.max(1, this.burstsPlanned));
    const jobs = Math.max(0, Math.min(Math.round(rate * (ms / 1000)), share, this.options.jobs - this.next));
    const durationMs = Math.max(TICK_MS, Math.round((jobs / rate) * 1000));
    this.boostRate = rate;
    this.boostLeft += jobs;
    this.boostUntil = Date.now() + durationMs;
    return { jobs, durationMs };
  }

  /** Jobs finished per second over the last few seconds, or the workers' capacity estimate if higher. */
  async drainRate(admin: pg.Pool): Promise<number> {
    const o = this.options;
    const meanJobMs = 300; // the workload's mix (workload.ts) averages about 0.3 s
    const capacity = (o.workers * o.concurrency * 1000) / meanJobMs;
    try {
      const { rows } = await admin.query<{ n: number }>(
        "SELECT count(*)::int AS n FROM audit_finished WHERE finished_at > now() - interval '5 seconds'",
      );
      return Math.max(rows[0]!.n / 5, capacity);
    } catch {
      return capacity;
    }
  }

  /** Enqueues everything not yet enqueued, then stops. */
  async finish(): Promise<void> {
    this.stopped = true;
    await this.loop;
    while (this.next < this.options.jobs) await this.send(Math.min(BATCH, this.options.jobs - this.next));
  }

  private async run(): Promise<void> {
    const o = this.options;
    const steady = Math.round(o.jobs * STEADY_SHARE);
    while (!this.stopped && this.next < o.jobs) {
      const elapsed = Date.now() - this.startedAt;
      const steadyDue = Math.max(0, Math.min(steady, Math.ceil((steady * elapsed) / o.faultWindowMs)) - this.steadySent);
      // A burst's jobs go out at its rate by the clock (an enqueue may take longer than a tick);
      // whatever is left when its time is up goes at once.
      const now = Date.now();
      let boostDue = 0;
      if (this.boostLeft > 0) {
        const owed = now >= this.boostUntil ? this.boostLeft : (this.boostRate * (now - this.lastTick)) / 1000 + this.boostCredit;
        boostDue = Math.min(this.boostLeft, Math.floor(owed));
        this.boostCredit = owed - boostDue;
        this.boostLeft -= boostDue;
      } else this.boostCredit = 0;
      this.lastTick = now;
      this.steadySent += steadyDue;
      for (let due = Math.min(steadyDue + boostDue, o.jobs - this.next); due > 0; due -= BATCH) {
        await this.send(Math.min(BATCH, due));
      }
      await new Promise((r) => setTimeout(r, TICK_MS));
    }
  }

  private steadySent = 0;

  private async send(n: number): Promise<void> {
    for (const unit of makeUnits(this.next, n, this.random, this.options.leaseMs, this.options.maxAttempts)) {
      await this.sendUnit(unit);
      this.next += unit.kind === "jobs" ? unit.jobs.length : unit.kind === "flow" ? unit.nodes.length : unit.batch.jobs.length + 1;
    }
  }

  /**
   * One enqueue call, sent again until it lands. A graph or batch has no unique key: one that
   * landed although its answer was lost lands twice (counted as producer duplicates).
   */
  private async sendUnit(unit: Unit): Promise<void> {
    for (let delay = 100; ; delay = Math.min(delay * 2, 2_000)) {
      try {
        if (unit.kind === "jobs") {
          await this.lh.enqueueMany(unit.jobs);
          this.onLanded(unit.jobs);
        } else if (unit.kind === "flow") await this.lh.enqueueFlow(unit.nodes);
        else await this.lh.enqueueBatch(unit.batch);
        return;
      } catch (err) {
        this.retries++;
        if (this.retries % 10 === 1) this.log(`producer: enqueue failed, retrying: ${String(err)}`);
        await new Promise((r) => setTimeout(r, delay));
      }
    }
  }
}
