import type { Queryable } from "./db.js";
import { run, statement, type RowOf } from "./sql.js";
import type { AttemptOutcome, ClaimedJob } from "../jobs/types.js";
import type { AttemptRef } from "./finish.js";

/**
 * The claim is the lease grant: one statement picks up to `limit` ready jobs, skipping
 * rows other claimers hold, and in the same UPDATE sets them running with a lease, a new
 * per-job fencing token (attempt + 1) and a new global one (fence, from a sequence).
 * A running job without a lease cannot exist.
 *
 * The UPDATE matches `id = ANY(ARRAY(...))`: joined to the CTE instead, the planner chose a
 * hash join over a sequential scan of the whole table (24 ms instead of ~3 ms for 500 jobs
 * out of 50,000). It returns only what a handler is given: each column is output by the
 * server and parsed by the client per job (leaving out priority, progress and created_at
 * took 10-15% off the bare claim + complete loop at 2,000 per batch). Only tasks the worker has handlers for are claimed: a job for a task being
 * rolled out waits for a worker that knows it instead of burning its retries.
 *
 * The attempt's start (`started_at`) is the database's clock read as the claim begins to run,
 * just after its snapshot and before it looks for jobs: `claimed_at`, read once, first (the
 * one-time filter in the ARRAY's subquery is evaluated before `next` is scanned). Not now():
 * that is when the transaction began, and a claim may see a job that became claimable after
 * it (a child released by its parent's success), so the audit trail showed a child starting
 * before its parent ended. Nor the clock at the first row written: that comes after the rows
 * are found and locked, and a claim whose snapshot preceded a pause could then show a start
 * after pauseQueue returned. The lease counts from now(), the earliest of these.
 */
const claimText = (next: string) => `
WITH claimed_at AS MATERIALIZED (SELECT clock_timestamp() AS at),
     next AS (${next}
)
UPDATE jobs
   SET state = 'running',
       attempt = attempt + 1,
       fence = nextval('fence_seq'),
       locked_by = $3,
       lease_until = now() + coalesce(lease_ms, $4) * interval '1 millisecond',
       heartbeat_at = now(),
       started_at = (SELECT at FROM claimed_at),
       progress_at = now()
 WHERE id = ANY(ARRAY(SELECT id FROM next WHERE (SELECT at FROM claimed_at) IS NOT NULL))
   AND state = 'waiting'
RETURNING id, queue, task, payload, attempt, fence, spent_attempts, max_attempts,
          coalesce(lease_ms, $4) AS lease_ms, checkpoint, last_outcome, last_error, progress_timeout_ms, max_run_ms,
          max_run_unlimited, headers, flow_key`;

const CLAIMED = {
  id: "int8",
  queue: "text",
  task: "text",
  payload: "jsonb",
  attempt: "int4",
  fence: "int8",
  spent_attempts: "int4",
  max_attempts: "int4",
  lease_ms: "int4",
  checkpoint: "jsonb?",
  last_outcome: "text?",
  last_error: "text?",
  progress_timeout_ms: "int4?",
  max_run_ms: "int4?",
  max_run_unlimited: "bool",
  headers: "jsonb?",
  flow_key: "text?",
} as const;

/**
 * A queue under flow control (paused, limited, keyed, or held back by a handler) is claimed
 * only through claim_flow(); the plain claims refuse it in the same statement, so a worker that
 * has not yet heard of a new setting claims nothing there rather than past the limit.
 */
const PLAIN = (queue: string) => `NOT EXISTS (SELECT 1 FROM queues AS fq WHERE fq.name = ${queue} AND (fq.flow OR fq.held_until > now()))`;

/**
 * A claimed job's size in a capped answer (the server's claim route), in bytes: at least its JSON
 * there. Its variable columns as PostgreSQL writes them (jsonb's text has spaces JSON.stringify
 * leaves out; to_json escapes text as JSON does), and room for the fixed ones and the receipt.
 * Not pg_column_size: that is the stored size, and a compressed payload is far smaller stored.
 */
