/**
 * The watchdog: Leasehold's recovery controller. Every way an attempt can be left behind
 * ends here, through the same retry-or-dead path as a failure (a recovery is a failure its
 * worker did not live to report, so it spends the retry budget), counted by cause:
 *   - crash detection (every `livenessIntervalMs`, the watchdogs taking turns):
 *     workers hold a liveness lock on their own session; when a worker's lock is gone (kill
 *     -9, OOM, a dead host's sockets closing) for longer than a short grace, its jobs are
 *     recovered at once (worker_lost);
 *   - leases that ran out (every `intervalMs`): the backstop for partitions, zombies and
 *     poolers that break session state (lease_expired);
 *   - attempts past their progress timeout or maximum run time by more than a lease, which
 *     their worker should have ended (stalled, timed_out);
 *   - an orphan scan (every `orphanScanIntervalMs`) for states that should not exist: jobs of
 *     tasks no live worker runs, finished jobs missing audit rows, waiting jobs past their
 *     retry budget (repaired: dead).
 * It also vacuums the hot table when dead rows outnumber live ones: claims walk them.
 * It runs inside every worker and standalone; any number may run at once (each statement
 * moves its rows out of reach of the others) and each job is recovered once.
 */
import os from "node:os";
import { randomBytes } from "node:crypto";
import type { Logger } from "../logger.js";
import type { Queryable } from "../store/db.js";
import * as store from "../store/index.js";
import { DEFAULT_BACKOFF } from "../worker/backoff.js";
import { DEFAULT_MAX_RUN_MS } from "../worker/options.js";
import { metricsRecorded, type Metrics } from "../metrics.js";
import { HANDLER_ALIVE_MS } from "./handler-gaps.js";
import { MaintenanceService } from "./service.js";
import type { BackoffPolicy } from "../store/end-attempts.js";

export const DEFAULT_WATCHDOG_INTERVAL_MS = 2_000;
export const DEFAULT_LIVENESS_INTERVAL_MS = 250;
/** A worker's liveness lock must be gone this long before its jobs are recovered: a reconnect takes less. */
export const DEFAULT_LOST_WORKER_GRACE_MS = 1_000;
/** After the database (re)starts, every session is new: wait this long before calling anyone lost. */
export const STARTUP_GRACE_MS = 5_000;
export const DEFAULT_ORPHAN_SCAN_INTERVAL_MS = 60_000;
/** A ready job of a task no live worker runs is reported once it has waited this long. */
export const DEFAULT_ORPHAN_AFTER_MS = 5 * 60_000;
/** The hot table is vacuumed when it holds more dead rows than live ones, and at least this many. */
export const HOT_TABLE_VACUUM_MIN_DEAD = 10_000;
/** One statement moved 10,000 expired jobs in ~70 ms on 2 cores; keep each short. */
export const REAP_BATCH = 1_000;
/**
 * leasehold_jobs_without_handler is counted this often by the fleet (each watchdog every fleetSize
 * times this): it reads the waiting jobs again, so
 * not on every reap tick of every watchdog (the live views and `doctor` count it when asked).
 */
export const HANDLER_GAUGE_INTERVAL_MS = 10_000;

/**
 * Crash detection by turns, not by chance: the wall clock is cut into slots of the liveness
 * interval, and slot s belongs to the watchdog ranked s mod fleetSize (by id, among the live
 * ones as last counted). A watchdog checks on its first tick in or after a slot of its own
 * (`previousSlot`: its previous tick's), so a crash waits about two slots at most to be seen,
 * three while a dead watchdog is still counted. Checking on a random share of the ticks left
 * gaps of a second or more now and then (docs/benchmarks.md). Hosts' clocks need only be
 * roughly in step: skew makes some slots checked twice and others not, and each watchdog
 * still checks once every fleetSize slots.
 */
export function ownsTurn(previousSlot: number | undefined, slot: number, fleetSize: number, rank: number): boolean {
  const previous = previousSlot ?? slot - 1;
  // A frozen process or a clock stepped back: check rather than reason about the slots missed.
  if (slot - previous >= fleetSize || slot < previous) return true;
  for (let s = previous + 1; s <= slot; s++) if (s % fleetSize === rank) return true;
  return false;
}

export interface WatchdogOptions {
  intervalMs?: number;
  livenessIntervalMs?: number;
  lostWorkerGraceMs?: number;
  /** The retry policy for jobs whose task no worker has announced. */
  backoff?: BackoffPolicy;
  orphanScanIntervalMs?: number;
  orphanAfterMs?: number;
}

