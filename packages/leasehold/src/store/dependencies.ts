/**
 * Dependencies between jobs (docs/flows.md): a graph of new jobs written in one transaction
 * with a few set-based statements, whatever its size, and what a dependent job reads of its
 * parents. Releasing and cancelling dependents is the database's own work (the triggers of
 * migration 014): nothing here runs when a parent ends.
 *
 * Every statement is built for a table prefix, so that a flow can be enqueued on a caller's
 * own client, whose search_path need not include Leasehold's schema.
 */
import { quoteIdent, type Queryable } from "./db.js";
import { markKeyedQueues } from "./enqueue.js";
import { JOB_COLUMN_LIST, JOB_UNNEST_ARGS, JOB_UNNEST_NAMES, JOB_VALUES, jobArrays } from "./job-rows.js";
import { run, statement, type Statement } from "./sql.js";
import { ValidationError } from "../errors.js";
import type { PreparedNode } from "../jobs/flow-graph.js";
import type { JsonValue } from "../jobs/types.js";

/**
 * The existing jobs a graph names as parents, locked (in id order, as the triggers lock
 * children) until the graph commits: none can end before its new dependents and their edges
 * are in place, so none ends without settling them. Those not yet marked get has_dependents.
 * A parent missing here has finished (or never was): the graph is refused.
 */
const lockParentsText = (s: string) => `
WITH locked AS (
  SELECT id, has_dependents FROM ${s}jobs WHERE id = ANY($1::bigint[]) ORDER BY id FOR UPDATE
), marked AS (
  UPDATE ${s}jobs AS j SET has_dependents = true FROM locked AS l WHERE j.id = l.id AND NOT l.has_dependents
)
SELECT id FROM locked`;

/** How the parents that are not unfinished ended, to say so in the error. */
const finishedText = (s: string) => `
SELECT id, state FROM ${s}finished_jobs WHERE id = ANY($1::bigint[])`;

/**
 * The whole graph's jobs in one INSERT: roots 'waiting' (the insert trigger wakes workers for
 * them as for any enqueue), the others 'blocked' with the count of their parents.
 */
const insertJobsText = (s: string) => `
INSERT INTO ${s}jobs (${JOB_COLUMN_LIST}, state, parents_pending, on_parent_failure, has_dependents)
SELECT ${JOB_VALUES},
       CASE WHEN parents > 0 THEN 'blocked' ELSE 'waiting' END,
       nullif(parents, 0), CASE WHEN parents > 0 THEN on_parent_failure END, has_dependents
  FROM unnest(${JOB_UNNEST_ARGS}, $15::int[], $16::text[], $17::bool[]) WITH ORDINALITY
       AS j(${JOB_UNNEST_NAMES}, parents, on_parent_failure, has_dependents, n)
 ORDER BY n
RETURNING id`;

const insertEdgesText = (s: string) => `
INSERT INTO ${s}job_dependencies (child_id, parent_id, ref)
SELECT * FROM unnest($1::int8[], $2::int8[], $3::text[])`;

const LOCK_PARENTS = statement("enqueueFlow (lock parents)", lockParentsText(""), { id: "int8" });
const FINISHED_PARENTS = statement("enqueueFlow (finished parents)", finishedText(""), { id: "int8", state: "text" });
const INSERT_FLOW_JOBS = statement("enqueueFlow (jobs)", insertJobsText(""), { id: "int8" });
const INSERT_EDGES = statement("enqueueFlow (edges)", insertEdgesText(""), {});

interface FlowStatements {
  lockParents: typeof LOCK_PARENTS;
  finishedParents: typeof FINISHED_PARENTS;
  insertJobs: typeof INSERT_FLOW_JOBS;
  insertEdges: typeof INSERT_EDGES;
}

const UNQUALIFIED: FlowStatements = {
  lockParents: LOCK_PARENTS,
  finishedParents: FINISHED_PARENTS,
  insertJobs: INSERT_FLOW_JOBS,
  insertEdges: INSERT_EDGES,
};
const qualified = new Map<string, FlowStatements>();

function statementsFor(schema: string | undefined): FlowStatements {
  if (schema === undefined) return UNQUALIFIED;
  let s = qualified.get(schema);
  if (!s) {
    const p = `${quoteIdent(schema)}.`;
    const as = <C extends Statement>(st: C, text: string): C => ({ ...st, text });
    s = {
      lockParents: as(LOCK_PARENTS, lockParentsText(p)),
      finishedParents: as(FINISHED_PARENTS, finishedText(p)),
      insertJobs: as(INSERT_FLOW_JOBS, insertJobsText(p)),
      insertEdges: as(INSERT_EDGES, insertEdgesText(p)),
    };
    qualified.set(schema, s);
  }
  return s;
}