const ANSWER_BYTES = (t: string) =>
  `(1024 + octet_length(${t}payload::text) + coalesce(octet_length(${t}checkpoint::text), 0) + coalesce(octet_length(${t}headers::text), 0)
     + octet_length(to_json(${t}queue)::text) + octet_length(to_json(${t}task)::text)
     + coalesce(octet_length(to_json(${t}last_error)::text), 0) + coalesce(octet_length(to_json(${t}flow_key)::text), 0))::int8`;

/**
 * A capped claim's candidates, cut at the answer's byte budget ($6) in claim order: a running sum
 * of their sizes, so the payloads past the budget never leave the database. The first is kept
 * even when it alone is larger, if $7 (nothing else is in the answer yet). The candidates past
 * the budget were locked for this statement only: they are not claimed and get no lease.
 */
const withinBudget = (candidates: string) => `
  SELECT id FROM (
    SELECT c.id, sum(c.bytes) OVER w AS bytes_so_far, row_number() OVER w AS n
      FROM (${candidates}) AS c
    WINDOW w AS (ORDER BY c.priority, c.run_at, c.id)
  ) AS sized
   WHERE bytes_so_far <= $6 OR (n = 1 AND $7::bool)`;

const fromQueue = (sized: boolean) => `
  SELECT id${sized ? `, priority, run_at, ${ANSWER_BYTES("")} AS bytes` : ""}
    FROM jobs
   WHERE state = 'waiting' AND queue = ($1::text[])[1] AND run_at <= now() AND task = ANY($5::text[])
     AND ${PLAIN("($1::text[])[1]")}
   ORDER BY priority, run_at, id
   LIMIT $2
     FOR UPDATE SKIP LOCKED`;

/** One queue (the common case): a plain walk of its partial index in claim order. */
const CLAIM_FROM_QUEUE = statement("claimJobs (one queue)", claimText(fromQueue(false)), CLAIMED);
const CLAIM_FROM_QUEUE_CAPPED = statement("claimJobs (one queue, answer capped)", claimText(withinBudget(fromQueue(true))), CLAIMED);

/**
 * Several queues: the LATERAL reads each queue's partial index in (priority, run_at, id)
 * order, so they merge in index order without sorting the queues' whole backlogs.
 */
const fromQueues = (sized: boolean) => `
  SELECT candidate.id${sized ? ", candidate.priority, candidate.run_at, candidate.bytes" : ""}
    FROM unnest($1::text[]) AS q(name)
   CROSS JOIN LATERAL (
         SELECT id, priority, run_at${sized ? `, ${ANSWER_BYTES("")} AS bytes` : ""}
           FROM jobs
          WHERE state = 'waiting' AND queue = q.name AND run_at <= now() AND task = ANY($5::text[])
            AND ${PLAIN("q.name")}
          ORDER BY priority, run_at, id
          LIMIT $2
            FOR UPDATE SKIP LOCKED
         ) AS candidate
   ORDER BY candidate.priority, candidate.run_at, candidate.id
   LIMIT $2`;

const CLAIM_FROM_QUEUES = statement("claimJobs (several queues)", claimText(fromQueues(false)), CLAIMED);
const CLAIM_FROM_QUEUES_CAPPED = statement("claimJobs (several queues, answer capped)", claimText(withinBudget(fromQueues(true))), CLAIMED);

/**
 * Claim named waiting spells of jobs (dispatch that learned of them elsewhere: a NATS message
 * per job, docs/nats.md): the same lease grant, for those of the (id, attempt) pairs whose job
 * still waits with that attempt and is due. A job already claimed, finished, cancelled, not
 * yet due, or waiting again after a later attempt matches nothing, so a duplicate or stale
 * message claims nothing. The attempt is checked against "id:attempt" keys, as completions do.
 * The message names a job, nothing more: the job must also be of a queue and task the caller
 * serves, or a message published by anyone could run a job on a worker not meant to run it.
 */
