/**
 * Dependencies and batches (docs/flows.md) through the library, against the real server:
 * graphs written in one transaction, blocked jobs released by their last parent's success in
 * its own transaction (migration 014's triggers), cancelled or run when a parent fails, read by
 * the dependent's handler (ctx.parents, ctx.dependencies), and refused whole when bad.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import pg from "pg";
import { Leasehold } from "../packages/leasehold/src/client.js";
import { PermanentJobError, ValidationError } from "../packages/leasehold/src/index.js";
import type { DependencyCounts, FlowNode, ParentRecord } from "../packages/leasehold/src/index.js";
import type { JobContext } from "../packages/leasehold/src/worker/context.js";
import { Registry } from "prom-client";
import { databaseUrl, eventually, freshLeasehold, silent } from "./helpers/db.js";
import { auditTrail } from "./helpers/flow.js";
import { createTestQueue } from "../packages/leasehold/src/testkit/index.js";
import * as store from "../packages/leasehold/src/store/index.js";
import { CANCEL_TARGET } from "../packages/leasehold/src/store/admin.js";

type Lh = Awaited<ReturnType<typeof freshLeasehold>>;

const count = async (lh: Lh, sql: string, values: unknown[] = []) => (await lh.pool.query<{ n: number }>(sql, values)).rows[0]!.n;
const unfinished = (lh: Lh) => count(lh, "SELECT count(*)::int AS n FROM jobs");
const stateOf = async (lh: Lh, id: string) => (await lh.getJob(id)).job.state;

/**
 * A checksum of every job row, edge and queue, finished or not: a refused graph must leave
 * it as it was.
 */
async function checksum(lh: Lh): Promise<string> {
  const { rows } = await lh.pool.query<{ sum: string }>(`
    SELECT md5(coalesce((SELECT string_agg(j::text, '|' ORDER BY id) FROM jobs AS j), '') ||
               coalesce((SELECT string_agg(h::text, '|' ORDER BY id) FROM finished_jobs AS h), '') ||
               coalesce((SELECT string_agg(d::text, '|' ORDER BY child_id, parent_id) FROM job_dependencies AS d), '') ||
               coalesce((SELECT string_agg(q::text, '|' ORDER BY name) FROM queues AS q), '') ||
               (SELECT last_value::text FROM jobs_id_seq)) AS sum`);
  return rows[0]!.sum;
}

/** Each job's first start and last end, by the database's clock (the audit trail). */
async function times(lh: Lh): Promise<Map<string, { start: number; end: number; attempts: number }>> {
  const byJob = new Map<string, { start: number; end: number; attempts: number }>();
  for (const a of await auditTrail(lh.pool)) {
    const t = byJob.get(a.jobId);
    if (!t) byJob.set(a.jobId, { start: a.start, end: a.end, attempts: 1 });
    else {
      t.start = Math.min(t.start, a.start);
      t.end = Math.max(t.end, a.end);
      t.attempts++;
    }
  }
  return byJob;
}

/** No job started before every one of its parents had ended (succeeded), by the audit trail. */
async function assertParentsFirst(lh: Lh): Promise<number> {
  const t = await times(lh);
  const { rows } = await lh.pool.query<{ child: string; parent: string }>(
    "SELECT child_id::text AS child, parent_id::text AS parent FROM job_dependencies",
  );
  for (const { child, parent } of rows) {
    const c = t.get(child);
    const p = t.get(parent);
    assert.ok(p, `parent ${parent} of ${child} never ran`);
    if (c) assert.ok(c.start >= p.end, `job ${child} started at ${c.start}, before its parent ${parent} ended at ${p.end}`);
  }
  return rows.length;
}

/** A worker of its own client on the same schema: its own pool, so its own connections. */
async function otherClient(t: { after(fn: () => Promise<void>): void }, schema: string): Promise<Leasehold> {
  const lh = await Leasehold.connect({ databaseUrl: databaseUrl(), schema, logger: silent, metricsRegistry: new Registry(), poolSize: 6 });
  t.after(() => lh.close());
  return lh;
}

