/**
 * The throughput sampler: stores PostgreSQL's cumulative row counters every interval (see
 * store/throughput.ts) and forgets samples older than a day. `leasehold serve` and `dev` run
 * it for the dashboard's charts; several may run at once (one sample per slot is kept). Each
 * run is two small statements, whatever the queue's load.
 */
import type { Logger } from "../logger.js";
import { ConfigError } from "../errors.js";
import type { Queryable } from "../store/db.js";
import * as store from "../store/index.js";
import { MaintenanceService } from "./service.js";

/** A chart of the last hour then has 360 points: fine-grained enough to see a stall start. */
export const DEFAULT_SAMPLE_INTERVAL_MS = 10_000;
export const SAMPLE_RETAIN_MS = 24 * 3600_000;

export interface ThroughputSamplerOptions {
  intervalMs?: number;
}

export class ThroughputSampler extends MaintenanceService<boolean> {
  constructor(
    private readonly db: Queryable,
    logger: Logger,
    options: ThroughputSamplerOptions = {},
  ) {
    const intervalMs = options.intervalMs ?? DEFAULT_SAMPLE_INTERVAL_MS;
    if (!Number.isInteger(intervalMs) || intervalMs < 1_000) {
      throw new ConfigError(`throughput sampler: the interval must be a whole number of milliseconds, at least 1000 (got ${intervalMs})`);
    }
    super("throughput", intervalMs, logger);
  }

  /** Takes this slot's sample (unless another process did); true if this call stored it. */
  async runOnce(): Promise<boolean> {
    const stored = await store.sampleThroughput(this.db, { intervalMs: this.intervalMs });
    if (stored) await store.pruneThroughputSamples(this.db, { retainMs: SAMPLE_RETAIN_MS });
    return stored;
  }
}