export interface ReapSummary {
  retried: number;
  dead: number;
  cancelled: number;
}

export type RecoveryCause = "lease_expired" | "worker_lost" | "stalled" | "timed_out";

export interface RecoverySummary extends ReapSummary {
  byCause: Partial<Record<RecoveryCause, number>>;
}

export class Watchdog extends MaintenanceService<RecoverySummary> {
  readonly id = `watchdog/${os.hostname()}-${process.pid}-${randomBytes(3).toString("hex")}`;
  private readonly livenessMs: number;
  private readonly reapMs: number;
  private readonly orphanMs: number;
  private readonly graceMs: number;
  private readonly backoff: BackoffPolicy;
  private lastReap = -Infinity;
  /** Workers this watchdog saw lose their liveness, and when their grace is over (monotonic ms). */
  private readonly lostSeen = new Map<string, number>();
  /** Live watchdogs, as last counted, and this one's rank among them: its turns (see ownsTurn). */
  private fleetSize = 1;
  private rank = 0;
  /** The wall-clock slot of the previous tick. */
  private lastSlot?: number;
  /** The reap-interval slot of the previous reap tick, for the gauges' turns. */
  private lastGaugeSlot?: number;
  private lastOrphanScan = -Infinity;
  private lastHandlerGauge = -Infinity;
  private announced = false;

  constructor(
    private readonly db: Queryable,
    private readonly metrics: Metrics,
    logger: Logger,
    private readonly options: WatchdogOptions = {},
  ) {
    const reapMs = options.intervalMs ?? DEFAULT_WATCHDOG_INTERVAL_MS;
    const livenessMs = Math.min(options.livenessIntervalMs ?? DEFAULT_LIVENESS_INTERVAL_MS, reapMs);
    super("watchdog", livenessMs, logger);
    this.livenessMs = livenessMs;
    this.reapMs = reapMs;
    this.orphanMs = options.orphanScanIntervalMs ?? DEFAULT_ORPHAN_SCAN_INTERVAL_MS;
    this.graceMs = options.lostWorkerGraceMs ?? DEFAULT_LOST_WORKER_GRACE_MS;
    this.backoff = options.backoff ?? DEFAULT_BACKOFF;
  }

  /** Stops, and says so in its row: a stopped watchdog is not listed as one that went silent. */
  override async stop(): Promise<void> {
    await super.stop();
    if (!this.announced) return;
    this.announced = false; // started again, it announces itself again
    await store.markWorkerStopped(this.db, this.id).catch(() => {});
  }

  /** Everything, now: crash detection, expired leases, overdue attempts and the orphan scan. */
  async runOnce(): Promise<RecoverySummary> {
    const summary = await this.recover(true, true, true);
    await this.scanOrphans();
    return summary;
  }

  /**
   * Crash detection on this watchdog's turns, so that the fleet's watchdogs together check
   * about once per `livenessIntervalMs` (every worker runs one: a hundred processes checking
   * four times a second each would be 400 statements a second for one answer); the heavier
   * parts when their interval has passed.
   */
  protected override async tick(): Promise<unknown> {
    const now = performance.now();
    const reapDue = now - this.lastReap >= this.reapMs - this.livenessMs / 2;
    const slot = Math.floor(Date.now() / this.livenessMs);
    const turn = ownsTurn(this.lastSlot, slot, this.fleetSize, this.rank);
    this.lastSlot = slot;
    await this.recover(reapDue, reapDue || turn);
    if (now - this.lastOrphanScan >= this.orphanMs) await this.scanOrphans();
    return undefined;
  }