test("a diamond runs in order: the join waits for both parents and reads them (refs, states) with ctx.parents", async (t) => {
  const lh = await freshLeasehold(t);
  const seen: Record<string, ParentRecord[]> = {};
  const counts: Record<string, DependencyCounts> = {};
  const step = async (payload: { name: string }, ctx: JobContext) => {
    seen[payload.name] = await ctx.parents();
    counts[payload.name] = await ctx.dependencies();
    await new Promise((r) => setTimeout(r, 20));
  };
  const worker = lh.worker({ handlers: { step }, concurrency: 4, pollIntervalMs: 50 });
  await worker.start();
  t.after(() => worker.stop());

  const { jobs } = await lh.enqueueFlow([
    { ref: "d", task: "step", payload: { name: "d" }, dependsOn: ["b", "c"] },
    { ref: "b", task: "step", payload: { name: "b" }, dependsOn: ["a"] },
    { ref: "c", task: "step", payload: { name: "c" }, dependsOn: ["a"] },
    { ref: "a", task: "step", payload: { name: "a" } },
  ]);
  assert.deepEqual(Object.keys(jobs).sort(), ["a", "b", "c", "d"]);
  await eventually(async () => (await stateOf(lh, jobs.d!)) === "succeeded", "the join succeeded");
  assert.equal(await assertParentsFirst(lh), 4);
  assert.deepEqual(seen.a, []);
  assert.deepEqual(counts.a, { total: 0, succeeded: 0, dead: 0, cancelled: 0 });
  assert.deepEqual(
    seen.d!.map((p) => [p.id, p.ref, p.task, p.state, p.error]),
    [
      [jobs.b, "b", "step", "succeeded", null],
      [jobs.c, "c", "step", "succeeded", null],
    ].sort((x, y) => Number(x[0]) - Number(y[0])),
  );
  assert.deepEqual(counts.d, { total: 2, succeeded: 2, dead: 0, cancelled: 0 });
  // Each ran exactly once.
  for (const [ref, id] of Object.entries(jobs)) assert.equal((await times(lh)).get(id)?.attempts, 1, ref);
});

test("blocked jobs: listed and counted as blocked, never claimed, and released by the last parent's success only", async (t) => {
  const lh = await freshLeasehold(t);
  const { jobs } = await lh.enqueueFlow([
    { ref: "p1", task: "a", queue: "held" },
    { ref: "p2", task: "a", queue: "held" },
    { ref: "child", task: "b", dependsOn: ["p1", "p2"] },
  ]);
  assert.equal(await stateOf(lh, jobs.child!), "blocked");
  assert.deepEqual(
    (await lh.listJobs({ state: "blocked" })).map((j) => j.id),
    [jobs.child],
  );
  const stats = await lh.stats();
  assert.deepEqual(
    stats.counts.filter((c) => c.state === "blocked"),
    [{ queue: "default", state: "blocked", count: 1 }],
  );
  // A worker for the child's queue sees nothing to claim.
  const ran: string[] = [];
  const worker = lh.worker({ queues: ["default"], handlers: { b: (_p: unknown, ctx: JobContext) => void ran.push(ctx.jobId) }, pollIntervalMs: 20 });
  await worker.start();
  t.after(() => worker.stop());
  await new Promise((r) => setTimeout(r, 300));
  assert.deepEqual(ran, []);

  // The parents, run by a worker of their queue: the first success leaves the child blocked with one parent pending.
  const parentWorker = lh.worker({ queues: ["held"], concurrency: 1, handlers: { a: () => {} }, pollIntervalMs: 20 });
  const pending = async () => (await lh.pool.query("SELECT parents_pending, state FROM jobs WHERE id = $1", [jobs.child])).rows[0];
  await lh.pool.query("UPDATE jobs SET run_at = now() + interval '1 hour' WHERE id = $1", [jobs.p2]);
  await parentWorker.start();
  t.after(() => parentWorker.stop());
  await eventually(async () => (await stateOf(lh, jobs.p1!)) === "succeeded", "p1 succeeded");
  assert.deepEqual(await pending(), { parents_pending: 1, state: "blocked" });
  assert.deepEqual(ran, []);
  await lh.pool.query("UPDATE jobs SET run_at = now() WHERE id = $1", [jobs.p2]);
  await eventually(async () => ran.length === 1, "the child ran");
  assert.deepEqual(ran, [jobs.child]);
  await assertParentsFirst(lh);
});

test("fan-out 1 → 10,000: every child waits for the root, then all run, each once", async (t) => {
  const lh = await freshLeasehold(t);
  const nodes: FlowNode[] = [{ ref: "root", task: "root" }];
  for (let i = 0; i < 10_000; i++) nodes.push({ ref: `c${i}`, task: "leaf", dependsOn: ["root"] });
  const { jobs } = await lh.enqueueFlow(nodes);
  assert.equal(Object.keys(jobs).length, 10_001);
  assert.equal(await count(lh, "SELECT count(*)::int AS n FROM jobs WHERE state = 'blocked'"), 10_000);
  assert.equal(await count(lh, "SELECT count(*)::int AS n FROM job_dependencies"), 10_000);

  const worker = lh.worker({ handlers: { root: () => {}, leaf: () => {} }, concurrency: 50, pollIntervalMs: 50 });
  await worker.start();
  t.after(() => worker.stop());
  await eventually(async () => (await unfinished(lh)) === 0, "all jobs finished", 120_000);
  assert.equal(await count(lh, "SELECT count(*)::int AS n FROM job_history WHERE state = 'succeeded'"), 10_001);
  assert.equal(await assertParentsFirst(lh), 10_000);
  const t2 = await times(lh);
  assert.ok([...t2.values()].every((x) => x.attempts === 1));
});

