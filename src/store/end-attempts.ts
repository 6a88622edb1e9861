/**
 * Every way an attempt ends without success goes through one path: a handler's failure,
 * the watchdog reaping an expired lease, a graceful release, and startup reconciliation.
 * Each statement selects and locks its attempts into a CTE named `ending`; the shared tail
 * then, in the same statement:
 *   - retries the job (back to waiting after a backoff) if budget is left,
 *   - or moves it to job_history as dead (budget spent) or cancelled (a cancel was requested),
 *   - and writes the attempt's audit row.
 * A release does not spend the retry budget; nothing here lowers `attempt`, the fencing token.
 *
 * Columns of `ending`: id, attempt, worker_id, started_at, error, retry_delay_ms,
 * spend (counts against max_attempts), give_up (dead now), outcome, cancelled, spent_attempts,
 * max_attempts.
 */
import type { Queryable } from "./db.js";
import type { AttemptRef } from "./finish.js";
import { run, statement } from "./sql.js";

const END_ATTEMPTS = `
, decided AS (
  SELECT e.*,
         NOT e.cancelled
           AND (e.give_up OR (e.spend AND e.spent_attempts + 1 >= e.max_attempts)) AS dead
    FROM ending AS e
), retried AS (
  UPDATE jobs AS j
     SET state = 'waiting',
         spent_attempts = j.spent_attempts + d.spend::int,
         run_at = now() + d.retry_delay_ms * interval '1 millisecond',
         last_error = coalesce(d.error, j.last_error),
         lease_until = NULL, locked_by = NULL, heartbeat_at = NULL
    FROM decided AS d
   WHERE j.id = d.id AND NOT d.cancelled AND NOT d.dead
  RETURNING j.id, j.queue, d.retry_delay_ms
), finished AS (
  DELETE FROM jobs AS j
   USING decided AS d
   WHERE j.id = d.id AND (d.cancelled OR d.dead)
  RETURNING j.*, d.spend, d.error AS final_error,
            CASE WHEN d.cancelled THEN 'cancelled' ELSE 'dead' END AS final_state
), history AS (
  INSERT INTO job_history (id, queue, task, payload, priority, state, attempt, spent_attempts, max_attempts,
                           lease_ms, progress, checkpoint, last_error, unique_key, created_at, started_at)
  SELECT id, queue, task, payload, priority, final_state, attempt, spent_attempts + spend::int, max_attempts,
         lease_ms, progress, checkpoint, coalesce(final_error, last_error), unique_key, created_at, started_at
    FROM finished
), audit AS (
  INSERT INTO job_attempts (job_id, attempt, worker_id, started_at, outcome, error)
  SELECT id, attempt, worker_id, started_at, CASE WHEN cancelled THEN 'cancelled' ELSE outcome END, error
    FROM decided
)
SELECT r.id, 'waiting' AS state,
       -- jobs released to run at once wake a sleeping worker (a NOTIFY per queue, deduplicated)
       CASE WHEN r.retry_delay_ms = 0 THEN pg_notify('leasehold:' || current_schema(), r.queue)::text END AS woke
  FROM retried AS r
UNION ALL
SELECT f.id, f.final_state, NULL FROM finished AS f`;

export type EndState = "waiting" | "dead" | "cancelled";

const ENDED = { id: "int8", state: "text", woke: "text?" } as const;

/** A statement that selects its attempts into `ending` and ends them through the shared tail. */
const ending = (name: string, selectEnding: string) => statement(name, selectEnding + END_ATTEMPTS, ENDED);

async function endAttempts(db: Queryable, st: ReturnType<typeof ending>, values: unknown[]): Promise<Map<string, EndState>> {
  const rows = await run(db, st, values);
  return new Map(rows.map((r) => [r.id, r.state as EndState]));
}

export interface Failure extends AttemptRef {
  error: string;
  /** Backoff before the retry, computed from the task's policy. */
  retryDelayMs: number;
  /** The handler said the job can never succeed: dead letter now, whatever budget is left. */
  giveUp?: boolean;
}

/** A handler's failures, fenced by (id, attempt, worker). Absent from the result: stale. */
export function failJobs(db: Queryable, p: { workerId: string; failures: Failure[] }): Promise<Map<string, EndState>> {
  if (p.failures.length === 0) return Promise.resolve(new Map());
  return endAttempts(db, FAIL_JOBS, [
    p.failures.map((f) => f.id),
    p.failures.map((f) => f.attempt),
    p.failures.map((f) => f.error),
    p.failures.map((f) => Math.max(0, Math.round(f.retryDelayMs))),
    p.failures.map((f) => f.giveUp ?? false),
    p.workerId,
  ]);
}

