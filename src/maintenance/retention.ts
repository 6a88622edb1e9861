/**
 * Retention: deletes finished jobs (and their audit rows) older than a configurable age,
 * keeping dead jobs longer, in bounded batches so that tables stay bounded without long
 * transactions.
 */
import type { Logger } from "pino";
import type { Queryable } from "../store/db.js";
import { pruneFinishedJobs } from "../store/index.js";
import type { Metrics } from "../metrics.js";
import { MaintenanceService } from "./service.js";

export const DEFAULT_RETAIN_MS = 24 * 3600_000;
export const DEFAULT_RETAIN_DEAD_MS = 7 * 24 * 3600_000;
export const DEFAULT_RETENTION_INTERVAL_MS = 60_000;
export const RETENTION_BATCH = 5_000;
/** Batches per run at most, so one run cannot hold the database for long. */
const MAX_BATCHES_PER_RUN = 100;

export interface RetentionOptions {
  retainMs?: number;
  retainDeadMs?: number;
  intervalMs?: number;
  batchSize?: number;
}

export class Retention extends MaintenanceService<number> {
  constructor(
    private readonly db: Queryable,
    private readonly metrics: Metrics,
    logger: Logger,
    private readonly options: RetentionOptions = {},
  ) {
    super("retention", options.intervalMs ?? DEFAULT_RETENTION_INTERVAL_MS, logger);
  }

  async runOnce(): Promise<number> {
    const batch = this.options.batchSize ?? RETENTION_BATCH;
    const retainMs = this.options.retainMs ?? DEFAULT_RETAIN_MS;
    const retainDeadMs = Math.max(retainMs, this.options.retainDeadMs ?? DEFAULT_RETAIN_DEAD_MS);
    let total = 0;
    for (let i = 0; i < MAX_BATCHES_PER_RUN; i++) {
      const deleted = await pruneFinishedJobs(this.db, { retainMs, retainDeadMs, limit: batch });
      total += deleted;
      this.metrics.retentionDeleted.inc(deleted);
      if (deleted < batch) break;
    }
    if (total > 0) this.logger.info({ deleted: total }, "retention deleted finished jobs");
    return total;
  }
}
