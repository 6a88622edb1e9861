/**
 * Instant cancel (docs/flows.md#instant-cancel): a cancel request of a running job reaches the
 * handler by notice, not at the worker's next heartbeat. Every worker here beats every 20 s
 * (lease 60 s) and each cancel must arrive within a few seconds, so a cancel that only a
 * heartbeat carried would fail the test; the metrics say which path carried it. The latency
 * itself is measured by `npm run bench` (cancel-latency), not here.
 */
import { test as nodeTest, test } from "node:test";
import assert from "node:assert/strict";
import type { FastifyInstance } from "fastify";
import { Registry } from "prom-client";
import { Leasehold } from "../packages/leasehold/src/client.js";
import type { JobAbortedError, JobContext } from "../packages/leasehold/src/worker/context.js";
import { RemoteTransport } from "../packages/leasehold/src/worker/remote-transport.js";
import { Worker } from "../packages/leasehold/src/worker/worker.js";
import { DatabaseTransport } from "../packages/leasehold/src/worker/transport.js";
import type { DispatchFactory, DispatchHost } from "../packages/leasehold/src/worker/dispatch.js";
import * as store from "../packages/leasehold/src/store/index.js";
import { createServer } from "../packages/cli/src/server/app.js";
import { databaseUrl, eventually, freshLeasehold, rawClient, recordEvents, silent, uniqueSchema, waitForEvent } from "./helpers/db.js";
import { runCli } from "./helpers/cli.js";
import { api, TOKEN } from "./helpers/server.js";

const LEASE_MS = 60_000;
const HEARTBEAT_MS = 20_000;
/** Far less than a beat interval: a cancel that waited for the next beat cannot arrive within it. */
const WELL_BEFORE_A_BEAT_MS = 5_000;

type T = { after(fn: () => Promise<void> | void): void };
type Ended = [{ id: string }, { state: string; reason?: string }];

/**
 * A handler that runs until its signal aborts, records the abort's reason, and then
 * "succeeds" anyway: its late success must end the job as cancelled.
 */
function stubborn(aborts: Map<string, string>) {
  return (_: unknown, ctx: JobContext) =>
    new Promise<void>((resolve) => {
      ctx.signal.addEventListener("abort", () => {
        aborts.set(ctx.jobId, (ctx.signal.reason as JobAbortedError).reason);
        setTimeout(resolve, 20);
      });
    });
}

async function counter(worker: Worker, name: "cancelNotices" | "heartbeatLeases", labels: Record<string, string> = {}): Promise<number> {
  const { values } = await worker.metrics[name].get();
  return values
    .filter((v) => Object.entries(labels).every(([k, x]) => (v.labels as Record<string, unknown>)[k] === x))
    .reduce((n, v) => n + v.value, 0);
}

function ended(worker: Worker, id: string) {
  return waitForEvent<Ended>(worker, "job:end", (job) => job.id === id, WELL_BEFORE_A_BEAT_MS).then(([, outcome]) => outcome);
}

/** Starts `n` jobs of task "hold" and waits until all run on `worker`. */
async function running(lh: Leasehold, worker: Worker, n: number): Promise<string[]> {
  const starts = recordEvents(worker, "job:start");
  const ids: string[] = [];
  for (let i = 0; i < n; i++) ids.push((await lh.enqueue("hold", { i })).id);
  for (const id of ids) await starts.waitFor((job: { id: string }) => job.id === id);
  return ids;
}

/** A report of the ended attempt, sent again now: the fence refuses it and the job stays cancelled. */
async function assertLateReportFenced(lh: Leasehold, worker: Worker, id: string): Promise<void> {
  const applied = await store.completeJobs(lh.pool, { workerId: worker.id, jobs: [{ id, attempt: 1 }] });
  assert.equal(applied.size, 0, "a report after the cancelled end changes nothing");
  const { job, attempts } = await lh.getJob(id);
  assert.equal(job.state, "cancelled");
  assert.deepEqual(
    attempts.map((a) => a.outcome),
    ["cancelled"],
  );
}

function databaseWorker(lh: Leasehold, aborts: Map<string, string>, extra: { concurrency?: number } = {}): Worker {
  return lh.worker({ leaseMs: LEASE_MS, heartbeatMs: HEARTBEAT_MS, concurrency: extra.concurrency ?? 5, handlers: { hold: stubborn(aborts) } });
}

test("database worker: lh.cancel aborts the running handler by notice, the late success ends it cancelled, the other job runs on", async (t) => {
  const lh = await freshLeasehold(t);
  const aborts = new Map<string, string>();
  const worker = databaseWorker(lh, aborts);
  await worker.start();
  t.after(() => worker.stop(0));
  const [target, other] = await running(lh, worker, 2);
  const end = ended(worker, target!);
  assert.equal(await lh.cancel(target!), "cancel_requested");
  assert.equal((await end).state, "cancelled", "the handler's late success ends the job as cancelled");
  assert.deepEqual([...aborts], [[target, "cancelled"]], "only the cancelled job's handler was aborted");
  assert.equal(await counter(worker, "cancelNotices"), 1, "the cancel came by notice");
  assert.equal(await counter(worker, "heartbeatLeases", { outcome: "cancelled" }), 0, "not by a heartbeat");
  await assertLateReportFenced(lh, worker, target!);
  assert.equal((await lh.getJob(other!)).job.state, "running", "the other job was not touched");
});

