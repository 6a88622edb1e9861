/**
 * NATS JetStream dispatch (docs/nats.md) against a real nats-server: the one `npm test`
 * starts (LEASEHOLD_TEST_NATS_URL), or one of the test's own when it restarts or stops it.
 * Without a nats-server none of them is registered; the runner says so in one line.
 */
import { test as nodeTest } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Registry } from "prom-client";
import { connect } from "@nats-io/transport-node";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { ConfigError, Leasehold, type JobContext } from "../packages/leasehold/src/index.js";
import type { NatsOptions } from "../packages/nats/src/options.js";
import { consumerOf, subjectOf } from "../packages/nats/src/options.js";
import type { NatsLink } from "../packages/nats/src/nats.js";
import { NatsServer } from "./harness/nats-server.js";
import { databaseUrl, eventually, silent, uniqueSchema, recordEvents, waitForEvent } from "./helpers/db.js";
import { runCli } from "./helpers/cli.js";

const NATS_URL = process.env.LEASEHOLD_TEST_NATS_URL || undefined;
const NATS_BIN = process.env.LEASEHOLD_TEST_NATS_SERVER || undefined;
// Without a nats-server the runner says so in one line, and this file registers no test.
const test: typeof nodeTest = NATS_URL ? nodeTest : ((() => undefined) as unknown as typeof nodeTest);
const HELPERS = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "helpers");

type T = { after(fn: () => Promise<void> | void): void };

async function natsLeasehold(t: T, nats: string | NatsOptions = NATS_URL!, schema = uniqueSchema("nats")) {
  const lh = await Leasehold.connect({ databaseUrl: databaseUrl(), schema, logger: silent, metricsRegistry: new Registry(), poolSize: 20, nats });
  t.after(async () => {
    await lh.pool.query(`DROP SCHEMA ${schema} CASCADE`).catch(() => {});
    await lh.close();
  });
  return lh;
}

async function ownServer(t: T): Promise<NatsServer> {
  const server = await NatsServer.start(NATS_BIN);
  t.after(() => server.dispose());
  return server;
}

async function metric(lh: Leasehold, name: "natsMessages" | "natsPublished" | "natsFallbacks", labels: Record<string, string> = {}) {
  const { values } = await lh.metrics[name].get();
  return values
    .filter((v) => Object.entries(labels).every(([k, x]) => (v.labels as Record<string, unknown>)[k] === x))
    .reduce((n, v) => n + v.value, 0);
}

async function consumerInfo(lh: Leasehold, queue: string, task: string) {
  const nc = await connect({ servers: (lh.nats as NatsLink).options.servers });
  try {
    return await (await jetstreamManager(nc)).consumers.info((lh.nats as NatsLink).stream, consumerOf(queue, task));
  } finally {
    await nc.close();
  }
}

test("enqueue publishes, a worker claims by id, then acks", async (t) => {
  const lh = await natsLeasehold(t);
  const ran: string[] = [];
  const worker = lh.worker({ handlers: { greet: (_p, ctx: JobContext) => void ran.push(ctx.jobId) } });
  await worker.start();
  t.after(() => worker.stop(0));
  const { id } = await lh.enqueue("greet", { to: "nats" });
  await eventually(async () => (await lh.getJob(id)).job.state === "succeeded", "the job ran");
  assert.deepEqual(ran, [id]);
  assert.equal(await metric(lh, "natsPublished", { kind: "new" }), 1);
  assert.equal(await metric(lh, "natsMessages", { result: "claimed" }), 1);
  assert.equal((await lh.pool.query("SELECT count(*)::int AS n FROM dispatch_outbox")).rows[0].n, 0, "nothing owed");
  await eventually(async () => {
    const i = await consumerInfo(lh, "default", "greet");
    return i.num_ack_pending === 0 && i.num_pending === 0;
  }, "the message was acknowledged");
  const info = await consumerInfo(lh, "default", "greet");
  assert.ok(info.config.ack_wait! / 1e6 > worker.settings.leaseMs);
});