/**
 * Writes a checked graph; returns the new jobs' ids in node order. Must run inside a
 * transaction (the caller's, or one of its own): its statements stand or fall together, and
 * the parents' locks must hold until the commit. `schema`: qualify the tables (a caller's
 * client); leave it out on Leasehold's own connections.
 */
export async function insertFlow(db: Queryable, nodes: PreparedNode[], schema?: string): Promise<string[]> {
  if (nodes.length === 0) return [];
  const st = statementsFor(schema);

  const existing = [...new Set(nodes.flatMap((n) => n.parentIds))];
  if (existing.length > 0) {
    const locked = new Set((await run(db, st.lockParents, [existing])).map((r) => r.id));
    const gone = existing.filter((id) => !locked.has(id));
    if (gone.length > 0) {
      const finished = new Map((await run(db, st.finishedParents, [gone])).map((r) => [r.id, r.state]));
      const id = gone[0]!;
      const node = nodes.find((n) => n.parentIds.includes(id))!;
      const state = finished.get(id);
      throw new ValidationError(
        state === undefined
          ? `node ${JSON.stringify(node.ref)}: dependsOn names no job ${id} (no such job, or forgotten by retention)`
          : `node ${JSON.stringify(node.ref)}: dependsOn names job ${id}, which has already ended (${state}); a parent must be an unfinished job`,
      );
    }
  }

  const jobs = nodes.map((n) => n.job);
  await markKeyedQueues(db, jobs, schema);
  // RETURNING gives the rows in the order inserted: the SELECT's, input order (ORDER BY n).
  const ids = (
    await run(db, st.insertJobs, [
      // A flow's jobs never have a unique key (refused at the edge): $8 is all nulls.
      ...jobArrays(jobs),
      nodes.map((n) => n.parents.length + n.parentIds.length),
      nodes.map((n) => n.onParentFailure),
      nodes.map((n) => n.hasDependents),
    ])
  ).map((r) => r.id);

  const child: string[] = [];
  const parent: string[] = [];
  const ref: (string | null)[] = [];
  nodes.forEach((n, i) => {
    for (const p of n.parents) {
      child.push(ids[i]!);
      parent.push(ids[p]!);
      ref.push(nodes[p]!.ref);
    }
    for (const id of n.parentIds) {
      child.push(ids[i]!);
      parent.push(id);
      ref.push(null);
    }
  });
  if (child.length > 0) await run(db, st.insertEdges, [child, parent, ref]);
  return ids;
}

/** A parent as its dependent reads it (ctx.parents). */
export interface ParentRecord {
  id: string;
  /** The dependent's name for it in the graph; null for a parent named by id. */
  ref: string | null;
  /** Null when retention has forgotten it. */
  task: string | null;
  state: "succeeded" | "dead" | "cancelled" | "unknown";
  result: JsonValue | null;
  /** Why it ended dead or cancelled; null when it succeeded. */
  error: string | null;
}

/** A page of a job's parents; `next` continues it (the last parent's id), null at the end. */
export interface ParentsPage {
  parents: ParentRecord[];
  next: string | null;
}

/** A page's byte budget when none is given: the server's answer cap. */
export const PARENTS_PAGE_BYTES = 8 * 1024 * 1024;

/**
 * A parent's size in a page, in bytes: at least its JSON (jsonb's text has spaces JSON.stringify
 * leaves out; to_json escapes text as JSON does), and room for the id and the field names.
 */
const PARENT_BYTES = `(SELECT 256 + coalesce(octet_length(to_json(f.task)::text), 0) + coalesce(octet_length(f.result::text), 0)
               + coalesce(octet_length(to_json(f.last_error)::text), 0)
          FROM finished_jobs AS f WHERE f.id = d.parent_id)`;

/**
 * One page of a job's parents, in id order after $2, and how each ended: a walk of the edges'
 * primary key, one parent a step, summing their sizes, that stops at the first parent past the
 * byte budget $3 (the first of a page is kept whatever its size). So the results past the budget
 * are never read out of the database: that parent comes back without them, `kept` false, and
 * says that the page has a next one. Each step reads only the edge and its parent's size (a
 * join in the step made the planner join every remaining edge at each step). A parent still
 * unfinished (it cannot be, once its dependent runs) or forgotten by retention reads as "unknown".
 */