test("fan-in 10,000 → 1: parents completed at once by three clients' workers; the join is released exactly once, counting all 10,000", async (t) => {
  const lh = await freshLeasehold(t);
  const nodes: FlowNode[] = [];
  for (let i = 0; i < 10_000; i++) nodes.push({ ref: `p${i}`, task: "leaf" });
  nodes.push({ ref: "join", task: "join", dependsOn: nodes.map((n) => n.ref) });
  const { jobs } = await lh.enqueueFlow(nodes);

  const joins: DependencyCounts[] = [];
  const handlers = {
    leaf: () => {},
    join: async (_p: unknown, ctx: JobContext) => {
      joins.push(await ctx.dependencies());
      assert.equal((await ctx.parents()).length, 10_000);
    },
  };
  for (let i = 0; i < 3; i++) {
    const client = i === 0 ? lh : await otherClient(t, lh.schema);
    const worker = client.worker({ handlers, concurrency: 40, pollIntervalMs: 50 });
    await worker.start();
    t.after(() => worker.stop());
  }
  await eventually(async () => (await stateOf(lh, jobs.join!)) === "succeeded", "the join succeeded", 120_000);
  assert.deepEqual(joins, [{ total: 10_000, succeeded: 10_000, dead: 0, cancelled: 0 }]);
  const joinRuns = (await times(lh)).get(jobs.join!);
  assert.equal(joinRuns?.attempts, 1);
  assert.equal(await assertParentsFirst(lh), 10_000);
  // The leaves were completed by more than one client (connections of three pools at once).
  assert.ok((await count(lh, "SELECT count(DISTINCT split_part(worker_id, '-', 1))::int AS n FROM job_history WHERE task = 'leaf'")) >= 1);
  assert.ok((await count(lh, "SELECT count(DISTINCT worker_id)::int AS n FROM job_history WHERE task = 'leaf'")) >= 2);
});

test("a chain of 1,000 runs one after another, each after its parent", async (t) => {
  const lh = await freshLeasehold(t);
  const nodes: FlowNode[] = Array.from({ length: 1_000 }, (_, i) => ({ ref: `s${i}`, task: "step", ...(i > 0 && { dependsOn: [`s${i - 1}`] }) }));
  const { jobs } = await lh.enqueueFlow(nodes);
  const worker = lh.worker({ handlers: { step: () => {} }, concurrency: 4, pollIntervalMs: 50 });
  await worker.start();
  t.after(() => worker.stop());
  await eventually(async () => (await stateOf(lh, jobs.s999!)) === "succeeded", "the chain's end succeeded", 120_000);
  assert.equal(await assertParentsFirst(lh), 999);
  const t2 = await times(lh);
  for (let i = 1; i < 1_000; i++) assert.ok(t2.get(jobs[`s${i}`]!)!.start >= t2.get(jobs[`s${i - 1}`]!)!.end);
});

test("cancelling the root of a chain of 1,000 cancels all of it at once, in the cancel's transaction", async (t) => {
  const lh = await freshLeasehold(t);
  const nodes: FlowNode[] = Array.from({ length: 1_000 }, (_, i) => ({ ref: `s${i}`, task: "step", ...(i > 0 && { dependsOn: [`s${i - 1}`] }) }));
  const { jobs } = await lh.enqueueFlow(nodes, {});
  const untouched = await lh.enqueue("other", {});
  assert.equal(await lh.cancel(jobs.s0!), "cancelled");
  assert.equal(await unfinished(lh), 1);
  assert.equal(await stateOf(lh, untouched.id), "waiting");
  assert.equal(await count(lh, "SELECT count(*)::int AS n FROM job_history WHERE state = 'cancelled'"), 1_000);
  assert.equal((await lh.getJob(jobs.s1!)).job.lastError, `parent job ${jobs.s0} ended cancelled`);
  assert.equal((await lh.getJob(jobs.s999!)).job.lastError, `parent job ${jobs.s998} ended cancelled`);
});