test("jobs enqueued in the caller's transaction and by SQL are published by the dispatchers; delayed ones when due", async (t) => {
  const lh = await natsLeasehold(t);
  const started = new Map<string, number>();
  const worker = lh.worker({ handlers: { t: (_p, ctx: JobContext) => void started.set(ctx.jobId, Date.now()) } });
  await worker.start();
  t.after(() => worker.stop(0));
  const client = await lh.pool.connect();
  let inTx: string;
  try {
    await client.query("BEGIN");
    inTx = (await lh.enqueue("t", {}, { db: client })).id;
    await client.query("COMMIT");
  } finally {
    client.release();
  }
  const bySql = (await lh.pool.query<{ id: string }>(`SELECT id::text FROM enqueue('t', '{}'::jsonb) AS id`)).rows[0]!.id;
  const delayedAt = Date.now();
  const { id: delayed } = await lh.enqueue("t", {}, { delayMs: 1_500 });
  for (const id of [inTx, bySql, delayed]) await eventually(async () => (await lh.getJob(id)).job.state === "succeeded", `job ${id} ran`);
  assert.ok(started.get(delayed)! - delayedAt >= 1_400, "the delayed job did not start before it was due");
  assert.equal(await metric(lh, "natsMessages", { result: "claimed" }), 3);
});

test("a publish that fails after the commit loses nothing: the outbox republishes it", async (t) => {
  const producer = await natsLeasehold(t);
  const workers = await natsLeasehold(t, NATS_URL!, producer.schema);
  const worker = workers.worker({ handlers: { t: () => undefined } });
  await worker.start();
  t.after(() => worker.stop(0));
  // This producer's publishes fail (as when NATS drops the connection between commit and publish).
  let failed = 0;
  (producer.nats as NatsLink).publish = async (doorbells) => {
    if (doorbells.length > 0) failed++;
    throw new Error("injected publish failure");
  };
  const at = Date.now();
  const { id } = await producer.enqueue("t");
  assert.equal(failed, 1);
  await eventually(async () => (await producer.getJob(id)).job.state === "succeeded", "the job ran", 20_000);
  const took = Date.now() - at;
  assert.ok(took >= 4_000, `published by a dispatcher after the enqueuer's grace (${took} ms)`);
  assert.equal(await metric(workers, "natsPublished", { kind: "new" }), 1, "the worker's dispatcher published it");
  assert.equal((await producer.pool.query("SELECT count(*)::int AS n FROM dispatch_outbox")).rows[0].n, 0);
});

test("a duplicate delivery runs the job once", async (t) => {
  const lh = await natsLeasehold(t);
  let runs = 0;
  const worker = lh.worker({ handlers: { once: () => void runs++ } });
  await worker.start();
  t.after(() => worker.stop(0));
  const { id } = await lh.enqueue("once");
  await eventually(async () => (await lh.getJob(id)).job.state === "succeeded", "the job ran");
  // The same doorbell twice more (new message ids: JetStream's own deduplication is not what is tested).
  const nc = await connect({ servers: NATS_URL! });
  const js = jetstream(nc);
  const body = JSON.stringify({ id, attempt: 0, queue: "default", task: "once", recovery: false });
  await js.publish(subjectOf((lh.nats as NatsLink).stream, "default", "once"), body, { msgID: "dup-1" });
  await js.publish(subjectOf((lh.nats as NatsLink).stream, "default", "once"), body, { msgID: "dup-2" });
  await nc.close();
  await eventually(async () => (await metric(lh, "natsMessages", { result: "skipped" })) === 2, "both duplicates skipped");
  assert.equal(runs, 1);
  assert.equal((await lh.getJob(id)).attempts.length, 1);
});

test("a message for a cancelled job is acknowledged and skipped", async (t) => {
  const lh = await natsLeasehold(t);
  const { id } = await lh.enqueue("gone"); // published: no worker yet
  assert.equal(await lh.cancel(id), "cancelled");
  let runs = 0;
  const worker = lh.worker({ handlers: { gone: () => void runs++ } });
  await worker.start();
  t.after(() => worker.stop(0));
  await eventually(async () => (await metric(lh, "natsMessages", { result: "skipped" })) === 1, "the message was skipped");
  const info = await consumerInfo(lh, "default", "gone");
  assert.deepEqual([info.num_pending, info.num_ack_pending], [0, 0]);
  assert.equal(runs, 0);
  assert.equal((await lh.getJob(id)).job.state, "cancelled");
});

/** Publishes as an outsider with access to the stream's subjects would: a raw JetStream client. */
async function forge(t: T, subject: string, body: unknown, msgID?: string): Promise<void> {
  const nc = await connect({ servers: NATS_URL! });
  t.after(() => nc.close());
  await jetstream(nc).publish(subject, JSON.stringify(body), msgID === undefined ? undefined : { msgID });
}

