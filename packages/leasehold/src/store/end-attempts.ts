/**
 * Every way an attempt ends without success goes through one path: a handler's failure, a
 * lease the watchdog reaps, a worker found dead, a stall or a run past its time limit, a
 * graceful release, and start-up reconciliation. Each statement selects and locks its
 * attempts into a CTE named `ending`; the shared tail then, in the same statement:
 *   - retries the job (back to waiting after a backoff) if budget is left,
 *   - or moves it to the dead letter (budget spent) or to job_history as cancelled (a cancel
 *     was requested), the final attempt's audit fields in that row,
 *   - and writes the audit row of an attempt that did not finish its job.
 * Only a graceful release by a live worker is free: every other end spends the retry budget,
 * so a job that kills its worker every time still reaches the dead letter. Nothing here
 * lowers `attempt`, the fencing token.
 *
 * Columns of `ending`: id, attempt, worker_id, started_at, error, retry_delay_ms,
 * spend (counts against max_attempts), give_up (dead now), outcome, cancelled, spent_attempts,
 * max_attempts, last_beat_at, recovery (recovery or a release ended it, not its handler).
 *
 * While NATS dispatch is active (docs/nats.md), a retried job also owes a doorbell: its
 * dispatch_outbox row is written here, due when the job is, flagged `recovery` when recovery
 * or a release put it back. Otherwise that part writes nothing (a one-row lookup per
 * statement).
 */
import type { Queryable } from "./db.js";
import type { AttemptRef } from "./finish.js";
import { DEFAULT_MAX_HOLD_MS } from "./flow.js";
import { run, statement } from "./sql.js";
import type { AttemptOutcome } from "../jobs/types.js";

/**
 * The shared tail. `wait`: what a suspension ends its job with (store/steps.ts), an expression
 * over `d`; every other end clears it.
 */
const endAttemptsTail = (wait = "NULL::jsonb") => `
, decided AS (
  SELECT e.*,
         NOT e.cancelled
           AND (e.give_up OR (e.spend AND e.spent_attempts + 1 >= e.max_attempts)) AS dead
    FROM ending AS e
), retried AS (
  UPDATE jobs AS j
     SET state = CASE WHEN d.outcome = 'suspended' THEN 'suspended' ELSE 'waiting' END,
         wait = ${wait},
         spent_attempts = j.spent_attempts + d.spend::int,
         run_at = now() + d.retry_delay_ms * interval '1 millisecond',
         last_error = coalesce(d.error, j.last_error),
         last_outcome = d.outcome,
         lease_until = NULL, locked_by = NULL, heartbeat_at = NULL
    FROM decided AS d
   WHERE j.id = d.id AND NOT d.cancelled AND NOT d.dead
  RETURNING j.id, j.queue, j.attempt, j.run_at, d.retry_delay_ms, d.last_beat_at, d.outcome, d.recovery
), doorbells AS (
  INSERT INTO dispatch_outbox (job_id, attempt, publish_at, recovery)
  SELECT r.id, r.attempt, r.run_at, r.recovery FROM retried AS r WHERE r.outcome <> 'suspended' AND nats_dispatch_active()
  ON CONFLICT DO NOTHING
), finished AS (
  DELETE FROM jobs AS j
   USING decided AS d
   WHERE j.id = d.id AND (d.cancelled OR d.dead)
  RETURNING j.*, d.spend, d.error AS final_error, d.worker_id AS final_worker, d.outcome AS final_outcome, d.last_beat_at,
            CASE WHEN d.cancelled THEN 'cancelled' ELSE 'dead' END AS final_state
), history AS (
  INSERT INTO job_history (id, queue, task, payload, priority, state, attempt, spent_attempts, max_attempts,
                           lease_ms, progress, checkpoint, last_error, unique_key, created_at, started_at,
                           worker_id, outcome, fence, progress_timeout_ms, max_run_ms, max_run_unlimited, generation)
  SELECT id, queue, task, payload, priority, final_state, attempt, spent_attempts + spend::int, max_attempts,
         lease_ms, progress, checkpoint, coalesce(final_error, last_error), unique_key, created_at, started_at,
         final_worker, 'cancelled', fence, progress_timeout_ms, max_run_ms, max_run_unlimited, (SELECT history_generation(now()))
    FROM finished
   WHERE final_state = 'cancelled'
), dead_letter AS (
  INSERT INTO dead_jobs (id, queue, task, payload, priority, attempt, spent_attempts, max_attempts,
                         lease_ms, progress, checkpoint, last_error, unique_key, created_at, started_at,
                         worker_id, outcome, fence, progress_timeout_ms, max_run_ms, max_run_unlimited)
  SELECT id, queue, task, payload, priority, attempt, spent_attempts + spend::int, max_attempts,
         lease_ms, progress, checkpoint, coalesce(final_error, last_error), unique_key, created_at, started_at,
         final_worker, final_outcome, fence, progress_timeout_ms, max_run_ms, max_run_unlimited
    FROM finished
   WHERE final_state = 'dead'
), audit AS (
  INSERT INTO job_attempts (job_id, attempt, worker_id, started_at, outcome, error)
  SELECT id, attempt, worker_id, started_at, outcome, error
    FROM decided
   WHERE NOT (cancelled OR dead)
)
SELECT r.id, CASE WHEN r.outcome = 'suspended' THEN 'suspended' ELSE 'waiting' END AS state,
       -- jobs released to run at once wake a sleeping worker (a NOTIFY per queue, deduplicated),
       -- and the NATS dispatchers when their doorbells are owed
       CASE WHEN r.retry_delay_ms = 0 AND r.outcome <> 'suspended'
            THEN concat(pg_notify('leasehold:' || current_schema(), r.queue),
                        CASE WHEN nats_dispatch_active() THEN pg_notify('leasehold:' || current_schema() || ':dispatch', '') END)
       END AS woke,
       extract(epoch FROM now() - r.last_beat_at)::float8 AS since_beat_s, r.outcome
  FROM retried AS r
UNION ALL
SELECT f.id, f.final_state, NULL, extract(epoch FROM now() - f.last_beat_at)::float8, f.final_outcome FROM finished AS f`;