  private async recover(all: boolean, checkLiveness = true, gaugeNow = false): Promise<RecoverySummary> {
    const summary: RecoverySummary = { retried: 0, dead: 0, cancelled: 0, byCause: {} };
    const count = (cause: RecoveryCause, ended: store.Ended) => {
      if (ended.size === 0) return;
      for (const state of ended.values()) summary[state === "waiting" || state === "suspended" ? "retried" : state]++;
      summary.byCause[cause] = (summary.byCause[cause] ?? 0) + ended.size;
      this.metrics.recoveries.inc({ cause }, ended.size);
      for (const s of ended.sinceBeatSeconds ?? []) this.metrics.recoveryDelay.observe({ cause }, s);
    };
    if (checkLiveness) {
      await this.checkLiveness();
      // Suspended jobs whose time came (docs/durable.md): on the fleet's liveness turns, so a
      // sleep ends within about a liveness interval, at one indexed statement per turn.
      await this.wakeSuspended();
    }
    const now = performance.now();
    // Recovery runs once the grace of a worker this watchdog saw go has passed, and on every
    // reap tick for workers another watchdog saw go: not one more statement on every tick.
    const graceOver = [...this.lostSeen].filter(([, due]) => now >= due);
    if (all || graceOver.length > 0) {
      count("worker_lost", await store.recoverLostWorkers(this.db, { limit: REAP_BATCH, graceMs: this.graceMs, backoff: this.backoff }));
      for (const [id] of graceOver) this.lostSeen.delete(id);
    }
    if (all) {
      this.lastReap = performance.now();
      if (!this.announced) {
        await store.announceWorker(this.db, {
          workerId: this.id,
          kind: "watchdog",
          host: os.hostname(),
          pid: process.pid,
          queues: [],
          livenessKey: null,
          policies: [],
        });
        this.announced = true;
      } else {
        const { watchdogs, rank } = await store.touchWorker(this.db, this.id, 3 * this.reapMs + 1_000);
        this.fleetSize = Math.max(1, watchdogs);
        this.rank = Math.min(rank, this.fleetSize - 1);
      }
      for (;;) {
        const reaped = await store.reapExpiredLeases(this.db, { limit: REAP_BATCH, backoff: this.backoff });
        count("lease_expired", reaped);
        for (const state of reaped.values()) this.metrics.leaseExpirations.inc({ result: state === "waiting" ? "retry" : state });
        if (reaped.size < REAP_BATCH) break;
      }
      const overdue = await store.endOverdueAttempts(this.db, { limit: REAP_BATCH, backoff: this.backoff, defaultMaxRunMs: DEFAULT_MAX_RUN_MS });
      if (overdue.size > 0) {
        for (const kind of ["stalled", "timed_out"] as const) {
          const ids = [...overdue.keys()].filter((id) => overdue.outcomes?.get(id) === kind);
          const part: store.Ended = new Map(ids.map((id) => [id, overdue.get(id)!]));
          part.sinceBeatSeconds = [];
          count(kind, part);
        }
        this.logger.warn(
          { jobs: [...overdue.keys()].slice(0, 20), n: overdue.size },
          "ended attempts past their progress timeout or maximum run time",
        );
      }
      // The gauges read every waiting job (~50 ms at 100,000): one watchdog of the fleet
      // reads them per reap interval, in turns, so a fleet of many processes costs what one
      // does. Each process's gauges are then at most fleetSize intervals old.
      const gaugeSlot = Math.floor(Date.now() / this.reapMs);
      if (metricsRecorded && (gaugeNow || ownsTurn(this.lastGaugeSlot, gaugeSlot, this.fleetSize, this.rank))) await this.gauge(gaugeNow);
      this.lastGaugeSlot = gaugeSlot;
    }
    const total = summary.retried + summary.dead + summary.cancelled;
    if (total > 0)
      this.logger.info({ ...summary.byCause, retried: summary.retried, dead: summary.dead, cancelled: summary.cancelled }, "recovered attempts");
    return summary;
  }

  private async wakeSuspended(): Promise<void> {
    for (;;) {
      const woken = await store.wakeSuspendedJobs(this.db, { limit: REAP_BATCH });
      let n = 0;
      for (const count of woken.values()) n += count;
      if (n > 0) this.logger.debug({ woken: Object.fromEntries(woken) }, "woke suspended jobs");
      if (n < REAP_BATCH) return;
    }
  }

  /** Workers whose liveness lock is gone are marked lost; their recovery waits the grace. */
  private async checkLiveness(): Promise<void> {
    const { lost, back, jobsLive, jobsDead } = await store.markLostWorkers(this.db, {
      startupGraceMs: STARTUP_GRACE_MS,
      defaultGraceMs: this.graceMs,
    });
    const now = performance.now();
    if (lost.length > 0) {
      this.logger.warn(
        { workers: lost.map((w) => w.id) },
        "worker liveness lost (session gone); recovering its jobs after the grace unless it comes back",
      );
      for (const w of lost) this.lostSeen.set(w.id, now + w.graceMs);
    }
    if (back.length > 0) {
      this.logger.info({ workers: back }, "worker liveness back");
      for (const id of back) this.lostSeen.delete(id);
    }
    // The hot table's dead rows slow every claim until vacuumed (see vacuumIfBloated); a busy
    // queue makes tens of thousands a second, so its counts are read with every liveness check
    // (for free: they come with it).
    if (store.isBloated(jobsLive, jobsDead, HOT_TABLE_VACUUM_MIN_DEAD)) {
      await store.vacuumTable(this.db, "jobs");
      this.logger.debug({ dead: jobsDead, live: jobsLive }, "vacuumed the jobs table");
    }
  }

