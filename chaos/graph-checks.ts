/**
 * Jobs that build on jobs, under faults (invariants 13-16 in docs/chaos.md), read from the
 * audit trail and job_dependencies on the database's clock (microseconds):
 *
 * 13. **No job starts before its parents allow it.** A job's first attempt is claimed after
 *     every parent succeeded: its started_at (read as the claim starts to run, after its
 *     snapshot) is later than each parent's succeeded end (the completing statement's now(),
 *     before the commit that released the child). A job enqueued with onParentFailure 'run'
 *     starts after every parent ended, however. A job
 *     that ran although a parent ended dead or cancelled (and it did not ask to run) breaks it.
 * 14. **No job stays blocked once its parents have ended**, and none is cancelled for nothing:
 *     after the drain, a job still blocked whose parents have all ended breaks it; so does a
 *     job cancelled although every parent succeeded or although it asked to run on failure
 *     (the run cancels nothing itself: a cancel comes only from a failed parent).
 * 15. **Every batch callback succeeds exactly once**: each batch member has one callback child;
 *     the callback ended succeeded, with one succeeded attempt, started after every member
 *     ended, and the counts its handler read (ctx.dependencies()) are the members' end states.
 * 16. **Results belong to the attempt that succeeded**: a stored result is a succeeded job's,
 *     and the attempt number and worker it names (the handler returns its own) are those of
 *     the attempt that succeeded, and every succeeded job has one (every chaos handler returns
 *     one). A succeeded graph node also saw its parents' end states through ctx.parents() as
 *     they are recorded.
 */
import type { JsonValue } from "../packages/leasehold/src/jobs/types.js";
import type pg from "pg";

export interface GraphViolation {
  invariant: string;
  job?: string;
  detail: string;
}

/** What a chaos handler returns: its own attempt, and what it read of its parents. */
export interface ChaosJobResult {
  seq: number;
  attempt: number;
  worker: string;
  /** ctx.parents(): each parent's id and state as the handler saw them (graph nodes and callbacks). */
  parents?: { id: string; state: string }[];
  /** ctx.dependencies() (batch callbacks). */
  dependencies?: { total: number; succeeded: number; dead: number; cancelled: number };
  /** A durable job's wait: the event's data, or null if it timed out (chaos/durable-workload.ts). */
  received?: JsonValue | null;
}

/** Where a job sits in a graph, kept in its payload (finished jobs keep no on_parent_failure column). */
export interface GraphRole {
  role: "node" | "member" | "callback";
  onParentFailure?: "cancel" | "run";
}

/** A job of the run: unfinished (state blocked, waiting, running) or finished; times in µs. */
export interface GraphJob {
  id: string;
  state: string;
  /** Its last attempt (0: never claimed). */
  attempt: number;
  graph: GraphRole | null;
  result: unknown;
  /** When it ended (finished_at), null while unfinished. */
  finished: number | null;
}

export interface GraphAttempt {
  job: string;
  attempt: number;
  worker: string;
  outcome: string;
  started: number;
  ended: number;
}

export interface GraphAudit {
  jobs: GraphJob[];
  edges: { child: string; parent: string }[];
  attempts: GraphAttempt[];
}

export interface GraphResult {
  /** Jobs with a parent, by how they ended; batches (callbacks) and their members. */
  dependents: Record<string, number>;
  batches: number;
  runOnFailure: number;
  results: number;
  /** Last parent's end to the child's first start (µs → ms), graph nodes that ran: the step latency under faults. */
  stepMs: number[];
}

const MAX_LISTED = 20;

/** Loads every job, the edges and the audit rows of the jobs in graphs, on the database's clock in µs. */
export async function loadGraphAudit(db: pg.Pool | pg.Client): Promise<GraphAudit> {
  const us = (col: string) => `(extract(epoch FROM ${col}) * 1000000)::float8`;
  const [jobs, edges, attempts] = await Promise.all([
    db.query<{ id: string; state: string; attempt: number; graph: GraphRole | null; result: unknown; finished: number | null }>(
      `SELECT id::text, state, attempt, payload->'graph' AS graph, NULL::jsonb AS result, NULL::float8 AS finished FROM jobs
       UNION ALL
       SELECT id::text, state, attempt, payload->'graph', result, ${us("finished_at")} FROM finished_jobs`,
    ),
    db.query<{ child: string; parent: string }>("SELECT child_id::text AS child, parent_id::text AS parent FROM job_dependencies"),
    db.query<GraphAttempt>(
      `SELECT job_id::text AS job, attempt, worker_id AS worker, outcome, ${us("started_at")} AS started, ${us("ended_at")} AS ended
         FROM all_attempts
        WHERE job_id IN (SELECT child_id FROM job_dependencies UNION SELECT parent_id FROM job_dependencies)
           OR job_id IN (SELECT id FROM finished_jobs WHERE result IS NOT NULL)
        ORDER BY job_id, attempt`,
    ),
  ]);
  return { jobs: jobs.rows, edges: edges.rows, attempts: attempts.rows };
}

