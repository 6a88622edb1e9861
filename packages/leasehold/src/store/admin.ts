/** Operators' statements: read jobs and their attempts, cancel, retry, counts. */
import type { Queryable } from "./db.js";
import { run, statement, type RowOf } from "./sql.js";
import type { AttemptRecord, JobLink, JobRecord, JobState, ListedJob } from "../jobs/types.js";

/** Every column of a job record but its id and payload (lists may leave the payload out). */
const JOB_FIELDS = `queue, task, priority, state, attempt, spent_attempts, max_attempts,
       run_at, lease_until, locked_by, heartbeat_at, cancel_requested_at, progress, checkpoint,
       last_error, unique_key, flow_key, created_at, started_at, finished_at`;
const JOB_COLUMNS = `id, payload, ${JOB_FIELDS}, result`;

// One shape for unfinished and finished jobs: the columns the other table lacks are null
// (an unfinished job has no result yet; a dead one keeps none).
const ALL_JOBS = `(
  SELECT id, queue, task, payload, priority, state, attempt, spent_attempts, max_attempts,
         run_at, lease_until, locked_by, heartbeat_at, cancel_requested_at, progress, checkpoint,
         last_error, unique_key, flow_key, created_at, started_at, NULL::timestamptz AS finished_at, NULL::jsonb AS result
    FROM jobs
  UNION ALL
  SELECT id, queue, task, payload, priority, state, attempt, spent_attempts, max_attempts,
         NULL, NULL, NULL, NULL, NULL, progress, checkpoint,
         last_error, unique_key, NULL::text, created_at, started_at, finished_at, result
    FROM finished_jobs
) AS all_jobs`;

const JOB_ROW = {
  id: "int8",
  payload: "jsonb",
  queue: "text",
  task: "text",
  priority: "int2",
  state: "text",
  attempt: "int4",
  spent_attempts: "int4",
  max_attempts: "int4",
  run_at: "timestamptz?",
  lease_until: "timestamptz?",
  locked_by: "text?",
  heartbeat_at: "timestamptz?",
  cancel_requested_at: "timestamptz?",
  progress: "jsonb?",
  checkpoint: "jsonb?",
  last_error: "text?",
  unique_key: "text?",
  flow_key: "text?",
  created_at: "timestamptz",
  started_at: "timestamptz?",
  finished_at: "timestamptz?",
  result: "jsonb?",
} as const;
type JobRow = RowOf<typeof JOB_ROW>;

const GET_JOB = statement("getJob", `SELECT ${JOB_COLUMNS} FROM ${ALL_JOBS} WHERE id = $1`, JOB_ROW);

const GET_ATTEMPTS = statement(
  "getAttempts",
  `
SELECT job_id, attempt, worker_id, started_at, ended_at, outcome, error
  FROM all_attempts WHERE job_id = $1 ORDER BY attempt`,
  { job_id: "int8", attempt: "int4", worker_id: "text", started_at: "timestamptz", ended_at: "timestamptz", outcome: "text", error: "text?" },
);

function toRecord(r: JobRow): JobRecord {
  return {
    id: r.id,
    queue: r.queue,
    task: r.task,
    payload: r.payload,
    priority: r.priority,
    state: r.state as JobState,
    attempt: r.attempt,
    spentAttempts: r.spent_attempts,
    maxAttempts: r.max_attempts,
    runAt: r.run_at,
    leaseUntil: r.lease_until,
    lockedBy: r.locked_by,
    heartbeatAt: r.heartbeat_at,
    cancelRequestedAt: r.cancel_requested_at,
    progress: r.progress,
    checkpoint: r.checkpoint,
    lastError: r.last_error,
    uniqueKey: r.unique_key,
    key: r.flow_key,
    createdAt: r.created_at,
    startedAt: r.started_at,
    finishedAt: r.finished_at,
    result: r.result,
  };
}

export async function getJob(db: Queryable, id: string): Promise<JobRecord | undefined> {
  const rows = await run(db, GET_JOB, [id]);
  return rows[0] ? toRecord(rows[0]) : undefined;
}