/**
 * The retry delay from the job's policy (HOLDER_POLICY), else the given
 * default ($1-$4): the formula itself is the schema's retry_delay_ms().
 */
const POLICY_DELAY = `retry_delay_ms(j.spent_attempts, coalesce(p.backoff_base_ms, $1), coalesce(p.backoff_factor, $2),
                        coalesce(p.backoff_max_ms, $3), coalesce(p.backoff_jitter, $4))`;

/**
 * The policy a running job is recovered by, as `p`: its holder's own declaration (a remote
 * worker declares limits for the jobs it holds only: worker_task_policies), else its task's
 * fleet-wide one (task_policies, from workers on the database). No row: the defaults apply.
 */
const HOLDER_POLICY = `LEFT JOIN LATERAL (
      SELECT o.task, o.backoff_base_ms, o.backoff_factor, o.backoff_max_ms, o.backoff_jitter, o.progress_timeout_ms, o.max_run_ms, 0 AS rank
        FROM worker_task_policies AS o WHERE o.worker_id = j.locked_by AND o.task = j.task
      UNION ALL
      SELECT t.task, t.backoff_base_ms, t.backoff_factor, t.backoff_max_ms, t.backoff_jitter, t.progress_timeout_ms, t.max_run_ms, 1
        FROM task_policies AS t WHERE t.task = j.task
      ORDER BY rank LIMIT 1) AS p ON true`;

const ENDED = { id: "int8", state: "text", woke: "text?", since_beat_s: "float8?", outcome: "text" } as const;

/** A statement that selects its attempts into `ending` and ends them through the shared tail. */
export const ending = (name: string, selectEnding: string, wait?: string) => statement(name, selectEnding + endAttemptsTail(wait), ENDED);

/** "suspended": a durable handler's sleep or wait ended the attempt (store/steps.ts). */
export type EndState = "waiting" | "dead" | "cancelled" | "suspended";

