import { quoteIdent, type Queryable } from "./db.js";
import { run, statement } from "./sql.js";

/**
 * Whether a succeeded row of `done` keeps its job_history record. Every queue does unless it
 * opted out (queues.keep_succeeded, migration 032); even then a job keeps it when someone needs
 * its result (dependents, a waiter, a durable parent awaiting it) or when retention forgets its
 * other rows with the record (its edges in a flow, earlier attempts' audit, durable steps):
 * without the record those rows would never be forgotten. The queue test comes first: the
 * opted-out queues are read once per statement (a hashed subplan, a hash probe per row), so a
 * queue that keeps its records pays nothing more; the job_steps probe runs only for jobs of an
 * opted-out queue.
 */
const keepsRecord = (s = "") => `(queue NOT IN (SELECT name FROM ${s}queues WHERE NOT keep_succeeded)
          OR has_dependents OR watched OR awaited_by IS NOT NULL OR parents_pending IS NOT NULL OR attempt > 1
          OR EXISTS (SELECT 1 FROM ${s}job_steps AS st WHERE st.job_id = done.id))`;

/**
 * What an ending statement carries from the deleted row to its record, and what tells
 * whether the record is kept (keepsRecord): not `j.*`, whose other columns
 * (leases, flow state, waits) the statement would copy for every job and never read.
 */
const RECORDED = `j.id, j.queue, j.task, j.payload, j.priority, j.attempt, j.spent_attempts, j.max_attempts, j.lease_ms,
            j.progress, j.checkpoint, j.last_error, j.unique_key, j.created_at, j.started_at, j.locked_by, j.fence,
            j.progress_timeout_ms, j.max_run_ms, j.max_run_unlimited, j.has_dependents, j.watched, j.awaited_by, j.parents_pending`;

/**
 * Success for a batch of attempts, fenced like a heartbeat by (id, attempt, worker).
 * In one statement the job leaves the hot table for job_history (the generation of this
 * moment: retention empties old generations whole), and its final attempt's audit fields
 * (worker, start, end, outcome) go with it in the same row: two row writes per finished
 * job. A job whose cancel was requested ends as cancelled: the handler's late success is
 * refused. Rows that match nothing are stale reports and change nothing.
 *
 * No join: the rows are found through the primary key (`id = ANY($1)`) and the attempt is
 * checked against "id:attempt" keys (a hashed `= ANY` under custom plans). Joined to
 * unnest($1, $2) instead, once statistics made `locked_by` look rare the planner rescanned
 * the unnest for every row: 500 x 500 comparisons, ~70-180 ms per 500-job batch instead of
 * ~5 ms; the bare-SQL ceiling of `npm run bench` went from ~11,500 to ~25,000 jobs/s.
 * Handlers' results come the same way, without a join: one jsonb object keyed by job id
 * ($4 -> id, a lookup per row), null when no job in the batch has one, so a plain
 * completion pays nothing. A cancel that won keeps no result: the success was refused.
 */
const COMPLETE_JOBS = statement(
  "completeJobs",
  `
WITH done AS (
  DELETE FROM jobs AS j
   WHERE j.id = ANY($1::bigint[])
     AND j.id::text || ':' || j.attempt = ANY($2::text[]) AND j.locked_by = $3
  RETURNING ${RECORDED},
            CASE WHEN j.cancel_requested_at IS NULL THEN 'succeeded' ELSE 'cancelled' END AS final_state
), history AS (
  INSERT INTO job_history (id, queue, task, payload, priority, state, attempt, spent_attempts, max_attempts,
                           lease_ms, progress, checkpoint, last_error, unique_key, created_at, started_at,
                           worker_id, outcome, fence, progress_timeout_ms, max_run_ms, max_run_unlimited, generation, result)
  SELECT id, queue, task, payload, priority, final_state, attempt, spent_attempts, max_attempts,
         lease_ms, progress, checkpoint, last_error, unique_key, created_at, started_at,
         locked_by, final_state, fence, progress_timeout_ms, max_run_ms, max_run_unlimited, (SELECT history_generation(now())),
         CASE WHEN final_state = 'succeeded' THEN $4::jsonb -> id::text END
    FROM done
   WHERE final_state <> 'succeeded' OR ${keepsRecord()}
)
SELECT id, final_state AS state FROM done`,
  { id: "int8", state: "text" },
);

