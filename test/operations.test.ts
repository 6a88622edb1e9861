/**
 * What operators rely on, against the real server and real processes: crash detection in
 * seconds after a kill -9, a reconnect that costs no job, a worker back within a second of
 * the database with the outage logged once, the metrics every process exposes, `leasehold
 * doctor`, and the fence token shared by all jobs.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { Writable } from "node:stream";
import { fileURLToPath } from "node:url";
import pino from "pino";
import { Registry } from "prom-client";
import { Leasehold } from "../packages/leasehold/src/client.js";
import type { JobAbortedError, JobContext } from "../packages/leasehold/src/worker/context.js";
import * as store from "../packages/leasehold/src/store/index.js";
import { databaseUrl, eventually, freshLeasehold, NO_BACKOFF, rawClient, recordEvents, waitForEvent } from "./helpers/db.js";
import { runCli, startCli } from "./helpers/cli.js";
import { TcpProxy } from "./helpers/proxy.js";

const CHILD = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "helpers", "worker-child.ts");

/** A worker process of its own; resolves once it runs, with a way to read its output. */
async function workerProcess(schema: string, env: Record<string, string> = {}) {
  const child = spawn(process.execPath, ["--import", "tsx", CHILD], {
    env: { ...process.env, DATABASE_URL: databaseUrl(), LEASEHOLD_SCHEMA: schema, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  child.stdout!.on("data", (b: Buffer) => (out += b.toString()));
  await eventually(async () => out.includes("ready "), "worker process ready", 30_000);
  return { child, output: () => out };
}

test("kill -9 of a worker process: its job runs again within seconds, not after its 30 s lease", async (t) => {
  const lh = await freshLeasehold(t);
  const victim = await workerProcess(lh.schema);
  t.after(() => victim.child.kill("SIGKILL"));
  const { id } = await lh.enqueue("hold", {}, { maxAttempts: 5 });
  await eventually(async () => victim.output().includes(`started ${id}`), "the job started in the worker process");
  // The watchdog a deployment runs, at its default settings.
  const watchdog = lh.watchdog().start();
  t.after(() => watchdog.stop());
  // The task's default backoff: a job's first crash retries at once all the same.
  const rescuer = lh.worker({ watchdog: false, handlers: { hold: () => undefined } });
  await rescuer.start();
  t.after(() => rescuer.stop(0));
  const killedAt = Date.now();
  victim.child.kill("SIGKILL");
  await waitForEvent(rescuer, "job:start", (j: { id: string }) => j.id === id, 20_000);
  const tookMs = Date.now() - killedAt;
  assert.ok(tookMs < 6_000, `ran again after ${tookMs} ms; the lease is 30 s`);
  const { attempts } = await lh.getJob(id);
  assert.equal(attempts[0]!.outcome, "worker_lost");
  const delays = await lh.metrics.recoveryDelay.get();
  assert.ok(delays.values.some((v) => v.labels.cause === "worker_lost" && v.metricName?.endsWith("_count") && v.value >= 1));
});

test("a worker whose session blips (terminated, reconnects) keeps its jobs: the grace covers a reconnect", async (t) => {
  const lh = await freshLeasehold(t);
  let release!: () => void;
  const worker = lh.worker({ watchdog: false, handlers: { t: () => new Promise<void>((r) => (release = r)) } });
  await worker.start();
  t.after(() => worker.stop(0));
  const watchdog = lh.watchdog({ livenessIntervalMs: 50 }).start();
  t.after(() => watchdog.stop());
  const starts = recordEvents(worker, "job:start");
  const { id } = await lh.enqueue("t");
  await starts.waitFor((j: { id: string }) => j.id === id);
  // Only this test's worker: ending another test file's sessions would break that file.
  const { rows } = await lh.pool.query<{ n: number }>(
    `SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity
      WHERE application_name = 'leasehold-worker' AND starts_with(query, 'LISTEN "leasehold:' || $1 || '"')`,
    [lh.schema],
  );
  assert.ok(rows[0]!.n >= 1, "terminated the worker's session");
  await new Promise((r) => setTimeout(r, 2_000)); // longer than the grace, but it came back sooner
  const { job } = await lh.getJob(id);
  assert.deepEqual([job.state, job.attempt, job.lockedBy], ["running", 1, worker.id]);
  release();
  await eventually(async () => (await lh.getJob(id)).job.state === "succeeded", "the job finished on its worker");
});

test("recovery checks the liveness lock again as it recovers: a worker whose session came back within the grace keeps its job", async (t) => {
  const { proxy, proxiedUrl } = TcpProxy.forUrl(databaseUrl());
  await proxy.start();
  t.after(() => proxy.stop());
  const lh = await freshLeasehold(t);
  // No beat while the test holds the worker's row: a beat waiting on it would hold the job's row.
  const worker = await workerProcess(lh.schema, { DATABASE_URL: proxiedUrl(), HEARTBEAT_MS: String(3_600_000) });
  t.after(() => worker.child.kill("SIGKILL"));
  const { id } = await lh.enqueue("hold", {}, { maxAttempts: 5 });
  await eventually(async () => worker.output().includes(`started ${id}`), "the job started in the worker process");
  const { rows } = await lh.pool.query<{ id: string; key: string }>(
    "SELECT w.id, w.liveness_key AS key FROM jobs AS j JOIN workers AS w ON w.id = j.locked_by WHERE j.id = $1",
    [id],
  );
  const { id: workerId, key } = rows[0]!;
  const lockHeld = async () =>
    (
      await lh.pool.query<{ held: boolean }>(
        `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted
                           AND ((classid::bigint << 32) | objid::bigint) = $1::bigint) AS held`,
        [key],
      )
    ).rows[0]!.held;
  const recover = () => store.recoverLostWorkers(lh.pool, { limit: 100, graceMs: 1_000, backoff: NO_BACKOFF });

  // Its session is cut: the lock goes, a liveness check marks the worker lost.
  proxy.cut();
  await eventually(async () => !(await lockHeld()), "the liveness lock is free");
  assert.deepEqual(
    (await store.markLostWorkers(lh.pool, { startupGraceMs: 0, defaultGraceMs: 1_000 })).lost.map((w) => w.id),
    [workerId],
  );
  // It comes back within the grace and takes its lock again, but its announcement (which
  // clears lost_at) waits behind this row lock: the state a slow announcement, or a liveness
  // check that read the locks just before the lock came back, leaves behind.
  const announcement = await rawClient(lh.schema);
  try {
    await announcement.query("BEGIN");
    await announcement.query("SELECT 1 FROM workers WHERE id = $1 FOR UPDATE", [workerId]);
    proxy.restore();
    await eventually(lockHeld, "the worker took its liveness lock again", 10_000);
    await eventually(
      async () => (await lh.pool.query("SELECT 1 FROM workers WHERE id = $1 AND lost_at < now() - interval '1.1 s'", [workerId])).rowCount === 1,
      "lost for longer than the grace",
    );
    assert.equal((await recover()).size, 0, "a live worker's job was recovered");
  } finally {
    await announcement.end(); // the announcement goes ahead
  }
  const { job } = await lh.getJob(id);
  assert.deepEqual([job.state, job.attempt, job.lockedBy], ["running", 1, workerId]);

  // The same statement recovers the job once the process is really gone.
  worker.child.kill("SIGKILL");
  await eventually(async () => !(await lockHeld()), "the liveness lock is free");
  await store.markLostWorkers(lh.pool, { startupGraceMs: 0, defaultGraceMs: 1_000 });
  await eventually(async () => (await recover()).get(id) === "waiting", "the dead worker's job recovered", 5_000);
});

test("a worker that first announced itself after the database started is lost at once, even within the start-up grace", async (t) => {
  const lh = await freshLeasehold(t);
  const worker = await workerProcess(lh.schema);
  t.after(() => worker.child.kill("SIGKILL"));
  const { rows } = await lh.pool.query<{ id: string; up_ms: number }>(
    "SELECT id, ceil(extract(epoch FROM now() - pg_postmaster_start_time()) * 1000)::float8 AS up_ms FROM workers WHERE kind = 'worker'",
  );
  const { id: workerId, up_ms: upMs } = rows[0]!;
  worker.child.kill("SIGKILL");
  // As if the server had started a moment ago: its sessions are all new, but this worker's was
  // never anywhere else, so its lock gone means its process is gone.
  await eventually(
    async () =>
      (await store.markLostWorkers(lh.pool, { startupGraceMs: upMs + 60_000, defaultGraceMs: 1_000 })).lost.map((w) => w.id).includes(workerId),
    "marked lost",
  );
  // A worker announced before the server started still gets the grace to reconnect.
  await store.announceWorker(lh.pool, {
    workerId: "w-before",
    kind: "worker",
    host: "h",
    pid: 1,
    queues: ["default"],
    livenessKey: "42",
    policies: [],
  });
  await lh.pool.query("UPDATE workers SET started_at = pg_postmaster_start_time() - interval '1 s' WHERE id = 'w-before'");
  assert.deepEqual(
    (await store.markLostWorkers(lh.pool, { startupGraceMs: upMs + 60_000, defaultGraceMs: 1_000 })).lost.map((w) => w.id),
    [],
  );
  assert.deepEqual(
    (await store.markLostWorkers(lh.pool, { startupGraceMs: 0, defaultGraceMs: 1_000 })).lost.map((w) => w.id),
    ["w-before"],
  );
});

test("after an outage a worker is back within a second of the database, and logs the outage once", async (t) => {
  const { proxy, proxiedUrl } = TcpProxy.forUrl(databaseUrl());
  await proxy.start();
  t.after(() => proxy.stop());
  const admin = await freshLeasehold(t);
  const lines: string[] = [];
  const logger = pino({ level: "info" }, new Writable({ write: (chunk, _e, done) => (lines.push(String(chunk)), done()) }));
  const lh = await Leasehold.connect({ databaseUrl: proxiedUrl(), schema: admin.schema, logger, metricsRegistry: new Registry(), migrate: false });
  t.after(() => lh.close());
  const worker = lh.worker({ watchdog: false, pollIntervalMs: 60_000, handlers: { t: () => undefined } });
  await worker.start();
  t.after(() => worker.stop(0));
  proxy.cut();
  await new Promise((r) => setTimeout(r, 4_000)); // every loop fails for a while
  const { id } = await admin.enqueue("t"); // its wake-up is lost: the listener is down
  proxy.restore();
  const restoredAt = Date.now();
  await waitForEvent(worker, "job:start", (j: { id: string }) => j.id === id, 10_000);
  const backAfter = Date.now() - restoredAt;
  assert.ok(backAfter < 1_500, `the job started ${backAfter} ms after the database came back`);
  const said = (text: string) => lines.filter((l) => l.includes(text)).length;
  assert.equal(said("database unreachable"), 1, lines.join(""));
  await eventually(async () => said("database reachable again") === 1, "the end of the outage logged");
});

test("every process exposes the eight operational metrics; `leasehold worker --metrics-port` serves them", async (t) => {
  const lh = await freshLeasehold(t);
  const worker = lh.worker({
    leaseMs: 3_000,
    watchdog: { intervalMs: 200 },
    handlers: { t: (_p: unknown, ctx: JobContext) => ctx.progress({ ok: 1 }) },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const jobs = await lh.enqueueMany(Array.from({ length: 20 }, () => ({ task: "t" })));
  for (const { id } of jobs) await eventually(async () => (await lh.getJob(id)).job.state === "succeeded", `job ${id}`);
  await worker.heartbeatNow();
  const text = await lh.metrics.registry.metrics();
  for (const name of [
    "leasehold_active_leases",
    "leasehold_worker_leases",
    "leasehold_lease_acquisition_seconds_count",
    "leasehold_heartbeat_leases_total",
    "leasehold_heartbeat_seconds_count",
    "leasehold_lease_expirations_total",
    "leasehold_recoveries_total",
    "leasehold_fencing_rejections_total",
    "leasehold_orphaned_jobs",
    "leasehold_recovery_delay_seconds",
    "leasehold_jobs_enqueued_total",
    "leasehold_job_attempts_ended_total",
    "leasehold_job_duration_seconds_count",
  ]) {
    assert.match(text, new RegExp(`^# (HELP|TYPE) ${name.replace(/_count$/, "")}`, "m"), name);
  }
  assert.match(text, /^leasehold_jobs_enqueued_total\{queue="default"\} 20$/m);
  assert.match(text, /^leasehold_job_attempts_ended_total\{queue="default",outcome="succeeded"\} 20$/m);
  assert.match(text, /^leasehold_lease_acquisition_seconds_count [1-9]/m);

  // The CLI worker, with only the metrics port asked for.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-tasks-"));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const tasks = path.join(dir, "tasks.mjs");
  fs.writeFileSync(tasks, "export default { t: () => undefined };\n");
  const cli = await startCli(["worker", "--tasks", tasks, "--metrics-port", "0", "--no-retention"], {
    schema: lh.schema,
    ready: /metrics at (http:\/\/\S+\/metrics)/,
  });
  t.after(() => cli.stop());
  const scraped = await (await fetch(cli.match[1]!)).text();
  assert.match(scraped, /^# TYPE leasehold_heartbeat_leases_total counter$/m);
  assert.match(scraped, /^# TYPE leasehold_lease_acquisition_seconds histogram$/m);
});

test("leasehold doctor: no watchdog with expired leases is an error; a lease shorter than the beats call for is named", async (t) => {
  const lh = await freshLeasehold(t);
  await store.announceWorker(lh.pool, {
    workerId: "w-doctor",
    kind: "worker",
    host: "h",
    pid: 1,
    queues: ["mail"],
    leaseMs: 3_000,
    heartbeatMs: 1_000,
    livenessKey: null,
    policies: [],
  });
  // Its beats: mostly prompt, 2% of them 1-2.5 s late.
  await lh.pool.query("UPDATE workers SET beat_gaps = $1 WHERE id = 'w-doctor'", [[900, 50, 0, 0, 0, 0, 0, 10, 20, 0, 0, 0, 0]]);
  await lh.enqueue("t");
  await store.claimJobs(lh.pool, { queues: ["default"], limit: 1, workerId: "gone", leaseMs: 30_000, tasks: ["t"] });
  await lh.pool.query("UPDATE jobs SET lease_until = now() - interval '1 minute'");
  const r = await runCli(["doctor", "--json"], { schema: lh.schema });
  assert.equal(r.code, 1, r.stderr);
  const d = JSON.parse(r.stdout) as {
    findings: { level: string; message: string }[];
    lease: { p99DelayMs: number; workers: { recommendedMs: number }[] };
  };
  assert.ok(d.findings.some((f) => f.level === "error" && /no watchdog is running/.test(f.message)));
  assert.ok(d.findings.some((f) => f.level === "error" && /1 lease\(s\) ran out and are not reaped/.test(f.message)));
  assert.equal(d.lease.p99DelayMs, 2_500);
  // max(3 x 1 s, 1 s + 2.5 s + 2.5 s) = 6 s, more than its 3 s lease.
  assert.deepEqual(
    d.lease.workers.map((w) => w.recommendedMs),
    [6_000],
  );
  assert.ok(d.findings.some((f) => f.level === "warn" && /w-doctor .* 3000 ms lease, shorter than the 6000 ms/.test(f.message)));
  const human = await runCli(["doctor"], { schema: lh.schema });
  assert.match(human.stdout, /✖ no watchdog is running/);
  assert.match(human.stdout, /recommended at least 6000 ms \(too short\)/);
});

test("ctx.fence grows across all jobs; ctx.fencedWrite refuses an older claim's write, aborts it and counts it", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.pool.query("CREATE TABLE shared (key text PRIMARY KEY, token bigint NOT NULL, writer text NOT NULL)");
  const fences = new Map<string, string>();
  let releaseA!: () => void;
  const aborted: string[] = [];
  const worker = lh.worker({
    concurrency: 2,
    handlers: {
      write: async (p: { name: string; waitFirst: boolean }, ctx: JobContext) => {
        fences.set(p.name, ctx.fence);
        if (p.waitFirst) await new Promise<void>((r) => (releaseA = r));
        ctx.signal.addEventListener("abort", () => aborted.push((ctx.signal.reason as JobAbortedError).reason));
        return ctx.fencedWrite(lh.pool, { table: "shared", key: { key: "x" }, values: { writer: p.name } });
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const a = await lh.enqueue("write", { name: "A", waitFirst: true }, { maxAttempts: 1 });
  await eventually(async () => fences.has("A"), "A claimed");
  const b = await lh.enqueue("write", { name: "B", waitFirst: false });
  await eventually(async () => (await lh.getJob(b.id)).job.state === "succeeded", "B wrote");
  assert.ok(BigInt(fences.get("B")!) > BigInt(fences.get("A")!), "a later claim of another job has a greater fence");
  releaseA(); // A, claimed first, writes last: refused
  await eventually(async () => ["succeeded", "dead"].includes((await lh.getJob(a.id)).job.state), "A ended");
  assert.deepEqual((await lh.pool.query("SELECT writer, token::text FROM shared")).rows, [{ writer: "B", token: fences.get("B") }]);
  assert.deepEqual(aborted, ["fence_refused"]);
  const refused = await lh.metrics.fencingRejections.get();
  assert.equal(refused.values.find((v) => v.labels.kind === "downstream")?.value, 1);
});