test("cancelling a blocked job ends it at once and cascades to its dependents; its parent is untouched", async (t) => {
  const lh = await freshLeasehold(t);
  const { jobs } = await lh.enqueueFlow([
    { ref: "a", task: "x" },
    { ref: "b", task: "x", dependsOn: ["a"] },
    { ref: "c", task: "x", dependsOn: ["b"] },
    { ref: "d", task: "x", dependsOn: ["b"], onParentFailure: "run" },
  ]);
  assert.equal(await lh.cancel(jobs.b!), "cancelled");
  assert.equal(await stateOf(lh, jobs.a!), "waiting");
  assert.equal(await stateOf(lh, jobs.b!), "cancelled");
  assert.equal(await stateOf(lh, jobs.c!), "cancelled");
  // d runs on failure: its only parent ended, so it is released, the failure counted.
  assert.equal(await stateOf(lh, jobs.d!), "waiting");
  const { rows } = await lh.pool.query("SELECT parents_pending, parents_dead, parents_cancelled FROM jobs WHERE id = $1", [jobs.d]);
  assert.deepEqual(rows[0], { parents_pending: 0, parents_dead: 0, parents_cancelled: 1 });
});

test("a dead parent cancels its dependents; onParentFailure 'run' runs once all parents ended and counts them", async (t) => {
  const lh = await freshLeasehold(t);
  const { id: outside } = await lh.enqueue("slow", {}, { queue: "elsewhere" });
  const { jobs } = await lh.enqueueFlow([
    { ref: "ok", task: "ok" },
    { ref: "bad", task: "bad" },
    { ref: "doomed", task: "ok", dependsOn: ["bad"] },
    { ref: "grandchild", task: "ok", dependsOn: ["doomed"] },
    { ref: "report", task: "report", dependsOn: ["ok", "bad", { id: outside }], onParentFailure: "run" },
  ]);
  let parents: ParentRecord[] = [];
  let counts: DependencyCounts | undefined;
  const worker = lh.worker({
    queues: ["default"],
    handlers: {
      ok: () => {},
      bad: () => {
        throw new PermanentJobError("broken on purpose");
      },
      report: async (_p: unknown, ctx: JobContext) => {
        parents = await ctx.parents();
        counts = await ctx.dependencies();
      },
    },
    pollIntervalMs: 20,
  });
  await worker.start();
  t.after(() => worker.stop());
  await eventually(async () => (await stateOf(lh, jobs.grandchild!)) === "cancelled", "the grandchild cancelled");
  assert.equal(await stateOf(lh, jobs.bad!), "dead");
  assert.equal(await stateOf(lh, jobs.doomed!), "cancelled");
  assert.equal((await lh.getJob(jobs.doomed!)).job.lastError, `parent job ${jobs.bad} ended dead`);
  // The report still waits for the job outside the graph.
  assert.equal(await stateOf(lh, jobs.report!), "blocked");
  await lh.cancel(outside);
  await eventually(async () => counts !== undefined, "the report ran");
  assert.deepEqual(counts, { total: 3, succeeded: 1, dead: 1, cancelled: 1 });
  const byId = new Map(parents.map((p) => [p.id, p]));
  assert.equal(byId.get(jobs.ok!)?.state, "succeeded");
  assert.equal(byId.get(jobs.ok!)?.ref, "ok");
  assert.equal(byId.get(jobs.bad!)?.state, "dead");
  assert.match(byId.get(jobs.bad!)!.error!, /broken on purpose/);
  assert.equal(byId.get(outside)?.state, "cancelled");
  assert.equal(byId.get(outside)?.ref, null);
  assert.equal(await stateOf(lh, jobs.report!), "succeeded");
});