/**
 * Whether an id was handed out by the jobs' id sequence: a job no table holds but whose id was
 * issued has finished and its record is not kept (or retention forgot it), rather than never
 * existed. The sequence's last value, not a scan. A role that may not read the sequence gets no
 * answer (null): "not found" then, as before.
 */
const JOB_ID_ISSUED = statement(
  "jobIdIssued",
  `SELECT $1::bigint <= coalesce(pg_sequence_last_value(pg_get_serial_sequence(quote_ident(current_schema()) || '.jobs', 'id')::regclass), 0)
          AS issued`,
  { issued: "bool" },
);

export async function jobIdIssued(db: Queryable, id: string): Promise<boolean | null> {
  try {
    return (await run(db, JOB_ID_ISSUED, [id]))[0]!.issued;
  } catch (err) {
    if ((err as { code?: string }).code === "42501") return null;
    throw err;
  }
}

export async function getAttempts(db: Queryable, jobId: string): Promise<AttemptRecord[]> {
  const rows = await run(db, GET_ATTEMPTS, [jobId]);
  return rows.map((r) => ({
    jobId: r.job_id,
    attempt: r.attempt,
    workerId: r.worker_id,
    startedAt: r.started_at,
    endedAt: r.ended_at,
    outcome: r.outcome as AttemptRecord["outcome"],
    error: r.error,
  }));
}

/** A job's parents or children listed at most this many each (a fan-out may have thousands). */
export const MAX_LISTED_RELATIONS = 1_000;

/**
 * A job's parents (the jobs it waits for or waited for) and children (the jobs waiting for
 * it), from job_dependencies, each with its state: "unknown" for a parent retention already
 * forgot (an edge is forgotten with its child, so a listed child always exists). `ref` is the
 * child's name for that parent (null for a parent named by id). Lowest ids first, at most
 * MAX_LISTED_RELATIONS of each, with the full counts.
 */
const GET_JOB_RELATIONS = statement(
  "getJobRelations",
  `
WITH edges AS (
  SELECT 'parent' AS side, d.parent_id AS id, d.ref FROM job_dependencies AS d WHERE d.child_id = $1
  UNION ALL
  SELECT 'child', d.child_id, d.ref FROM job_dependencies AS d WHERE d.parent_id = $1
), ranked AS (
  SELECT e.*, row_number() OVER (PARTITION BY e.side ORDER BY e.id) AS n, count(*) OVER (PARTITION BY e.side)::int AS total FROM edges AS e
)
SELECT r.side, r.id, r.ref, r.total, coalesce(j.task, f.task) AS task, coalesce(j.state, f.state, 'unknown') AS state
  FROM ranked AS r
  LEFT JOIN jobs AS j ON j.id = r.id
  LEFT JOIN LATERAL (SELECT x.task, x.state FROM finished_jobs AS x WHERE x.id = r.id AND j.id IS NULL LIMIT 1) AS f ON true
 WHERE r.n <= $2
 ORDER BY r.side DESC, r.id`,
  { side: "text", id: "int8", ref: "text?", total: "int4", task: "text?", state: "text" },
);

export interface JobRelations {
  parents: JobLink[];
  children: JobLink[];
  /** How many there are in all (the lists stop at MAX_LISTED_RELATIONS). */
  parentCount: number;
  childCount: number;
}

export async function getJobRelations(db: Queryable, id: string): Promise<JobRelations> {
  const rows = await run(db, GET_JOB_RELATIONS, [id, MAX_LISTED_RELATIONS]);
  const out: JobRelations = { parents: [], children: [], parentCount: 0, childCount: 0 };
  for (const r of rows) {
    const link: JobLink = { id: r.id, ref: r.ref, task: r.task, state: r.state as JobLink["state"] };
    if (r.side === "parent") {
      out.parents.push(link);
      out.parentCount = r.total;
    } else {
      out.children.push(link);
      out.childCount = r.total;
    }
  }
  return out;
}