const FAILED = new Set(["dead", "cancelled"]);

/**
 * `resultsRequired`: every succeeded job must hold a result (the chaos handlers return one for
 * every job; a hand-made history of plain completions has none).
 */
export function checkGraphs(audit: GraphAudit, { resultsRequired = true } = {}): { violations: GraphViolation[]; result: GraphResult } {
  const violations: GraphViolation[] = [];
  const counts = new Map<string, number>();
  const add = (invariant: string, detail: string, job?: string) => {
    const n = (counts.get(invariant) ?? 0) + 1;
    counts.set(invariant, n);
    if (n <= MAX_LISTED) violations.push({ invariant, detail, job });
  };
  const jobs = new Map(audit.jobs.map((j) => [j.id, j]));
  const parentsOf = new Map<string, string[]>();
  const childrenOf = new Map<string, string[]>();
  for (const e of audit.edges) {
    parentsOf.set(e.child, [...(parentsOf.get(e.child) ?? []), e.parent]);
    childrenOf.set(e.parent, [...(childrenOf.get(e.parent) ?? []), e.child]);
  }
  const attemptsOf = new Map<string, GraphAttempt[]>();
  for (const a of audit.attempts) attemptsOf.set(a.job, [...(attemptsOf.get(a.job) ?? []), a]);
  const attempt = (job: string, n: number) => attemptsOf.get(job)?.find((a) => a.attempt === n);
  const iso = (us: number) => new Date(us / 1000).toISOString();
  const succeededEnd = (p: GraphJob) => attempt(p.id, p.attempt)?.ended ?? p.finished;
  const result: GraphResult = { dependents: {}, batches: 0, runOnFailure: 0, results: 0, stepMs: [] };

  for (const [id, parentIds] of parentsOf) {
    const child = jobs.get(id);
    if (!child) {
      add("no job starts before its parents allow it", `job_dependencies names job ${id}, which the run has no record of`, id);
      continue;
    }
    result.dependents[child.state] = (result.dependents[child.state] ?? 0) + 1;
    const parents = parentIds.map((p) => jobs.get(p));
    const runs = child.graph?.onParentFailure === "run" || child.graph?.role === "callback";
    if (runs) result.runOnFailure++;
    const failed = parents.filter((p) => p && FAILED.has(p.state));
    const unfinished = parents.filter((p) => !p || p.finished === null);
    const first = attempt(id, 1);

    // 13. Its first start after every parent it waits for.
    if (first) {
      let lastEnd = -Infinity;
      for (const p of parents) {
        if (!p) continue;
        if (!runs && p.state !== "succeeded") {
          add("no job starts before its parents allow it", `started at ${iso(first.started)} though parent ${p.id} ended ${p.state}`, id);
          continue;
        }
        const end = p.state === "succeeded" ? succeededEnd(p) : p.finished;
        if (end === null || end === undefined) {
          add("no job starts before its parents allow it", `started at ${iso(first.started)} while parent ${p.id} was still ${p.state}`, id);
          continue;
        }
        lastEnd = Math.max(lastEnd, end);
        if (first.started <= end) {
          add(
            "no job starts before its parents allow it",
            `started at ${iso(first.started)}, ${Math.round(end - first.started)} µs before parent ${p.id} ended ${p.state} at ${iso(end)}`,
            id,
          );
        }
      }
      for (const p of parentIds.filter((pid) => !jobs.has(pid))) add("no job starts before its parents allow it", `parent ${p} has no record`, id);
      if (Number.isFinite(lastEnd) && child.graph?.role !== "callback") result.stepMs.push((first.started - lastEnd) / 1000);
    }

    // 14. Not left blocked, not cancelled without a cause.
    if (child.state === "blocked" && unfinished.length === 0) {
      add("no job stays blocked once its parents have ended", `still blocked; its ${parents.length} parents all ended (${describe(parents)})`, id);
    }
    if (child.state === "cancelled") {
      if (runs)
        add("no job stays blocked once its parents have ended", `cancelled, though it runs whatever its parents' end (${describe(parents)})`, id);
      else if (failed.length === 0)
        add("no job stays blocked once its parents have ended", `cancelled, though no parent failed (${describe(parents)})`, id);
    }
  }

  // 15. Batches: one callback per member, succeeded once, after every member, with the right counts.
  for (const j of audit.jobs) {
    if (j.graph?.role === "member") {
      const callbacks = (childrenOf.get(j.id) ?? []).filter((c) => jobs.get(c)?.graph?.role === "callback");
      if (callbacks.length !== 1) add("every batch callback succeeds exactly once", `batch member with ${callbacks.length} callbacks`, j.id);
    }
    if (j.graph?.role !== "callback") continue;
    result.batches++;
    const members = (parentsOf.get(j.id) ?? []).map((p) => jobs.get(p)).filter((p): p is GraphJob => p !== undefined);
    const tries = attemptsOf.get(j.id) ?? [];
    const successes = tries.filter((a) => a.outcome === "succeeded");
    if (j.state !== "succeeded" || successes.length !== 1) {
      add(
        "every batch callback succeeds exactly once",
        `callback ended ${j.state} with ${successes.length} succeeded attempts of ${tries.length} (members: ${describe(members)})`,
        j.id,
      );
      continue;
    }
    const got = (j.result as ChaosJobResult | null)?.dependencies;
    const want = {
      total: members.length,
      succeeded: members.filter((m) => m.state === "succeeded").length,
      dead: members.filter((m) => m.state === "dead").length,
      cancelled: members.filter((m) => m.state === "cancelled").length,
    };
    if (!got || got.total !== want.total || got.succeeded !== want.succeeded || got.dead !== want.dead || got.cancelled !== want.cancelled) {
      add(
        "every batch callback succeeds exactly once",
        `its handler read counts ${JSON.stringify(got ?? null)}; the members ended ${JSON.stringify(want)}`,
        j.id,
      );
    }
  }

  // 16. Results: the succeeded attempt's own, and the parents as recorded.
  for (const j of audit.jobs) {
    if (j.result === null || j.result === undefined) continue;
    result.results++;
    const r = j.result as ChaosJobResult;
    if (j.state !== "succeeded") {
      add("results belong to the attempt that succeeded", `ended ${j.state} but holds result ${JSON.stringify(r)}`, j.id);
      continue;
    }
    const winner = attempt(j.id, j.attempt);
    if (r.attempt !== j.attempt || !winner || r.worker !== winner.worker || winner.outcome !== "succeeded") {
      add(
        "results belong to the attempt that succeeded",
        `result names attempt ${r.attempt} by ${r.worker}; attempt ${j.attempt} by ${winner?.worker ?? "?"} ended ${winner?.outcome ?? "unrecorded"}`,
        j.id,
      );
    }
    const parentIds = parentsOf.get(j.id);
    if (parentIds && r.parents) {
      const seen = new Map(r.parents.map((p) => [p.id, p.state]));
      const wrong = parentIds.filter((p) => seen.get(p) !== jobs.get(p)?.state);
      if (wrong.length || seen.size !== parentIds.length) {
        add(
          "results belong to the attempt that succeeded",
          `ctx.parents() said ${JSON.stringify(r.parents)}; the parents ended ${describe(parentIds.map((p) => jobs.get(p)))}`,
          j.id,
        );
      }
    }
  }
  // Every chaos handler returns a result (inside ctx.transaction, with its completion).
  for (const j of resultsRequired ? audit.jobs : []) {
    if (j.state === "succeeded" && (j.result === null || j.result === undefined)) {
      add("results belong to the attempt that succeeded", "succeeded but no result was stored", j.id);
    }
  }

  for (const [invariant, n] of counts) if (n > MAX_LISTED) violations.push({ invariant, detail: `${n} violations in all` });
  return { violations, result };
}

function describe(parents: (GraphJob | undefined)[]): string {
  return parents.map((p) => (p ? `${p.id} ${p.state}` : "unknown")).join(", ");
}