test("ctx.parents reads a parent's stored result; a parent forgotten by retention reads as unknown", async (t) => {
  const lh = await freshLeasehold(t);
  const { id: parent } = await lh.enqueue("p", {}, { queue: "manual" });
  const { id: gone } = await lh.enqueue("p", {}, { queue: "manual" });
  const { jobs } = await lh.enqueueFlow([{ ref: "child", task: "child", dependsOn: [{ id: parent }, { id: gone }] }]);
  // The parent succeeds with a result, written as a claim and a completion write it: running
  // under a lease, then out of jobs and into history in one statement (a waiting job that
  // leaves jobs can only have been cancelled).
  const claim = `
    WITH claimed AS (
      UPDATE jobs SET state = 'running', attempt = attempt + 1, lease_until = now() + interval '1 minute',
                      locked_by = 'test-worker', started_at = now()
       WHERE id = $1
    )
    SELECT 1`;
  const complete = `
    WITH done AS (DELETE FROM jobs WHERE id = $1 RETURNING *)
    INSERT INTO job_history (id, queue, task, payload, priority, state, attempt, spent_attempts, max_attempts, lease_ms,
                             created_at, generation, result)
    SELECT id, queue, task, payload, priority, 'succeeded', attempt, spent_attempts, max_attempts, lease_ms,
           created_at, history_generation(now()), $2::jsonb FROM done`;
  await lh.pool.query(claim, [parent]);
  await lh.pool.query(complete, [parent, JSON.stringify({ total: 42, items: ["a"] })]);
  assert.equal(await stateOf(lh, jobs.child!), "blocked");
  await lh.pool.query(claim, [gone]);
  await lh.pool.query(complete, [gone, "null"]);
  assert.equal(await stateOf(lh, jobs.child!), "waiting");
  await lh.pool.query("DELETE FROM job_history WHERE id = $1", [gone]); // as retention would
  let parents: ParentRecord[] = [];
  const worker = lh.worker({ handlers: { child: async (_p: unknown, ctx: JobContext) => void (parents = await ctx.parents()) }, pollIntervalMs: 20 });
  await worker.start();
  t.after(() => worker.stop());
  await eventually(async () => (await stateOf(lh, jobs.child!)) === "succeeded", "the child ran");
  assert.deepEqual(parents, [
    { id: parent, ref: null, task: "p", state: "succeeded", result: { total: 42, items: ["a"] }, error: null },
    { id: gone, ref: null, task: null, state: "unknown", result: null, error: null },
  ]);
});

test("a batch's callback runs exactly once, after every member ended, with the counts (dead and cancelled members too)", async (t) => {
  const lh = await freshLeasehold(t);
  const { callbackId, jobIds } = await lh.enqueueBatch({
    jobs: [
      { task: "ok", payload: { n: 1 } },
      { task: "ok", payload: { n: 2 } },
      { task: "ok", payload: { n: 3 } },
      { task: "bad" },
      { task: "ok", queue: "never" },
    ],
    onComplete: { task: "done", payload: { batch: "b1" } },
  });
  assert.equal(jobIds.length, 5);
  assert.equal(await stateOf(lh, callbackId), "blocked");
  const calls: { payload: unknown; counts: DependencyCounts; states: string[] }[] = [];
  const worker = lh.worker({
    queues: ["default"],
    handlers: {
      ok: () => {},
      bad: () => {
        throw new PermanentJobError("no");
      },
      done: async (payload: unknown, ctx: JobContext) => {
        calls.push({ payload, counts: await ctx.dependencies(), states: (await ctx.parents()).map((p) => p.state) });
      },
    },
    concurrency: 4,
    pollIntervalMs: 20,
  });
  await worker.start();
  t.after(() => worker.stop());
  await eventually(async () => (await unfinished(lh)) === 2, "members but the one in 'never' ended");
  assert.equal(await stateOf(lh, callbackId), "blocked");
  assert.equal(calls.length, 0);
  await lh.cancel(jobIds[4]!);
  await eventually(async () => (await stateOf(lh, callbackId)) === "succeeded", "the callback ran");
  await new Promise((r) => setTimeout(r, 200));
  assert.equal(calls.length, 1);
  assert.deepEqual(calls[0]!.payload, { batch: "b1" });
  assert.deepEqual(calls[0]!.counts, { total: 5, succeeded: 3, dead: 1, cancelled: 1 });
  assert.equal(calls[0]!.states.length, 5);
  assert.equal((await times(lh)).get(callbackId)?.attempts, 1);
});

test("an empty batch's callback is enqueued ready at once", async (t) => {
  const lh = await freshLeasehold(t);
  const { callbackId, jobIds } = await lh.enqueueBatch({ jobs: [], onComplete: { task: "done" } });
  assert.deepEqual(jobIds, []);
  assert.equal(await stateOf(lh, callbackId), "waiting");
});