/** What became of each ended attempt's job (by job id). */
export type Ended = Map<string, EndState> & {
  /** Seconds from each ended attempt's last heartbeat to its end (recovery delay). */
  sinceBeatSeconds?: number[];
  /** How each attempt ended, by job id. */
  outcomes?: Map<string, AttemptOutcome>;
};

export async function endAttempts(db: Queryable, st: ReturnType<typeof ending>, values: unknown[]): Promise<Ended> {
  const rows = await run(db, st, values);
  const ended: Ended = new Map(rows.map((r) => [r.id, r.state as EndState]));
  ended.sinceBeatSeconds = rows.flatMap((r) => (r.since_beat_s === null ? [] : [r.since_beat_s]));
  ended.outcomes = new Map(rows.map((r) => [r.id, r.outcome as AttemptOutcome]));
  return ended;
}

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

const policyValues = (b: BackoffPolicy) => [b.baseMs, b.factor, b.maxMs, b.jitter];

/** How a handler's attempt ended without success, as its worker reports it. */
export type FailureOutcome = Extract<AttemptOutcome, "failed" | "stalled" | "timed_out">;

export interface Failure extends AttemptRef {
  error: string;
  /** The task's retry policy: the delay before the retry is computed from it in SQL. */
  backoff: BackoffPolicy;
  /** The handler said the job can never succeed: dead letter now, whatever budget is left. */
  giveUp?: boolean;
  /** Default "failed"; "stalled" or "timed_out" when the worker ended a handler at its limit. */
  outcome?: FailureOutcome;
}

const FAIL_JOBS = ending(
  "failJobs",
  `WITH ending AS (
  SELECT j.id, j.attempt, j.locked_by AS worker_id, j.started_at, f.error,
         retry_delay_ms(j.spent_attempts, f.base_ms, f.factor, f.max_ms, f.jitter) AS retry_delay_ms,
         true AS spend, f.give_up, f.outcome, j.cancel_requested_at IS NOT NULL AS cancelled,
         j.spent_attempts, j.max_attempts, j.heartbeat_at AS last_beat_at, false AS recovery
    FROM jobs AS j
    JOIN unnest($1::bigint[], $2::int[], $3::text[], $4::text[], $5::bool[], $6::float8[], $7::float8[], $8::float8[], $9::float8[])
         AS f(id, attempt, error, outcome, give_up, base_ms, factor, max_ms, jitter)
      ON j.id = f.id AND j.attempt = f.attempt
   WHERE j.id = ANY($1::bigint[]) AND j.locked_by = $10
     FOR UPDATE OF j
)`,
);

/** A handler's failures, fenced by (id, attempt, worker). Absent from the result: stale. */
export function failJobs(db: Queryable, p: { workerId: string; failures: Failure[] }): Promise<Ended> {
  if (p.failures.length === 0) return Promise.resolve(new Map());
  return endAttempts(db, FAIL_JOBS, [
    p.failures.map((f) => f.id),
    p.failures.map((f) => f.attempt),
    p.failures.map((f) => f.error),
    p.failures.map((f) => f.outcome ?? "failed"),
    p.failures.map((f) => f.giveUp ?? false),
    p.failures.map((f) => f.backoff.baseMs),
    p.failures.map((f) => f.backoff.factor),
    p.failures.map((f) => f.backoff.maxMs),
    p.failures.map((f) => f.backoff.jitter),
    p.workerId,
  ]);
}

const REAP_EXPIRED_LEASES = ending(
  "reapExpiredLeases",
  `WITH ending AS (
  SELECT j.id, j.attempt, j.locked_by AS worker_id, j.started_at, 'lease expired' AS error,
         ${POLICY_DELAY} AS retry_delay_ms,
         true AS spend, false AS give_up, 'lease_expired' AS outcome,
         j.cancel_requested_at IS NOT NULL AS cancelled, j.spent_attempts, j.max_attempts, j.heartbeat_at AS last_beat_at,
         true AS recovery
    FROM jobs AS j
    ${HOLDER_POLICY}
   WHERE j.state = 'running' AND j.lease_until < now()
   ORDER BY j.lease_until
   LIMIT $5
     FOR UPDATE OF j SKIP LOCKED
)`,
);

