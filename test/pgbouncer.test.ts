/**
 * Leasehold through a real PgBouncer in transaction pooling (test/harness/pgbouncer.ts), with
 * and without a direct URL for the sessions a pooler cannot carry. The pooler's `lh` alias
 * sets this file's schema with connect_query, as docs/deployment.md tells users to.
 */
import { test, before, after } from "node:test";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import assert from "node:assert/strict";
import pg from "pg";
import pino from "pino";
import { Registry } from "prom-client";
import { Leasehold, type LeaseholdOptions } from "../packages/leasehold/src/client.js";
import { ConfigError, JobNotFoundError, WorkerNameInUseError } from "../packages/leasehold/src/errors.js";
import type { JobContext } from "../packages/leasehold/src/worker/context.js";
import { databaseUrl, eventually, rawClient, silent, uniqueSchema, untilAborted } from "./helpers/db.js";
import { cliWorker, workerChild } from "./helpers/processes.js";
import { runCli } from "./helpers/cli.js";
import { startServe, TOKEN } from "./helpers/server.js";
import { findPgBouncer, PGBOUNCER_INSTALL_HINT, PgBouncer } from "./harness/pgbouncer.js";
import { RemoteTransport } from "../packages/leasehold/src/worker/remote-transport.js";
import { Worker } from "../packages/leasehold/src/worker/worker.js";

const binary = process.env.LEASEHOLD_TEST_PGBOUNCER !== undefined ? process.env.LEASEHOLD_TEST_PGBOUNCER || undefined : findPgBouncer();
const skip = binary ? false : `no pgbouncer: ${PGBOUNCER_INSTALL_HINT}`;

const schema = uniqueSchema("pgb");
let bouncer: PgBouncer;
/** Made first, through the pooler: it ran the migrations there. */
let admin: Leasehold;

before(async () => {
  if (!binary) return;
  bouncer = await PgBouncer.start(
    databaseUrl(),
    {
      lh: { connectQuery: `SET search_path = ${schema}; SET jit = off`, poolSize: 4 },
      // No connect_query: the server's default search_path (public).
      plain: {},
      // One server connection: whatever one client leaves on it, the next one gets.
      trap: { poolSize: 1 },
    },
    binary,
  );
  admin = await connect();
});

