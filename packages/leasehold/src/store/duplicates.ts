/**
 * Enqueue with `onDuplicate` replace modes (docs/flows.md#debounce-and-replace): what an
 * enqueue does to the unfinished job that already holds its unique key.
 *
 * Set-based, per key, in rounds:
 *   1. One INSERT ... ON CONFLICT DO UPDATE per time mode ("replace" and "cancel_running" move
 *      the run time, "replace_payload" keeps it): a key nobody holds gets the new job; a waiting
 *      or blocked holder takes the payload (and time). A running holder is left alone by the
 *      DO UPDATE's WHERE, but locked by it, so it cannot finish or retry until we commit. So is
 *      a suspended one (a durable job asleep or waiting for an event): it is mid-run, its steps
 *      recorded for its payload, and a new run time would cut its sleep short.
 *   2. The keys held by running and suspended jobs are freed from them (`unique_key = NULL`;
 *      for "cancel_running", a running one gets a cancel request, whose trigger notifies the
 *      worker, and a suspended one, holding no lease, is cancelled at once as lh.cancel does),
 *      and the next round inserts their new jobs.
 * A round can meet a holder that appeared meanwhile (another transaction's enqueue, or, outside
 * a transaction, a holder that went back to waiting); the rounds are bounded as for "keep".
 * Run it inside a transaction: freeing a key and enqueueing its new job commit together.
 *
 * ON CONFLICT DO UPDATE cannot touch a row twice in one statement, so a batch is first folded
 * to one row per key, as if its jobs were enqueued one after the other: the first job (or, past
 * a running holder, the first that replaces) makes the row, the last replacing job gives the
 * payload, the last time-replacing job the run time. Every input job still gets its answer.
 */
import { quoteIdent, type Queryable } from "./db.js";
import { run, statement, type Statement } from "./sql.js";
import { cancelTarget } from "./admin.js";
import { JOB_COLUMNS, JOB_ROWS, jobArrays } from "./job-rows.js";
import type { NormalizedJob } from "../jobs/validate.js";
import type { EnqueuedJob } from "../jobs/types.js";
import { UniqueKeyConflictError } from "../errors.js";

/**
 * Refuses a job whose unique key is held by an unfinished job outside its `uniqueScope` (of
 * another task, or in another queue): that job is not its duplicate, and the key cannot be held
 * twice (the index is on the key alone, as a previous release's enqueues expect).
 */
export function checkHolderInScope(job: NormalizedJob, holder: { id: string; task: string; queue: string }): void {
  const scope = job.uniqueScope ?? "task";
  if (scope === "task" && holder.task !== job.task) throw new UniqueKeyConflictError(job.uniqueKey!, holder, "task");
  if (scope === "queue" && holder.queue !== job.queue) throw new UniqueKeyConflictError(job.uniqueKey!, holder, "queue");
}

interface Names {
  jobs: string;
  history: string;
  /** history_generation(), for a cancelled holder's history row. */
  generation: string;
  outbox: string;
  natsActive: string;
  /** The schema's name as an SQL expression, for notification channels. */
  schemaName: string;
}

const OWN: Names = {
  jobs: "jobs",
  history: "job_history",
  generation: "history_generation",
  outbox: "dispatch_outbox",
  natsActive: "nats_dispatch_active",
  schemaName: "current_schema()",
};

/**
 * Which holders a group of jobs with one key may replace: of the same task, in the same queue
 * (both for a group whose jobs ask for both), or any.
 */
interface Scope {
  byTask: boolean;
  byQueue: boolean;
}