/**
 * A waiter's mark: the job's end then sends a notification (migration 014). Only a row not
 * yet marked is written; a finished job is not in `jobs`, and the caller reads it next.
 */
const WATCH_JOB = statement("watchJob", `UPDATE jobs SET watched = true WHERE id = $1 AND NOT watched`, {});

export async function watchJob(db: Queryable, id: string): Promise<void> {
  await run(db, WATCH_JOB, [id]);
}

/** Which of these jobs have finished (or are gone): what waiters re-check after a lost notification. */
const UNFINISHED_OF = statement("unfinishedOf", `SELECT id FROM jobs WHERE id = ANY($1::bigint[])`, { id: "int8" });

export async function unfinishedOf(db: Queryable, ids: string[]): Promise<Set<string>> {
  if (ids.length === 0) return new Set();
  return new Set((await run(db, UNFINISHED_OF, [ids])).map((r) => r.id));
}

/** Which of a job's times `from` and `to` bound: when it was created, or when it finished. */
export type TimeField = "created" | "finished";

/** What a job list, a count or a bulk action selects; absent fields match everything. */
export interface JobFilter {
  state?: JobState;
  queue?: string;
  task?: string;
  /** At or after this moment (of `timeField`). */
  from?: Date;
  /** Before this moment. */
  to?: Date;
  /** Default "created"; "finished" matches finished jobs only. */
  timeField?: TimeField;
}

/**
 * The filter's conditions on a relation with the job columns; its values are $from.. in
 * filterValues' order. Unfinished jobs (table jobs) have no finished_at: pass "NULL".
 */
export function filterSql(from: number, finishedAt = "finished_at"): string {
  const $ = (i: number) => `$${from + i}`;
  const time = `(CASE WHEN ${$(5)}::text = 'finished' THEN ${finishedAt}::timestamptz ELSE created_at END)`;
  return `(${$(0)}::text IS NULL OR state = ${$(0)}) AND (${$(1)}::text IS NULL OR queue = ${$(1)}) AND (${$(2)}::text IS NULL OR task = ${$(2)})
   AND (${$(3)}::timestamptz IS NULL OR ${time} >= ${$(3)}) AND (${$(4)}::timestamptz IS NULL OR ${time} < ${$(4)})`;
}

export function filterValues(f: JobFilter): unknown[] {
  return [f.state ?? null, f.queue ?? null, f.task ?? null, f.from ?? null, f.to ?? null, f.timeField ?? "created"];
}

export interface ListJobsFilter extends JobFilter {
  limit: number;
  /** Only jobs with a smaller id: the last id of the previous page (a cursor). */
  before?: string;
  /** Read the payloads too; without, the column is null and records have none. */
  includePayload: boolean;
}

/**
 * Newest first. Filters are bound parameters; a null filter matches everything. Pages by
 * `id < before`: ids only grow, so a page never repeats a job. A payload left out is not
 * read from its TOAST storage.
 */
const LIST_JOBS = statement(
  "listJobs",
  `
SELECT id, CASE WHEN $3::boolean THEN payload END AS payload, ${JOB_FIELDS},
       CASE WHEN $3::boolean THEN result END AS result FROM ${ALL_JOBS}
 WHERE ${filterSql(4)}
   AND ($2::bigint IS NULL OR id < $2)
 ORDER BY id DESC
 LIMIT $1`,
  { ...JOB_ROW, payload: "jsonb?", result: "jsonb?" },
);

export async function listJobs(db: Queryable, f: ListJobsFilter): Promise<ListedJob[]> {
  const rows = await run(db, LIST_JOBS, [f.limit, f.before ?? null, f.includePayload, ...filterValues(f)]);
  return rows.map((r) => listed(r, f.includePayload));
}

function listed(r: RowOf<typeof LIST_JOBS.columns>, includePayload: boolean): ListedJob {
  const record: ListedJob = toRecord(r);
  if (!includePayload) {
    delete record.payload;
    delete record.result;
  }
  return record;
}