after(async () => {
  if (!binary) return;
  const raw = await rawClient("public");
  await raw.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`).catch(() => {});
  await raw.end();
  await admin?.close();
  await bouncer?.dispose();
});

/** A client through the pooler's `lh` alias in transaction pooling; with `direct`, the direct URL too. */
async function connect(options: Partial<LeaseholdOptions> & { direct?: boolean } = {}): Promise<Leasehold> {
  const { direct, ...rest } = options;
  return Leasehold.connect({
    databaseUrl: bouncer.url("lh"),
    pooling: "transaction",
    ...(direct && { directDatabaseUrl: databaseUrl() }),
    schema,
    logger: silent,
    metricsRegistry: new Registry(),
    ...rest,
  });
}

/** A logger that keeps its JSON lines. */
function capturingLogger(): { logger: pino.Logger; lines: () => { level: number; msg: string }[] } {
  const out: string[] = [];
  const logger = pino({ level: "info" }, { write: (line: string) => void out.push(line) });
  return { logger, lines: () => out.map((l) => JSON.parse(l) as { level: number; msg: string }) };
}

/** Advisory locks held by the backends of the pooler's server connections. */
async function locksOnPooledConnections(pooler = bouncer): Promise<number> {
  const pids = await pooler.serverPids();
  const raw = await rawClient(schema);
  try {
    const { rows } = await raw.query<{ n: number }>(`SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND pid = ANY($1::int[])`, [
      pids,
    ]);
    return rows[0]!.n;
  } finally {
    await raw.end();
  }
}

test("migrations ran through the pooler, and its connections carry no options: the alias's connect_query set the schema", { skip }, async () => {
  const raw = await rawClient(schema);
  const { rows } = await raw.query<{ n: number }>("SELECT count(*)::int AS n FROM schema_migrations");
  await raw.end();
  assert.ok(rows[0]!.n > 0);
  const { rows: here } = await admin.pool.query<{ s: string; jit: string }>("SELECT current_schema() AS s, current_setting('jit') AS jit");
  assert.deepEqual(here[0], { s: schema, jit: "off" });
});

test("a pooled URL whose connections are not on Leasehold's schema fails at connect with a ConfigError that names the fix", { skip }, async () => {
  await assert.rejects(
    Leasehold.connect({ databaseUrl: bouncer.url("plain"), pooling: "transaction", schema, logger: silent, metricsRegistry: new Registry() }),
    (err: unknown) => err instanceof ConfigError && /current_schema\(\) "public"/.test(err.message) && /connect_query/.test(err.message),
  );
});

test(
  "a pooler that refuses the options start-up parameter, with pooling left at session: a ConfigError says to set pooling transaction",
  { skip },
  async () => {
    const explained = (err: unknown) =>
      err instanceof ConfigError && /pooling: "transaction"/.test(err.message) && /LEASEHOLD_POOLING=transaction/.test(err.message);
    await assert.rejects(Leasehold.connect({ databaseUrl: bouncer.url("lh"), schema, logger: silent, metricsRegistry: new Registry() }), explained);
    // With migrate: false too, at once: the refusal is not a restart to wait out.
    const started = Date.now();
    await assert.rejects(
      Leasehold.connect({ databaseUrl: bouncer.url("lh"), schema, logger: silent, metricsRegistry: new Registry(), migrate: false }),
      explained,
    );
    assert.ok(Date.now() - started < 5_000, `took ${Date.now() - started} ms`);
  },
);

test("the trap: through the pooler a session advisory lock outlives its client and is handed to the next one", { skip }, async () => {
  const key = 7_700_000 + Math.floor(Math.random() * 100_000);
  const first = new pg.Client(bouncer.url("trap"));
  await first.connect();
  await first.query("SELECT pg_advisory_lock($1)", [key]);
  await first.end();
  // The first client is gone, and yet: the lock is still held, by the one server connection,
  // which the next client of the alias now has.
  const next = new pg.Client(bouncer.url("trap"));
  await next.connect();
  const raw = await rawClient(schema);
  try {
    const { rows } = await next.query<{ mine: boolean }>(
      "SELECT pid = pg_backend_pid() AS mine FROM pg_locks WHERE locktype = 'advisory' AND objid = $1 AND granted",
      [key],
    );
    assert.deepEqual(rows, [{ mine: true }], "the next client's backend holds the first client's lock");
    const { rows: direct } = await raw.query<{ got: boolean }>("SELECT pg_try_advisory_lock($1) AS got", [key]);
    assert.equal(direct[0]!.got, false, "a liveness lock taken so would say a dead worker is alive");
  } finally {
    await next.query("SELECT pg_advisory_unlock_all()");
    await next.end();
    await raw.end();
  }
});

test("without a direct URL: enqueue, claim, heartbeat, progress, complete, ctx.transaction and waitFor through the pooler; no lock on a pooled connection; one warn line and the metric", async (t) => {
  if (skip) return t.skip(skip);
  const { logger, lines } = capturingLogger();
  const registry = new Registry();
  const lh = await connect({ logger, metricsRegistry: registry });
  await lh.pool.query("CREATE TABLE IF NOT EXISTS side_effects (job_id bigint PRIMARY KEY)");
  let release!: () => void;
  const held = new Promise<void>((r) => (release = r));
  const worker = lh.worker({
    queues: ["plain"],
    leaseMs: 3_000,
    heartbeatMs: 300,
    watchdog: false,
    scheduler: false,
    handlers: {
      slow: async (_p: unknown, ctx: JobContext) => {
        ctx.progress({ step: "waiting" });
        await held;
      },
      write: async (_p: unknown, ctx: JobContext) =>
        ctx.transaction(async (tx) => {
          await tx.query("INSERT INTO side_effects (job_id) VALUES ($1)", [ctx.jobId]);
        }),
    },
  });
  await worker.start();
  t.after(() => worker.stop(0).then(() => lh.close()));

  const slow = await lh.enqueue("slow", {}, { queue: "plain" });
  const started = await eventually(async () => (await lh.getJob(slow.id)).job.state === "running", "slow job claimed");
  assert.ok(started);
  // A beat renews the lease through the pooler: lease_until moves on.
  const leaseBefore = (await lh.getJob(slow.id)).job.leaseUntil!.getTime();
  await eventually(async () => (await lh.getJob(slow.id)).job.leaseUntil!.getTime() > leaseBefore, "the lease renewed by a heartbeat");
  assert.equal(await locksOnPooledConnections(), 0, "the worker holds no advisory lock through the pooler");
  const { rows: announced } = await lh.pool.query<{ liveness_key: string | null }>("SELECT liveness_key FROM workers WHERE id = $1", [worker.id]);
  assert.deepEqual(announced, [{ liveness_key: null }], "announced without a liveness lock: recovered by lease expiry");
  release();
  const done = await lh.waitFor(slow.id, { timeoutMs: 15_000 });
  assert.equal(done.state, "succeeded");

  const write = await lh.enqueue("write", {}, { queue: "plain" });
  const wrote = await lh.waitFor(write.id, { timeoutMs: 15_000 });
  assert.equal(wrote.state, "succeeded");
  const { rows } = await lh.pool.query("SELECT job_id FROM side_effects WHERE job_id = $1", [write.id]);
  assert.equal(rows.length, 1, "the handler's write committed with the completion");

  const warned = lines().filter((l) => l.level === 40 && /pooling "transaction" without directDatabaseUrl/.test(l.msg));
  assert.equal(warned.length, 1, "one warn line at start says what is degraded");
  assert.match(warned[0]!.msg, /polls for jobs every 1000 ms/);
  assert.match(warned[0]!.msg, /recovered when their leases run out/);
  const text = await registry.metrics();
  for (const feature of ["listen", "liveness", "name_lock"]) {
    assert.match(text, new RegExp(`leasehold_worker_session_features\\{feature="${feature}"\\} 0`));
  }
});

test("with a direct URL: LISTEN, liveness and the name lock on the direct session, none on a pooled connection; no warning; the metric says 1", async (t) => {
  if (skip) return t.skip(skip);
  const { logger, lines } = capturingLogger();
  const registry = new Registry();
  const lh = await connect({ direct: true, logger, metricsRegistry: registry });
  let release!: () => void;
  const held = new Promise<void>((r) => (release = r));
  const worker = lh.worker({
    queues: ["direct"],
    name: `direct-${schema}`,
    watchdog: false,
    scheduler: false,
    handlers: { slow: () => held },
  });
  await worker.start();
  t.after(() => worker.stop(0).then(() => lh.close()));
  const job = await lh.enqueue("slow", {}, { queue: "direct" });
  await eventually(async () => (await lh.getJob(job.id)).job.state === "running", "job claimed");
  assert.equal(await locksOnPooledConnections(), 0);
  const raw = await rawClient(schema);
  try {
    const { rows } = await raw.query<{ held: boolean }>(
      `SELECT EXISTS (SELECT 1 FROM workers AS w JOIN pg_locks AS l
                        ON l.locktype = 'advisory' AND l.granted AND ((l.classid::bigint << 32) | l.objid::bigint) = w.liveness_key
                       WHERE w.id = $1) AS held`,
      [worker.id],
    );
    assert.equal(rows[0]!.held, true, "the liveness lock is held, on the direct session");
  } finally {
    await raw.end();
  }
  release();
  assert.equal((await lh.waitFor(job.id, { timeoutMs: 15_000 })).state, "succeeded");
  assert.equal(lines().filter((l) => l.level >= 40).length, 0);
  const text = await registry.metrics();
  for (const feature of ["listen", "liveness", "name_lock"]) {
    assert.match(text, new RegExp(`leasehold_worker_session_features\\{feature="${feature}"\\} 1`));
  }
});

test("unique names: without a direct URL a named worker is refused with a ConfigError naming directDatabaseUrl", async (t) => {
  if (skip) return t.skip(skip);
  const lh = await connect();
  t.after(() => lh.close());
  const worker = lh.worker({ name: "pod-1", watchdog: false, scheduler: false, handlers: { quick: () => undefined } });
  await assert.rejects(worker.start(), (err: unknown) => err instanceof ConfigError && /directDatabaseUrl/.test(err.message));
});

test("unique names: with a direct URL a second process with the name is refused while the first lives", async (t) => {
  if (skip) return t.skip(skip);
  const name = `named-${schema}`;
  await workerChild(t, schema, {
    DATABASE_URL: bouncer.url("lh"),
    LEASEHOLD_POOLING: "transaction",
    LEASEHOLD_DIRECT_DATABASE_URL: databaseUrl(),
    WORKER_NAME: name,
  });
  const lh = await connect({ direct: true });
  t.after(() => lh.close());
  const second = lh.worker({ name, watchdog: false, scheduler: false, handlers: { quick: () => undefined } });
  await assert.rejects(second.start(), WorkerNameInUseError);
});

/** Kills a real worker process holding a job; returns how the attempt ended. */
async function killHoldingWorker(t: { after(fn: () => unknown): void }, queue: string, env: Record<string, string>): Promise<string> {
  const lh = await connect();
  const watchdog = lh.watchdog({ intervalMs: 250 }).start();
  t.after(() => watchdog.stop().then(() => lh.close()));
  const { child, output } = await workerChild(t, schema, { DATABASE_URL: bouncer.url("lh"), LEASEHOLD_POOLING: "transaction", ...env });
  // worker-child runs the default queue: this test's job goes there alone.
  const job = await lh.enqueue("hold", {}, { queue });
  await eventually(async () => output().includes(`started ${job.id}`), "the child started the job");
  child.kill("SIGKILL");
  const attempt = await eventually(async () => (await lh.getJob(job.id)).attempts.find((a) => a.attempt === 1), "the attempt recovered", 20_000);
  // Retried at once, and nobody to run it: out of the next test's way.
  await lh.cancel(job.id).catch(() => {});
  return attempt.outcome;
}

test("crash recovery with a direct URL: kill -9 a real worker, its liveness lock goes, the watchdog recovers the job (worker_lost)", async (t) => {
  if (skip) return t.skip(skip);
  // A 30 s lease: within the wait only the liveness path can recover it.
  const outcome = await killHoldingWorker(t, "default", { LEASEHOLD_DIRECT_DATABASE_URL: databaseUrl() });
  assert.equal(outcome, "worker_lost");
});

test("crash recovery without a direct URL: kill -9 a real worker, the job is recovered when its short lease runs out (lease_expired)", async (t) => {
  if (skip) return t.skip(skip);
  const outcome = await killHoldingWorker(t, "default", { HEARTBEAT_MS: "1000" });
  assert.equal(outcome, "lease_expired");
});

test("schedules: the scheduler in a pooled worker enqueues a schedule's job, which runs", async (t) => {
  if (skip) return t.skip(skip);
  const lh = await connect();
  await lh.schedule({ name: `tick-${schema}`, cron: "* * * * * *", task: "tick", queue: "scheduled" });
  const ran: string[] = [];
  const worker = lh.worker({
    queues: ["scheduled"],
    watchdog: false,
    handlers: { tick: (_p: unknown, ctx: JobContext) => void ran.push(ctx.jobId) },
  });
  await worker.start();
  t.after(() => worker.stop(0).then(() => lh.close()));
  await eventually(async () => ran.length > 0, "a scheduled job ran");
  await lh.unschedule(`tick-${schema}`);
});

test("a cancel: with a direct URL the handler hears it by notice; without, at its next heartbeat (both abort it)", async (t) => {
  if (skip) return t.skip(skip);
  for (const direct of [true, false]) {
    const registry = new Registry();
    const lh = await connect({ direct, metricsRegistry: registry });
    const queue = direct ? "cancel-direct" : "cancel-pooled";
    const aborted: unknown[] = [];
    const worker = lh.worker({
      queues: [queue],
      leaseMs: 3_000,
      heartbeatMs: 500,
      watchdog: false,
      scheduler: false,
      handlers: {
        hold: untilAborted(aborted),
      },
    });
    await worker.start();
    try {
      const job = await lh.enqueue("hold", {}, { queue });
      await eventually(async () => (await lh.getJob(job.id)).job.state === "running", "job running");
      assert.equal(await lh.cancel(job.id), "cancel_requested");
      assert.equal((await lh.waitFor(job.id, { timeoutMs: 15_000 })).state, "cancelled");
      assert.deepEqual(aborted, ["cancelled"]);
      const notices = /leasehold_cancel_notices_total (\d+)/.exec(await registry.metrics())?.[1];
      assert.equal(notices, direct ? "1" : "0", direct ? "heard by notice" : "no LISTEN: heard by the heartbeat");
    } finally {
      await worker.stop(0);
      await lh.close();
    }
  }
});

test("a direct URL that goes through the pooler is refused at worker start: its session must be PostgreSQL's own", async (t) => {
  if (skip) return t.skip(skip);
  const lh = await connect({ directDatabaseUrl: bouncer.url("lh") });
  t.after(() => lh.close());
  const worker = lh.worker({ watchdog: false, scheduler: false, handlers: { quick: () => undefined } });
  await assert.rejects(worker.start(), (err: unknown) => err instanceof ConfigError && /directDatabaseUrl refused the `options`/.test(err.message));
});

/**
 * A PgBouncer that drops the `options` start-up parameter instead of refusing it, with an alias
 * in transaction pooling and one in session pooling, both on this file's schema. The session
 * alias logs in as a role of its own whose search_path is that schema: in session pooling a
 * leaving client's DISCARD ALL would undo a connect_query, but not the role's default.
 */
async function droppingOptions(t: { after(fn: () => Promise<void>): void }): Promise<PgBouncer> {
  const role = { user: uniqueSchema("lh_sess"), password: `pw-${process.pid}` };
  const raw = await rawClient(schema);
  try {
    await raw.query(`CREATE ROLE ${role.user} LOGIN SUPERUSER PASSWORD '${role.password}'`);
    await raw.query(`ALTER ROLE ${role.user} SET search_path = ${schema}`);
  } finally {
    await raw.end();
  }
  const pooler = await PgBouncer.start(
    databaseUrl(),
    {
      txn: { connectQuery: `SET search_path = ${schema}`, poolSize: 4 },
      sess: { serverUser: role, poolSize: 20, poolMode: "session" },
    },
    binary,
    { ignoreStartupParameters: ["options"] },
  );
  t.after(async () => {
    await pooler.dispose();
    const raw = await rawClient(schema);
    await raw.query(`DROP ROLE ${role.user}`).catch(() => {});
    await raw.end();
  });
  return pooler;
}

test("a transaction pooler that drops options, with pooling left at session: workers refuse to start, saying what to do, and leave no lock behind", async (t) => {
  if (skip) return t.skip(skip);
  const pooler = await droppingOptions(t);
  // Through it, the client itself works: connect_query put its connections on the schema.
  const lh = await Leasehold.connect({ databaseUrl: pooler.url("txn"), schema, poolSize: 2, logger: silent, metricsRegistry: new Registry() });
  t.after(() => lh.close());
  const explained = (err: unknown) =>
    err instanceof ConfigError &&
    /databaseUrl hands a session's PostgreSQL connection to other clients/.test(err.message) &&
    /pooling: "transaction"/.test(err.message) &&
    /directDatabaseUrl/.test(err.message);
  // Twice with one name: a first start that took its locks would have the restart refused as
  // "name in use" by its own leaked lock.
  for (let i = 0; i < 2; i++) {
    const worker = lh.worker({ name: `dropped-${schema}`, watchdog: false, scheduler: false, handlers: { quick: () => undefined } });
    t.after(() => worker.stop(0).catch(() => {}));
    await assert.rejects(worker.start(), explained);
  }
  assert.equal(await locksOnPooledConnections(pooler), 0, "no liveness or name lock on a pooled connection");
  // As directDatabaseUrl it is refused too: the worker's session must be its own.
  const pooled = await connect({ directDatabaseUrl: pooler.url("txn") });
  t.after(() => pooled.close());
  const worker = pooled.worker({ watchdog: false, scheduler: false, handlers: { quick: () => undefined } });
  t.after(() => worker.stop(0).catch(() => {}));
  await assert.rejects(
    worker.start(),
    (err: unknown) => err instanceof ConfigError && /^directDatabaseUrl hands/.test(err.message) && /must reach PostgreSQL itself/.test(err.message),
  );
  assert.equal(await locksOnPooledConnections(pooler), 0);
});

test("the same pooler in session pooling is a session of its own: a named worker starts, runs a job, and restarts with its name", async (t) => {
  if (skip) return t.skip(skip);
  const pooler = await droppingOptions(t);
  const lh = await Leasehold.connect({ databaseUrl: pooler.url("sess"), schema, poolSize: 2, logger: silent, metricsRegistry: new Registry() });
  t.after(() => lh.close());
  for (let i = 0; i < 2; i++) {
    const worker = lh.worker({ queues: ["sess"], name: `sess-${schema}`, watchdog: false, scheduler: false, handlers: { quick: () => "ran" } });
    await worker.start();
    try {
      const job = await lh.enqueue("quick", {}, { queue: "sess" });
      assert.equal((await lh.waitFor(job.id, { timeoutMs: 15_000 })).state, "succeeded");
    } finally {
      await worker.stop();
    }
  }
});

test("the CLI: worker and watchdog --pooling transaction through the pooler, the warn line on stderr; --name without --direct-database-url refused", async (t) => {
  if (skip) return t.skip(skip);
  const flags = ["--database-url", bouncer.url("lh"), "--pooling", "transaction"];
  const worker = await cliWorker(t, schema, `export default { "cli-task": async () => "done" };`, [...flags, "--queues", "cli"]);
  const job = await admin.enqueue("cli-task", {}, { queue: "cli" });
  assert.equal((await admin.waitFor(job.id, { timeoutMs: 15_000 })).state, "succeeded");
  const { stderr } = await worker.stop();
  assert.match(stderr, /pooling \\"transaction\\" without directDatabaseUrl/);

  const tasks = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-pgb-")), "tasks.mjs");
  fs.writeFileSync(tasks, `export default { "cli-task": async () => "done" };`);
  t.after(() => fs.rmSync(path.dirname(tasks), { recursive: true, force: true }));
  const named = await runCli(["worker", "--tasks", tasks, ...flags, "--name", "pod-1", "--no-watchdog"], { schema });
  assert.notEqual(named.code, 0);
  assert.match(named.stderr, /directDatabaseUrl/);

  const watchdog = await runCli(["watchdog", "--once", ...flags], { schema });
  assert.equal(watchdog.code, 0, watchdog.stderr);
});

test("serve without a direct URL: a remote worker's long poll is woken by the once-a-second re-check, and a cancel reaches it at its heartbeat", async (t) => {
  if (skip) return t.skip(skip);
  const serve = await startServe(schema, ["--database-url", bouncer.url("lh"), "--pooling", "transaction", "--no-watchdog"]);
  t.after(() => serve.stop());
  const aborted: unknown[] = [];
  // A 20 s long poll (the remote default): with no LISTEN, only the re-check can wake it sooner.
  const worker = new Worker({
    queues: ["served"],
    leaseMs: 3_000,
    heartbeatMs: 500,
    logger: silent,
    metricsRegistry: new Registry(),
    transport: new RemoteTransport({ serverUrl: serve.match[1]!, token: TOKEN, waitMs: 20_000 }),
    handlers: {
      echo: (p: unknown) => p,
      hold: untilAborted(aborted),
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  // Let the worker's first claim find nothing and wait.
  await new Promise((r) => setTimeout(r, 500));
  const queued = performance.now();
  const echo = await admin.enqueue("echo", { n: 1 }, { queue: "served" });
  const ended = await admin.waitFor(echo.id, { timeoutMs: 15_000 });
  assert.equal(ended.state, "succeeded");
  const tookMs = performance.now() - queued;
  assert.ok(tookMs < 8_000, `woken by the re-check, not by the 20 s poll's end (${Math.round(tookMs)} ms)`);

  const hold = await admin.enqueue("hold", {}, { queue: "served" });
  await eventually(async () => (await admin.getJob(hold.id)).job.state === "running", "the remote worker runs it");
  assert.equal(await admin.cancel(hold.id), "cancel_requested");
  assert.equal((await admin.waitFor(hold.id, { timeoutMs: 15_000 })).state, "cancelled");
  assert.deepEqual(aborted, ["cancelled"]);
  await worker.stop(0);
  const { stderr } = await serve.stop();
  assert.match(stderr, /without directDatabaseUrl: no LISTEN session/);
});