const upsertText = (n: Names, moveTime: boolean, scope: Scope) => `
WITH upserted AS (
  INSERT INTO ${n.jobs} AS cur ${JOB_COLUMNS}
  ${JOB_ROWS}
  ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL DO UPDATE
     SET payload = excluded.payload${moveTime ? ",\n         run_at = excluded.run_at" : ""}
   -- a holder outside the scope is left alone (and locked), and refused below; so is one mid-run
   WHERE cur.state NOT IN ('running', 'suspended')${scope.byTask ? " AND cur.task = excluded.task" : ""}${scope.byQueue ? " AND cur.queue = excluded.queue" : ""}
  -- xmax is 0 only on a row this statement inserted (an updated one carries our lock)
  RETURNING cur.id, cur.unique_key, cur.queue, cur.state, cur.run_at, cur.attempt, cur.xmax::text = '0' AS inserted
)${
  moveTime
    ? `, moved AS (
  SELECT id, queue, run_at, attempt FROM upserted WHERE NOT inserted AND state = 'waiting'
), doorbells AS (
  -- NATS dispatch: the doorbell of a job whose time moved follows it. One still owed moves;
  -- one already published gets a new row (its message, if it comes early, claims nothing: the
  -- claim by id takes only due jobs, and acks a message of a job not yet due).
  INSERT INTO ${n.outbox} (job_id, attempt, publish_at)
  SELECT id, attempt, greatest(run_at, now()) FROM moved WHERE ${n.natsActive}()
  ON CONFLICT (job_id, attempt) DO UPDATE SET publish_at = excluded.publish_at
  RETURNING job_id
), woken AS (
  -- an UPDATE fires no insert trigger: wake the workers of jobs now due, and the dispatchers
  SELECT count(pg_notify('leasehold:' || ${n.schemaName}, m.queue)) AS n
    FROM (SELECT DISTINCT queue FROM moved WHERE run_at <= now()) AS m
  UNION ALL
  SELECT count(pg_notify('leasehold:' || ${n.schemaName} || ':dispatch', '')) FROM (SELECT 1 FROM doorbells LIMIT 1) AS d
)
SELECT id, unique_key, inserted FROM upserted WHERE (SELECT sum(n) FROM woken) >= 0`
    : `
SELECT id, unique_key, inserted FROM upserted`
}`;

/**
 * Frees keys from the running and suspended jobs that hold them; `cancel`: also requests a
 * running one's cancel (migration 014's trigger notifies the worker that runs it, at commit).
 */
const freeText = (n: Names) => `
UPDATE ${n.jobs} AS j
   SET unique_key = NULL,
       cancel_requested_at = CASE WHEN f.cancel AND j.state = 'running' THEN coalesce(j.cancel_requested_at, now())
                                  ELSE j.cancel_requested_at END
  FROM unnest($1::text[], $2::bool[]) AS f(unique_key, cancel)
 WHERE j.unique_key = f.unique_key AND j.state IN ('running', 'suspended')
RETURNING j.id, f.unique_key, j.state`;

/** "cancel_running" of suspended holders: no handler to abort, so they end now, as lh.cancel ends them. */
const cancelSuspendedText = (n: Names) => `
WITH target AS (
  SELECT id, state FROM ${n.jobs} WHERE id = ANY($1::bigint[]) AND state = 'suspended' FOR UPDATE
), ${cancelTarget(n)}
SELECT id FROM ended`;

/** The holders of keys an upsert left alone (running, or outside the scope), locked by it. */
const holdersText = (n: Names) => `
SELECT id, unique_key, task, queue FROM ${n.jobs} WHERE unique_key = ANY($1::text[])`;

const UPSERTED = { id: "int8", unique_key: "text", inserted: "bool" } as const;
type Upsert = Statement<typeof UPSERTED>;
const SCOPES: Scope[] = [
  { byTask: true, byQueue: false },
  { byTask: false, byQueue: false },
  { byTask: false, byQueue: true },
  { byTask: true, byQueue: true },
];
const scopeName = (s: Scope) => (s.byTask ? (s.byQueue ? "task and queue" : "task") : s.byQueue ? "queue" : "global");
const upsertName = (moveTime: boolean, s: Scope) =>
  `enqueueJobs (${moveTime ? "replace" : "replace payload"} on duplicate key, ${scopeName(s)} scope)`;
/** upsert statements by `${moveTime}/${byTask}/${byQueue}`. */
const upsertKey = (moveTime: boolean, s: Scope) => `${moveTime}/${s.byTask}/${s.byQueue}`;
const UPSERTS = new Map<string, Upsert>(
  [true, false].flatMap((moveTime) =>
    SCOPES.map((sc) => [upsertKey(moveTime, sc), statement(upsertName(moveTime, sc), upsertText(OWN, moveTime, sc), UPSERTED)] as const),
  ),
);
const FREE_KEYS = statement("enqueueJobs (free keys of running or suspended jobs)", freeText(OWN), { id: "int8", unique_key: "text", state: "text" });
const CANCEL_SUSPENDED = statement("enqueueJobs (cancel suspended holders)", cancelSuspendedText(OWN), { id: "int8" });
const HOLDERS = statement("enqueueJobs (holders of keys left alone)", holdersText(OWN), {
  id: "int8",
  unique_key: "text",
  task: "text",
  queue: "text",
});

