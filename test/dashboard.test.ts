/**
 * What the dashboard reads and does, without a browser: the monitor routes (overview,
 * running, running long, activity, recoveries), bulk retry and cancel with a confirmed count, the page's
 * headers, `--dashboard off`, and `leasehold jobs watch` on the database and over the API.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import type { FastifyInstance } from "fastify";
import { ThroughputSampler } from "../packages/leasehold/src/maintenance/throughput.js";
import { createServer } from "../packages/cli/src/server/app.js";
import type { DashboardMode } from "../packages/cli/src/server/dashboard.js";
import * as store from "../packages/leasehold/src/store/index.js";
import { eventually, freshLeasehold, silent } from "./helpers/db.js";
import { runCli } from "./helpers/cli.js";
import { api as apiAt, TOKEN } from "./helpers/server.js";

let lh: Awaited<ReturnType<typeof freshLeasehold>>;
let base: string;
const servers: FastifyInstance[] = [];
const api = (method: string, path: string, body?: unknown, headers?: Record<string, string>) => apiAt(base, method, path, body, headers);

async function startServer(dashboard: DashboardMode = "on"): Promise<string> {
  const app = createServer({ leasehold: lh, token: TOKEN, dashboard, sampleIntervalMs: 1_000 });
  servers.push(app);
  await app.listen({ host: "127.0.0.1", port: 0 });
  return `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
}

/** Claims one job of `task` as worker `w` and reports `progress` for it. */
async function runningWithProgress(task: string, queue: string, progress: unknown): Promise<string> {
  const { id } = await lh.enqueue(task, null, { queue });
  const [job] = await store.claimJobs(lh.pool, { queues: [queue], limit: 1, workerId: "w-watch", leaseMs: 60_000, tasks: [task] });
  assert.equal(job!.id, id);
  await lh.pool.query("UPDATE jobs SET progress = $2 WHERE id = $1", [id, JSON.stringify(progress)]);
  return id;
}

before(async () => {
  lh = await freshLeasehold();
  base = await startServer();
});

after(async () => {
  for (const app of servers) await app.close();
  await lh.dispose();
});

test("the page and its assets carry a strict policy and need no token; the data does", async () => {
  for (const path of ["/", "/assets/main.js", "/assets/uplot.js", "/assets/dashboard.css"]) {
    const r = await api("GET", path, undefined, {});
    assert.equal(r.status, 200, path);
    assert.match(r.headers.get("content-security-policy")!, /^default-src 'none'; script-src 'self'; style-src 'self'/);
    assert.match(r.headers.get("content-security-policy")!, /frame-ancestors 'none'/);
    assert.equal(r.headers.get("x-content-type-options"), "nosniff");
  }
  const traversal = await api("GET", "/assets/%2e%2e%2fpackage.json", undefined, {});
  assert.ok(traversal.status === 400 || traversal.status === 404, "only the files it lists");
  assert.equal((await api("GET", "/assets/nope.js", undefined, {})).status, 404);
  for (const path of ["/v1/overview", "/v1/running", "/v1/activity", "/v1/recoveries", "/v1/bulk/retry?state=dead"]) {
    assert.equal((await api("GET", path, undefined, {})).status, 401, path);
  }
  const off = await startServer("off");
  assert.equal((await apiAt(off, "GET", "/")).status, 404);
  assert.equal((await apiAt(off, "GET", "/v1/overview")).status, 200, "the API stays");
});

test("overview: counts by queue incl. scheduled, the oldest ready job's age, live processes", async () => {
  await lh.enqueue("t", null, { queue: "ov" });
  await lh.enqueue("t", null, { queue: "ov", runAt: new Date(Date.now() + 3_600_000) });
  await lh.pool.query("UPDATE jobs SET run_at = now() - interval '5 seconds' WHERE queue = 'ov' AND run_at <= now()");
  const r = await api("GET", "/v1/overview");
  assert.equal(r.status, 200);
  const ov = r.json.queues.find((q: { queue: string }) => q.queue === "ov");
  assert.equal(ov.waiting, 1);
  assert.equal(ov.scheduled, 1);
  assert.equal(ov.running, 0);
  assert.ok(ov.oldestWaitingMs >= 4_900 && ov.oldestWaitingMs < 60_000, String(ov.oldestWaitingMs));
  assert.ok(Array.isArray(r.json.processes));
});

