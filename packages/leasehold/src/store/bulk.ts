/**
 * Bulk retry and cancel: every job matching a filter, in one statement. An operator first
 * asks how many match (countMatching) and confirms that number; the statement then locks
 * what matches now and acts only if that is no more than was confirmed, so a confirmation
 * never covers jobs the operator was not told about. Retry reads the dead letter (dead_jobs)
 * and cancel the unfinished jobs (jobs): both small tables, never the history.
 */
import type { Queryable } from "./db.js";
import { CANCEL_TARGET, FINISHED_COLUMNS, REVIVE, filterSql, filterValues, type JobFilter } from "./admin.js";
import { run, statement } from "./sql.js";

export type BulkAction = "retry" | "cancel";

/** Retry takes dead jobs; cancel takes waiting, blocked, suspended and running ones. */
const SOURCE: Record<BulkAction, string> = { retry: "dead_jobs", cancel: "jobs" };
/** Unfinished jobs have no finish time: a filter on it matches none of them. */
const FINISHED_AT: Record<BulkAction, string> = { retry: "finished_at", cancel: "NULL" };

/** As many as a bulk action counts, locks and changes in one statement (~1 s at this size). */
export const MAX_BULK_JOBS = 10_000;

const COUNT = (action: BulkAction) =>
  statement(`countMatching (${action})`, `SELECT count(*)::int AS matched FROM ${SOURCE[action]} WHERE ${filterSql(1, FINISHED_AT[action])}`, {
    matched: "int4",
  });
const COUNT_MATCHING = { retry: COUNT("retry"), cancel: COUNT("cancel") };

/** How many jobs a bulk action on `filter` would take now. */
export async function countMatching(db: Queryable, action: BulkAction, filter: JobFilter): Promise<number> {
  const [row] = await run(db, COUNT_MATCHING[action], filterValues(filter));
  return row!.matched;
}

/**
 * `matched`: the jobs that match, locked, at most $7 + 1 of them; `decision.go`: act only if
 * they are no more than the operator confirmed ($8) and the cap ($7).
 */
const matching = (action: BulkAction, columns: string) => `
WITH matched AS (
  SELECT ${columns} FROM ${SOURCE[action]}
   WHERE ${filterSql(1, FINISHED_AT[action])}
   ORDER BY id
   LIMIT $7::int + 1
     FOR UPDATE
), decision AS (
  SELECT count(*)::int AS n, count(*) <= least($7::int, $8::int) AS go FROM matched
)`;

const RETRY_MATCHING = statement(
  "retryMatching",
  `${matching("retry", "id, unique_key")},
picked AS (
  -- A job whose unique key an unfinished job holds cannot be retried (its insert would
  -- conflict); of several matching dead jobs with one key, the newest is retried.
  SELECT DISTINCT ON (m.unique_key IS NULL, coalesce(m.unique_key, m.id::text)) m.id
    FROM matched AS m, decision
   WHERE decision.go AND (m.unique_key IS NULL OR NOT EXISTS (SELECT 1 FROM jobs AS j WHERE j.unique_key = m.unique_key))
   ORDER BY m.unique_key IS NULL, coalesce(m.unique_key, m.id::text), m.id DESC
), revived AS (
  DELETE FROM dead_jobs WHERE id IN (SELECT id FROM picked) RETURNING ${FINISHED_COLUMNS}
), ${REVIVE}
SELECT (SELECT n FROM decision) AS matched, (SELECT go FROM decision) AS applied, (SELECT count(*)::int FROM requeued) AS changed,
       0 AS requested`,
  { matched: "int4", applied: "bool", changed: "int4", requested: "int4" },
);

const CANCEL_MATCHING = statement(
  "cancelMatching",
  `${matching("cancel", "id, state")},
target AS (
  SELECT m.id, m.state FROM matched AS m, decision WHERE decision.go
), ${CANCEL_TARGET}
SELECT (SELECT n FROM decision) AS matched, (SELECT go FROM decision) AS applied, (SELECT count(*)::int FROM ended) AS changed,
       (SELECT count(*)::int FROM requested) AS requested`,
  { matched: "int4", applied: "bool", changed: "int4", requested: "int4" },
);

export interface BulkResult {
  /** Jobs matching the filter when the action ran (counted up to the cap + 1). */
  matched: number;
  /** False: more matched than was confirmed (or than the cap), and nothing changed. */
  applied: boolean;
  /** Retry: jobs back to waiting. Cancel: waiting jobs ended as cancelled. */
  changed: number;
  /** Cancel: running jobs whose cancel was requested (aborted at their next heartbeat). */
  requested: number;
}

/**
 * Retries (dead jobs back to waiting with a fresh budget) or cancels every job matching
 * `filter`, if no more than `confirmed` match now. A retry skips dead jobs whose unique key
 * an unfinished job holds: `matched - changed` of them.
 */
export async function actOnMatching(db: Queryable, action: BulkAction, filter: JobFilter, confirmed: number): Promise<BulkResult> {
  const st = action === "retry" ? RETRY_MATCHING : CANCEL_MATCHING;
  const [row] = await run(db, st, [...filterValues(filter), MAX_BULK_JOBS, confirmed]);
  return row!;
}