export interface AttemptRef {
  id: string;
  attempt: number;
}

/** A success to report: the attempt, and its handler's result as JSON (validated) if it has one. */
export interface Completion extends AttemptRef {
  resultJson?: string;
}

/**
 * The batch's results as one JSON object keyed by job id, built from the JSON already made
 * (nothing is parsed or serialised again); null when none has a result.
 */
export function resultsObject(jobs: Completion[]): string | null {
  let parts: string[] | undefined;
  for (const j of jobs) if (j.resultJson !== undefined) (parts ??= []).push(`${JSON.stringify(j.id)}:${j.resultJson}`);
  return parts ? `{${parts.join(",")}}` : null;
}

/** Per job: "succeeded", "cancelled" (a cancel won), or absent from the map: stale. */
export async function completeJobs(db: Queryable, p: { workerId: string; jobs: Completion[] }): Promise<Map<string, "succeeded" | "cancelled">> {
  if (p.jobs.length === 0) return new Map();
  const rows = await run(db, COMPLETE_JOBS, [p.jobs.map((j) => j.id), p.jobs.map((j) => `${j.id}:${j.attempt}`), p.workerId, resultsObject(p.jobs)]);
  return new Map(rows.map((r) => [r.id, r.state as "succeeded" | "cancelled"]));
}

/**
 * Superseded attempts (docs/fencing.md): a handler's fenced write was refused because a newer
 * claim of another job already wrote the row, so this job has nothing left to do, and a
 * retry (with a newer fence) would overwrite the newer value. Like a completion: fenced by
 * (id, attempt, worker), the job leaves the hot table for job_history in one statement, its
 * retry budget untouched. It finishes as succeeded with its final attempt's outcome
 * `superseded` and `last_error` saying which write was refused: a state every reader knows,
 * and one that is neither retried, nor dead, nor counted against the job. A cancel requested
 * meanwhile wins, as over a success. A row that matches nothing is a stale report.
 */
const SUPERSEDE_JOBS = statement(
  "supersedeJobs",
  `
WITH done AS (
  DELETE FROM jobs AS j
   USING unnest($1::bigint[], $2::int[], $3::text[]) AS s(id, attempt, reason)
   WHERE j.id = ANY($1::bigint[]) AND j.id = s.id AND j.attempt = s.attempt AND j.locked_by = $4
  RETURNING j.*, s.reason,
            CASE WHEN j.cancel_requested_at IS NULL THEN 'superseded' ELSE 'cancelled' END AS final_outcome
), history AS (
  INSERT INTO job_history (id, queue, task, payload, priority, state, attempt, spent_attempts, max_attempts,
                           lease_ms, progress, checkpoint, last_error, unique_key, created_at, started_at,
                           worker_id, outcome, fence, progress_timeout_ms, max_run_ms, generation)
  SELECT id, queue, task, payload, priority, CASE WHEN final_outcome = 'superseded' THEN 'succeeded' ELSE 'cancelled' END,
         attempt, spent_attempts, max_attempts, lease_ms, progress, checkpoint, reason, unique_key, created_at, started_at,
         locked_by, final_outcome, fence, progress_timeout_ms, max_run_ms, (SELECT history_generation(now()))
    FROM done
)
SELECT id, final_outcome AS state FROM done`,
  { id: "int8", state: "text" },
);

export interface Supersession extends AttemptRef {
  /** Why: which write was refused (kept as the job's last_error and the attempt's error). */
  reason: string;
}