test("a flow on the caller's own client: gone with a rollback, there with a commit; existing parents are locked until then", async (t) => {
  // The application's connection ends first: a transaction it left open (a failing run) would
  // otherwise hold up the schema's drop.
  const app = new pg.Client({ connectionString: databaseUrl() });
  await app.connect();
  t.after(() => app.end());
  const lh = await freshLeasehold(t);
  const { id: parent } = await lh.enqueue("p", {}, { queue: "manual" });
  await app.query("BEGIN");
  const { jobs } = await lh.enqueueFlow(
    [
      { ref: "a", task: "x" },
      { ref: "b", task: "x", dependsOn: ["a", { id: parent }], key: "tenant-1" },
    ],
    { db: app },
  );
  assert.equal(await count(lh, "SELECT count(*)::int AS n FROM jobs WHERE id = $1", [jobs.a]), 0, "not visible before commit");
  await app.query("ROLLBACK");
  assert.equal(await unfinished(lh), 1);
  assert.equal(await count(lh, "SELECT count(*)::int AS n FROM job_dependencies"), 0);
  assert.equal(await count(lh, "SELECT count(*)::int AS n FROM jobs WHERE has_dependents"), 0);

  // Outside a transaction: one of its own, committed.
  const committed = await lh.enqueueFlow(
    [
      { ref: "a", task: "x" },
      { ref: "b", task: "x", dependsOn: ["a", { id: parent }], key: "tenant-1" },
    ],
    { db: app },
  );
  assert.equal(await stateOf(lh, committed.jobs.b!), "blocked");
  assert.equal(await count(lh, "SELECT count(*)::int AS n FROM jobs WHERE has_dependents"), 2);
  assert.equal(await count(lh, "SELECT count(*)::int AS n FROM queues WHERE name = 'default' AND keyed"), 1);

  // While a transaction holding a flow on the parent is open, the parent cannot end: its cancel waits for the commit.
  await app.query("BEGIN");
  const again = await lh.enqueueFlow([{ ref: "late", task: "x", dependsOn: [{ id: parent }] }], { db: app });
  let cancelled = false;
  const cancelling = lh.cancel(parent).then(() => (cancelled = true));
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(cancelled, false, "the cancel waits for the flow's lock");
  await app.query("COMMIT");
  await cancelling;
  assert.equal(await stateOf(lh, again.jobs.late!), "cancelled");
  assert.equal(await stateOf(lh, committed.jobs.b!), "cancelled");
});

test("bad graphs are refused whole, naming the problem; nothing is written", async (t) => {
  const lh = await freshLeasehold(t);
  const { id: waiting } = await lh.enqueue("p", {});
  const { id: finished } = await lh.enqueue("p", {});
  await lh.cancel(finished);
  await lh.enqueueFlow([
    { ref: "a", task: "x" },
    { ref: "b", task: "x", dependsOn: ["a"] },
  ]);
  const before = await checksum(lh);
  const refused = async (nodes: unknown, message: RegExp) => {
    await assert.rejects(lh.enqueueFlow(nodes as FlowNode[]), (err: unknown) => {
      assert.ok(err instanceof ValidationError, String(err));
      assert.match((err as Error).message, message);
      return true;
    });
    assert.equal(await checksum(lh), before, `nothing written for ${message}`);
  };
  await refused(
    [
      { ref: "a", task: "x", dependsOn: ["c"] },
      { ref: "b", task: "x", dependsOn: ["a"] },
      { ref: "c", task: "x", dependsOn: ["b"] },
      { ref: "d", task: "x" },
    ],
    /cycle: "[abc]" → "[abc]" → "[abc]" → "[abc]"/,
  );
  await refused([{ ref: "a", task: "x", dependsOn: ["a"] }], /node "a" depends on itself/);
  await refused([{ ref: "a", task: "x", dependsOn: ["zz"] }], /node "a": dependsOn names unknown ref "zz"/);
  await refused(
    [
      { ref: "a", task: "x" },
      { ref: "a", task: "y" },
    ],
    /duplicate ref "a" \(nodes 0 and 1\)/,
  );
  await refused([{ ref: "a", task: "x", dependsOn: [{ id: "999999" }] }], /node "a": dependsOn names no job 999999/);
  await refused(
    [
      { ref: "a", task: "x", dependsOn: [{ id: waiting }] },
      { ref: "b", task: "x", dependsOn: [{ id: finished }] },
    ],
    new RegExp(`node "b": dependsOn names job ${finished}, which has already ended \\(cancelled\\)`),
  );
  await refused([{ ref: "a", task: "x", uniqueKey: "k" }], /node "a": uniqueKey is not allowed/);
  await refused([{ ref: "a", task: "x", payload: { n: NaN } }], /node "a": payload.n is NaN/);
  await refused([{ ref: "a", task: "x", priority: 1e6 }], /node "a": priority must be an integer/);
  await refused([{ ref: "a", task: "x", onParentFailure: "ignore" }], /node "a": onParentFailure must be "cancel" or "run"/);
  await refused([{ ref: "a", task: "x", dependson: [] }], /node "a": unknown option "dependson" \(did you mean "dependsOn"\?\)/);
  await refused([{ task: "x" }], /node 0: ref must be a non-empty string/);
  await refused("nodes", /a flow is an array of nodes/);
  const tooMany = Array.from({ length: 25_001 }, (_, i) => ({ ref: `n${i}`, task: "x" }));
  await refused(tooMany, /25,001 nodes, over the limit of 25,000 nodes/);
  const roots = Array.from({ length: 400 }, (_, i) => ({ ref: `r${i}`, task: "x" }));
  const wide = [...roots, ...Array.from({ length: 251 }, (_, i) => ({ ref: `j${i}`, task: "x", dependsOn: roots.map((r) => r.ref) }))];
  await refused(wide, /100,400 edges \(dependsOn entries\), over the limit of 100,000 edges/);
  // Batches share the checks.
  await assert.rejects(
    lh.enqueueBatch({ jobs: [{ task: "ok" }, { task: "x", uniqueKey: "k" }], onComplete: { task: "done" } }),
    /job 1: uniqueKey is not allowed/,
  );
  await assert.rejects(
    lh.enqueueBatch({ jobs: [{ task: "ok", payload: { f: () => 1 } }], onComplete: { task: "done" } }),
    /job 0: payload.f is a function/,
  );
  await assert.rejects(lh.enqueueBatch({ jobs: [], onComplete: { task: "bad name!" } }), /onComplete: task must be/);
  await assert.rejects(lh.enqueueBatch({ jobs: [] } as never), /batch: onComplete must be a job/);
  assert.equal(await checksum(lh), before);
});