test("a forged message naming a job of another queue is refused once, and the job runs on a worker of its queue", async (t) => {
  const lh = await natsLeasehold(t);
  const stream = (lh.nats as NatsLink).stream;
  const ranOn: string[] = [];
  const wrong = lh.worker({ queues: ["public"], handlers: { t: () => void ranOn.push("public") } });
  await wrong.start();
  t.after(() => wrong.stop(0));
  // Its real message waits on the consumer of "private", which no worker serves yet.
  const { id } = await lh.enqueue("t", {}, { queue: "private" });
  await forge(t, subjectOf(stream, "public", "t"), { id, attempt: 0, queue: "public", task: "t", recovery: false });
  await eventually(async () => (await metric(lh, "natsMessages", { result: "refused" })) === 1, "the forged message was refused");
  const left = (await lh.getJob(id)).job;
  assert.deepEqual([left.state, left.attempt], ["waiting", 0], "the job was left alone");
  await eventually(async () => {
    const i = await consumerInfo(lh, "public", "t");
    return i.num_pending + i.num_ack_pending === 0;
  }, "the forged message was acknowledged, not given back");
  const right = lh.worker({ queues: ["private"], handlers: { t: () => void ranOn.push("private") } });
  await right.start();
  t.after(() => right.stop(0));
  await eventually(async () => (await lh.getJob(id)).job.state === "succeeded", "the job ran");
  assert.deepEqual(ranOn, ["private"]);
  assert.equal(await metric(lh, "natsMessages", { result: "refused" }), 1, "refused once, not redelivered");
});

test("a forged message that took a future doorbell's message id first does not hold that doorbell back", async (t) => {
  const lh = await natsLeasehold(t);
  const worker = lh.worker({ handlers: { t: () => undefined } });
  await worker.start();
  t.after(() => worker.stop(0));
  const first = await lh.enqueue("t");
  await eventually(async () => (await lh.getJob(first.id)).job.state === "succeeded", "the first job ran");
  // Job ids are a sequence: the next one is easy to predict. JetStream's duplicate window is
  // the stream's, so the subject the outsider uses does not matter.
  const next = String(BigInt(first.id) + 1n);
  for (const attempt of [0, 1]) await forge(t, `${(lh.nats as NatsLink).stream}.elsewhere.t`, {}, `${next}:${attempt}`);
  const { id } = await lh.enqueue("t");
  assert.equal(id, next, "the id was predicted");
  // Well inside the two-minute window (and past the 10 s lost-message check's first chance).
  await eventually(async () => (await lh.getJob(id)).job.state === "succeeded", "the job ran", 10_000);
});

test("a cancelled job retried runs at once: a delayed one not at its old time, a published one not swallowed as a duplicate", async (t) => {
  const lh = await natsLeasehold(t);
  // A NATS worker running switches the outbox on: the delayed job below owes its doorbell there.
  const first = lh.worker({ handlers: { delayed: () => undefined } });
  await first.start();
  t.after(() => first.stop(0));
  // Owed for two minutes from now when it is cancelled.
  const delayed = await lh.enqueue("delayed", {}, { delayMs: 120_000 });
  assert.equal(await lh.cancel(delayed.id), "cancelled");
  // Published at once (no worker runs its task yet) and cancelled; then its message is
  // consumed and skipped, so only the retry's own message can run it.
  const published = await lh.enqueue("published");
  assert.equal(await lh.cancel(published.id), "cancelled");
  const second = lh.worker({ handlers: { published: () => undefined } });
  await second.start();
  t.after(() => second.stop(0));
  await eventually(async () => (await metric(lh, "natsMessages", { result: "skipped" })) === 1, "the cancelled job's message was skipped");
  for (const { id } of [delayed, published]) await lh.retry(id);
  for (const { id } of [delayed, published]) {
    // Well before the lost-message check (every 10 s, for jobs ready 5 s) could find them.
    await eventually(async () => (await lh.getJob(id)).job.state === "succeeded", `the retried job ${id} ran`, 5_000);
  }
});

test("a job made due by SQL while its doorbell waits for its old time is found by the lost-message check", async (t) => {
  const lh = await natsLeasehold(t);
  const worker = lh.worker({ handlers: { t: () => undefined } });
  await worker.start();
  t.after(() => worker.stop(0));
  const { id } = await lh.enqueue("t", {}, { delayMs: 120_000 });
  // An operator brings it forward; its outbox row still says two minutes from now.
  await lh.pool.query(`UPDATE jobs SET run_at = now() - interval '10 seconds' WHERE id = $1`, [id]);
  await eventually(async () => (await lh.getJob(id)).job.state === "succeeded", "the job ran", 25_000);
});