/**
 * The watchdog: every lease that ran out, in one set-based UPDATE over the partial lease
 * index, through the same retry-or-dead path as a failure (error "lease expired"). SKIP
 * LOCKED plus moving the rows out of `running` in the same statement means concurrent
 * reapers never reap a job twice, and a heartbeat in flight (holding the row) wins. The
 * backoff is the job's task policy (`backoff` when its task announced none).
 */
export function reapExpiredLeases(db: Queryable, p: { limit: number; backoff: BackoffPolicy }): Promise<Ended> {
  return endAttempts(db, REAP_EXPIRED_LEASES, [...policyValues(p.backoff), p.limit]);
}

const RECOVER_LOST_WORKERS = ending(
  "recoverLostWorkers",
  `WITH ending AS (
  SELECT j.id, j.attempt, j.locked_by AS worker_id, j.started_at,
         'worker lost: its process is gone (its database session ended)' AS error,
         CASE WHEN j.spent_attempts = 0 THEN 0 ELSE ${POLICY_DELAY} END AS retry_delay_ms,
         true AS spend, false AS give_up, 'worker_lost' AS outcome,
         j.cancel_requested_at IS NOT NULL AS cancelled, j.spent_attempts, j.max_attempts, j.heartbeat_at AS last_beat_at,
         true AS recovery
    FROM jobs AS j
    JOIN workers AS w ON w.id = j.locked_by
    ${HOLDER_POLICY}
   WHERE j.state = 'running' AND w.lost_at < now() - coalesce(w.liveness_grace_ms, $6::bigint) * interval '1 millisecond'
     -- Its lock is still free now: a session back within the grace (lock held again, its
     -- announcement not yet landed, or a liveness check not yet run) keeps its jobs.
     AND NOT EXISTS (SELECT 1 FROM pg_locks AS l
                      WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
                        AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                        AND ((l.classid::bigint << 32) | l.objid::bigint) = w.liveness_key)
   LIMIT $5
     FOR UPDATE OF j SKIP LOCKED
)`,
);

/**
 * Crash detection: the jobs of workers whose liveness lock has been gone longer than their
 * announced grace, else `graceMs` (see workers.ts), and is still free as this statement runs,
 * recovered at once instead of after their leases. A job's first
 * spent attempt, if it is a crash, retries at once: the common crash (a deploy's kill, an
 * OOM, a lost machine) is not the job's doing, and another worker can run it now. A job that
 * has failed or crashed before backs off by its task's policy, so a job that kills every
 * worker it runs on (a poison pill) is slowed down and ends dead after its budget.
 */
export function recoverLostWorkers(db: Queryable, p: { limit: number; graceMs: number; backoff: BackoffPolicy }): Promise<Ended> {
  return endAttempts(db, RECOVER_LOST_WORKERS, [...policyValues(p.backoff), p.limit, p.graceMs]);
}

const END_OVERDUE_ATTEMPTS = ending(
  "endOverdueAttempts",
  `WITH ending AS (
  SELECT j.id, j.attempt, j.locked_by AS worker_id, j.started_at,
         CASE WHEN d.timed_out THEN 'timed out: ran longer than ' || l.max_run_ms || ' ms (ended by the watchdog)'
              ELSE 'stalled: no progress for ' || l.progress_timeout_ms || ' ms (ended by the watchdog)' END AS error,
         ${POLICY_DELAY} AS retry_delay_ms,
         true AS spend, false AS give_up, CASE WHEN d.timed_out THEN 'timed_out' ELSE 'stalled' END AS outcome,
         j.cancel_requested_at IS NOT NULL AS cancelled, j.spent_attempts, j.max_attempts, j.heartbeat_at AS last_beat_at,
         true AS recovery
    FROM jobs AS j
    ${HOLDER_POLICY}
   CROSS JOIN LATERAL (
         -- the job's own limit (or its opt-out), else its holder's or its task's (HOLDER_POLICY)
         -- (null: the task opted out), else the default ($6) for a task no worker announced
         SELECT CASE WHEN j.max_run_unlimited THEN NULL
                     WHEN j.max_run_ms IS NOT NULL THEN j.max_run_ms
                     WHEN p.task IS NOT NULL THEN p.max_run_ms
                     ELSE $6::int END AS max_run_ms,
                coalesce(j.progress_timeout_ms, p.progress_timeout_ms) AS progress_timeout_ms,
                -- the worker ends an attempt at its limit; the database acts a whole lease
                -- later (progress reaches it only with the next beat)
                j.lease_until - j.heartbeat_at AS slack
         ) AS l
   CROSS JOIN LATERAL (
         SELECT j.started_at + l.max_run_ms * interval '1 millisecond' + l.slack < now() AS timed_out,
                j.progress_at + l.progress_timeout_ms * interval '1 millisecond' + l.slack < now() AS stalled
         ) AS d
   WHERE j.state = 'running' AND (d.timed_out OR d.stalled)
   LIMIT $5
     FOR UPDATE OF j SKIP LOCKED
)`,
);

