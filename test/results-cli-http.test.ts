/**
 * Results and waiting through the HTTP API (`leasehold serve`'s routes, in this process) and the
 * built CLI (a real process, on the database and through the server): a job's result, parents
 * and children in `GET /v1/jobs/:id` and `jobs show`; the long poll `GET /v1/jobs/:id/wait` and
 * `jobs wait` with their timeout answers and exit codes. Flows are made here with SQL (rows in
 * job_dependencies and a blocked child), as a graph's enqueue would write them.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import type { FastifyInstance } from "fastify";
import { createServer } from "../packages/cli/src/server/app.js";
import * as store from "../packages/leasehold/src/store/index.js";
import { eventually, freshLeasehold } from "./helpers/db.js";
import { isOneLineError, runCli, startCli } from "./helpers/cli.js";
import { api as apiAt, TOKEN } from "./helpers/server.js";

const WORKER_TOKEN = "worker-token-0123456789abcdef";

let lh: Awaited<ReturnType<typeof freshLeasehold>>;
let app: FastifyInstance;
let base: string;
const api = (method: string, path: string, headers?: Record<string, string>) => apiAt(base, method, path, undefined, headers);

before(async () => {
  lh = await freshLeasehold();
  app = createServer({ leasehold: lh, token: TOKEN, workerToken: WORKER_TOKEN });
  await app.listen({ host: "127.0.0.1", port: 0 });
  base = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
});

after(async () => {
  await app.close();
  await lh.dispose();
});

/** Ends one job of `task` with the store's fenced statements: success with `result`, or dead. */
async function finish(task: string, end: { result: unknown } | { dead: string }): Promise<string> {
  const [job] = await store.claimJobs(lh.pool, { queues: ["default"], limit: 1, workerId: "w", leaseMs: 60_000, tasks: [task] });
  assert.ok(job, `a ${task} job`);
  if ("result" in end) {
    await store.completeJobs(lh.pool, { workerId: "w", jobs: [{ id: job.id, attempt: job.attempt, resultJson: JSON.stringify(end.result) }] });
  } else {
    await store.failJobs(lh.pool, {
      workerId: "w",
      failures: [{ id: job.id, attempt: job.attempt, error: end.dead, backoff: { baseMs: 0, factor: 1, maxMs: 0, jitter: 0 }, giveUp: true }],
    });
  }
  return job.id;
}

/**
 * A flow made by hand: `fetch` (pending) and an earlier parent `gone` that retention forgot
 * (an edge to an id with no job), both parents of `report`, which is blocked on `fetch`.
 */
async function flow(): Promise<{ fetch: string; report: string }> {
  const { id: fetch } = await lh.enqueue("fetch");
  const { id: report } = await lh.enqueue("report");
  await lh.pool.query("UPDATE jobs SET has_dependents = true WHERE id = $1", [fetch]);
  await lh.pool.query("UPDATE jobs SET state = 'blocked', parents_pending = 1, on_parent_failure = 'cancel' WHERE id = $1", [report]);
  await lh.pool.query("INSERT INTO job_dependencies (child_id, parent_id, ref) VALUES ($1, $2, 'fetch'), ($1, 999999999, NULL)", [report, fetch]);
  return { fetch, report };
}

test("GET /v1/jobs/:id carries the result and the job's parents and children with their states", async () => {
  const { fetch, report } = await flow();
  const blocked = await api("GET", `/v1/jobs/${report}`);
  assert.equal(blocked.status, 200, blocked.text);
  assert.equal(blocked.json.job.result, null);
  assert.deepEqual(blocked.json.parents, [
    { id: fetch, ref: "fetch", task: "fetch", state: "waiting" },
    { id: "999999999", ref: null, task: null, state: "unknown" },
  ]);
  assert.deepEqual([blocked.json.children, blocked.json.parentCount, blocked.json.childCount], [[], 2, 0]);

  assert.equal(await finish("fetch", { result: { rows: 3 } }), fetch);
  const parent = await api("GET", `/v1/jobs/${fetch}`);
  assert.deepEqual(parent.json.job.result, { rows: 3 });
  // Its end released the child (migration 014's trigger): the child's state reads so.
  assert.deepEqual(parent.json.children, [{ id: report, ref: "fetch", task: "report", state: "waiting" }]);
  assert.deepEqual(parent.json.parents, []);
  const listed = await api("GET", `/v1/jobs?state=succeeded&payload=true`);
  assert.deepEqual(listed.json.jobs.find((j: { id: string }) => j.id === fetch).result, { rows: 3 });
});

