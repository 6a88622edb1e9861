/**
 * The scheduler: enqueues the jobs of due schedules. It runs inside every worker (and in
 * `leasehold watchdog`); any number may run at once. Each run probes for the earliest tick
 * with one cheap statement (and sleeps until it, at most 5 s) and, when one is due, in a
 * single transaction: locks the due schedules (SKIP LOCKED: another scheduler takes the
 * rest), enqueues one job per tick to run (keyed `schedule:<name>:<tick>`, run_at = the
 * tick) and moves each schedule past them. After downtime that is the latest missed tick, or
 * with backfill the latest ones up to the schedule's limit (at most MAX_BACKFILL_LIMIT): a
 * per-second schedule down for a day enqueues at most that many jobs, not 86,400.
 * Exactly one job per tick, however many schedulers there are. Ticks are computed on the
 * database's clock.
 */
import type pg from "pg";
import type { Logger } from "../logger.js";
import { latestTick, nextTick, parseCron } from "../jobs/schedule.js";
import type { NormalizedJob } from "../jobs/validate.js";
import * as store from "../store/index.js";
import type { Metrics } from "../metrics.js";
import { MaintenanceService } from "./service.js";

export const DEFAULT_SCHEDULER_INTERVAL_MS = 1_000;
/** Schedules handled per transaction; more wait for the next run. */
const SCHEDULES_PER_RUN = 100;

/** With nothing due soon, the scheduler still looks this often (a new schedule's first tick is at most this late). */
export const MAX_IDLE_PROBE_MS = 5_000;

export interface SchedulerOptions {
  intervalMs?: number;
}

export class Scheduler extends MaintenanceService<number> {
  private nextProbeAt = 0;

  constructor(
    private readonly pool: pg.Pool,
    private readonly metrics: Metrics,
    logger: Logger,
    options: SchedulerOptions = {},
  ) {
    super("scheduler", options.intervalMs ?? DEFAULT_SCHEDULER_INTERVAL_MS, logger);
  }

  /**
   * Probes no more often than needed: not before the earliest tick is due, and at least every
   * MAX_IDLE_PROBE_MS (a schedule saved meanwhile by another process is found by then).
   */
  protected override async tick(): Promise<unknown> {
    if (performance.now() < this.nextProbeAt) return 0;
    return this.runOnce();
  }

  /** Enqueues what is due; returns the jobs enqueued. */
  async runOnce(): Promise<number> {
    const dueInMs = await store.nextScheduleDue(this.pool);
    if (dueInMs === null || dueInMs > 0) {
      this.nextProbeAt = performance.now() + Math.min(dueInMs ?? Infinity, MAX_IDLE_PROBE_MS);
      return 0;
    }
    this.nextProbeAt = 0;
    const enqueued = await store.withTransaction(this.pool, async (client) => {
      const { schedules, now } = await store.lockDueSchedules(client, SCHEDULES_PER_RUN);
      const jobs: NormalizedJob[] = [];
      const owners: { name: string }[] = [];
      const advances: store.ScheduleAdvance[] = [];
      for (const s of schedules) {
        let cron;
        try {
          cron = parseCron(s.cron, s.timezone);
        } catch (err) {
          // Saved through lh.schedule, so valid then; a croner upgrade could still refuse it.
          this.logger.error({ schedule: s.name, err: (err as Error).message }, "schedule's pattern no longer parses; skipped");
          continue;
        }
        const ticks = s.backfill
          ? latestTicks(cron, s.nextRunAt, now, s.backfillLimit ?? 1)
          : [latestTick(cron, s.nextRunAt, now)].filter((t): t is Date => t !== null);
        if (ticks[0] && ticks[0].getTime() > s.nextRunAt.getTime()) {
          this.logger.warn(
            { schedule: s.name, missedSince: s.nextRunAt, enqueuedFrom: ticks[0], enqueued: ticks.length },
            s.backfill
              ? "schedule missed more ticks than its backfill limit (no scheduler ran); only the latest are enqueued"
              : "schedule missed ticks (no scheduler ran); only the latest is enqueued (backfill off)",
          );
        }
        for (const tick of ticks) {
          jobs.push({
            queue: s.queue,
            task: s.task,
            payloadJson: JSON.stringify(s.payload),
            priority: s.jobOptions.priority ?? 0,
            runAt: tick,
            delayMs: 0,
            maxAttempts: s.jobOptions.maxAttempts ?? 25,
            uniqueKey: `schedule:${s.name}:${tick.toISOString()}`,
            // The key names its schedule: whatever task the schedule had at that tick holds it.
            uniqueScope: "global",
            leaseMs: s.jobOptions.leaseMs ?? null,
            progressTimeoutMs: s.jobOptions.progressTimeoutMs ?? null,
            maxRunMs: s.jobOptions.maxRunMs ?? null,
            maxRunUnlimited: s.jobOptions.maxRunMs === null,
          });
          owners.push({ name: s.name });
        }
        const last = ticks[ticks.length - 1];
        // After the last tick enqueued, or after now when nothing was due after all.
        const next = nextTick(cron, last ?? now);
        // A pattern with no more ticks (a date in the past) parks far in the future.
        advances.push({ name: s.name, nextRunAt: next ?? new Date("9999-12-31T00:00:00Z"), lastRunAt: last ?? null, lastJobId: null });
      }
      const made = await store.enqueueJobs(client, jobs);
      const byName = new Map(advances.map((a) => [a.name, a]));
      for (const [i, owner] of owners.entries()) byName.get(owner.name)!.lastJobId = made[i]!.id;
      await store.advanceSchedules(client, advances);
      return made.filter((m) => m.created).length;
    });
    if (enqueued > 0) {
      this.metrics.scheduledJobs.inc(enqueued);
      this.logger.debug({ enqueued }, "scheduled jobs enqueued");
    }
    return enqueued;
  }
}

/**
 * The latest `limit` ticks in [from, now], oldest first. (`from` is a tick unless edited by
 * hand: start at the first tick not before it.) Found by widening a window back from `now`
 * (1 s, 2 s, 4 s, ...) until it holds `limit` ticks or reaches `from`: walking from `from`
 * after a long outage of a per-second schedule would take millions of steps.
 */
function latestTicks(cron: ReturnType<typeof parseCron>, from: Date, now: Date, limit: number): Date[] {
  if (from.getTime() > now.getTime()) return [];
  for (let width = 1_000; ; width *= 2) {
    const start = Math.max(from.getTime() - 1, now.getTime() - width);
    const ticks: Date[] = [];
    for (let t = nextTick(cron, new Date(start)); t && t.getTime() <= now.getTime(); t = nextTick(cron, t)) {
      ticks.push(t);
      if (ticks.length > limit) ticks.shift();
    }
    if (ticks.length >= limit || start <= from.getTime() - 1) return ticks;
  }
}