const CLAIM_BY_ID = statement(
  "claimJobsById",
  claimText(`
  SELECT id
    FROM jobs
   WHERE id = ANY($1::bigint[]) AND id::text || ':' || attempt = ANY($6::text[])
     AND state = 'waiting' AND run_at <= now() AND task = ANY($5::text[]) AND queue = ANY($7::text[])
     AND ${PLAIN("jobs.queue")}
   ORDER BY id
   LIMIT $2
     FOR UPDATE SKIP LOCKED`),
  CLAIMED,
);

export interface ClaimParams {
  /** Queues claimed the plain way (the statement refuses any under flow control). */
  queues: string[];
  /** Queues under flow control, as far as the caller knows: each claimed through claim_flow(). */
  flowQueues?: string[];
  limit: number;
  workerId: string;
  /** Lease for jobs that did not set their own. */
  leaseMs: number;
  /** Task names this worker can run. */
  tasks: string[];
  /**
   * The answer's byte budget (a server's claim route; undefined on a database connection): the
   * claim stops at it in SQL, always taking at least one job (ANSWER_BYTES says what counts).
   */
  maxBytes?: number;
}

/**
 * What a claim found. `retryInMs`: a flow limit (not the backlog) held the claim back; asking
 * again sooner finds nothing. `paused`: queues that were paused when claimed. `overBudget`:
 * attempts a flow claim leased past `maxBytes`, read without their payloads: the caller gives
 * them back.
 */
export type ClaimedJobs = ClaimedJob[] & { retryInMs?: number; paused?: string[]; overBudget?: AttemptRef[] };

const CLAIM_FLOW = statement(
  "claimFlow",
  `SELECT id, queue, task, payload, attempt, fence, spent_attempts, max_attempts, lease_ms, checkpoint, last_outcome,
          last_error, progress_timeout_ms, max_run_ms, max_run_unlimited, headers, flow_key, retry_ms
     FROM claim_flow($1, $2, $3, $4, $5::text[])`,
  {
    ...CLAIMED,
    id: "int8?",
    task: "text?",
    payload: "jsonb?",
    attempt: "int4?",
    fence: "int8?",
    spent_attempts: "int4?",
    max_attempts: "int4?",
    lease_ms: "int4?",
    max_run_unlimited: "bool?",
    retry_ms: "int4?",
  },
);

/**
 * claim_flow() under a byte budget ($6, with $7 as in withinBudget): the function chooses and
 * leases the jobs inside its queue's limits (the limits stay in one place), and this statement
 * keeps the payloads of those past the budget in the database: they come back as (id, attempt)
 * only, `kept` false, to be released. `bytes`: each kept job's share of the budget.
 */
const CLAIM_FLOW_CAPPED = statement(
  "claimFlow (answer capped)",
  `SELECT id, queue, task, CASE WHEN kept THEN payload END AS payload, attempt, fence, spent_attempts, max_attempts, lease_ms,
          CASE WHEN kept THEN checkpoint END AS checkpoint, last_outcome, CASE WHEN kept THEN last_error END AS last_error,
          progress_timeout_ms, max_run_ms, max_run_unlimited, CASE WHEN kept THEN headers END AS headers, flow_key, retry_ms, kept, bytes
     FROM (SELECT c.*, c.id IS NOT NULL AND (sum(c.bytes) OVER w <= $6 OR (row_number() OVER w = 1 AND $7::bool)) AS kept
             FROM (SELECT f.*, ${ANSWER_BYTES("f.")} AS bytes
                     FROM claim_flow($1, $2, $3, $4, $5::text[]) WITH ORDINALITY AS f) AS c
           WINDOW w AS (ORDER BY c.ordinality)) AS sized
    ORDER BY ordinality`,
  { ...CLAIM_FLOW.columns, kept: "bool", bytes: "int8?" },
);

/**
 * Each flow queue is claimed on its own (its claims are serialised on its own row), with at most
 * an even share of the limit, before the plain queues take the rest: a plain queue's backlog
 * never starves a limited queue of the same worker.
 */