test("GET /v1/jobs/:id/wait answers when the job ends, or at its timeout with finished false; unknown ids 404, bad timeouts 400", async () => {
  await lh.enqueueMany([{ task: "w1" }, { task: "w2" }, { task: "w3" }]);
  const done = await finish("w1", { result: "already" });
  const now = await api("GET", `/v1/jobs/${done}/wait`);
  assert.equal(now.status, 200, now.text);
  assert.deepEqual([now.json.finished, now.json.job.state, now.json.job.result], [true, "succeeded", "already"]);

  const [pending] = await store.claimJobs(lh.pool, { queues: ["default"], limit: 1, workerId: "w", leaseMs: 60_000, tasks: ["w2"] });
  const waiting = api("GET", `/v1/jobs/${pending!.id}/wait?timeoutMs=20000`);
  await eventually(async () => (await lh.pool.query("SELECT watched FROM jobs WHERE id = $1", [pending!.id])).rows[0].watched, "marked");
  await store.completeJobs(lh.pool, { workerId: "w", jobs: [{ id: pending!.id, attempt: pending!.attempt, resultJson: '{"woken":true}' }] });
  const woken = await waiting;
  assert.deepEqual([woken.json.finished, woken.json.job.result], [true, { woken: true }]);

  const { id: slow } = await lh.enqueue("never");
  const timedOut = await api("GET", `/v1/jobs/${slow}/wait?timeoutMs=200`);
  assert.equal(timedOut.status, 200, timedOut.text);
  assert.deepEqual([timedOut.json.finished, timedOut.json.job.state, timedOut.json.job.id], [false, "waiting", slow]);

  const dead = await finish("w3", { dead: "broke" });
  const deadWait = await api("GET", `/v1/jobs/${dead}/wait?timeoutMs=1000`);
  assert.deepEqual([deadWait.json.finished, deadWait.json.job.state, deadWait.json.job.lastError], [true, "dead", "broke"]);

  const unknown = await api("GET", "/v1/jobs/987654321/wait?timeoutMs=100");
  assert.deepEqual([unknown.status, unknown.json.error.code], [404, "job_not_found"]);
  for (const bad of ["abc", "-5", "1.5"]) {
    const r = await api("GET", `/v1/jobs/${slow}/wait?timeoutMs=${bad}`);
    assert.equal(r.status, 400, `${bad}: ${r.text}`);
  }
  const asWorker = await api("GET", `/v1/jobs/${slow}/wait?timeoutMs=100`, { authorization: `Bearer ${WORKER_TOKEN}` });
  assert.equal(asWorker.status, 403, "an operator's route");
  assert.equal((await lh.getJob(slow)).job.state, "waiting", "waiting changed nothing");
});

test("jobs show prints the result, parents and children; jobs wait exits 0 succeeded, 6 dead or cancelled, 7 timed out, 3 unknown", async () => {
  const cli = (...args: string[]) => runCli(args, { schema: lh.schema });
  const { fetch, report } = await flow();
  await finish("fetch", { result: { rows: 7 } });

  const shown = await cli("jobs", "show", fetch);
  assert.equal(shown.code, 0, shown.stderr);
  assert.match(shown.stdout, /^result\s+\{"rows":7\}$/m);
  assert.match(shown.stdout, new RegExp(`children:\\nID\\s+REF\\s+TASK\\s+STATE\\n${report}\\s+fetch\\s+report\\s+waiting`));
  const child = await cli("jobs", "show", report);
  assert.match(child.stdout, /^result\s+-$/m);
  assert.match(child.stdout, new RegExp(`parents:\\n.*\\n${fetch}\\s+fetch\\s+fetch\\s+succeeded\\n999999999\\s+-\\s+-\\s+unknown`));
  const json = JSON.parse((await cli("jobs", "show", fetch, "--json")).stdout);
  assert.deepEqual([json.job.result, json.children.length, json.childCount], [{ rows: 7 }, 1, 1]);

  const ok = await cli("jobs", "wait", fetch);
  assert.equal(ok.code, 0, ok.stderr);
  assert.equal(ok.stdout.trim(), `job ${fetch} succeeded; result: {"rows":7}`);
  const okJson = await cli("jobs", "wait", fetch, "--json");
  assert.deepEqual(JSON.parse(okJson.stdout).result, { rows: 7 });

  await lh.enqueue("doomed");
  const dead = await finish("doomed", { dead: "no luck" });
  const deadRun = await cli("jobs", "wait", dead);
  assert.equal(deadRun.code, 6, deadRun.stderr);
  assert.equal(deadRun.stdout.trim(), `job ${dead} dead: no luck`);

  const { id: cancelled } = await lh.enqueue("never");
  const waiting = cli("jobs", "wait", cancelled, "--timeout", "30s");
  await eventually(async () => (await lh.pool.query("SELECT watched FROM jobs WHERE id = $1", [cancelled])).rows[0].watched, "marked");
  await lh.cancel(cancelled);
  const cancelRun = await waiting;
  assert.equal(cancelRun.code, 6, cancelRun.stderr);
  assert.match(cancelRun.stdout, new RegExp(`^job ${cancelled} cancelled`));

  const { id: slow } = await lh.enqueue("never");
  const late = await cli("jobs", "wait", slow, "--timeout", "300ms");
  assert.equal(late.code, 7, late.stderr);
  assert.ok(isOneLineError(late.stderr), late.stderr);
  assert.match(late.stderr, new RegExp(`job ${slow} did not finish within 300 ms`));

  const unknown = await cli("jobs", "wait", "987654321", "--timeout", "1s");
  assert.equal(unknown.code, 3, unknown.stderr);
  const badTimeout = await cli("jobs", "wait", slow, "--timeout", "soon");
  assert.equal(badTimeout.code, 2);
  assert.ok(isOneLineError(badTimeout.stderr), badTimeout.stderr);
});

