/**
 * Which tasks have a handler: the tasks workers announced (workers.tasks, with the queues they
 * take) and the tasks any worker ever declared a policy for (task_policies). Enqueue checks a
 * job's task against these (src/jobs/known-tasks.ts); the live views and `doctor` list the
 * waiting jobs that no live worker can run.
 */
import type { Queryable } from "./db.js";
import { run, statement } from "./sql.js";
import { ORPHAN_SCAN_LIMIT } from "./orphans.js";

const KNOWN_TASKS = statement(
  "knownTasks",
  `
SELECT t.task, coalesce(array_agg(DISTINCT q.queue) FILTER (WHERE q.queue IS NOT NULL), '{}') AS queues
  FROM (SELECT unnest(tasks) AS task, queues FROM workers
         WHERE kind = 'worker' AND last_seen_at > now() - $1::bigint * interval '1 millisecond') AS t
       LEFT JOIN LATERAL unnest(t.queues) AS q(queue) ON true
 GROUP BY t.task
UNION ALL
SELECT p.task, '{}'::text[] FROM task_policies AS p
 WHERE NOT EXISTS (SELECT 1 FROM workers AS w
                    WHERE w.kind = 'worker' AND w.last_seen_at > now() - $1::bigint * interval '1 millisecond'
                      AND p.task = ANY(w.tasks))`,
  { task: "text", queues: "_text" },
);

/**
 * Tasks a handler is known for: announced by a worker seen within `recentMs` (live, stopped or
 * lost: a deploy stops workers for a moment), with the queues those workers take; or declared
 * by any worker ever (task_policies: a worker that runs once a week is still that task's
 * handler), with no queues known (`queues: []`).
 */
export async function knownTasks(db: Queryable, p: { recentMs: number }): Promise<{ task: string; queues: string[] }[]> {
  return run(db, KNOWN_TASKS, [p.recentMs]);
}

const WITHOUT_HANDLER = statement(
  "jobsWithoutHandler",
  `
SELECT j.queue, j.task,
       count(*) FILTER (WHERE j.run_at <= now())::int AS waiting,
       count(*) FILTER (WHERE j.run_at > now())::int AS scheduled,
       (extract(epoch FROM now() - min(j.run_at) FILTER (WHERE j.run_at <= now())) * 1000)::float8 AS oldest_waiting_ms
  FROM (SELECT queue, task, run_at FROM jobs WHERE state = 'waiting' LIMIT ${ORPHAN_SCAN_LIMIT}) AS j
 GROUP BY j.queue, j.task
HAVING NOT EXISTS (
         SELECT 1 FROM workers AS w
          WHERE w.kind = 'worker' AND w.stopped_at IS NULL AND w.lost_at IS NULL
            AND w.last_seen_at > now() - $1::bigint * interval '1 millisecond'
            AND j.task = ANY(w.tasks) AND j.queue = ANY(w.queues))
 ORDER BY count(*) DESC, j.queue, j.task
 LIMIT 100`,
  { queue: "text", task: "text", waiting: "int4", scheduled: "int4", oldest_waiting_ms: "float8?" },
);

export interface JobsWithoutHandler {
  queue: string;
  task: string;
  /** Ready to run now. */
  waiting: number;
  /** Due later (delayed, or backing off). */
  scheduled: number;
  /** How long the oldest ready one has waited; null when none is ready. */
  oldestWaitingMs: number | null;
}

/**
 * Waiting jobs (ready or due later) whose queue and task no live worker takes (not stopped,
 * not lost, seen within `aliveMs`): nothing will run them until such a worker starts. By
 * queue and task, the largest first, at most 100 pairs; scanned at most ORPHAN_SCAN_LIMIT
 * waiting jobs deep (the counts are then "at least").
 */
export async function jobsWithoutHandler(db: Queryable, p: { aliveMs: number }): Promise<JobsWithoutHandler[]> {
  const rows = await run(db, WITHOUT_HANDLER, [p.aliveMs]);
  return rows.map(({ oldest_waiting_ms, ...r }) => ({ ...r, oldestWaitingMs: oldest_waiting_ms }));
}