const PARENTS_PAGE = statement(
  "parentsPage",
  `
WITH RECURSIVE page AS (
  (SELECT d.parent_id AS id, 1 AS n, (coalesce(octet_length(to_json(d.ref)::text), 0) + coalesce(${PARENT_BYTES}, 256))::int8 AS bytes_so_far
     FROM job_dependencies AS d
    WHERE d.child_id = $1 AND d.parent_id > $2
    ORDER BY d.parent_id
    LIMIT 1)
  UNION ALL
  SELECT nx.id, p.n + 1, p.bytes_so_far + nx.bytes
    FROM page AS p
   CROSS JOIN LATERAL (
         SELECT d.parent_id AS id, (coalesce(octet_length(to_json(d.ref)::text), 0) + coalesce(${PARENT_BYTES}, 256))::int8 AS bytes
           FROM job_dependencies AS d
          WHERE d.child_id = $1 AND d.parent_id > p.id
          ORDER BY d.parent_id
          LIMIT 1) AS nx
   WHERE p.bytes_so_far <= $3 OR p.n = 1
)
SELECT p.id, d.ref, f.task, coalesce(f.state, 'unknown') AS state, CASE WHEN p.kept THEN f.result END AS result,
       CASE WHEN p.kept AND f.state IN ('dead', 'cancelled') THEN f.last_error END AS error, p.kept
  FROM (SELECT id, bytes_so_far <= $3 OR n = 1 AS kept FROM page) AS p
  JOIN job_dependencies AS d ON d.child_id = $1 AND d.parent_id = p.id
  LEFT JOIN finished_jobs AS f ON f.id = p.id
 ORDER BY p.id`,
  { id: "int8", ref: "text?", task: "text?", state: "text", result: "jsonb?", error: "text?", kept: "bool" },
);

/** One page of a job's parents, at most about `maxBytes` of them (always at least one). */
export async function parentsPage(db: Queryable, jobId: string, p: { after: string | null; maxBytes: number }): Promise<ParentsPage> {
  const rows = await run(db, PARENTS_PAGE, [jobId, p.after ?? "0", p.maxBytes]);
  const kept = rows.filter((r) => r.kept);
  return {
    parents: kept.map(({ kept: _, ...r }) => ({ ...r, state: r.state as ParentRecord["state"] })),
    next: kept.length < rows.length ? kept.at(-1)!.id : null,
  };
}

/**
 * All of a job's parents (ctx.parents()), read in pages as a remote worker reads them through
 * the server: no one statement's answer grows past a page, however many parents and results.
 * The parents are fixed once their dependent runs, so the pages add up to the whole list.
 */
export async function parentsOf(db: Queryable, jobId: string): Promise<ParentRecord[]> {
  const parents: ParentRecord[] = [];
  let after: string | null = null;
  do {
    const page = await parentsPage(db, jobId, { after, maxBytes: PARENTS_PAGE_BYTES });
    parents.push(...page.parents);
    after = page.next;
  } while (after !== null);
  return parents;
}

/** How a job's parents ended, as the triggers counted them (ctx.dependencies: a batch callback's counts). */
export interface DependencyCounts {
  total: number;
  succeeded: number;
  dead: number;
  cancelled: number;
}

/**
 * The counters the triggers kept on the job's row, and its edges for the total. A job no
 * longer in `jobs` (it has ended) has no counters: its parents' states are counted instead.
 */
const DEPENDENCY_COUNTS = statement(
  "dependencyCounts",
  `
SELECT (SELECT count(*) FROM job_dependencies WHERE child_id = $1)::int AS total,
       coalesce((SELECT j.parents_dead FROM jobs AS j WHERE j.id = $1),
                (SELECT count(*) FROM job_dependencies AS d JOIN dead_jobs AS x ON x.id = d.parent_id WHERE d.child_id = $1))::int AS dead,
       coalesce((SELECT j.parents_cancelled FROM jobs AS j WHERE j.id = $1),
                (SELECT count(*) FROM job_dependencies AS d JOIN job_history AS h ON h.id = d.parent_id
                  WHERE d.child_id = $1 AND h.state = 'cancelled'))::int AS cancelled`,
  { total: "int4", dead: "int4", cancelled: "int4" },
);

export async function dependencyCounts(db: Queryable, jobId: string): Promise<DependencyCounts> {
  const [r] = await run(db, DEPENDENCY_COUNTS, [jobId]);
  const { total, dead, cancelled } = r!;
  return { total, succeeded: Math.max(0, total - dead - cancelled), dead, cancelled };
}