/**
 * The database side of stall and run-time limits: attempts past their progress timeout or
 * maximum run time by more than a lease (their worker should have ended them and did not: a
 * wedged event loop, a worker without the limits) end as stalled or timed_out.
 * `defaultMaxRunMs`: the limit of a job whose task no worker announced (workers announce
 * every task's resolved limit, the default included, so they and the watchdog agree).
 */
export function endOverdueAttempts(db: Queryable, p: { limit: number; backoff: BackoffPolicy; defaultMaxRunMs: number }): Promise<Ended> {
  return endAttempts(db, END_OVERDUE_ATTEMPTS, [...policyValues(p.backoff), p.limit, p.defaultMaxRunMs]);
}

const RELEASE_JOBS = ending(
  "releaseJobs",
  `WITH ending AS (
  SELECT j.id, j.attempt, j.locked_by AS worker_id, j.started_at, $8::text AS error,
         CASE WHEN $7::bool THEN ${POLICY_DELAY} ELSE 0 END::bigint AS retry_delay_ms,
         $7::bool AS spend, false AS give_up, CASE WHEN $7::bool THEN 'worker_lost' ELSE 'released' END AS outcome,
         j.cancel_requested_at IS NOT NULL AS cancelled, j.spent_attempts, j.max_attempts, j.heartbeat_at AS last_beat_at,
         true AS recovery
    FROM jobs AS j
    JOIN unnest($5::bigint[], $6::int[]) AS r(id, attempt) ON j.id = r.id AND j.attempt = r.attempt
    ${HOLDER_POLICY}
   WHERE j.id = ANY($5::bigint[]) AND j.locked_by = $9
     FOR UPDATE OF j
)`,
);

/**
 * Gives attempts back, fenced. A live worker's graceful release (`spend: false`) is free and
 * runs the job again at once. A release on behalf of an attempt that died (a claim whose
 * answer never reached its client) spends the budget like a reaped lease (outcome
 * worker_lost, with the task's backoff).
 */
export function releaseJobs(
  db: Queryable,
  p: { workerId: string; jobs: AttemptRef[]; reason: string; spend?: boolean; backoff: BackoffPolicy },
): Promise<Ended> {
  if (p.jobs.length === 0) return Promise.resolve(new Map());
  return endAttempts(db, RELEASE_JOBS, [
    ...policyValues(p.backoff),
    p.jobs.map((j) => j.id),
    p.jobs.map((j) => j.attempt),
    p.spend ?? false,
    p.reason,
    p.workerId,
  ]);
}

