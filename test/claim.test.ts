import { test } from "node:test";
import assert from "node:assert/strict";
import pg from "pg";
// @ts-expect-error: pg ships no types for its utils; prepareValue turns JS arrays into array literals.
import { prepareValue } from "pg/lib/utils.js";
import * as store from "../packages/leasehold/src/store/index.js";
import { registeredStatements } from "../packages/leasehold/src/store/sql.js";
import { freshLeasehold, databaseUrl, NO_BACKOFF } from "./helpers/db.js";

const LEASE = 30_000;

test("concurrent claimers never share a job, and together they claim every job", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.enqueueMany(Array.from({ length: 2_000 }, (_, i) => ({ task: "t", payload: { i } })));
  const claimers = 8;
  const pools = Array.from({ length: claimers }, () => store.createPool({ connectionString: databaseUrl(), schema: lh.schema, max: 1 }));
  t.after(() => Promise.all(pools.map((p) => p.end())).then(() => {}));
  const claimed = await Promise.all(
    pools.map(async (pool, k) => {
      const mine: string[] = [];
      for (;;) {
        const jobs = await store.claimJobs(pool, { queues: ["default"], limit: 37, workerId: `w${k}`, leaseMs: LEASE, tasks: ["t"] });
        if (jobs.length === 0) return mine;
        mine.push(...jobs.map((j) => j.id));
      }
    }),
  );
  const all = claimed.flat();
  assert.equal(new Set(all).size, all.length, "a job was claimed twice");
  assert.equal(all.length, 2_000);
  assert.ok(claimed.filter((c) => c.length > 0).length > 1, "the claimers should have run concurrently");
  const { rows } = await lh.pool.query("SELECT count(*)::int AS n FROM jobs WHERE state = 'running' AND attempt = 1 AND lease_until > now()");
  assert.equal(rows[0].n, 2_000);
});

test("a claim grants the lease in the same statement: running, lease, worker, attempt + 1", async (t) => {
  const lh = await freshLeasehold(t);
  const { id } = await lh.enqueue("t", { a: 1 }, { leaseMs: 5_000 });
  const [job] = await store.claimJobs(lh.pool, { queues: ["default"], limit: 10, workerId: "w1", leaseMs: LEASE, tasks: ["t"] });
  assert.equal(job!.id, id);
  assert.equal(job!.attempt, 1);
  assert.equal(job!.leaseMs, 5_000, "the job's own lease length wins over the worker's");
  const { rows } = await lh.pool.query(
    "SELECT state, locked_by, attempt, extract(epoch FROM lease_until - now()) AS left_s FROM jobs WHERE id = $1",
    [id],
  );
  assert.equal(rows[0].state, "running");
  assert.equal(rows[0].locked_by, "w1");
  assert.ok(rows[0].left_s > 3 && rows[0].left_s <= 5, `lease should be ~5 s, is ${rows[0].left_s}`);
});

test("a claim records its start after what it saw: a child released while the claiming transaction was already open starts after its parent ended", async (t) => {
  const lh = await freshLeasehold(t);
  const { jobs } = await lh.enqueueFlow([
    { ref: "parent", task: "t" },
    { ref: "child", task: "t", dependsOn: ["parent"] },
  ]);
  const claimer = new pg.Client({ connectionString: databaseUrl(), options: `-c search_path=${lh.schema}` });
  await claimer.connect();
  t.after(() => claimer.end());
  // The claim's transaction begins (its now() is fixed here) before the parent even finishes,
  // as when a claiming backend is slow between its start and its snapshot.
  await claimer.query("BEGIN");
  await claimer.query("SELECT now()");
  const [parent] = await store.claimJobs(lh.pool, { queues: ["default"], limit: 1, workerId: "w1", leaseMs: LEASE, tasks: ["t"] });
  assert.equal(parent!.id, jobs.parent);
  await store.completeJobs(lh.pool, { workerId: "w1", jobs: [{ id: parent!.id, attempt: parent!.attempt }] });
  // Read committed: the claim's snapshot sees the child released by the parent's success.
  const [child] = await store.claimJobs(claimer, { queues: ["default"], limit: 1, workerId: "w2", leaseMs: LEASE, tasks: ["t"] });
  await claimer.query("COMMIT");
  assert.equal(child!.id, jobs.child);
  const { rows } = await lh.pool.query(
    `SELECT (SELECT finished_at FROM job_history WHERE id = $1) AS parent_ended, (SELECT started_at FROM jobs WHERE id = $2) AS child_started`,
    [jobs.parent, jobs.child],
  );
  assert.ok(
    rows[0].child_started > rows[0].parent_ended,
    `child started ${rows[0].child_started.toISOString()}, parent ended ${rows[0].parent_ended.toISOString()}`,
  );
});