/**
 * A listed job's size in a capped page, in bytes: at least its JSON (jsonb's text has spaces
 * JSON.stringify leaves out; to_json escapes text as JSON does), and room for the fixed fields.
 */
const LISTED_BYTES = `(1024 + CASE WHEN $3::boolean THEN coalesce(octet_length(payload::text), 0) + coalesce(octet_length(result::text), 0) ELSE 0 END
       + coalesce(octet_length(progress::text), 0) + coalesce(octet_length(checkpoint::text), 0)
       + coalesce(octet_length(to_json(last_error)::text), 0) + coalesce(octet_length(to_json(unique_key)::text), 0)
       + octet_length(to_json(queue)::text) + octet_length(to_json(task)::text)
       + coalesce(octet_length(to_json(locked_by)::text), 0) + coalesce(octet_length(to_json(flow_key)::text), 0))::int8`;

/**
 * listJobs cut at a byte budget ($10) in its statement, for a server's page: a running sum of the
 * listed jobs' sizes, newest first; the first is kept whatever its size if $11. The large columns
 * of the jobs past the budget are never read out of the database; the first of them comes back
 * with its id only (`kept` false) to say that the page was cut there.
 */
const LIST_JOBS_CAPPED = statement(
  "listJobs (page capped)",
  `
WITH chunk AS (
  SELECT l.*, row_number() OVER w AS n, sum(l.bytes) OVER w <= $10 OR (row_number() OVER w = 1 AND $11::boolean) AS kept
    FROM (SELECT *, ${LISTED_BYTES} AS bytes FROM ${ALL_JOBS}
           WHERE ${filterSql(4)}
             AND ($2::bigint IS NULL OR id < $2)
           ORDER BY id DESC
           LIMIT $1) AS l
  WINDOW w AS (ORDER BY l.id DESC)
)
SELECT id, CASE WHEN kept AND $3::boolean THEN payload END AS payload, queue, task, priority, state, attempt, spent_attempts,
       max_attempts, run_at, lease_until, locked_by, heartbeat_at, cancel_requested_at, CASE WHEN kept THEN progress END AS progress,
       CASE WHEN kept THEN checkpoint END AS checkpoint, CASE WHEN kept THEN last_error END AS last_error, unique_key, flow_key,
       created_at, started_at, finished_at, CASE WHEN kept AND $3::boolean THEN result END AS result, kept, bytes
  FROM chunk
 WHERE n <= (SELECT count(*) FROM chunk WHERE kept) + 1
 ORDER BY id DESC`,
  { ...JOB_ROW, payload: "jsonb?", result: "jsonb?", kept: "bool", bytes: "int8" },
);

/**
 * One chunk of a list, within a byte budget (a server's page; the filter is checked at its edge):
 * the jobs kept, the bytes they count for, and whether the budget cut the chunk short.
 */
export async function listJobsWithin(
  db: Queryable,
  f: ListJobsFilter,
  budget: { maxBytes: number; atLeastOne: boolean },
): Promise<{ jobs: ListedJob[]; bytes: number; cut: boolean }> {
  const rows = await run(db, LIST_JOBS_CAPPED, [f.limit, f.before ?? null, f.includePayload, ...filterValues(f), budget.maxBytes, budget.atLeastOne]);
  const kept = rows.filter((r) => r.kept);
  return {
    jobs: kept.map((r) => listed(r, f.includePayload)),
    bytes: kept.reduce((sum, r) => sum + Number(r.bytes), 0),
    cut: kept.length < rows.length,
  };
}

/**
 * Cancel: a waiting, blocked or suspended (sleeping, waiting for an event) job ends at once (to history as cancelled; a blocked job's own
 * dependents are then settled by the triggers of migration 014); a running job is marked, its
 * handler is aborted at once (migration 014's trigger notifies the worker holding it), and its
 * late report ends it as cancelled.
 * This tail cancels the jobs of a CTE `target(id, state)` (locked by its caller); one job's
 * cancel, a bulk cancel and a duplicate enqueue's "cancel_running" share it (`n`: the tables
 * and function, schema-qualified for a caller's client).
 */