test("database worker: leasehold jobs cancel (the CLI) reaches the running handler at once", async (t) => {
  const lh = await freshLeasehold(t);
  const aborts = new Map<string, string>();
  const worker = databaseWorker(lh, aborts);
  await worker.start();
  t.after(() => worker.stop(0));
  const [id] = await running(lh, worker, 1);
  const end = ended(worker, id!);
  const cli = await runCli(["jobs", "cancel", id!], { schema: lh.schema });
  assert.equal(cli.code, 0, cli.stderr);
  assert.equal((await end).state, "cancelled");
  assert.equal(aborts.get(id!), "cancelled");
  assert.equal(await counter(worker, "cancelNotices"), 1);
  await assertLateReportFenced(lh, worker, id!);
});

test("database worker: a job claimed but not started is given back as cancelled without starting", async (t) => {
  const lh = await freshLeasehold(t);
  const aborts = new Map<string, string>();
  // One slot: the first job runs; the second is claimed for the worker and handed to it the way
  // a dispatch (NATS) hands over jobs, so it waits in the worker's buffer (without a finishing
  // rate the worker claims no more than its slots by itself).
  let host!: DispatchHost;
  const handOver: DispatchFactory = async () => ({
    start: async (h) => {
      host = h;
      h.setPolling(true);
    },
    kick: () => {},
    stop: async () => {},
  });
  const worker = new Worker({
    handlers: { hold: stubborn(aborts) },
    leaseMs: LEASE_MS,
    heartbeatMs: HEARTBEAT_MS,
    concurrency: 1,
    logger: silent,
    metricsRegistry: new Registry(),
    transport: new DatabaseTransport(lh.pool, lh.databaseUrl, lh.schema),
    dispatch: handOver,
  });
  const started: string[] = [];
  worker.on("job:start", (job: { id: string }) => void started.push(job.id));
  await worker.start();
  t.after(() => worker.stop(0));
  const first = (await lh.enqueue("hold", {})).id;
  await eventually(async () => started.includes(first), "the first job runs");
  const buffered = (await lh.enqueue("hold", {})).id;
  const claimed = await store.claimJobsById(lh.pool, {
    workerId: worker.id,
    leaseMs: LEASE_MS,
    queues: ["default"],
    tasks: ["hold"],
    spells: [{ id: buffered, attempt: (await lh.getJob(buffered)).job.attempt }],
  });
  assert.equal(claimed.length, 1);
  host.deliver(claimed, performance.now());
  assert.equal(worker.inFlightCount, 2, "the second job is buffered");
  assert.equal(await lh.cancel(buffered), "cancel_requested");
  await eventually(async () => (await lh.getJob(buffered)).job.state === "cancelled", "the buffered job ends cancelled", WELL_BEFORE_A_BEAT_MS);
  assert.equal(await counter(worker, "cancelNotices"), 1);
  assert.deepEqual(started, [first], "the cancelled job's handler never started");
  assert.equal(aborts.size, 0, "the running job was not aborted");
  assert.equal((await lh.getJob(first)).job.state, "running");
});