test("retention through the pooler: old generations are emptied (a lock and TRUNCATE in one pooled transaction) and dead jobs pruned", async (t) => {
  if (skip) return t.skip(skip);
  const lh = await connect();
  t.after(() => lh.close());
  const retention = lh.retention({ retainMs: 1_000, retainDeadMs: 1_000, batchSize: 1 });
  await retention.runOnce();
  const worker = lh.worker({
    queues: ["retained"],
    watchdog: false,
    scheduler: false,
    handlers: {
      fine: () => "ok",
      broken: () => {
        throw new Error("for good");
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const jobs = [
    await lh.enqueue("fine", {}, { queue: "retained" }),
    await lh.enqueue("fine", {}, { queue: "retained" }),
    await lh.enqueue("broken", {}, { queue: "retained", maxAttempts: 1 }),
  ];
  const states = await Promise.all(jobs.map(async (j) => (await lh.waitFor(j.id, { timeoutMs: 15_000 })).state));
  assert.deepEqual(states, ["succeeded", "succeeded", "dead"]);
  await worker.stop(0);
  // Past a whole one-second generation, and past the dead jobs' retention.
  await new Promise((r) => setTimeout(r, 2_100));
  assert.ok((await retention.runOnce()) >= 3);
  for (const job of jobs) await assert.rejects(lh.getJob(job.id), JobNotFoundError);
});