  /** The gauges of every queue's depth, from one read of the queue_depth view. */
  private async gauge(now = false): Promise<void> {
    setDepthGauges(this.metrics, await store.queueDepth(this.db));
    // Durable jobs asleep or waiting, by what for: in the same turn as the depth gauges.
    this.metrics.suspendedJobs.reset();
    for (const s of await store.suspendedByKind(this.db))
      this.metrics.suspendedJobs.inc({ queue: this.metrics.queueLabel(s.queue), kind: s.kind }, s.n);
    // Like the depth gauges, about once per interval for the whole fleet.
    if (now || performance.now() - this.lastHandlerGauge >= HANDLER_GAUGE_INTERVAL_MS * this.fleetSize) {
      this.lastHandlerGauge = performance.now();
      const gaps = await store.jobsWithoutHandler(this.db, { aliveMs: HANDLER_ALIVE_MS });
      this.metrics.jobsWithoutHandler.reset();
      for (const g of gaps) this.metrics.jobsWithoutHandler.inc({ queue: this.metrics.queueLabel(g.queue), task: g.task }, g.waiting + g.scheduled);
    }
  }

  /** States that should not exist: each kind counted (a gauge and a log line), repaired where safe. */
  async scanOrphans(): Promise<Record<string, number>> {
    this.lastOrphanScan = performance.now();
    const found: Record<string, number> = {};
    const noWorker = await store.findJobsWithoutWorker(this.db, {
      waitingMs: this.options.orphanAfterMs ?? DEFAULT_ORPHAN_AFTER_MS,
      aliveMs: Math.max(60_000, 3 * this.reapMs),
    });
    found.no_worker_for_task = noWorker.reduce((n, r) => n + r.jobs, 0);
    if (noWorker.length > 0) {
      this.logger.warn(
        { tasks: noWorker.map((r) => ({ queue: r.queue, task: r.task, jobs: r.jobs, waitingSince: r.oldest })) },
        "ready jobs of tasks no live worker runs",
      );
    }
    const missing = await store.findMissingAudit(this.db, { withinMs: 2 * this.orphanMs });
    found.missing_audit = missing.length;
    if (missing.length > 0) this.logger.error({ jobs: missing.slice(0, 20) }, "finished jobs with fewer audit rows than attempts");
    const overBudget = await store.endOverBudgetJobs(this.db);
    found.over_budget = overBudget.length;
    if (overBudget.length > 0) {
      this.metrics.orphansRepaired.inc({ kind: "over_budget" }, overBudget.length);
      this.logger.warn({ jobs: overBudget.slice(0, 20), n: overBudget.length }, "waiting jobs past their retry budget moved to the dead letter");
    }
    for (const [kind, n] of Object.entries(found)) this.metrics.orphanedJobs.set({ kind }, n);
    await store.pruneWorkers(this.db, { retainMs: 24 * 3600_000 });
    return found;
  }
}

/**
 * Sets the depth gauges from queue_depth's rows. Queues past the label cap share the label
 * "other": their counts add up, their oldest age and pause are the largest among them.
 */
export function setDepthGauges(metrics: Metrics, depth: store.QueueDepth[]): void {
  metrics.jobs.reset();
  metrics.queueOldestReadyAge.reset();
  metrics.queuePaused.reset();
  const oldest = new Map<string, number>();
  const paused = new Map<string, number>();
  let running = 0;
  let pausedQueues = 0;
  for (const d of depth) {
    const queue = metrics.queueLabel(d.queue);
    for (const [state, n] of [
      ["waiting", d.ready],
      ["scheduled", d.delayed],
      ["running", d.running],
      ["blocked", d.blocked],
      ["suspended", d.suspended],
    ] as const) {
      if (n > 0) metrics.jobs.inc({ queue, state }, n);
    }
    oldest.set(queue, Math.max(oldest.get(queue) ?? 0, d.oldestReadyAgeSeconds));
    paused.set(queue, Math.max(paused.get(queue) ?? 0, d.paused ? 1 : 0));
    running += d.running;
    if (d.paused) pausedQueues++;
  }
  for (const [queue, age] of oldest) metrics.queueOldestReadyAge.set({ queue }, age);
  for (const [queue, p] of paused) metrics.queuePaused.set({ queue }, p);
  metrics.activeLeases.set(running);
  // A paused queue's jobs wait however many workers run: worth an alert when it lasts.
  metrics.queuesPaused.set(pausedQueues);
}