export const cancelTarget = (n = { jobs: "jobs", history: "job_history", generation: "history_generation" }) => `
ended AS (
  DELETE FROM ${n.jobs} AS j USING target AS t
   WHERE j.id = t.id AND t.state IN ('waiting', 'blocked', 'suspended')
  RETURNING j.*
), history AS (
  INSERT INTO ${n.history} (id, queue, task, payload, priority, state, attempt, spent_attempts, max_attempts,
                           lease_ms, progress, checkpoint, last_error, unique_key, created_at, started_at,
                           fence, progress_timeout_ms, max_run_ms, max_run_unlimited, generation)
  SELECT id, queue, task, payload, priority, 'cancelled', attempt, spent_attempts, max_attempts,
         lease_ms, progress, checkpoint, last_error, unique_key, created_at, started_at,
         fence, progress_timeout_ms, max_run_ms, max_run_unlimited, (SELECT ${n.generation}(now()))
    FROM ended
), requested AS (
  UPDATE ${n.jobs} AS j SET cancel_requested_at = coalesce(j.cancel_requested_at, now())
    FROM target AS t
   WHERE j.id = t.id AND t.state = 'running'
  RETURNING j.id
)`;
export const CANCEL_TARGET = cancelTarget();

const CANCEL_JOB = statement(
  "cancelJob",
  `
WITH target AS (
  SELECT id, state FROM jobs WHERE id = $1 FOR UPDATE
), ${CANCEL_TARGET}
SELECT 'cancelled' AS result FROM ended
UNION ALL
SELECT 'cancel_requested' FROM requested`,
  { result: "text" },
);

export type CancelResult = "cancelled" | "cancel_requested" | { finished: JobState } | "not_found";

export async function cancelJob(db: Queryable, id: string): Promise<CancelResult> {
  const rows = await run(db, CANCEL_JOB, [id]);
  if (rows[0]) return rows[0].result as "cancelled" | "cancel_requested";
  const job = await getJob(db, id);
  return job ? { finished: job.state } : "not_found";
}

/**
 * Manual retry of a dead (or cancelled) job: back to waiting with a fresh retry budget.
 * `attempt`, the fencing token, is kept: the next claim is attempt + 1, so a report from
 * any earlier attempt can never match it. The final attempt's audit fields leave with the
 * history row, so they become that attempt's job_attempts row. This tail revives the rows
 * of a CTE `revived` (taken out of dead_jobs or job_history; ids in the CTE `requeued`);
 * one job's retry and a bulk retry share it.
 *
 * Keeping `attempt` means the revived job waits in the same spell (id, attempt) it may have
 * waited in before: a doorbell row still owed from then (a delayed job cancelled before it
 * was due) would keep its old publish time, and the insert trigger's own row for the revived
 * job would yield to it, holding a job ready now back until then. Such a row is deleted here,
 * so the trigger owes the doorbell afresh (docs/nats.md).
 */
export const REVIVE = `
final_attempt AS (
  INSERT INTO job_attempts (job_id, attempt, worker_id, started_at, ended_at, outcome, error)
  SELECT id, attempt, worker_id, started_at, finished_at, outcome, last_error
    FROM revived
   WHERE outcome IS NOT NULL AND worker_id IS NOT NULL AND started_at IS NOT NULL
), requeued AS (
  INSERT INTO jobs (id, queue, task, payload, priority, run_at, state, attempt, spent_attempts, max_attempts,
                    lease_ms, progress, checkpoint, last_error, unique_key, created_at,
                    progress_timeout_ms, max_run_ms, max_run_unlimited, last_outcome)
  SELECT id, queue, task, payload, priority, now(), 'waiting', attempt, 0, max_attempts,
         lease_ms, progress, checkpoint, last_error, unique_key, created_at,
         progress_timeout_ms, max_run_ms, max_run_unlimited, outcome
    FROM revived
  RETURNING id
), stale_doorbells AS (
  DELETE FROM dispatch_outbox AS o USING revived AS r WHERE o.job_id = r.id AND o.attempt = r.attempt
)`;