test("through a server (--server, no database): jobs show and jobs wait behave the same", async () => {
  const env = { DATABASE_URL: "postgres://nobody@127.0.0.1:1/none", LEASEHOLD_TOKEN: TOKEN };
  const cli = (...args: string[]) => runCli(["--server", base, ...args], { schema: lh.schema, env });
  const { fetch, report } = await flow();

  const waiting = cli("jobs", "wait", fetch, "--timeout", "30s", "--json");
  await eventually(async () => (await lh.pool.query("SELECT watched FROM jobs WHERE id = $1", [fetch])).rows[0].watched, "marked");
  await finish("fetch", { result: ["remote"] });
  const ok = await waiting;
  assert.equal(ok.code, 0, ok.stderr);
  assert.deepEqual(JSON.parse(ok.stdout).result, ["remote"]);

  const shown = await cli("jobs", "show", report);
  assert.equal(shown.code, 0, shown.stderr);
  assert.match(shown.stdout, new RegExp(`parents:\\n.*\\n${fetch}\\s+fetch\\s+fetch\\s+succeeded`));

  const { id: slow } = await lh.enqueue("never");
  const late = await cli("jobs", "wait", slow, "--timeout", "500ms");
  assert.equal(late.code, 7, late.stderr);
  assert.match(late.stderr, new RegExp(`job ${slow} did not finish within 500 ms`));
  const unknown = await cli("jobs", "wait", "987654321", "--timeout", "1s");
  assert.equal(unknown.code, 3, unknown.stderr);
});

test("worker --max-result-bytes: a handler's result over it ends its job dead; one within it is kept", async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-tasks-"));
  const tasksFile = path.join(dir, "tasks.mjs");
  fs.writeFileSync(tasksFile, `export default { small: () => ({ ok: 1 }), large: () => ({ blob: "z".repeat(100) }) };\n`);
  const [small, large] = await lh.enqueueMany([
    { task: "small", queue: "cliw" },
    { task: "large", queue: "cliw", maxAttempts: 5 },
  ]);
  const bad = await runCli(["worker", "--tasks", tasksFile, "--max-result-bytes", "0"], { schema: lh.schema });
  assert.equal(bad.code, 2, bad.stderr);
  assert.ok(isOneLineError(bad.stderr), bad.stderr);
  const worker = await startCli(["worker", "--tasks", tasksFile, "--queues", "cliw", "--max-result-bytes", "50", "--no-retention"], {
    schema: lh.schema,
    ready: /running small, large/,
  });
  try {
    assert.deepEqual((await lh.waitFor(small!.id, { timeoutMs: 15_000 })).result, { ok: 1 });
    const dead = await lh.waitFor(large!.id, { timeoutMs: 15_000 });
    assert.deepEqual([dead.state, dead.attempt], ["dead", 1]);
    assert.match(dead.lastError!, /result is 111 bytes, over maxResultBytes \(50\)/);
  } finally {
    assert.equal((await worker.stop("SIGTERM")).code, 0);
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("50 HTTP waits share the server's one waiting session; past --max-long-polls a wait answers at once", async () => {
  const { id } = await lh.enqueue("many");
  const waits = Array.from({ length: 50 }, () => api("GET", `/v1/jobs/${id}/wait?timeoutMs=20000`));
  await eventually(async () => (await lh.pool.query("SELECT watched FROM jobs WHERE id = $1", [id])).rows[0].watched, "marked");
  const { rows } = await lh.pool.query("SELECT count(*)::int AS n FROM pg_stat_activity WHERE query = $1", [`LISTEN "leasehold:${lh.schema}:ended"`]);
  assert.equal(rows[0].n, 1, "one session for every wait");
  await finish("many", { result: "all of them" });
  for (const w of await Promise.all(waits)) assert.deepEqual([w.json.finished, w.json.job.result], [true, "all of them"]);

  const capped = createServer({ leasehold: lh, token: TOKEN, limits: { maxLongPolls: 0 } });
  await capped.listen({ host: "127.0.0.1", port: 0 });
  try {
    const { id: slow } = await lh.enqueue("never");
    const at = `http://127.0.0.1:${(capped.server.address() as { port: number }).port}`;
    const r = await apiAt(at, "GET", `/v1/jobs/${slow}/wait?timeoutMs=30000`);
    assert.deepEqual([r.status, r.json.finished, r.json.job.state], [200, false, "waiting"]);
    const { rows: marked } = await lh.pool.query("SELECT watched FROM jobs WHERE id = $1", [slow]);
    assert.equal(marked[0].watched, false, "answered as it was, without waiting for it");
  } finally {
    await capped.close();
  }
});
