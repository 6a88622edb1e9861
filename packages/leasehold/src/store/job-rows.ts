import type { NormalizedJob } from "../jobs/validate.js";

/**
 * The rows an enqueue writes, as one array per column: the INSERT's column list, the SELECT that
 * unnests the arrays ($1..$14), and the arrays themselves in that order. Shared by the plain
 * enqueue (store/enqueue.ts), the replacing one (store/duplicates.ts) and a flow's jobs
 * (store/dependencies.ts, which adds its graph columns after these), so they cannot drift.
 */
export const JOB_COLUMN_LIST = `queue, task, payload, priority, run_at, max_attempts, unique_key, lease_ms,
     progress_timeout_ms, max_run_ms, max_run_unlimited, headers, flow_key`;

/** The values for JOB_COLUMN_LIST, read from the unnested arrays (JOB_UNNEST_ARGS as JOB_UNNEST_NAMES). */
export const JOB_VALUES = `queue, task, payload, priority,
       coalesce(run_at, now() + delay_ms * interval '1 millisecond'),
       max_attempts, unique_key, lease_ms, progress_timeout_ms, max_run_ms, max_run_unlimited, headers, flow_key`;

export const JOB_UNNEST_ARGS = `$1::text[], $2::text[], $3::jsonb[], $4::smallint[], $5::timestamptz[],
              $6::bigint[], $7::int[], $8::text[], $9::int[], $10::int[], $11::int[], $12::bool[], $13::jsonb[],
              $14::text[]`;

export const JOB_UNNEST_NAMES = `queue, task, payload, priority, run_at, delay_ms, max_attempts, unique_key, lease_ms,
            progress_timeout_ms, max_run_ms, max_run_unlimited, headers, flow_key`;

export const JOB_COLUMNS = `(${JOB_COLUMN_LIST})`;

export const JOB_ROWS = `SELECT ${JOB_VALUES}
  FROM unnest(${JOB_UNNEST_ARGS})
       AS j(${JOB_UNNEST_NAMES})`;

/** JOB_ROWS' parameters $1..$14 for these jobs. */
export function jobArrays(jobs: NormalizedJob[]): unknown[] {
  return [
    jobs.map((j) => j.queue),
    jobs.map((j) => j.task),
    jobs.map((j) => j.payloadJson),
    jobs.map((j) => j.priority),
    jobs.map((j) => j.runAt),
    jobs.map((j) => j.delayMs),
    jobs.map((j) => j.maxAttempts),
    jobs.map((j) => j.uniqueKey),
    jobs.map((j) => j.leaseMs),
    jobs.map((j) => j.progressTimeoutMs),
    jobs.map((j) => j.maxRunMs),
    jobs.map((j) => j.maxRunUnlimited),
    jobs.map((j) => j.headersJson ?? null),
    jobs.map((j) => j.flowKey ?? null),
  ];
}