test("database worker: a cancel sent while its listening session is cut arrives when the session is back", async (t) => {
  const lh = await freshLeasehold(t);
  const aborts = new Map<string, string>();
  const worker = databaseWorker(lh, aborts);
  await worker.start();
  t.after(() => worker.stop(0));
  const [id] = await running(lh, worker, 1);
  const end = ended(worker, id!);
  // In one transaction: end the worker's listening session (waiting until it is gone), then
  // request the cancel. The notice goes out at commit. The new session announces the worker
  // (its row, locked here until the commit) before it LISTENs, so it cannot hear the notice:
  // it is lost.
  const c = await rawClient(lh.schema);
  try {
    await c.query("BEGIN");
    await c.query("SELECT 1 FROM workers WHERE id = $1 FOR UPDATE", [worker.id]);
    // The worker's session is the one holding its liveness lock.
    const cut = await c.query(
      `SELECT pg_terminate_backend(l.pid, 5000) AS ok
         FROM pg_locks AS l JOIN workers AS w ON w.liveness_key = (l.classid::bigint << 32) | l.objid::bigint
        WHERE w.id = $1 AND l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
      [worker.id],
    );
    assert.equal(cut.rowCount, 1, "the worker's listening session was found");
    assert.equal(await store.cancelJob(c, id!), "cancel_requested");
    await c.query("COMMIT");
  } finally {
    await c.end();
  }
  assert.equal((await end).state, "cancelled");
  assert.equal(aborts.get(id!), "cancelled");
  assert.equal(await counter(worker, "cancelNotices"), 0, "the notice was lost with the session");
  assert.equal(await counter(worker, "heartbeatLeases", { outcome: "cancelled" }), 1, "the beat made on reconnect found the cancel");
  await assertLateReportFenced(lh, worker, id!);
});

async function serve(t: T, lh: Leasehold): Promise<{ app: FastifyInstance; base: string }> {
  const app = createServer({ leasehold: lh, token: TOKEN });
  await app.listen({ host: "127.0.0.1", port: 0 });
  t.after(() => app.close());
  return { app, base: `http://127.0.0.1:${(app.server.address() as { port: number }).port}` };
}

function remote(base: string, aborts: Map<string, string>): Worker {
  return new Worker({
    handlers: { hold: stubborn(aborts) },
    leaseMs: LEASE_MS,
    heartbeatMs: HEARTBEAT_MS,
    concurrency: 5,
    logger: silent,
    metricsRegistry: new Registry(),
    // The default long polls (20 s): only a notice can answer the cancel poll sooner.
    transport: new RemoteTransport({ serverUrl: base, token: TOKEN }),
  });
}

test("remote HTTP worker: a cancel over the HTTP API reaches its handler through the server's cancel poll", async (t) => {
  const lh = await freshLeasehold(t);
  const { base } = await serve(t, lh);
  const aborts = new Map<string, string>();
  const worker = remote(base, aborts);
  await worker.start();
  t.after(() => worker.stop(0));
  const [target, other] = await running(lh, worker, 2);
  const end = ended(worker, target!);
  const res = await api(base, "POST", `/v1/jobs/${target}/cancel`);
  assert.equal(res.status, 200, res.text);
  assert.equal(res.json.result, "cancel_requested");
  assert.equal((await end).state, "cancelled");
  assert.deepEqual([...aborts], [[target, "cancelled"]]);
  assert.equal(await counter(worker, "cancelNotices"), 1, "the cancel came by the cancel poll");
  assert.equal(await counter(worker, "heartbeatLeases", { outcome: "cancelled" }), 0, "not by a heartbeat");
  await assertLateReportFenced(lh, worker, target!);
  assert.equal((await lh.getJob(other!)).job.state, "running", "the other job was not touched");
});

test("remote HTTP worker: a cancel sent while the server's listening session is cut arrives by the next poll's check", async (t) => {
  const lh = await freshLeasehold(t);
  const { base } = await serve(t, lh);
  const aborts = new Map<string, string>();
  const worker = remote(base, aborts);
  await worker.start();
  t.after(() => worker.stop(0));
  const [id] = await running(lh, worker, 1);
  const end = ended(worker, id!);
  const c = await rawClient(lh.schema);
  try {
    // The server starts listening at its first waiting long poll, which may come a moment after
    // the job started: wait for the session (other test files run servers too).
    await eventually(
      async () =>
        (
          await c.query("SELECT 1 FROM pg_stat_activity WHERE application_name = 'leasehold-serve-listen' AND query LIKE $1", [
            `%LISTEN "leasehold:${lh.schema}"%`,
          ])
        ).rowCount === 1,
      "the server's listening session",
    );
    await c.query("BEGIN");
    // This server's session: the one listening on this schema's channel.
    const cut = await c.query(
      "SELECT pg_terminate_backend(pid, 5000) AS ok FROM pg_stat_activity WHERE application_name = 'leasehold-serve-listen' AND query LIKE $1",
      [`%LISTEN "leasehold:${lh.schema}"%`],
    );
    assert.equal(cut.rowCount, 1, "the server's listening session was found");
    assert.equal(await store.cancelJob(c, id!), "cancel_requested");
    await c.query("COMMIT");
  } finally {
    await c.end();
  }
  assert.equal((await end).state, "cancelled");
  assert.equal(aborts.get(id!), "cancelled");
  assert.equal(await counter(worker, "cancelNotices"), 1, "the cancel came by a cancel poll's check, not a heartbeat");
  assert.equal(await counter(worker, "heartbeatLeases", { outcome: "cancelled" }), 0);
  await assertLateReportFenced(lh, worker, id!);
});

const NATS_URL = process.env.LEASEHOLD_TEST_NATS_URL || undefined;
const natsTest: typeof nodeTest = NATS_URL ? nodeTest : ((() => undefined) as unknown as typeof nodeTest);

natsTest("NATS worker: a cancel reaches the running handler at once", async (t) => {
  const schema = uniqueSchema("nats");
  const lh = await Leasehold.connect({ databaseUrl: databaseUrl(), schema, logger: silent, metricsRegistry: new Registry(), nats: NATS_URL });
  t.after(async () => {
    await lh.pool.query(`DROP SCHEMA ${schema} CASCADE`).catch(() => {});
    await lh.close();
  });
  const aborts = new Map<string, string>();
  const worker = databaseWorker(lh, aborts);
  await worker.start();
  t.after(() => worker.stop(0));
  const [id] = await running(lh, worker, 1);
  const end = ended(worker, id!);
  assert.equal(await lh.cancel(id!), "cancel_requested");
  assert.equal((await end).state, "cancelled");
  assert.equal(aborts.get(id!), "cancelled");
  assert.equal(await counter(worker, "cancelNotices"), 1);
  await assertLateReportFenced(lh, worker, id!);
});