const FAIL_JOBS = ending(
  "failJobs",
  `WITH ending AS (
  SELECT j.id, j.attempt, j.locked_by AS worker_id, j.started_at, f.error, f.retry_delay_ms,
         true AS spend, f.give_up, 'failed' AS outcome, j.cancel_requested_at IS NOT NULL AS cancelled,
         j.spent_attempts, j.max_attempts
    FROM jobs AS j
    JOIN unnest($1::bigint[], $2::int[], $3::text[], $4::bigint[], $5::bool[])
         AS f(id, attempt, error, retry_delay_ms, give_up)
      ON j.id = f.id AND j.attempt = f.attempt
   WHERE j.id = ANY($1::bigint[]) AND j.locked_by = $6
     FOR UPDATE OF j
)`,
);

export interface BackoffPolicy {
  /** Delay before the first retry. */
  baseMs: number;
  /** Growth per spent attempt. */
  factor: number;
  /** Upper bound of a delay. */
  maxMs: number;
  /** 0..1: a delay is drawn from [d * (1 - jitter), d]. */
  jitter: number;
}

/**
 * The watchdog: every lease that ran out, in one set-based UPDATE over the partial lease
 * index, through the same retry-or-dead path as a failure (error "lease expired"). SKIP
 * LOCKED plus moving the rows out of `running` in the same statement means concurrent
 * reapers never reap a job twice, and a heartbeat in flight (holding the row) wins.
 * The backoff is the same formula as the worker's, computed with the database's clock.
 */
export function reapExpiredLeases(
  db: Queryable,
  p: { limit: number; backoff: BackoffPolicy },
): Promise<Map<string, EndState>> {
  return endAttempts(db, REAP_EXPIRED_LEASES, [p.backoff.baseMs, p.backoff.factor, p.backoff.maxMs, p.backoff.jitter, p.limit]);
}

const REAP_EXPIRED_LEASES = ending(
  "reapExpiredLeases",
  `WITH ending AS (
  SELECT j.id, j.attempt, j.locked_by AS worker_id, j.started_at, 'lease expired' AS error,
         round(least($3::float8, $1::float8 * power($2::float8, j.spent_attempts))
               * (1 - $4::float8 * random()))::bigint AS retry_delay_ms,
         true AS spend, false AS give_up, 'lease_expired' AS outcome,
         j.cancel_requested_at IS NOT NULL AS cancelled, j.spent_attempts, j.max_attempts
    FROM jobs AS j
   WHERE j.state = 'running' AND j.lease_until < now()
   ORDER BY j.lease_until
   LIMIT $5
     FOR UPDATE SKIP LOCKED
)`,
);

/** Graceful shutdown: give jobs back to waiting at once, without spending an attempt. */
export function releaseJobs(
  db: Queryable,
  p: { workerId: string; jobs: AttemptRef[]; reason: string },
): Promise<Map<string, EndState>> {
  if (p.jobs.length === 0) return Promise.resolve(new Map());
  return endAttempts(db, RELEASE_JOBS, [p.jobs.map((j) => j.id), p.jobs.map((j) => j.attempt), p.workerId, p.reason]);
}

const RELEASE_JOBS = ending(
  "releaseJobs",
  `WITH ending AS (
  SELECT j.id, j.attempt, j.locked_by AS worker_id, j.started_at, $4::text AS error, 0::bigint AS retry_delay_ms,
         false AS spend, false AS give_up, 'released' AS outcome,
         j.cancel_requested_at IS NOT NULL AS cancelled, j.spent_attempts, j.max_attempts
    FROM jobs AS j
    JOIN unnest($1::bigint[], $2::int[]) AS r(id, attempt) ON j.id = r.id AND j.attempt = r.attempt
   WHERE j.id = ANY($1::bigint[]) AND j.locked_by = $3
     FOR UPDATE OF j
)`,
);

/**
 * Startup reconciliation: a worker with a stable name (say a pod name) releases at once the
 * jobs still held by an earlier process of that name, instead of waiting for their leases.
 * Worker ids are "<name>/<host>-<pid>-<random>"; the name never contains "/".
 */
export function releaseJobsOfEarlierProcess(
  db: Queryable,
  p: { workerName: string; currentWorkerId: string },
): Promise<Map<string, EndState>> {
  return endAttempts(db, RELEASE_EARLIER_PROCESS, [p.workerName, p.currentWorkerId]);
}

const RELEASE_EARLIER_PROCESS = ending(
  "releaseJobsOfEarlierProcess",
  `WITH ending AS (
  SELECT j.id, j.attempt, j.locked_by AS worker_id, j.started_at,
         'released: worker ' || $1 || ' restarted' AS error, 0::bigint AS retry_delay_ms,
         false AS spend, false AS give_up, 'released' AS outcome,
         j.cancel_requested_at IS NOT NULL AS cancelled, j.spent_attempts, j.max_attempts
    FROM jobs AS j
   WHERE j.state = 'running' AND split_part(j.locked_by, '/', 1) = $1 AND j.locked_by <> $2
     FOR UPDATE OF j SKIP LOCKED
)`,
);
