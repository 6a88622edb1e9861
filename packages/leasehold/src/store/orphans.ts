/**
 * States that should not exist, for the watchdog's orphan scan: found, counted, and repaired
 * where repairing is safe. Each kind is a label of `leasehold_orphaned_jobs`.
 */
import type { Queryable } from "./db.js";
import { run, statement } from "./sql.js";

/** Scanned at most this many waiting jobs deep: the count is then "at least". */
export const ORPHAN_SCAN_LIMIT = 100_000;

const WAITING_WITHOUT_WORKER = statement(
  "findJobsWithoutWorker",
  `
SELECT j.queue, j.task, count(*)::int AS jobs, min(j.run_at) AS oldest
  FROM (SELECT queue, task, run_at
          FROM jobs
         WHERE state = 'waiting' AND run_at < now() - $1::bigint * interval '1 millisecond'
         LIMIT ${ORPHAN_SCAN_LIMIT}) AS j
 WHERE NOT EXISTS (
         SELECT 1 FROM workers AS w
          WHERE w.kind = 'worker' AND w.stopped_at IS NULL AND w.lost_at IS NULL
            AND w.last_seen_at > now() - $2::bigint * interval '1 millisecond'
            AND j.task = ANY(w.tasks) AND j.queue = ANY(w.queues))
 GROUP BY j.queue, j.task
 ORDER BY jobs DESC`,
  { queue: "text", task: "text", jobs: "int4", oldest: "timestamptz" },
);

/**
 * Waiting jobs ready for longer than `waitingMs` whose (queue, task) no live worker has
 * announced: nobody will ever run them until one is deployed. Not repaired (nothing safe to
 * do); a worker seen within `aliveMs` counts as live.
 */
export async function findJobsWithoutWorker(
  db: Queryable,
  p: { waitingMs: number; aliveMs: number },
): Promise<{ queue: string; task: string; jobs: number; oldest: Date }[]> {
  return run(db, WAITING_WITHOUT_WORKER, [p.waitingMs, p.aliveMs]);
}

const MISSING_AUDIT = statement(
  "findMissingAudit",
  `
SELECT h.id, h.attempt, (SELECT count(*)::int FROM all_attempts AS a WHERE a.job_id = h.id) AS recorded
  FROM finished_jobs AS h
 WHERE h.finished_at > now() - $1::bigint * interval '1 millisecond'
   AND h.attempt > (SELECT count(*) FROM all_attempts AS a WHERE a.job_id = h.id)
 LIMIT 100`,
  { id: "int8", attempt: "int4", recorded: "int4" },
);

/**
 * Jobs finished within `withinMs` with fewer audit rows than attempts: every claim's attempt
 * should have one. Not repaired (an invented row would be a lie); counted and named.
 */
export async function findMissingAudit(db: Queryable, p: { withinMs: number }): Promise<{ id: string; attempt: number; recorded: number }[]> {
  return run(db, MISSING_AUDIT, [p.withinMs]);
}

const KILL_OVER_BUDGET = statement(
  "endOverBudgetJobs",
  `
WITH over AS (
  DELETE FROM jobs
   WHERE id IN (SELECT id FROM jobs WHERE state = 'waiting' AND spent_attempts >= max_attempts LIMIT 1000 FOR UPDATE SKIP LOCKED)
  RETURNING *
), dead_letter AS (
  INSERT INTO dead_jobs (id, queue, task, payload, priority, attempt, spent_attempts, max_attempts,
                         lease_ms, progress, checkpoint, last_error, unique_key, created_at, started_at,
                         fence, progress_timeout_ms, max_run_ms, max_run_unlimited)
  SELECT id, queue, task, payload, priority, attempt, spent_attempts, max_attempts,
         lease_ms, progress, checkpoint, coalesce(last_error, 'dead: its retry budget was already spent'), unique_key,
         created_at, started_at, fence, progress_timeout_ms, max_run_ms, max_run_unlimited
    FROM over
)
SELECT id FROM over`,
  { id: "int8" },
);

/**
 * Waiting jobs whose retry budget is already spent (every path that spends it decides
 * retry-or-dead in the same statement, so only a hand edit makes one): they would run again
 * past their budget. Repaired: moved to the dead letter, where a manual retry can revive them.
 */
export async function endOverBudgetJobs(db: Queryable): Promise<string[]> {
  return (await run(db, KILL_OVER_BUDGET)).map((r) => r.id);
}

const TOUCH_WORKER = statement(
  "touchWorker",
  `
WITH touched AS (UPDATE workers SET last_seen_at = now() WHERE id = $1)
SELECT count(*)::int AS watchdogs, count(*) FILTER (WHERE id < $1)::int AS rank
  FROM workers
 WHERE kind = 'watchdog' AND stopped_at IS NULL AND lost_at IS NULL
   AND last_seen_at > now() - $2::bigint * interval '1 millisecond'`,
  { watchdogs: "int4", rank: "int4" },
);

/**
 * A watchdog's sign of life (it holds no jobs, so it has no beat to carry it). Returns how
 * many watchdogs were seen within `withinMs` (this one included, at least from its last touch),
 * and this one's rank among them by id (0-based), which gives each its turns.
 */
export async function touchWorker(db: Queryable, workerId: string, withinMs = 60_000): Promise<{ watchdogs: number; rank: number }> {
  const [row] = await run(db, TOUCH_WORKER, [workerId, withinMs]);
  return { watchdogs: row!.watchdogs, rank: row!.rank };
}
