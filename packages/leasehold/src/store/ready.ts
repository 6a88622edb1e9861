import type { Queryable } from "./db.js";

/**
 * For the server's waiting long polls: which of these (queue, tasks) pairs has a job that a
 * claim would take now. One statement answers for every waiting claim of a server process,
 * instead of each claim re-running itself every second (a job whose run_at passes sends no
 * notification). Task lists are comma-joined: names cannot contain a comma.
 *
 * The LATERAL keeps the lookup per queue on the claim index (jobs_claim_idx), as the claim
 * does; as an EXISTS semi-join the planner scanned the index by run_at across all queues.
 */
const READY_PAIRS = `
SELECT w.i::int AS i
  FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS w(queue, tasks, i)
 CROSS JOIN LATERAL (
         SELECT 1 FROM jobs
          WHERE state = 'waiting' AND queue = w.queue AND run_at <= now()
            AND task = ANY(string_to_array(w.tasks, ','))
          LIMIT 1
       ) AS ready`;

export interface QueueTasks {
  queue: string;
  tasks: string[];
}

/** The indexes (0-based) of the pairs with a job ready to claim. */
export async function readyPairs(db: Queryable, pairs: QueueTasks[]): Promise<number[]> {
  if (pairs.length === 0) return [];
  const { rows } = await db.query<{ i: number }>(READY_PAIRS, [pairs.map((p) => p.queue), pairs.map((p) => p.tasks.join(","))]);
  return rows.map((r) => r.i - 1);
}