export async function claimJobs(db: Queryable, p: ClaimParams): Promise<ClaimedJobs> {
  if (p.limit <= 0) return [];
  const flow = new Set(p.flowQueues ?? []);
  const plain = p.queues.filter((q) => !flow.has(q));
  // In the order given: the worker rotates it, so that when it has room for fewer jobs than it
  // has flow queues, the first ones do not take every claim.
  const wanted = new Set(p.queues);
  const flowQueues = (p.flowQueues ?? []).filter((q) => wanted.has(q));
  const share = Math.max(1, Math.ceil(p.limit / (flowQueues.length + (plain.length > 0 ? 1 : 0))));
  const claimed: ClaimedJobs = [];
  // Bytes left of the answer's budget; the first job is taken whatever its size.
  let budget = p.maxBytes ?? Infinity;
  const spent = () => claimed.length > 0 && budget <= 0;
  for (const queue of flowQueues) {
    if (claimed.length >= p.limit || spent()) break;
    const args = [queue, Math.min(share, p.limit - claimed.length), p.workerId, p.leaseMs, p.tasks];
    const rows =
      p.maxBytes === undefined ? await run(db, CLAIM_FLOW, args) : await run(db, CLAIM_FLOW_CAPPED, [...args, budget, claimed.length === 0]);
    // A job row has every column; only the hint row (id null) has nulls where CLAIMED has none.
    const kept = rows.filter((r) => r.id !== null && (!("kept" in r) || r.kept));
    claimed.push(...toClaimed(kept as RowOf<typeof CLAIMED>[]));
    for (const r of kept) if ("bytes" in r) budget -= Number(r.bytes);
    for (const r of rows) {
      if ("kept" in r && r.id !== null && !r.kept) (claimed.overBudget ??= []).push({ id: r.id, attempt: r.attempt! });
      if (r.id !== null) continue;
      if (r.retry_ms === null) {
        (claimed.paused ??= []).push(queue);
      } else {
        claimed.retryInMs = Math.min(claimed.retryInMs ?? Infinity, r.retry_ms);
      }
    }
  }
  if (plain.length > 0 && claimed.length < p.limit && !spent()) {
    const args = [plain, p.limit - claimed.length, p.workerId, p.leaseMs, p.tasks];
    if (p.maxBytes === undefined) {
      claimed.push(...toClaimed(await run(db, plain.length === 1 ? CLAIM_FROM_QUEUE : CLAIM_FROM_QUEUES, args)));
    } else {
      const st = plain.length === 1 ? CLAIM_FROM_QUEUE_CAPPED : CLAIM_FROM_QUEUES_CAPPED;
      claimed.push(...toClaimed(await run(db, st, [...args, budget, claimed.length === 0])));
    }
  }
  return claimed;
}

/** `queues` and `tasks`: only jobs of these are claimed, whatever spells are named. */
export async function claimJobsById(db: Queryable, p: Omit<ClaimParams, "limit" | "flowQueues"> & { spells: AttemptRef[] }): Promise<ClaimedJob[]> {
  if (p.spells.length === 0) return [];
  return toClaimed(
    await run(db, CLAIM_BY_ID, [
      p.spells.map((s) => s.id),
      p.spells.length,
      p.workerId,
      p.leaseMs,
      p.tasks,
      p.spells.map((s) => `${s.id}:${s.attempt}`),
      p.queues,
    ]),
  );
}

function toClaimed(rows: RowOf<typeof CLAIMED>[]): ClaimedJob[] {
  return rows.map((r) => ({
    id: r.id,
    queue: r.queue,
    task: r.task,
    payload: r.payload,
    attempt: r.attempt,
    fence: r.fence,
    spentAttempts: r.spent_attempts,
    maxAttempts: r.max_attempts,
    leaseMs: r.lease_ms,
    checkpoint: r.checkpoint,
    previousOutcome: r.last_outcome as AttemptOutcome | null,
    lastError: r.last_error,
    progressTimeoutMs: r.progress_timeout_ms,
    maxRunMs: r.max_run_ms,
    maxRunUnlimited: r.max_run_unlimited,
    headers: r.headers as ClaimedJob["headers"],
    key: r.flow_key,
  }));
}
