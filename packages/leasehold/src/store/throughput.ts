/**
 * Throughput without reading jobs: PostgreSQL counts the rows ever inserted into each table
 * (pg_stat_get_tuples_inserted, kept in shared memory, flushed by each backend about once a
 * second). A sampler stores those counters every few seconds; the rate over a slot is the
 * difference between two samples. Reading an hour costs a few hundred sample rows, whether an
 * hour is 100 jobs or 140 million. What it cannot say: which queue (the counters are per
 * table), and anything from before a sampler ran. A statistics reset (pg_stat_reset, or
 * crash recovery) makes a counter go down: that slot has no rate rather than a wrong one.
 */
import type { Queryable } from "./db.js";
import { run, statement } from "./sql.js";

/**
 * One sample per slot of `$1` ms, whoever takes it first: several servers sampling at once
 * store one row. job_history's counters are its generations' (partitions') sums: "finished"
 * counts the records written, so the succeeded jobs of a queue that keeps no record of them
 * (queues.keep_succeeded, migration 032) are not in it; dead jobs always are.
 */
const SAMPLE_THROUGHPUT = statement(
  "sampleThroughput",
  `
INSERT INTO throughput_samples (at, finished, dead, requeued, enqueued)
SELECT to_timestamp(floor(extract(epoch FROM now()) * 1000 / $1::bigint) * $1::bigint / 1000.0),
       (SELECT coalesce(sum(pg_stat_get_tuples_inserted(inhrelid)), 0)::bigint FROM pg_inherits WHERE inhparent = 'job_history'::regclass),
       pg_stat_get_tuples_inserted('dead_jobs'::regclass),
       pg_stat_get_tuples_inserted('job_attempts'::regclass),
       pg_stat_get_tuples_inserted('jobs'::regclass)
ON CONFLICT (at) DO NOTHING
RETURNING at`,
  { at: "timestamptz" },
);

/** Stores a sample for the current slot unless one is there; true if this call stored it. */
export async function sampleThroughput(db: Queryable, p: { intervalMs: number }): Promise<boolean> {
  return (await run(db, SAMPLE_THROUGHPUT, [p.intervalMs])).length > 0;
}

const PRUNE_THROUGHPUT_SAMPLES = statement(
  "pruneThroughputSamples",
  `
WITH gone AS (DELETE FROM throughput_samples WHERE at < now() - $1::bigint * interval '1 millisecond' RETURNING 1)
SELECT count(*)::int AS deleted FROM gone`,
  { deleted: "int4" },
);

export async function pruneThroughputSamples(db: Queryable, p: { retainMs: number }): Promise<number> {
  const [row] = await run(db, PRUNE_THROUGHPUT_SAMPLES, [p.retainMs]);
  return row!.deleted;
}

/** Each sample of the window with what changed since the one before it (null for the first). */
const THROUGHPUT_SERIES = statement(
  "throughputSeries",
  `
SELECT at,
       extract(epoch FROM sampled_at - lag(sampled_at) OVER w)::float8 AS seconds,
       (finished - lag(finished) OVER w)::float8 AS finished,
       (dead - lag(dead) OVER w)::float8 AS dead,
       (requeued - lag(requeued) OVER w)::float8 AS requeued,
       (enqueued - lag(enqueued) OVER w)::float8 AS enqueued
  FROM throughput_samples
 WHERE at >= now() - $1::bigint * interval '1 millisecond'
WINDOW w AS (ORDER BY at)
 ORDER BY at`,
  { at: "timestamptz", seconds: "float8?", finished: "float8?", dead: "float8?", requeued: "float8?", enqueued: "float8?" },
);

const TRACK_COUNTS = statement("trackCounts", `SELECT current_setting('track_counts')::boolean AS counting`, { counting: "bool" });

/** Rows per second over the interval that ends at `at`; null where there is no rate to give. */
export interface ThroughputPoint {
  at: Date;
  finished: number | null;
  dead: number | null;
  requeued: number | null;
  enqueued: number | null;
}

export interface ThroughputSeries {
  points: ThroughputPoint[];
  /** PostgreSQL's track_counts: off, the counters never move and there is no throughput to show. */
  counting: boolean;
}

/**
 * Rates over the last `windowMs`. A gap longer than `maxGapMs` between two samples (no sampler
 * ran) gives a point with no rate, so a chart shows a gap rather than an average over it.
 */
export async function throughputSeries(db: Queryable, p: { windowMs: number; maxGapMs: number }): Promise<ThroughputSeries> {
  const [rows, [track]] = await Promise.all([run(db, THROUGHPUT_SERIES, [p.windowMs]), run(db, TRACK_COUNTS)]);
  const points: ThroughputPoint[] = [];
  for (const r of rows) {
    if (r.seconds === null) continue; // the first sample: nothing to compare with
    const usable = r.seconds > 0 && r.seconds * 1000 <= p.maxGapMs;
    // A counter that went down was reset (pg_stat_reset, crash recovery): no rate for that slot.
    const rate = (delta: number | null) => (usable && delta !== null && delta >= 0 ? delta / r.seconds! : null);
    points.push({ at: r.at, finished: rate(r.finished), dead: rate(r.dead), requeued: rate(r.requeued), enqueued: rate(r.enqueued) });
  }
  return { points, counting: track!.counting };
}