test("a claim reads its start time before it looks for jobs: the one-time filter on claimed_at gates the scan of next", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.enqueueMany(Array.from({ length: 20 }, () => ({ task: "t" })));
  // Read after the rows are found and locked, a claim whose snapshot came before a pause could
  // record a start after pauseQueue returned; the plan must read the clock first.
  const text = registeredStatements().find((s) => s.name === "claimJobs (one queue)")!.text;
  const { rows } = await lh.pool.query(`EXPLAIN (COSTS OFF) ${text}`, [["default"], 5, "w", LEASE, ["t"]]);
  const plan = rows.map((r) => r["QUERY PLAN"] as string).join("\n");
  assert.match(plan, /One-Time Filter: \(.+ IS NOT NULL\)\n.*InitPlan.*\n.*CTE Scan on claimed_at.*\n.*CTE Scan on next/, plan);
});

test("the schema refuses a running job without a lease", async (t) => {
  const lh = await freshLeasehold(t);
  const { id } = await lh.enqueue("t");
  await assert.rejects(lh.pool.query("UPDATE jobs SET state = 'running' WHERE id = $1", [id]), /jobs_running_has_lease/);
});

test("claims go by priority (lower first), then run_at, then id, across queues", async (t) => {
  const lh = await freshLeasehold(t);
  const low = await lh.enqueue("t", {}, { priority: 5 });
  const a = await lh.enqueue("t", {}, { queue: "b" });
  const b = await lh.enqueue("t", {});
  const urgent = await lh.enqueue("t", {}, { priority: -3, queue: "b" });
  const order: string[] = [];
  for (;;) {
    const jobs = await store.claimJobs(lh.pool, { queues: ["default", "b"], limit: 1, workerId: "w", leaseMs: LEASE, tasks: ["t"] });
    if (jobs.length === 0) break;
    order.push(jobs[0]!.id);
  }
  assert.deepEqual(order, [urgent.id, a.id, b.id, low.id]);
});

test("delayed jobs are not claimed before their time, by the database clock", async (t) => {
  const lh = await freshLeasehold(t);
  const later = await lh.enqueue("t", {}, { delayMs: 60_000 });
  const soon = await lh.enqueue("t", {}, { delayMs: 300 });
  const claim = () => store.claimJobs(lh.pool, { queues: ["default"], limit: 10, workerId: "w", leaseMs: LEASE, tasks: ["t"] });
  assert.deepEqual(await claim(), []);
  await new Promise((r) => setTimeout(r, 400));
  assert.deepEqual(
    (await claim()).map((j) => j.id),
    [soon.id],
  );
  // Move the delayed job's time into the past, as the clock would.
  await lh.pool.query("UPDATE jobs SET run_at = now() - interval '1 s' WHERE id = $1", [later.id]);
  assert.deepEqual(
    (await claim()).map((j) => j.id),
    [later.id],
  );
});

test("a worker claims only the tasks it has handlers for", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.enqueue("email");
  const video = await lh.enqueue("video");
  const jobs = await store.claimJobs(lh.pool, { queues: ["default"], limit: 10, workerId: "w", leaseMs: LEASE, tasks: ["video"] });
  assert.deepEqual(
    jobs.map((j) => j.id),
    [video.id],
  );
});

test("completion and heartbeat fences keep an index plan under a generic plan (the prepared-statement trap)", async (t) => {
  // pg switches a named prepared statement to a generic plan after 5 runs, and a fence
  // written as `IN (SELECT unnest ...)` was measured turning into a nested loop over every
  // running job. Capture our real statements and explain them as generic plans.
  const lh = await freshLeasehold(t);
  await lh.enqueueMany(Array.from({ length: 3_000 }, () => ({ task: "t" })));
  const running = await store.claimJobs(lh.pool, { queues: ["default"], limit: 500, workerId: "w", leaseMs: LEASE, tasks: ["t"] });
  await lh.pool.query("ANALYZE jobs");
  const client = new pg.Client({ connectionString: databaseUrl(), options: `-c search_path=${lh.schema}` });
  await client.connect();
  t.after(() => client.end());
  const captured: { text: string; values: unknown[] }[] = [];
  const recorder = {
    query: (text: string, values?: unknown[]) => (captured.push({ text, values: values ?? [] }), client.query(text, values)),
  } as unknown as store.Queryable;
  const refs = running.slice(0, 50).map((j) => ({ id: j.id, attempt: j.attempt }));
  await store.extendLeases(recorder, { workerId: "w", leaseMs: LEASE, beats: refs });
  await store.completeJobs(recorder, { workerId: "w", jobs: refs.slice(0, 10) });
  await store.failJobs(recorder, { workerId: "w", failures: refs.slice(10, 20).map((r) => ({ ...r, error: "x", backoff: NO_BACKOFF })) });
  await client.query("SET plan_cache_mode = force_generic_plan");
  for (const [i, q] of captured.entries()) {
    await client.query(`PREPARE s${i} AS ${q.text}`);
    const args = q.values.map((v) => (v === null ? "NULL" : client.escapeLiteral(String(prepareValue(v))))).join(", ");
    const plan = await client.query(`EXPLAIN (FORMAT JSON) EXECUTE s${i}(${args})`);
    const text = JSON.stringify(plan.rows[0]["QUERY PLAN"]);
    assert.match(text, /jobs_pkey/, `statement ${i} should reach jobs through its primary key:\n${q.text}`);
    assert.doesNotMatch(text, /"Seq Scan","Parallel Aware":false,"Async Capable":false,"Relation Name":"jobs"/, `statement ${i} scans jobs`);
  }
});