const RATE_LIMIT_JOBS = ending(
  "rateLimitJobs",
  `WITH asked AS (
  SELECT j.id, j.attempt, j.queue, j.flow_key, r.delay_ms AS asked_ms, r.scope,
         least(r.delay_ms, coalesce(q.max_hold_ms, ${DEFAULT_MAX_HOLD_MS})) AS delay_ms
    FROM jobs AS j
    JOIN unnest($1::bigint[], $2::int[], $3::bigint[], $4::text[]) AS r(id, attempt, delay_ms, scope)
      ON j.id = r.id AND j.attempt = r.attempt
    LEFT JOIN queues AS q ON q.name = j.queue
   WHERE j.id = ANY($1::bigint[]) AND j.locked_by = $5 AND j.state = 'running'
), held AS (
  SELECT count(rate_limit_hold(a.queue, a.flow_key, a.scope = 'queue', a.delay_ms, a.id)) AS n
    FROM asked AS a WHERE a.scope <> 'job'
), ending AS (
  SELECT j.id, j.attempt, j.locked_by AS worker_id, j.started_at,
         'rate-limited: retry in ' || a.delay_ms || ' ms'
           || CASE WHEN a.asked_ms > a.delay_ms THEN ' (asked ' || a.asked_ms || ' ms: the queue''s longest hold)' ELSE '' END
           || coalesce(': ' || $6, '') AS error,
         a.delay_ms AS retry_delay_ms,
         false AS spend, false AS give_up, 'rate_limited' AS outcome,
         j.cancel_requested_at IS NOT NULL AS cancelled, j.spent_attempts, j.max_attempts, j.heartbeat_at AS last_beat_at,
         false AS recovery
    FROM jobs AS j
    JOIN asked AS a ON a.id = j.id
   CROSS JOIN held
     FOR UPDATE OF j
)`,
);

/** How a handler said it was rate-limited: its job waits `delayMs`; `scope` holds back its key or queue too. */
export interface RateLimited extends AttemptRef {
  delayMs: number;
  scope: "job" | "key" | "queue";
}

/**
 * Attempts whose handlers were rate-limited by what they called (an HTTP 429): each job goes
 * back to waiting for its delay without spending its retry budget, and its key starts nothing
 * for that long (rate_limit_hold(), migration 019). The delay is clamped to the queue's hold cap
 * for the job too, since a keyed job not yet due blocks its key's line. The whole queue is held
 * (scope "queue", or a keyless job) only where the queue allows it: whoever holds a worker
 * token must not be able to stop a queue. Fenced like a release.
 */
export function rateLimitJobs(db: Queryable, p: { workerId: string; jobs: RateLimited[]; message?: string }): Promise<Ended> {
  if (p.jobs.length === 0) return Promise.resolve(new Map());
  return endAttempts(db, RATE_LIMIT_JOBS, [
    p.jobs.map((j) => j.id),
    p.jobs.map((j) => j.attempt),
    p.jobs.map((j) => j.delayMs),
    p.jobs.map((j) => j.scope),
    p.workerId,
    p.message ?? null,
  ]);
}

const RECOVER_EARLIER_PROCESS = ending(
  "recoverJobsOfEarlierProcess",
  `WITH ending AS (
  SELECT j.id, j.attempt, j.locked_by AS worker_id, j.started_at,
         'worker lost: ' || $5 || ' restarted while it ran' AS error,
         ${POLICY_DELAY} AS retry_delay_ms,
         true AS spend, false AS give_up, 'worker_lost' AS outcome,
         j.cancel_requested_at IS NOT NULL AS cancelled, j.spent_attempts, j.max_attempts, j.heartbeat_at AS last_beat_at,
         true AS recovery
    FROM jobs AS j
    ${HOLDER_POLICY}
   WHERE j.state = 'running' AND split_part(j.locked_by, '/', 1) = $5 AND j.locked_by <> $6
     FOR UPDATE OF j SKIP LOCKED
)`,
);

/**
 * Start-up reconciliation: a worker with a stable name (say a pod name), holding that name,
 * recovers at once the jobs still held by an earlier process of the name: that process died
 * with them, so each attempt spends budget like a reaped lease (a job that OOM-kills its pod
 * still reaches the dead letter). Worker ids are "<name>/<host>-<pid>-<random>"; the name
 * never contains "/".
 */
export function recoverJobsOfEarlierProcess(
  db: Queryable,
  p: { workerName: string; currentWorkerId: string; backoff: BackoffPolicy },
): Promise<Ended> {
  return endAttempts(db, RECOVER_EARLIER_PROCESS, [...policyValues(p.backoff), p.workerName, p.currentWorkerId]);
}
