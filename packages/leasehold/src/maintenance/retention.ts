/**
 * Retention: forgets finished jobs (and their audit rows) older than a configurable age,
 * keeping dead jobs longer, and the record of stale refusals as long as finished jobs; a job's
 * recorded durable steps go with it, and events are kept for a window of their own. Succeeded and cancelled jobs go a whole generation at a time
 * (TRUNCATE, see store/retention.ts); dead jobs in bounded batches, so that no run holds a
 * long transaction.
 */
import type pg from "pg";
import type { Logger } from "../logger.js";
import {
  GENERATIONS,
  pruneDeadJobs,
  pruneEvents,
  pruneFlowKeyState,
  pruneFlowStarts,
  pruneStaleRefusals,
  setGenerationWidth,
  truncateOldGenerations,
  vacuumIfBloated,
} from "../store/index.js";
import { ConfigError } from "../errors.js";
import type { Metrics } from "../metrics.js";
import { MaintenanceService } from "./service.js";

export const DEFAULT_RETAIN_MS = 24 * 3600_000;
export const DEFAULT_RETAIN_DEAD_MS = 7 * 24 * 3600_000;
/** Events (lh.sendEvent) are kept this long by default: a wait that begins later still finds one sent within it. */
export const DEFAULT_RETAIN_EVENTS_MS = 7 * 24 * 3600_000;
/** Runs at least this often, and at least twice per generation (so one never outlives its turn). */
export const DEFAULT_RETENTION_INTERVAL_MS = 60_000;
export const RETENTION_BATCH = 5_000;
/** Dead-job batches per run at most, so one run cannot hold the database for long. */
const MAX_BATCHES_PER_RUN = 100;

export interface RetentionOptions {
  /** Succeeded and cancelled jobs are kept at least this long (and at most about 1.25 times it). */
  retainMs?: number;
  /** Dead jobs are kept at least this long (never less than `retainMs`). */
  retainDeadMs?: number;
  /**
   * Events are kept this long (default 7 days): a ctx.waitForEvent that begins after its event
   * was sent receives it only if the event is still kept (docs/durable.md#events-and-the-race-with-a-wait).
   */
  retainEventsMs?: number;
  intervalMs?: number;
  batchSize?: number;
}

export class Retention extends MaintenanceService<number> {
  private readonly retainMs: number;
  private readonly retainDeadMs: number;
  private readonly retainEventsMs: number;

  constructor(
    private readonly pool: pg.Pool,
    private readonly metrics: Metrics,
    logger: Logger,
    private readonly options: RetentionOptions = {},
  ) {
    const retainMs = options.retainMs ?? DEFAULT_RETAIN_MS;
    if (!Number.isInteger(retainMs) || retainMs < 1_000) {
      throw new ConfigError(`retention: retainMs must be a whole number of milliseconds, at least 1000 (got ${retainMs})`);
    }
    const generationMs = Math.ceil(retainMs / (GENERATIONS - 2));
    super("retention", options.intervalMs ?? Math.min(DEFAULT_RETENTION_INTERVAL_MS, Math.max(500, Math.floor(generationMs / 2))), logger);
    this.retainMs = retainMs;
    this.retainDeadMs = Math.max(retainMs, options.retainDeadMs ?? DEFAULT_RETAIN_DEAD_MS);
    const retainEventsMs = options.retainEventsMs ?? DEFAULT_RETAIN_EVENTS_MS;
    if (!Number.isInteger(retainEventsMs) || retainEventsMs < 1_000) {
      throw new ConfigError(`retention: retainEventsMs must be a whole number of milliseconds, at least 1000 (got ${retainEventsMs})`);
    }
    this.retainEventsMs = retainEventsMs;
  }

  async runOnce(): Promise<number> {
    await setGenerationWidth(this.pool, this.retainMs);
    let total = await truncateOldGenerations(this.pool, { retainMs: this.retainMs });
    const batch = this.options.batchSize ?? RETENTION_BATCH;
    let dead = 0;
    for (let i = 0; i < MAX_BATCHES_PER_RUN; i++) {
      const deleted = await pruneDeadJobs(this.pool, { retainDeadMs: this.retainDeadMs, limit: batch });
      dead += deleted;
      if (deleted < batch) break;
    }
    total += dead;
    // Stale refusals (what the dashboard's Recoveries view lists) are kept as long as finished jobs.
    for (let i = 0; i < MAX_BATCHES_PER_RUN; i++) {
      if ((await pruneStaleRefusals(this.pool, { retainMs: this.retainMs, limit: batch })) < batch) break;
    }
    // Per-key rate logs and holds of keys that went quiet (one row per key that was ever limited).
    for (let i = 0; i < MAX_BATCHES_PER_RUN; i++) {
      if ((await pruneFlowKeyState(this.pool, { limit: batch })) < batch) break;
    }
    // Rate starts of queues and keys no longer claimed (a claim deletes its own that left the window).
    for (let i = 0; i < MAX_BATCHES_PER_RUN; i++) {
      if ((await pruneFlowStarts(this.pool, { limit: batch })) < batch) break;
    }
    // Events past their window, in batches like the dead letter (not counted as jobs).
    let events = 0;
    for (let i = 0; i < MAX_BATCHES_PER_RUN; i++) {
      const deleted = await pruneEvents(this.pool, { retainEventsMs: this.retainEventsMs, limit: batch });
      events += deleted;
      if (deleted < batch) break;
    }
    if (events > 0) this.logger.info({ events }, "retention forgot old events");
    this.metrics.retentionDeleted.inc(total);
    if (total > 0) {
      this.logger.info({ deleted: total }, "retention forgot finished jobs");
      // Audit and dead-letter deletes leave dead rows; autovacuum may not come round for a
      // minute, and these tables are read by id.
      await vacuumIfBloated(this.pool, { tables: ["job_attempts", "dead_jobs", "job_steps"], minDead: batch });
    }
    return total;
  }
}