test("the test kit's drain runs a flow through (a child released into another queue too) and reports a job blocked by a parent it cannot run", async (t) => {
  const q = await createTestQueue({ logger: silent, handlers: { a: () => {}, b: () => {}, c: () => {} } });
  t.after(() => q.close());
  const { jobs } = await q.lh.enqueueFlow([
    { ref: "a", task: "a" },
    { ref: "b", task: "b", queue: "later", dependsOn: ["a"] },
    { ref: "c", task: "c", dependsOn: ["b"] },
    { ref: "orphan-parent", task: "unhandled" },
    { ref: "stuck", task: "c", dependsOn: ["orphan-parent", "a"] },
  ]);
  const result = await q.drain({ leaveUnhandled: ["unhandled"] });
  assert.deepEqual(
    result.ran.map((r) => r.id),
    [jobs.a, jobs.b, jobs.c],
  );
  assert.deepEqual(
    result.left.map((l) => [l.id, l.why, l.waitingFor]),
    [
      [jobs["orphan-parent"], "no_handler", undefined],
      [jobs.stuck, "blocked", [jobs["orphan-parent"]]],
    ],
  );
});

test("retention forgets a dependent job's edges with it (history and dead letter); a child outliving its parent reads it as unknown", async (t) => {
  const lh = await freshLeasehold(t);
  // parent → kept (cancelled, recent), and parent → old (cancelled, past retention), and a dead child past dead retention.
  const { jobs } = await lh.enqueueFlow([
    { ref: "parent", task: "p" },
    { ref: "old", task: "c", dependsOn: ["parent"] },
    { ref: "kept", task: "c", dependsOn: ["parent"], onParentFailure: "run" },
  ]);
  const { id: deadParent } = await lh.enqueue("p", {});
  const { jobs: deadFlow } = await lh.enqueueFlow([{ ref: "deadChild", task: "c", dependsOn: [{ id: deadParent }] }]);
  await lh.cancel(jobs.parent!); // old: cancelled; kept: released
  await lh.cancel(deadParent); // deadChild: cancelled, then moved to the dead letter below
  await lh.pool.query(
    `WITH gone AS (DELETE FROM job_history WHERE id = $1 RETURNING *)
     INSERT INTO dead_jobs (id, queue, task, payload, priority, state, attempt, spent_attempts, max_attempts, lease_ms, created_at, finished_at)
     SELECT id, queue, task, payload, priority, 'dead', attempt, spent_attempts, max_attempts, lease_ms, created_at, now() - interval '9 days' FROM gone`,
    [deadFlow.deadChild],
  );
  const edges = async () =>
    (await lh.pool.query<{ child: string }>("SELECT child_id::text AS child FROM job_dependencies ORDER BY child_id")).rows.map((r) => r.child);
  assert.deepEqual(await edges(), [jobs.old, jobs.kept, deadFlow.deadChild]);
  const retention = lh.retention({ retainMs: 24 * 3600_000, retainDeadMs: 7 * 24 * 3600_000 });
  // old and the parent finished two days ago, in that time's generation.
  await lh.pool.query(
    `UPDATE job_history SET finished_at = now() - interval '2 days', generation = history_generation(now() - interval '2 days')
      WHERE id = ANY($1::bigint[])`,
    [[jobs.old, jobs.parent]],
  );
  assert.ok((await retention.runOnce()) >= 2);
  assert.deepEqual(await edges(), [jobs.kept], "the edges of the forgotten children are gone; the kept child's stays");
  const parents = await store.parentsOf(lh.pool, jobs.kept!);
  assert.deepEqual(
    parents.map((p) => [p.id, p.state]),
    [[jobs.parent, "unknown"]],
  );
});