interface DuplicateStatements {
  upserts: Map<string, Upsert>;
  free: typeof FREE_KEYS;
  cancelSuspended: typeof CANCEL_SUSPENDED;
  holders: typeof HOLDERS;
}

const UNQUALIFIED: DuplicateStatements = { upserts: UPSERTS, free: FREE_KEYS, cancelSuspended: CANCEL_SUSPENDED, holders: HOLDERS };
const qualified = new Map<string, DuplicateStatements>();

/** The statements with the schema named, for a caller's client whose search_path is not ours. */
function statementsFor(schema: string | undefined): DuplicateStatements {
  if (schema === undefined) return UNQUALIFIED;
  let s = qualified.get(schema);
  if (!s) {
    const q = quoteIdent(schema);
    const n: Names = {
      jobs: `${q}.jobs`,
      history: `${q}.job_history`,
      generation: `${q}.history_generation`,
      outbox: `${q}.dispatch_outbox`,
      natsActive: `${q}.nats_dispatch_active`,
      schemaName: `'${schema.replaceAll("'", "''")}'`,
    };
    const as = <C extends Statement>(st: C, text: string): C => ({ ...st, text });
    s = {
      upserts: new Map(
        [true, false].flatMap((moveTime) =>
          SCOPES.map((sc) => [upsertKey(moveTime, sc), as(UPSERTS.get(upsertKey(moveTime, sc))!, upsertText(n, moveTime, sc))] as const),
        ),
      ),
      free: as(FREE_KEYS, freeText(n)),
      cancelSuspended: as(CANCEL_SUSPENDED, cancelSuspendedText(n)),
      holders: as(HOLDERS, holdersText(n)),
    };
    qualified.set(schema, s);
  }
  return s;
}

const replaces = (j: NormalizedJob) => j.onDuplicate !== undefined && j.onDuplicate !== "keep";
const movesTime = (j: NormalizedJob) => j.onDuplicate === "replace" || j.onDuplicate === "cancel_running";

/** One key's jobs of a batch, in input order, folded to what one-by-one enqueues would do. */
interface KeyGroup {
  key: string;
  /** Indexes into the batch. */
  members: number[];
  /** Position (in members) of the first job that replaces: the new job's maker past a running holder. */
  firstReplacer: number;
  /** The last job that replaces: its payload wins. */
  payloadFrom: NormalizedJob;
  /** The last job that moves the time, if any: its run time wins. */
  timeFrom: NormalizedJob | undefined;
  /** Running (or suspended) jobs that held the key, freed from it (the first one answers the jobs before the first replacer). */
  freed: string[];
  cancelled?: string;
  answer?: { id: string; inserted: boolean };
  /** Every member's scope at once: a holder any of them would refuse is refused. */
  scope: Scope;
}

/** Whether a batch holds jobs for this module (a keyed job with a replace mode). */
export function hasReplaceModes(jobs: NormalizedJob[]): boolean {
  return jobs.some((j) => j.uniqueKey !== null && replaces(j));
}

/** Indexes of the batch's jobs whose key has a replacing job: those go through `enqueueReplacing`. */
export function replacingIndexes(jobs: NormalizedJob[]): Set<number> {
  const keys = new Set(jobs.filter((j) => j.uniqueKey !== null && replaces(j)).map((j) => j.uniqueKey!));
  const out = new Set<number>();
  jobs.forEach((j, i) => j.uniqueKey !== null && keys.has(j.uniqueKey) && out.add(i));
  return out;
}

/**
 * Enqueues `indexes` of `jobs` (every job of a key that some job of the batch replaces with);
 * returns their answers by index. `maxRounds` bounds the holders met one after another.
 */
