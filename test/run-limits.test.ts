/**
 * The maximum run time every job has unless it opts out: the 15-minute default, a worker's,
 * a task's or a job's own limit (a job's beats its task's), `null` at each level, both
 * enforcers (the worker by its clock, the watchdog by the database's), the checks at every
 * boundary (library, SQL, HTTP, CLI), and `leasehold doctor` naming jobs that run far longer
 * than their task usually takes.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";
import type { FastifyInstance } from "fastify";
import type { JobAbortedError, JobContext } from "../packages/leasehold/src/worker/context.js";
import { DEFAULT_MAX_RUN_MS } from "../packages/leasehold/src/worker/options.js";
import { createServer } from "../packages/cli/src/server/app.js";
import * as store from "../packages/leasehold/src/store/index.js";
import { databaseUrl, eventually, freshLeasehold, NO_BACKOFF } from "./helpers/db.js";
import { runCli } from "./helpers/cli.js";
import { api, TOKEN } from "./helpers/server.js";

const CHILD = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "helpers", "worker-child.ts");
const forever = () => new Promise<never>(() => {});
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
type Lh = Awaited<ReturnType<typeof freshLeasehold>>;

const finalOf = async (lh: Lh, id: string) => {
  const { job } = await lh.getJob(id);
  return ["succeeded", "dead", "cancelled"].includes(job.state) ? job : undefined;
};
const outcomes = async (lh: Lh, id: string) => (await lh.getJob(id)).attempts.map((a) => a.outcome);

test("every task runs under the 15-minute default unless it or its worker sets another; null opts out; the watchdog learns each", async (t) => {
  const lh = await freshLeasehold(t);
  const handler = () => undefined;
  const plain = lh.worker({
    watchdog: false,
    handlers: { "t.default": handler, "t.own": { handler, maxRunMs: 60_000 }, "t.none": { handler, maxRunMs: null } },
  });
  assert.equal(DEFAULT_MAX_RUN_MS, 15 * 60_000);
  assert.equal(plain.settings.tasks.get("t.default")!.maxRunMs, DEFAULT_MAX_RUN_MS);
  assert.equal(plain.settings.tasks.get("t.own")!.maxRunMs, 60_000);
  assert.equal(plain.settings.tasks.get("t.none")!.maxRunMs, null);
  await plain.start();
  await plain.stop(0);
  const policies = async () =>
    Object.fromEntries(
      (await lh.pool.query<{ task: string; max_run_ms: number | null }>("SELECT task, max_run_ms FROM task_policies ORDER BY task")).rows.map((r) => [
        r.task,
        r.max_run_ms,
      ]),
    );
  assert.deepEqual(await policies(), { "t.default": DEFAULT_MAX_RUN_MS, "t.none": null, "t.own": 60_000 });
  // A worker's own default (here: none) for the tasks that set nothing; a task's own still wins.
  const unlimited = lh.worker({ watchdog: false, maxRunMs: null, handlers: { "t.default": handler, "t.own": { handler, maxRunMs: 60_000 } } });
  await unlimited.start();
  await unlimited.stop(0);
  assert.deepEqual(await policies(), { "t.default": null, "t.none": null, "t.own": 60_000 });
});

test("a hung handler with no limit of its own ends at the default; task null and job null opt out; a job's limit beats its task's", async (t) => {
  const lh = await freshLeasehold(t);
  const reasons = new Map<string, string>();
  const hang = (_p: unknown, ctx: JobContext) => {
    ctx.signal.addEventListener("abort", () => reasons.set(ctx.jobId, (ctx.signal.reason as JobAbortedError).reason));
    return forever(); // awaits something that never settles; its process beats on
  };
  // The worker's default stands in for the 15 minutes (the same path: nothing set on task or job).
  const worker = lh.worker({
    watchdog: false,
    leaseMs: 1_500,
    pollIntervalMs: 50,
    maxRunMs: 1_500,
    backoff: NO_BACKOFF,
    handlers: { hang, "hang.free": { handler: hang, maxRunMs: null }, "hang.hour": { handler: hang, maxRunMs: 3_600_000 } },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const startedAt = Date.now();
  const plain = await lh.enqueue("hang", {}, { maxAttempts: 1 });
  const taskFree = await lh.enqueue("hang.free", {}, { maxAttempts: 1 });
  const jobFree = await lh.enqueue("hang", {}, { maxAttempts: 1, maxRunMs: null });
  const jobOverTask = await lh.enqueue("hang.hour", {}, { maxAttempts: 1, maxRunMs: 1_000 });
  const jobOverFreeTask = await lh.enqueue("hang.free", {}, { maxAttempts: 1, maxRunMs: 1_000 });
  for (const { id } of [plain, jobOverTask, jobOverFreeTask]) {
    const job = await eventually(() => finalOf(lh, id), `job ${id} ended at its limit`, 10_000);
    assert.equal(job.state, "dead");
    assert.deepEqual(await outcomes(lh, id), ["timed_out"]);
    assert.equal(reasons.get(id), "timed_out");
  }
  assert.match((await lh.getJob(plain.id)).attempts[0]!.error!, /timed out: ran longer than 1500 ms/);
  // Past the default and a lease of slack: a watchdog would end the opted-out jobs now if it
  // took them for limited.
  await sleep(Math.max(0, startedAt + 1_500 + 1_500 + 500 - Date.now()));
  await lh.watchdog().runOnce();
  for (const { id } of [taskFree, jobFree]) {
    assert.equal((await lh.getJob(id)).job.state, "running", `job ${id} opted out and still runs`);
    assert.equal(reasons.get(id), undefined);
  }
});

test("the watchdog ends, by the database's clock, a job past the 15-minute default; opt-outs and longer limits are left alone", async (t) => {
  const lh = await freshLeasehold(t);
  // Policies as current workers announce them: a task with nothing set carries the default.
  await store.announceWorker(lh.pool, {
    workerId: "w-beating",
    kind: "worker",
    host: "h",
    pid: 1,
    queues: ["default"],
    livenessKey: null,
    policies: [
      { task: "announced", backoff: NO_BACKOFF, progressTimeoutMs: null, maxRunMs: DEFAULT_MAX_RUN_MS },
      { task: "opted-out", backoff: NO_BACKOFF, progressTimeoutMs: null, maxRunMs: null },
    ],
  });
  const jobs = {
    announced: await lh.enqueue("announced", {}, { maxAttempts: 1 }),
    unannounced: await lh.enqueue("unannounced", {}, { maxAttempts: 1 }),
    taskOptedOut: await lh.enqueue("opted-out", {}, { maxAttempts: 1 }),
    jobOptedOut: await lh.enqueue("announced", {}, { maxAttempts: 1, maxRunMs: null }),
    jobLonger: await lh.enqueue("announced", {}, { maxAttempts: 1, maxRunMs: 20 * 60_000 }),
  };
  const claimed = await store.claimJobs(lh.pool, {
    queues: ["default"],
    limit: 10,
    workerId: "w-beating",
    leaseMs: 1_000,
    tasks: ["announced", "unannounced", "opted-out"],
  });
  assert.equal(claimed.length, 5);
  // Each attempt started 16 minutes ago and its worker still beats: only the limit can end it.
  await lh.pool.query("UPDATE jobs SET started_at = now() - interval '16 minutes'");
  await store.extendLeases(lh.pool, { workerId: "w-beating", leaseMs: 1_000, beats: claimed.map((j) => ({ id: j.id, attempt: j.attempt })) });
  await lh.watchdog().runOnce();
  const state = async (id: string) => (await lh.getJob(id)).job.state;
  assert.equal(await state(jobs.announced.id), "dead");
  assert.equal(await state(jobs.unannounced.id), "dead", "a task no worker announced gets the default");
  for (const id of [jobs.announced.id, jobs.unannounced.id]) {
    assert.deepEqual(await outcomes(lh, id), ["timed_out"]);
    assert.match((await lh.getJob(id)).attempts[0]!.error!, /ran longer than 900000 ms \(ended by the watchdog\)/);
  }
  for (const id of [jobs.taskOptedOut.id, jobs.jobOptedOut.id, jobs.jobLonger.id]) assert.equal(await state(id), "running", `job ${id}`);
});

test("the watchdog ends the overdue job of a live worker process that beats on but never ends it", async (t) => {
  const lh = await freshLeasehold(t);
  // A real worker process with no limit of its own (like one of the previous release), its
  // beats going on; then a current worker announces the task's limit.
  const child = spawn(process.execPath, ["--import", "tsx", CHILD], {
    env: { ...process.env, DATABASE_URL: databaseUrl(), LEASEHOLD_SCHEMA: lh.schema, LEASE_MS: "1500", MAX_RUN: "none" },
    stdio: ["ignore", "pipe", "pipe"],
  });
  t.after(() => child.kill("SIGKILL"));
  let out = "";
  child.stdout!.on("data", (b: Buffer) => (out += b.toString()));
  await eventually(async () => out.includes("ready "), "worker process ready", 30_000);
  const { id } = await lh.enqueue("hold", {}, { maxAttempts: 1 });
  await eventually(async () => out.includes(`started ${id}`), "the job started in the worker process");
  await store.announceWorker(lh.pool, {
    workerId: "w-current",
    kind: "worker",
    host: "h",
    pid: 2,
    queues: ["default"],
    livenessKey: null,
    policies: [{ task: "hold", backoff: NO_BACKOFF, progressTimeoutMs: null, maxRunMs: 1_000 }],
  });
  const watchdog = lh.watchdog({ intervalMs: 100 }).start();
  t.after(() => watchdog.stop());
  const job = await eventually(() => finalOf(lh, id), "the watchdog ended it", 15_000);
  assert.equal(job.state, "dead");
  const { attempts } = await lh.getJob(id);
  assert.deepEqual(
    attempts.map((a) => a.outcome),
    ["timed_out"],
    "ended at its limit, not by a lease running out: the process beat on",
  );
  assert.match(attempts[0]!.error!, /ran longer than 1000 ms \(ended by the watchdog\)/);
  assert.equal(child.exitCode, null, "the worker process is alive");
});

test("maxRunMs is checked at every boundary; null is stored apart from 'not set' and survives the dead letter and a retry", async (t) => {
  const lh = await freshLeasehold(t);
  for (const bad of [-1, 0, 999, 1.5, 7 * 24 * 3_600_000 + 1, "60000", Number.NaN]) {
    await assert.rejects(
      lh.enqueue("t", {}, { maxRunMs: bad as number }),
      /job 0: maxRunMs must be an integer from 1000 to 604800000, or null for no limit/,
      String(bad),
    );
  }
  assert.throws(() => lh.worker({ handlers: { t: { handler: () => undefined, maxRunMs: -5 } } }), /task "t": maxRunMs must be an integer from 1000/);
  assert.throws(() => lh.worker({ maxRunMs: 2.5, handlers: { t: () => undefined } }), /^ConfigError: maxRunMs must be an integer from 1000/);
  const row = async (id: string) =>
    (
      await lh.pool.query<{ max_run_ms: number | null; max_run_unlimited: boolean }>("SELECT max_run_ms, max_run_unlimited FROM jobs WHERE id = $1", [
        id,
      ])
    ).rows[0];

  // SQL: null opts out, a bad value is refused naming it.
  const { rows } = await lh.pool.query<{ id: string }>(`SELECT enqueue('t', '{}', '{"maxRunMs": null}') AS id`);
  assert.deepEqual(await row(rows[0]!.id), { max_run_ms: null, max_run_unlimited: true });
  await assert.rejects(lh.pool.query(`SELECT enqueue('t', '{}', '{"maxRunMs": -1}')`), /maxRunMs must be an integer from 1000 to 604800000/);
  const plain = (await lh.pool.query<{ id: string }>(`SELECT enqueue('t') AS id`)).rows[0]!.id;
  assert.deepEqual(await row(plain), { max_run_ms: null, max_run_unlimited: false });

  // HTTP.
  const app: FastifyInstance = createServer({ leasehold: lh, token: TOKEN });
  t.after(() => app.close());
  await app.listen({ host: "127.0.0.1", port: 0 });
  const base = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
  const refused = await api(base, "POST", "/v1/jobs", { task: "t", maxRunMs: -1 });
  assert.equal(refused.status, 400);
  assert.match(refused.json.error.message, /maxRunMs/);
  const accepted = await api(base, "POST", "/v1/jobs", { task: "t", maxRunMs: null });
  assert.equal(accepted.status, 201, JSON.stringify(accepted.json));
  assert.deepEqual(await row(accepted.json.id), { max_run_ms: null, max_run_unlimited: true });

  // CLI.
  const cliRefused = await runCli(["enqueue", "t", "--max-run", "500ms"], { schema: lh.schema });
  assert.equal(cliRefused.code, 2, cliRefused.stderr);
  assert.match(cliRefused.stderr, /--max-run must be from 1s to 7d, or none for no limit \(got "500ms"\)/);
  const cliNone = await runCli(["enqueue", "t", "--max-run", "none", "--json"], { schema: lh.schema });
  assert.equal(cliNone.code, 0, cliNone.stderr);
  assert.deepEqual(await row((JSON.parse(cliNone.stdout) as { id: string }).id), { max_run_ms: null, max_run_unlimited: true });
  const cliTwoHours = await runCli(["enqueue", "t", "--max-run", "2h", "--json"], { schema: lh.schema });
  assert.deepEqual(await row((JSON.parse(cliTwoHours.stdout) as { id: string }).id), { max_run_ms: 7_200_000, max_run_unlimited: false });
  const workerRefused = await runCli(["worker", "--tasks", "nope.js", "--max-run", "forever"], { schema: lh.schema });
  assert.equal(workerRefused.code, 2, workerRefused.stderr);
  assert.match(workerRefused.stderr, /--max-run must be a duration like 30s, 15m or 2h, or none for no limit/);

  // The opt-out goes with the job to the dead letter and back.
  const { id } = await lh.enqueue("t", {}, { maxAttempts: 1, maxRunMs: null });
  const [claimed] = await store
    .claimJobs(lh.pool, { queues: ["default"], limit: 10, workerId: "w", leaseMs: 5_000, tasks: ["t"] })
    .then((js) => js.filter((j) => j.id === id));
  assert.equal(claimed!.maxRunUnlimited, true);
  await store.failJobs(lh.pool, { workerId: "w", failures: [{ id, attempt: claimed!.attempt, error: "boom", backoff: NO_BACKOFF }] });
  assert.equal((await lh.getJob(id)).job.state, "dead");
  await lh.retry(id);
  assert.deepEqual(await row(id), { max_run_ms: null, max_run_unlimited: true });
});

test("leasehold doctor names a job running far longer than its task usually takes, not one within normal nor a task too new to judge", async (t) => {
  const lh = await freshLeasehold(t);
  // History: 400 quick successes of "usual" (one in eight sampled: ~50), 5 of "fresh" (too few to judge).
  const worker = lh.worker({ watchdog: false, pollIntervalMs: 20, handlers: { usual: () => undefined, fresh: () => undefined } });
  await worker.start();
  t.after(() => worker.stop(0));
  const done = await lh.enqueueMany([
    ...Array.from({ length: 400 }, () => ({ task: "usual" })),
    ...Array.from({ length: 5 }, () => ({ task: "fresh" })),
  ]);
  for (const { id } of done) await eventually(() => finalOf(lh, id), `job ${id} finished`);
  await worker.stop(0);
  // Running now: one "usual" job for 10 minutes, one just started, one "fresh" job for 10 minutes.
  const stuck = await lh.enqueue("usual");
  const normal = await lh.enqueue("usual");
  const young = await lh.enqueue("fresh");
  await store.claimJobs(lh.pool, { queues: ["default"], limit: 10, workerId: "w-held", leaseMs: 600_000, tasks: ["usual", "fresh"] });
  await lh.pool.query("UPDATE jobs SET started_at = now() - interval '10 minutes' WHERE id = ANY($1::bigint[])", [[stuck.id, young.id]]);

  const r = await runCli(["doctor", "--json"], { schema: lh.schema });
  const d = JSON.parse(r.stdout) as { findings: { level: string; message: string }[]; runningLong: { id: string; samples: number }[] };
  const sampled = await sampledSuccesses(lh, "usual");
  assert.ok(sampled >= store.MIN_RUN_TIME_SAMPLES && sampled < 400 / 4, `sampled ${sampled}`);
  assert.deepEqual(
    d.runningLong.map((j) => [j.id, j.samples]),
    [[stuck.id, sampled]],
  );
  const named = d.findings.filter((f) => /longer than its task usually takes/.test(f.message));
  assert.equal(named.length, 1);
  assert.equal(named[0]!.level, "warn");
  assert.match(named[0]!.message, new RegExp(`^job ${stuck.id} \\(task usual, queue default\\) has run 10m \\d\\ds`));
  assert.ok(!d.findings.some((f) => f.message.includes(`job ${normal.id} `) || f.message.includes(`job ${young.id} `)));
  const human = await runCli(["doctor"], { schema: lh.schema });
  assert.match(human.stdout, new RegExp(`! job ${stuck.id} \\(task usual, queue default\\) has run 10m`));
});

/** The task's successes in the run-time sample (migration 033: one in eight, by a hash of the id). */
async function sampledSuccesses(lh: Awaited<ReturnType<typeof freshLeasehold>>, task: string): Promise<number> {
  const { rows } = await lh.pool.query<{ n: number }>(
    "SELECT count(*)::int AS n FROM job_history WHERE task = $1 AND outcome = 'succeeded' AND (hashint8(id) & 7) = 0",
    [task],
  );
  return rows[0]!.n;
}
