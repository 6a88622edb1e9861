/**
 * A durable handler's children (ctx.children, docs/durable-children.md): child jobs, or a child
 * flow, started as a step and awaited with the job suspended.
 *
 * Starting is exactly once per job: the children, the step's record (state 'waiting', naming
 * them) and the suspension commit in one transaction on the worker's pool, under the attempt's
 * fence (its row locked first), so a replay finds the record and a zombie writes nothing. Each
 * child names the job awaiting it (jobs.awaited_by) and that job counts its children not yet
 * ended (jobs.children_pending); migration 029's triggers take an ended child off the count and
 * wake the suspended job at 0. The replay then reads the children's ends and records them as
 * the step's result.
 */
import { ValidationError } from "../errors.js";
import type { Queryable } from "./db.js";
import { insertFlow } from "./dependencies.js";
import { endAttempts, ending, type EndState } from "./end-attempts.js";
import { ATTEMPT_ENDING, NO_TIMEOUT_MS, type SuspendingStep } from "./steps.js";
import { run, statement } from "./sql.js";
import type { PreparedNode } from "../jobs/flow-graph.js";
import type { JsonValue } from "../jobs/types.js";

/** A child as the awaiting job reads it once it has ended. */
export interface ChildEndRecord {
  id: string;
  /** The node's ref in a child flow; null for a list's children. */
  ref: string | null;
  /** Null when retention has forgotten it. */
  task: string | null;
  state: "succeeded" | "dead" | "cancelled" | "unknown";
  result: JsonValue | null;
  /** Why it ended dead or cancelled; null when it succeeded. */
  error: string | null;
}

/** The attempt, fenced and locked until the transaction ends; its children not yet ended. */
const LOCK_ATTEMPT = statement(
  "children (lock attempt)",
  `SELECT coalesce(j.children_pending, 0) AS pending, j.cancel_requested_at IS NOT NULL AS cancelling FROM jobs AS j
    WHERE j.id = $1 AND j.attempt = $2 AND j.locked_by = $3 AND j.state = 'running'
      FOR UPDATE`,
  { pending: "int4", cancelling: "bool" },
);

/** The step's place, taken as waiting; nothing when another attempt recorded it first. */
const BEGIN_STEP = statement(
  "children (begin step)",
  `INSERT INTO job_steps (job_id, seq, name, occurrence, kind, state, attempt)
   VALUES ($1, $2, $3, $4, 'children', 'waiting', $5)
   ON CONFLICT (job_id, seq) DO NOTHING
   RETURNING job_id`,
  { job_id: "int8" },
);

/** The children name their awaiting job, which counts them, and the step names them (id and ref, in order). */
const AWAIT_CHILDREN = statement(
  "children (await)",
  `WITH marked AS (
  UPDATE jobs AS c SET awaited_by = $1 WHERE c.id = ANY($3::bigint[]) RETURNING c.id
), counted AS (
  UPDATE jobs AS j SET children_pending = coalesce(j.children_pending, 0) + (SELECT count(*) FROM marked)::int
   WHERE j.id = $1
  RETURNING j.id
)
UPDATE job_steps AS s
   SET result = jsonb_build_object('children',
                  (SELECT jsonb_agg(jsonb_build_object('id', c.id::text, 'ref', c.ref) ORDER BY c.n)
                     FROM unnest($3::bigint[], $4::text[]) WITH ORDINALITY AS c(id, ref, n)))
 WHERE s.job_id = $1 AND s.seq = $2 AND EXISTS (SELECT 1 FROM counted)
RETURNING s.job_id`,
  { job_id: "int8" },
);

/**
 * Suspends the job until its last child ends (the triggers wake it; the deadline is only a
 * safety net, and a wake before the children ended suspends the job again).
 */