/** Every column of a finished job, as a DELETE ... RETURNING of dead_jobs or job_history gives them to REVIVE. */
export const FINISHED_COLUMNS = `id, queue, task, payload, priority, state, attempt, spent_attempts, max_attempts, lease_ms, progress, checkpoint, last_error, unique_key, created_at, started_at, finished_at, worker_id, outcome, fence, progress_timeout_ms, max_run_ms, max_run_unlimited`;

const RETRY_JOB = statement(
  "retryJob",
  `
WITH dead AS (
  DELETE FROM dead_jobs WHERE id = $1 RETURNING ${FINISHED_COLUMNS}
), cancelled AS (
  DELETE FROM job_history WHERE id = $1 AND state = 'cancelled' RETURNING ${FINISHED_COLUMNS}
), revived AS (
  SELECT * FROM dead UNION ALL SELECT * FROM cancelled
), ${REVIVE}
SELECT id FROM requeued`,
  { id: "int8" },
);

export type RetryResult = "retried" | { notRetryable: JobState } | "not_found";

export async function retryJob(db: Queryable, id: string): Promise<RetryResult> {
  const rows = await run(db, RETRY_JOB, [id]);
  if (rows.length > 0) return "retried";
  const job = await getJob(db, id);
  return job ? { notRetryable: job.state } : "not_found";
}

const QUEUE_STATS = statement(
  "queueStats",
  `
SELECT queue, state, count(*)::int AS count FROM jobs GROUP BY queue, state
UNION ALL
SELECT queue, state, count(*)::int FROM job_history GROUP BY queue, state
UNION ALL
SELECT queue, state, count(*)::int FROM dead_jobs GROUP BY queue, state
ORDER BY queue, state`,
  { queue: "text", state: "text", count: "int4" },
);

const LEASE_STATS = statement(
  "queueStats (leases)",
  `
SELECT count(*) FILTER (WHERE state = 'running')::int AS active_leases,
       count(*) FILTER (WHERE state = 'running' AND lease_until < now())::int AS expired_leases,
       min(run_at) FILTER (WHERE state = 'waiting' AND run_at <= now()) AS oldest_ready_at,
       extract(epoch FROM now() - min(run_at) FILTER (WHERE state = 'waiting' AND run_at <= now()))::float8 AS oldest_ready_age_s,
       (SELECT count(*)::int FROM workers
         WHERE kind = 'watchdog' AND stopped_at IS NULL AND last_seen_at > now() - interval '1 minute') AS watchdogs,
       (SELECT count(*)::int FROM workers
         WHERE kind = 'worker' AND stopped_at IS NULL AND lost_at IS NULL AND last_seen_at > now() - interval '1 minute') AS workers
  FROM jobs`,
  {
    active_leases: "int4",
    expired_leases: "int4",
    oldest_ready_at: "timestamptz?",
    oldest_ready_age_s: "float8?",
    watchdogs: "int4",
    workers: "int4",
  },
);

export interface QueueStats {
  counts: { queue: string; state: JobState; count: number }[];
  activeLeases: number;
  expiredLeases: number;
  /** The oldest job ready to run and not yet claimed: how far behind the workers are. */
  oldestReadyAt: Date | null;
  oldestReadyAgeSeconds: number | null;
  /** Watchdogs and workers seen within the last minute (a watchdog refreshes its row every interval). */
  watchdogs: number;
  workers: number;
}

export async function queueStats(db: Queryable): Promise<QueueStats> {
  const [counts, leases] = await Promise.all([run(db, QUEUE_STATS), run(db, LEASE_STATS)]);
  const l = leases[0]!;
  return {
    counts: counts.map((c) => ({ ...c, state: c.state as JobState })),
    activeLeases: l.active_leases,
    expiredLeases: l.expired_leases,
    oldestReadyAt: l.oldest_ready_at,
    oldestReadyAgeSeconds: l.oldest_ready_age_s,
    watchdogs: l.watchdogs,
    workers: l.workers,
  };
}