test("a message naming a job id past bigint's range is dropped as invalid, not given back for ever with the jobs claimed beside it", async (t) => {
  const lh = await natsLeasehold(t);
  const worker = lh.worker({ handlers: { t: () => undefined } });
  await worker.start();
  t.after(() => worker.stop(0));
  await forge(t, subjectOf((lh.nats as NatsLink).stream, "default", "t"), { id: "9999999999999999999", attempt: 0 });
  await eventually(async () => (await metric(lh, "natsMessages", { result: "skipped", kind: "invalid" })) === 1, "the message was dropped");
  const { id } = await lh.enqueue("t");
  await eventually(async () => (await lh.getJob(id)).job.state === "succeeded", "a real job still runs");
  const info = await consumerInfo(lh, "default", "t");
  assert.deepEqual([info.num_pending, info.num_ack_pending], [0, 0]);
});

test("a worker serving many queues keeps a pull waiting on every queue's consumer while idle, and runs a job in each at once", async (t) => {
  const lh = await natsLeasehold(t);
  const queues = ["q1", "q2", "q3", "q4", "q5", "q6"];
  const worker = lh.worker({ queues, concurrency: 2, handlers: { tick: () => undefined } });
  await worker.start();
  t.after(() => worker.stop(0));
  // Idle a while. When every pull reserved the worker's free capacity, the loop whose pull
  // ended took it all back at once, and the other queues' loops never pulled: their jobs'
  // messages stayed pending, and the lost-message check (which only looks at consumers with
  // nothing pending) could not help.
  await new Promise((r) => setTimeout(r, 2_500));
  const nc = await connect({ servers: (lh.nats as NatsLink).options.servers });
  t.after(() => nc.close());
  const jsm = await jetstreamManager(nc);
  const pulled = new Set<string>();
  for (let i = 0; i < 20 && pulled.size < queues.length; i++) {
    for (const q of queues) if ((await jsm.consumers.info((lh.nats as NatsLink).stream, consumerOf(q, "tick"))).num_waiting > 0) pulled.add(q);
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.deepEqual(
    queues.filter((q) => !pulled.has(q)),
    [],
    "queues whose consumer never had a pull waiting",
  );
  const enqueuedAt = Date.now();
  const jobs = await Promise.all(queues.map((queue) => lh.enqueue("tick", {}, { queue })));
  await eventually(async () => {
    const states = await Promise.all(jobs.map(async ({ id }) => (await lh.getJob(id)).job.state));
    return states.every((s) => s === "succeeded");
  }, "a job in every queue ran");
  assert.ok(Date.now() - enqueuedAt < 5_000, `the jobs took ${Date.now() - enqueuedAt} ms`);
});

test("ack_wait no longer than the lease is refused at start", async (t) => {
  const lh = await natsLeasehold(t, { url: NATS_URL!, ackWaitMs: 5_000 });
  const worker = lh.worker({ leaseMs: 10_000, handlers: { t: () => undefined } });
  await assert.rejects(
    worker.start(),
    (err: Error) => err instanceof ConfigError && /ack_wait \(5000 ms\) must be longer than the lease \(10000 ms\)/.test(err.message),
  );
  // An existing consumer with a short ack_wait is refused as well.
  const ok = lh.worker({ leaseMs: 3_000, handlers: { t: () => undefined } });
  await ok.start();
  await ok.stop(0);
  const lh3 = await natsLeasehold(t, { url: NATS_URL!, stream: (lh.nats as NatsLink).stream }, uniqueSchema("nats"));
  const w3 = lh3.worker({ leaseMs: 10_000, handlers: { t: () => undefined } });
  await assert.rejects(w3.start(), (err: Error) => err instanceof ConfigError && /consumer .* ack_wait \(5000 ms\)/.test(err.message));
});

test("NATS down at enqueue time: enqueue succeeds at once, and the job runs once NATS is back", async (t) => {
  const server = await ownServer(t);
  await server.stop();
  const lh = await natsLeasehold(t, server.url);
  const at = Date.now();
  const { id } = await lh.enqueue("later");
  assert.ok(Date.now() - at < 1_000, `enqueue took ${Date.now() - at} ms`);
  await server.resume();
  await (lh.nats as NatsLink).waitConnected(10_000);
  const worker = lh.worker({ handlers: { later: () => undefined } });
  await worker.start();
  t.after(() => worker.stop(0));
  await eventually(async () => (await lh.getJob(id)).job.state === "succeeded", "the job ran", 20_000);
});

test("NATS restarted mid-run: workers fall back to polling, then return; every job runs once", async (t) => {
  const server = await ownServer(t);
  const lh = await natsLeasehold(t, server.url);
  await (lh.nats as NatsLink).waitConnected(10_000);
  const runs = new Map<string, number>();
  const worker = lh.worker({ handlers: { n: (_p, ctx: JobContext) => void runs.set(ctx.jobId, (runs.get(ctx.jobId) ?? 0) + 1) } });
  await worker.start();
  t.after(() => worker.stop(0));
  const ids: string[] = [];
  for (let i = 0; i < 20; i++) ids.push((await lh.enqueue("n", { i })).id);
  await server.stop(true); // a crash
  for (let i = 0; i < 20; i++) ids.push((await lh.enqueue("n", { i })).id);
  await eventually(async () => ids.every((id) => runs.has(id)), "jobs enqueued while NATS was down ran (by polling)", 20_000);
  assert.ok((await metric(lh, "natsFallbacks")) >= 1, "the fallback was counted");
  await server.resume();
  await (lh.nats as NatsLink).waitConnected(10_000);
  await eventually(async () => (await lh.metrics.natsFallback.get()).values[0]?.value === 0, "back on NATS", 20_000);
  const before = await metric(lh, "natsMessages", { result: "claimed" });
  for (let i = 0; i < 10; i++) ids.push((await lh.enqueue("n", { i })).id);
  await eventually(async () => ids.every((id) => runs.has(id)), "every job ran", 20_000);
  assert.ok((await metric(lh, "natsMessages", { result: "claimed" })) >= before + 10, "jobs after the restart came through NATS");
  assert.ok(
    [...runs.values()].every((n) => n === 1),
    "no job ran twice",
  );
});

test("a worker killed (kill -9) between receiving a message and claiming: JetStream redelivers it", async (t) => {
  const lh = await natsLeasehold(t, { url: NATS_URL!, ackWaitMs: 3_000 });
  const { id } = await lh.enqueue("r");
  // The consumer, as a worker would create it (lease 2 s, ack_wait 3 s).
  await (lh.nats as NatsLink).waitConnected(10_000);
  await (lh.nats as NatsLink).ensureConsumer("default", "r", 3_000, 2_000);
  const taker = spawn(process.execPath, ["--import", "tsx", path.join(HELPERS, "nats-taker.ts")], {
    env: { ...process.env, NATS_URL: NATS_URL!, STREAM: (lh.nats as NatsLink).stream, CONSUMER: consumerOf("default", "r") },
    stdio: ["ignore", "pipe", "inherit"],
  });
  t.after(() => void taker.kill("SIGKILL"));
  let out = "";
  taker.stdout!.on("data", (b: Buffer) => (out += b.toString()));
  await eventually(async () => out.includes(`"id":"${id}"`), "the taker holds the message", 30_000);
  taker.kill("SIGKILL");
  const worker = lh.worker({ leaseMs: 2_000, handlers: { r: () => undefined } });
  await worker.start();
  t.after(() => worker.stop(0));
  await eventually(async () => (await lh.getJob(id)).job.state === "succeeded", "the redelivered message ran the job", 15_000);
  assert.equal((await lh.getJob(id)).attempts.length, 1, "claimed once");
});

test("a worker killed (kill -9) after claiming: the watchdog recovers the job and republishes it as a recovery", async (t) => {
  const lh = await natsLeasehold(t);
  const victim = spawn(process.execPath, ["--import", "tsx", path.join(HELPERS, "worker-child.ts")], {
    env: { ...process.env, DATABASE_URL: databaseUrl(), LEASEHOLD_SCHEMA: lh.schema, NATS_URL: NATS_URL! },
    stdio: ["ignore", "pipe", "inherit"],
  });
  t.after(() => void victim.kill("SIGKILL"));
  let out = "";
  victim.stdout!.on("data", (b: Buffer) => (out += b.toString()));
  await eventually(async () => out.includes("ready "), "the worker process is ready", 30_000);
  const { id } = await lh.enqueue("hold", {}, { maxAttempts: 5 });
  await eventually(async () => out.includes(`started ${id}`), "the job started in the worker process");
  let recovered: boolean | undefined;
  const rescuer = lh.worker({ handlers: { hold: (_p, ctx: JobContext) => void (recovered = ctx.recovered) } });
  await rescuer.start();
  t.after(() => rescuer.stop(0));
  victim.kill("SIGKILL");
  await waitForEvent(rescuer, "job:start", (j: { id: string }) => j.id === id, 20_000);
  await eventually(async () => (await lh.getJob(id)).job.state === "succeeded", "the job ran again");
  assert.equal(recovered, true);
  assert.equal((await lh.getJob(id)).attempts[0]!.outcome, "worker_lost");
  assert.equal(await metric(lh, "natsPublished", { kind: "recovery" }), 1);
  assert.equal(await metric(lh, "natsMessages", { result: "claimed", kind: "recovery" }), 1);
});

test("a job released at a graceful shutdown comes back by a recovery message, with ctx.recovered false", async (t) => {
  const lh = await natsLeasehold(t);
  const seen: [string | null, boolean][] = [];
  const handler = (_p: unknown, ctx: JobContext) => {
    seen.push([ctx.previousOutcome, ctx.recovered]);
    if (seen.length === 1) return new Promise<void>((resolve) => ctx.signal.addEventListener("abort", () => resolve()));
  };
  const leaving = lh.worker({ handlers: { t: handler } });
  await leaving.start();
  t.after(() => leaving.stop(0));
  const starts = recordEvents(leaving, "job:start");
  const { id } = await lh.enqueue("t", {}, { maxAttempts: 5 });
  await starts.waitFor((j: { id: string }) => j.id === id);
  await leaving.stop(0);
  const next = lh.worker({ handlers: { t: handler } });
  await next.start();
  t.after(() => next.stop(0));
  await eventually(async () => (await lh.getJob(id)).job.state === "succeeded", "the job ran again");
  assert.deepEqual(seen, [
    [null, false],
    ["released", false],
  ]);
  assert.equal(await metric(lh, "natsMessages", { result: "claimed", kind: "recovery" }), 1);
});

test("the CLI: enqueue --nats publishes (LEASEHOLD_NATS_URL too); a bad URL is refused in one line", async (t) => {
  const lh = await natsLeasehold(t);
  const flag = await runCli(["enqueue", "--nats", NATS_URL!, "cli", "--payload", "{}"], { schema: lh.schema });
  assert.equal(flag.code, 0, flag.stderr);
  const env = await runCli(["enqueue", "cli"], { schema: lh.schema, env: { LEASEHOLD_NATS_URL: NATS_URL! } });
  assert.equal(env.code, 0, env.stderr);
  await (lh.nats as NatsLink).waitConnected(10_000);
  await (lh.nats as NatsLink).ensureConsumer("default", "cli", 60_000, 30_000);
  assert.equal(await (lh.nats as NatsLink).pendingOf("default", "cli"), 2, "two messages wait for a worker");
  const bad = await runCli(["enqueue", "--nats", "http://nope", "cli"], { schema: lh.schema });
  assert.notEqual(bad.code, 0);
  assert.match(bad.stderr, /the NATS URL must look like nats:\/\/host:4222/);
});

test("flow control under NATS dispatch: a paused queue starts nothing until resumed; a limited or keyed queue is claimed by polling, within its limit", async (t) => {
  const lh = await natsLeasehold(t);
  let running = 0;
  let most = 0;
  const started: string[] = [];
  const worker = lh.worker({
    concurrency: 10,
    handlers: {
      work: async (_p, ctx: JobContext) => {
        started.push(ctx.jobId);
        most = Math.max(most, ++running);
        await new Promise((r) => setTimeout(r, 100));
        running--;
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));

  await lh.pauseQueue("default", { create: true });
  const paused = await lh.enqueueMany(Array.from({ length: 5 }, () => ({ task: "work" })));
  // The messages arrive; the claims by id refuse a paused queue, and polling skips it.
  await new Promise((r) => setTimeout(r, 1_500));
  assert.deepEqual(started, [], "nothing of a paused queue starts");
  await lh.resumeQueue("default");
  for (const { id } of paused) await eventually(async () => (await lh.getJob(id)).job.state === "succeeded", `job ${id} ran after the resume`);

  await lh.setQueueLimits("default", { concurrency: 2 });
  started.length = 0;
  most = 0;
  const limited = await lh.enqueueMany(Array.from({ length: 10 }, (_, i) => ({ task: "work", key: `k${i % 3}` })));
  for (const { id } of limited) await eventually(async () => (await lh.getJob(id)).job.state === "succeeded", `job ${id} ran within the limit`);
  assert.equal(started.length, 10);
  assert.equal(most, 2, "at most the limit at once, and the limit reached");
});