test("running: lease left, last beat and the progress fraction", async () => {
  const id = await runningWithProgress("report", "run", { done: 3, of: 4 });
  const r = await api("GET", "/v1/running?queue=run");
  assert.equal(r.status, 200);
  const [job] = r.json.jobs;
  assert.equal(job.id, id);
  assert.equal(job.progressFraction, 0.75);
  assert.equal(job.workerId, "w-watch");
  assert.ok(job.leaseLeftMs > 50_000 && job.leaseLeftMs <= 60_000);
  assert.equal((await api("GET", "/v1/running?limit=0")).status, 400);
  assert.equal((await api("GET", "/v1/running?queue=bad%20name!")).status, 400);
});

test("running long: a job far past its task's usual run time is listed, one within normal is not", async () => {
  // The task's history: enough quick successes to judge it by (one in eight is sampled: ~50).
  const done = await lh.enqueueMany(Array.from({ length: 400 }, () => ({ task: "thumbnail", queue: "rl" })));
  const claimed = await store.claimJobs(lh.pool, { queues: ["rl"], limit: done.length, workerId: "w-rl", leaseMs: 60_000, tasks: ["thumbnail"] });
  await store.completeJobs(lh.pool, { workerId: "w-rl", jobs: claimed.map((j) => ({ id: j.id, attempt: j.attempt })) });
  const stuck = await lh.enqueue("thumbnail", null, { queue: "rl" });
  const normal = await lh.enqueue("thumbnail", null, { queue: "rl" });
  await store.claimJobs(lh.pool, { queues: ["rl"], limit: 2, workerId: "w-rl", leaseMs: 60_000, tasks: ["thumbnail"] });
  await lh.pool.query("UPDATE jobs SET started_at = now() - interval '5 minutes' WHERE id = $1", [stuck.id]);
  const r = await api("GET", "/v1/running-long?queue=rl");
  assert.equal(r.status, 200);
  const { rows: sampled } = await lh.pool.query<{ n: number }>(
    "SELECT count(*)::int AS n FROM job_history WHERE task = 'thumbnail' AND outcome = 'succeeded' AND (hashint8(id) & 7) = 0",
  );
  assert.ok(sampled[0]!.n >= store.MIN_RUN_TIME_SAMPLES && sampled[0]!.n < 100, `sampled ${sampled[0]!.n}`);
  assert.deepEqual(
    r.json.jobs.map((j: { id: string; samples: number }) => [j.id, j.samples]),
    [[stuck.id, sampled[0]!.n]],
  );
  assert.ok(r.json.jobs[0].runningMs >= 300_000 && r.json.jobs[0].usualP99Ms < 10_000, JSON.stringify(r.json.jobs[0]));
  assert.deepEqual([r.json.minSamples, r.json.factor, r.json.more], [store.MIN_RUN_TIME_SAMPLES, store.RUNNING_LONG_FACTOR, false]);
  // Both run; only the stuck one is long.
  const running = await api("GET", "/v1/running?queue=rl");
  assert.deepEqual(running.json.jobs.map((j: { id: string }) => j.id).sort(), [stuck.id, normal.id].sort());
  assert.equal((await api("GET", "/v1/running-long?limit=0")).status, 400);
  assert.equal((await api("GET", "/v1/running-long", undefined, {})).status, 401);
});

test("activity: throughput from the sampled counters, recoveries per minute", async () => {
  const sampler = new ThroughputSampler(lh.pool, silent, { intervalMs: 1_000 });
  await sampler.runOnce();
  await lh.enqueueMany(Array.from({ length: 20 }, () => ({ task: "t", queue: "tp" })));
  // PostgreSQL flushes a backend's counters about once a second.
  await eventually(
    async () => {
      await sampler.runOnce();
      const r = await api("GET", "/v1/activity");
      return r.json.throughput.some((p: { enqueued: number | null }) => (p.enqueued ?? 0) > 0);
    },
    "a sample shows the enqueues",
    20_000,
  );
  const r = await api("GET", "/v1/activity");
  assert.equal(r.json.windowMs, 3_600_000);
  assert.equal(r.json.counting, true);
});