/** Per job: "superseded", "cancelled" (a cancel won), or absent from the map: stale. */
export async function supersedeJobs(db: Queryable, p: { workerId: string; jobs: Supersession[] }): Promise<Map<string, "superseded" | "cancelled">> {
  if (p.jobs.length === 0) return new Map();
  const rows = await run(db, SUPERSEDE_JOBS, [p.jobs.map((j) => j.id), p.jobs.map((j) => j.attempt), p.jobs.map((j) => j.reason), p.workerId]);
  return new Map(rows.map((r) => [r.id, r.state as "superseded" | "cancelled"]));
}

/**
 * The transaction-local setting that marks the transaction ctx.transaction began. Transaction
 * local (set_config's `true`), it is gone once that transaction ends, however it ended.
 */
export const TRANSACTION_MARKER = "leasehold.transaction";

/**
 * Success of one attempt inside the caller's transaction (`ctx.transaction`): the handler's
 * own writes and this statement commit together or not at all. Fenced like any completion,
 * and also refused when a cancel was requested: the caller then rolls everything back, so a
 * cancelled job leaves none of its writes. $4 is the attempt's result (JSON) or null. The
 * text names the schema, because the caller's connection runs with its own search_path
 * (where its tables are). $5 is the marker BEGIN_WITHIN set: nothing completes unless the
 * statement runs in that very transaction (`ours`), so a handler that ended it (a COMMIT, a
 * ROLLBACK) can never have the completion commit apart from its writes.
 */
const completeWithinText = (s: string) => `
WITH done AS (
  DELETE FROM ${s}jobs AS j
   WHERE j.id = $1 AND j.attempt = $2 AND j.locked_by = $3 AND j.state = 'running' AND j.cancel_requested_at IS NULL
     AND current_setting('${TRANSACTION_MARKER}', true) = $5::text
  RETURNING ${RECORDED}
), history AS (
  INSERT INTO ${s}job_history (id, queue, task, payload, priority, state, attempt, spent_attempts, max_attempts,
                               lease_ms, progress, checkpoint, last_error, unique_key, created_at, started_at,
                               worker_id, outcome, fence, progress_timeout_ms, max_run_ms, max_run_unlimited, generation, result)
  SELECT id, queue, task, payload, priority, 'succeeded', attempt, spent_attempts, max_attempts,
         lease_ms, progress, checkpoint, last_error, unique_key, created_at, started_at,
         locked_by, 'succeeded', fence, progress_timeout_ms, max_run_ms, max_run_unlimited, (SELECT ${s}history_generation(now())),
         $4::jsonb
    FROM done
   WHERE ${keepsRecord(s)}
)
SELECT (SELECT count(*) FROM done)::int AS completed,
       coalesce(current_setting('${TRANSACTION_MARKER}', true) = $5::text, false) AS ours`;

const COMPLETE_WITHIN = statement("completeWithin", completeWithinText(""), { completed: "int4", ours: "bool" });
const qualifiedCompleteWithin = new Map<string, typeof COMPLETE_WITHIN>();

/** BEGIN and the marker in one round trip (the simple protocol runs both); `marker` is a UUID. */
export function beginWithin(marker: string): string {
  if (!/^[0-9a-f-]{36}$/.test(marker)) throw new Error(`not a transaction marker: ${marker}`);
  return `BEGIN; SELECT set_config('${TRANSACTION_MARKER}', '${marker}', true)`;
}

/**
 * "completed" (pending the caller's commit); "stale": the attempt no longer holds its job, or
 * its job is being cancelled; "not_ours": the statement did not run in the transaction marked
 * with `marker` (the handler ended it), so nothing was done.
 */
export async function completeWithin(
  db: Queryable,
  schema: string,
  p: { workerId: string; job: Completion; marker: string },
): Promise<"completed" | "stale" | "not_ours"> {
  let st = qualifiedCompleteWithin.get(schema);
  if (!st) qualifiedCompleteWithin.set(schema, (st = { ...COMPLETE_WITHIN, text: completeWithinText(`${quoteIdent(schema)}.`) }));
  const [row] = await run(db, st, [p.job.id, p.job.attempt, p.workerId, p.job.resultJson ?? null, p.marker]);
  if (!row!.ours) return "not_ours";
  return row!.completed === 1 ? "completed" : "stale";
}
