import type { Queryable } from "./db.js";
import { run, statement } from "./sql.js";

/**
 * Deletes up to `limit` finished jobs older than the retention age (dead jobs are kept
 * longer, for operators to inspect and retry), with their audit rows, in one statement.
 * Bounded batches keep each transaction short. The BRIN index on finished_at finds them.
 */
const PRUNE_FINISHED_JOBS = statement(
  "pruneFinishedJobs",
  `
WITH old AS (
  SELECT id FROM job_history
   WHERE finished_at < now() - $1::bigint * interval '1 millisecond'
     AND (state <> 'dead' OR finished_at < now() - $2::bigint * interval '1 millisecond')
   LIMIT $3
), gone AS (
  DELETE FROM job_history AS h USING old WHERE h.id = old.id RETURNING h.id
), audit AS (
  DELETE FROM job_attempts AS a USING gone WHERE a.job_id = gone.id
)
SELECT count(*)::int AS deleted FROM gone`,
  { deleted: "int4" },
);

export async function pruneFinishedJobs(
  db: Queryable,
  p: { retainMs: number; retainDeadMs: number; limit: number },
): Promise<number> {
  const rows = await run(db, PRUNE_FINISHED_JOBS, [p.retainMs, p.retainDeadMs, p.limit]);
  return rows[0]!.deleted;
}