export async function enqueueReplacing(
  db: Queryable,
  jobs: NormalizedJob[],
  indexes: number[],
  schema: string | undefined,
  maxRounds: number,
): Promise<Map<number, EnqueuedJob>> {
  const st = statementsFor(schema);
  const groups = new Map<string, KeyGroup>();
  for (const i of indexes) {
    const job = jobs[i]!;
    const key = job.uniqueKey!;
    let g = groups.get(key);
    if (!g) {
      g = { key, members: [], firstReplacer: -1, payloadFrom: job, timeFrom: undefined, freed: [], scope: { byTask: false, byQueue: false } };
      groups.set(key, g);
    }
    const scope = job.uniqueScope ?? "task";
    if (scope === "task") g.scope.byTask = true;
    if (scope === "queue") g.scope.byQueue = true;
    if (replaces(job)) {
      if (g.firstReplacer < 0) g.firstReplacer = g.members.length;
      g.payloadFrom = job;
      if (movesTime(job)) g.timeFrom = job;
    }
    g.members.push(i);
  }
  let pending = [...groups.values()];
  for (let round = 1; pending.length > 0; round++) {
    if (round > maxRounds) {
      throw new Error(
        `unique key ${JSON.stringify(pending[0]!.key)} was held by a running job in each of ${maxRounds} rounds; nothing more was written for it`,
      );
    }
    // In key order: two batches that share keys lock their holders in the same order.
    const byStatement = new Map<string, KeyGroup[]>();
    for (const g of pending) {
      const k = upsertKey(g.timeFrom !== undefined, g.scope);
      const same = byStatement.get(k);
      if (same) same.push(g);
      else byStatement.set(k, [g]);
    }
    for (const [k, groupsOfStatement] of [...byStatement].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) {
      const rows = await run(db, st.upserts.get(k)!, jobArrays(groupsOfStatement.map((g) => rowOf(g, jobs)).sort(byKey)));
      for (const r of rows) groups.get(r.unique_key)!.answer = { id: r.id, inserted: r.inserted };
    }
    pending = pending.filter((g) => g.answer === undefined);
    if (pending.length === 0) break;
    // Left alone: a holder outside a member's scope is refused (the transaction rolls back).
    for (const holder of await run(db, st.holders, [pending.map((g) => g.key)])) {
      const g = groups.get(holder.unique_key)!;
      for (const i of g.members) checkHolderInScope(jobs[i]!, holder);
    }
    // Held by running or suspended jobs (locked by the upsert until we commit): free their keys.
    const cancels = (g: KeyGroup) => jobs[g.members[g.firstReplacer]!]!.onDuplicate === "cancel_running";
    const freed = await run(db, st.free, [pending.map((g) => g.key), pending.map(cancels)]);
    const suspendedToCancel: string[] = [];
    for (const r of freed) {
      const g = groups.get(r.unique_key)!;
      g.freed.push(r.id);
      if (!cancels(g)) continue;
      g.cancelled ??= r.id;
      if (r.state === "suspended") suspendedToCancel.push(r.id);
    }
    if (suspendedToCancel.length > 0) await run(db, st.cancelSuspended, [suspendedToCancel]);
  }
  const out = new Map<number, EnqueuedJob>();
  for (const g of groups.values()) {
    const { id, inserted } = g.answer!;
    const maker = g.freed.length > 0 ? g.firstReplacer : 0;
    g.members.forEach((i, pos) => {
      if (pos < maker) out.set(i, { id: g.freed[0]!, created: false });
      else if (pos === maker && inserted) out.set(i, { id, created: true, ...(g.cancelled !== undefined && { cancelled: g.cancelled }) });
      else {
        const replaced = replaces(jobs[i]!);
        out.set(i, {
          id,
          created: false,
          ...(replaced && { replaced: true as const }),
          ...(pos === maker && g.cancelled !== undefined && { cancelled: g.cancelled }),
        });
      }
    });
  }
  return out;
}

/** The row a key's group inserts: its maker's options, the winning payload and run time. */
function rowOf(g: KeyGroup, jobs: NormalizedJob[]): NormalizedJob {
  const maker = jobs[g.members[g.freed.length > 0 ? g.firstReplacer : 0]!]!;
  const time = g.timeFrom ?? maker;
  return { ...maker, payloadJson: g.payloadFrom.payloadJson, runAt: time.runAt, delayMs: time.delayMs };
}

const byKey = (a: NormalizedJob, b: NormalizedJob) => (a.uniqueKey! < b.uniqueKey! ? -1 : a.uniqueKey! > b.uniqueKey! ? 1 : 0);