test("bulk retry: a count first, then the action only for the confirmed number", async () => {
  const ids: string[] = [];
  for (let i = 0; i < 3; i++) {
    const { id } = await lh.enqueue("bulky", { i }, { queue: "bulk", maxAttempts: 1 });
    ids.push(id);
  }
  await lh.pool.query("UPDATE jobs SET run_at = now() WHERE queue = 'bulk'");
  const claimed = await store.claimJobs(lh.pool, { queues: ["bulk"], limit: 3, workerId: "w-bulk", leaseMs: 60_000, tasks: ["bulky"] });
  await store.failJobs(lh.pool, {
    workerId: "w-bulk",
    failures: claimed.map((j) => ({ id: j.id, attempt: j.attempt, error: "boom", backoff: { baseMs: 0, factor: 1, maxMs: 0, jitter: 0 } })),
  });
  const count = await api("GET", "/v1/bulk/retry?state=dead&queue=bulk");
  assert.deepEqual({ matched: count.json.matched, action: count.json.action }, { matched: 3, action: "retry" });
  // Confirmed fewer than match now: nothing changes.
  const tooFew = await api("POST", "/v1/bulk/retry", { state: "dead", queue: "bulk", confirmed: 2 });
  assert.equal(tooFew.status, 409);
  assert.equal(tooFew.json.error.code, "count_changed");
  assert.equal((await lh.getJob(ids[0]!)).job.state, "dead");
  assert.equal((await api("POST", "/v1/bulk/retry", { state: "dead", queue: "bulk" })).status, 400, "confirmed is required");
  assert.equal((await api("POST", "/v1/bulk/retry", { state: "dead", queue: "bulk", confirmed: 3, extra: 1 })).status, 400);
  const done = await api("POST", "/v1/bulk/retry", { state: "dead", queue: "bulk", confirmed: 3 });
  assert.equal(done.status, 200, done.text);
  assert.equal(done.json.changed, 3);
  for (const id of ids) assert.equal((await lh.getJob(id)).job.state, "waiting");
  // Cancel what is waiting in the queue now.
  const c = await api("GET", "/v1/bulk/cancel?queue=bulk");
  assert.equal(c.json.matched, 3);
  const cancelled = await api("POST", "/v1/bulk/cancel", { queue: "bulk", confirmed: 3 });
  assert.equal(cancelled.json.changed, 3);
  for (const id of ids) assert.equal((await lh.getJob(id)).job.state, "cancelled");
});

test("jobs list filters by task and time", async () => {
  await lh.enqueue("needle", null, { queue: "search" });
  await lh.enqueue("hay", null, { queue: "search" });
  const r = await api("GET", `/v1/jobs?queue=search&task=needle&from=${new Date(Date.now() - 60_000).toISOString()}`);
  assert.equal(r.status, 200);
  assert.deepEqual(
    r.json.jobs.map((j: { task: string }) => j.task),
    ["needle"],
  );
  assert.equal((await api("GET", "/v1/jobs?from=yesterday")).status, 400);
});

test("leasehold jobs watch: counts per queue and running jobs with a progress bar, on the database and over the API", async () => {
  await runningWithProgress("watched", "watchq", { fraction: 0.5 });
  const onDb = await runCli(["jobs", "watch", "--once"], { schema: lh.schema });
  assert.equal(onDb.code, 0, onDb.stderr);
  assert.match(onDb.stdout, /QUEUE\s+WAITING\s+SCHEDULED\s+RUNNING\s+DEAD/);
  assert.match(onDb.stdout, /watchq/);
  assert.match(onDb.stdout, /watched\s+watchq\s+\[#{10}-{10}\]\s+50%/);
  const overApi = await runCli(["jobs", "watch", "--once", "--json", "--server", base], { schema: lh.schema, env: { LEASEHOLD_TOKEN: TOKEN } });
  assert.equal(overApi.code, 0, overApi.stderr);
  const frame = JSON.parse(overApi.stdout);
  assert.ok(frame.queues.some((q: { queue: string }) => q.queue === "watchq"));
  assert.ok(frame.running.some((j: { task: string; progressFraction: number }) => j.task === "watched" && j.progressFraction === 0.5));
});