const SUSPEND_FOR_CHILDREN = ending(
  "suspendForChildren",
  `WITH ending AS (
  ${ATTEMPT_ENDING},
         ${NO_TIMEOUT_MS}::float8 AS retry_delay_ms,
         jsonb_build_object('kind', 'children', 'step', $4::text, 'until', now() + ${NO_TIMEOUT_MS} * interval '1 millisecond') AS wait
    FROM jobs AS j
   WHERE j.id = $1 AND j.attempt = $2 AND j.locked_by = $3 AND j.state = 'running'
)`,
  "d.wait",
);

/** The children's ends, in the order started, recorded as the step's result. */
const RECORD_ENDS = statement(
  "children (record ends)",
  `WITH kids AS (
  SELECT c.value ->> 'id' AS id, c.value ->> 'ref' AS ref, c.n
    FROM job_steps AS s, jsonb_array_elements(s.result -> 'children') WITH ORDINALITY AS c(value, n)
   WHERE s.job_id = $1 AND s.seq = $2 AND s.state = 'waiting' AND s.kind = 'children'
), ends AS (
  SELECT coalesce(jsonb_agg(jsonb_build_object(
           'id', k.id, 'ref', k.ref, 'task', f.task, 'state', coalesce(f.state, 'unknown'),
           'result', f.result, 'error', CASE WHEN f.state IN ('dead', 'cancelled') THEN f.last_error END) ORDER BY k.n), '[]'::jsonb) AS v
    FROM kids AS k
    LEFT JOIN finished_jobs AS f ON f.id = k.id::bigint
)
UPDATE job_steps AS s
   SET state = 'succeeded', attempt = $3, result = (SELECT v FROM ends), recorded_at = now()
 WHERE s.job_id = $1 AND s.seq = $2 AND s.state = 'waiting' AND s.kind = 'children'
RETURNING s.result::text AS result_json`,
  { result_json: "text" },
);

/** A children step: the first time, the children to start (`flow`: a child flow, whose refs are kept); null on a replay. */
export interface ChildrenStep extends SuspendingStep {
  nodes: PreparedNode[] | null;
  flow: boolean;
}

/**
 * What a children step came to: the children's ends (all ended), or the job suspended until
 * they have (or found cancelled on the way), or "stale": the attempt no longer holds its job.
 */
export type ChildrenAnswer = { ends: ChildEndRecord[] } | { ended: EndState | undefined } | "stale";

/**
 * Starts the children (the first time the step is reached) or looks at them (a replay of a
 * waiting record, `nodes` null), in one transaction the caller began and commits.
 */
export async function startOrAwaitChildren(db: Queryable, p: ChildrenStep): Promise<ChildrenAnswer> {
  const [held] = await run(db, LOCK_ATTEMPT, [p.id, p.attempt, p.workerId]);
  if (!held) return "stale";
  let pending = held.pending;
  // A job being cancelled starts nothing: the suspension below ends it cancelled.
  if (p.nodes !== null && !held.cancelling) {
    // Taken already (another attempt of this job started them): look at those instead.
    const begun = await run(db, BEGIN_STEP, [p.id, p.seq, p.name, p.occurrence, p.attempt]);
    if (begun.length === 1) {
      const ids = await insertFlow(db, p.nodes);
      await run(db, AWAIT_CHILDREN, [p.id, p.seq, ids, p.flow ? p.nodes.map((n) => n.ref) : p.nodes.map(() => null)]);
      pending += ids.length;
    }
  }
  if (pending > 0 || held.cancelling) {
    const ended = await endAttempts(db, SUSPEND_FOR_CHILDREN, [p.id, p.attempt, p.workerId, p.name]);
    return { ended: ended.get(p.id) };
  }
  const [recorded] = await run(db, RECORD_ENDS, [p.id, p.seq, p.attempt]);
  // The attempt holds its job, so no other attempt recorded this place meanwhile: a record of
  // another kind is there (a changed handler; the replay's check names it).
  if (!recorded) throw new ValidationError(`job ${p.id}: step "${p.name}" (place ${p.seq}) has no waiting children record to complete`);
  return { ends: JSON.parse(recorded.result_json) as ChildEndRecord[] };
}