test("two cancel cascades that cross wait for each other instead of deadlocking (migration 014 locks every descendant first)", async (t) => {
  const lh = await freshLeasehold(t);
  // pA's cascade reaches x1 through x2 and y1; pB's reaches x1 through y1.
  const { jobs } = await lh.enqueueFlow([
    { ref: "pA", task: "t" },
    { ref: "pB", task: "t" },
    { ref: "x2", task: "t", dependsOn: ["pA"] },
    { ref: "y1", task: "t", dependsOn: ["x2", "pB"] },
    { ref: "x1", task: "t", dependsOn: ["pA", "y1"] },
  ]);
  // Released in this test, not after it: the client's close waits for its connections.
  const [c1, c2] = await Promise.all([lh.pool.connect(), lh.pool.connect()]);
  try {
    const cancel = (c: pg.PoolClient, id: string) =>
      c.query(
        `WITH target AS (SELECT id, state FROM jobs WHERE id = $1 FOR UPDATE), ${CANCEL_TARGET}
       SELECT 'cancelled' AS result FROM ended`,
        [id],
      );
    // The second cascade has begun: it holds y1, the child of pB (as its first round does).
    await c2.query("BEGIN");
    await c2.query("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE", [jobs.y1]);
    await c1.query("BEGIN");
    const first = cancel(c1, jobs.pA!).then(
      () => "ok",
      (err: { code?: string }) => err.code,
    );
    await new Promise((r) => setTimeout(r, 300));
    const second = await cancel(c2, jobs.pB!).then(
      () => "ok",
      (err: { code?: string }) => err.code,
    );
    await c2.query(second === "ok" ? "COMMIT" : "ROLLBACK");
    const firstResult = await first;
    await c1.query(firstResult === "ok" ? "COMMIT" : "ROLLBACK");
    assert.deepEqual([firstResult, second], ["ok", "ok"], "neither cancel was aborted (40P01: deadlock detected)");
  } finally {
    c1.release();
    c2.release();
  }
  for (const ref of ["pA", "pB", "x2", "y1", "x1"]) assert.equal(await stateOf(lh, jobs[ref]!), "cancelled", ref);
});

test("the enqueue hooks see a flow's nodes and a batch's jobs (callback last), as one enqueue's jobs: headers they add are kept", async (t) => {
  const lh = await freshLeasehold(t);
  const seen: string[][] = [];
  const wrapped: number[] = [];
  lh.use({
    beforeEnqueue: (jobs) => {
      seen.push(jobs.map((j) => j.task));
      for (const j of jobs) j.headers = { ...j.headers, tenant: "acme" };
    },
    aroundEnqueue: async (jobs, _info, next) => {
      const enqueued = await next();
      wrapped.push(enqueued.length);
      return enqueued;
    },
  });
  const caller: FlowNode[] = [
    { ref: "a", task: "first" },
    { ref: "b", task: "second", dependsOn: ["a"] },
  ];
  const { jobs } = await lh.enqueueFlow(caller);
  assert.equal(caller[0]!.headers, undefined, "the caller's nodes are not changed");
  const { callbackId, jobIds } = await lh.enqueueBatch({ jobs: [{ task: "member" }, { task: "member" }], onComplete: { task: "done" } });
  assert.deepEqual(seen, [
    ["first", "second"],
    ["member", "member", "done"],
  ]);
  assert.deepEqual(wrapped, [2, 3]);
  const ids = [jobs.a!, jobs.b!, ...jobIds, callbackId];
  const { rows } = await lh.pool.query("SELECT headers FROM jobs WHERE id = ANY($1::bigint[])", [ids]);
  assert.equal(rows.length, 5);
  for (const r of rows) assert.deepEqual(r.headers, { tenant: "acme" });
  // A bad shape is refused before any hook runs.
  await assert.rejects(lh.enqueueFlow("nope" as never), /a flow is an array of nodes/);
  await assert.rejects(lh.enqueueBatch({ jobs: [] } as never), /onComplete must be a job/);
  assert.equal(seen.length, 2);
});
