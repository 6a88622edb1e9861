/**
 * A queue that keeps no record of its succeeded jobs (docs/flow-control.md#records-of-succeeded-jobs):
 * a succeeded job leaves `jobs` without a job_history row, and getJob says "finished, not kept";
 * failures, dead and cancelled jobs keep theirs; a job whose result someone needs (dependents, a
 * batch callback, a waiter, a durable parent) keeps it anyway; the setting binds the next
 * completions; ctx.transaction's completion and a remote worker's (through the server) obey it.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import type { FastifyInstance } from "fastify";
import { createServer } from "../packages/cli/src/server/app.js";
import { JobNotFoundError, JobNotKeptError, ValidationError } from "../packages/leasehold/src/errors.js";
import * as store from "../packages/leasehold/src/store/index.js";
import type { JobContext } from "../packages/leasehold/src/worker/context.js";
import { eventually, freshLeasehold, NO_BACKOFF } from "./helpers/db.js";
import { remoteWorker, TOKEN } from "./helpers/server.js";

type Lh = Awaited<ReturnType<typeof freshLeasehold>>;

/** Where a job is now: its row's table (or none) and state, straight from the tables. */
async function whereIs(lh: Lh, id: string): Promise<string> {
  const { rows } = await lh.pool.query<{ at: string }>(
    `SELECT 'jobs:' || state AS at FROM jobs WHERE id = $1
     UNION ALL SELECT 'history:' || state FROM job_history WHERE id = $1
     UNION ALL SELECT 'dead' FROM dead_jobs WHERE id = $1`,
    [id],
  );
  assert.ok(rows.length <= 1, `job ${id} is in one place`);
  return rows[0]?.at ?? "gone";
}

const unfinished = async (lh: Lh) => (await lh.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM jobs")).rows[0]!.n;

/** Claims and completes every waiting job of `task` by hand (one batch, the store's statement). */
async function completeAll(lh: Lh, task: string, queue = "default") {
  const jobs = await store.claimJobs(lh.pool, { queues: [queue], limit: 100, workerId: "w", leaseMs: 60_000, tasks: [task] });
  const done = await store.completeJobs(lh.pool, { workerId: "w", jobs: jobs.map((j) => ({ id: j.id, attempt: j.attempt, resultJson: '"r"' })) });
  assert.equal(done.size, jobs.length, "every completion was taken");
  return jobs.map((j) => j.id);
}

test("opted out: succeeded jobs leave no record and getJob says not kept; failed, dead and cancelled keep theirs; another queue keeps all", async (t) => {
  const lh = await freshLeasehold(t);
  const settings = await lh.setQueueHistory("lean", { keepSucceeded: false }, { create: true });
  assert.equal(settings.keepSucceeded, false);
  assert.equal(settings.flow, false, "keeping no record does not make the queue flow-controlled");
  const listed = await lh.listQueues();
  assert.deepEqual(
    listed.map((q) => [q.name, q.keepSucceeded]),
    [["lean", false]],
  );

  const worker = lh.worker({
    queues: ["lean", "default"],
    handlers: {
      ok: (p: { n: number }) => ({ n: p.n }),
      flaky: (_: unknown, ctx: JobContext) => {
        if (ctx.attempt === 1) throw new Error("once");
        return "second time";
      },
      boom: () => {
        throw new Error("always");
      },
      slow: async (_: unknown, ctx: JobContext) => {
        await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve, { once: true }));
        throw ctx.signal.reason;
      },
    },
    backoff: NO_BACKOFF,
    concurrency: 10,
    pollIntervalMs: 20,
  });
  await worker.start();
  t.after(() => worker.stop(0));

  const oks = await lh.enqueueMany(Array.from({ length: 20 }, (_, n) => ({ task: "ok", payload: { n }, queue: "lean" })));
  const kept = await lh.enqueue("ok", { n: 99 }); // queue "default": keeps its records
  const flaky = await lh.enqueue("flaky", {}, { queue: "lean", maxAttempts: 3 });
  const dead = await lh.enqueue("boom", {}, { queue: "lean", maxAttempts: 2 });
  const slow = await lh.enqueue("slow", {}, { queue: "lean" });
  await eventually(async () => (await whereIs(lh, slow.id)) === "jobs:running", "the slow job runs");
  assert.equal(await lh.cancel(slow.id), "cancel_requested");
  await eventually(async () => (await unfinished(lh)) === 0, "every job ended");

  for (const j of oks) {
    assert.equal(await whereIs(lh, j.id), "gone");
    const err = await lh.getJob(j.id).catch((e: unknown) => e);
    assert.ok(err instanceof JobNotKeptError, `getJob(${j.id}): ${String(err)}`);
    assert.ok(err instanceof JobNotFoundError, "old catch blocks still catch it");
    assert.equal(err.code, "job_not_kept");
    assert.match(err.message, /has finished and its record is not kept/);
  }
  assert.deepEqual((await lh.getJob(kept.id)).job.result, { n: 99 });
  // A job with an earlier attempt keeps its record: its failed attempt's audit is forgotten with it.
  assert.deepEqual([(await lh.getJob(flaky.id)).job.state, (await lh.getJob(flaky.id)).job.result], ["succeeded", "second time"]);
  assert.equal(await whereIs(lh, dead.id), "dead");
  assert.equal(await whereIs(lh, slow.id), "history:cancelled");
  // An id never issued is still plainly not found.
  const never = await lh.getJob("999999999").catch((e: unknown) => e);
  assert.ok(never instanceof JobNotFoundError && !(never instanceof JobNotKeptError), String(never));
  assert.equal((never as JobNotFoundError).code, "job_not_found");
  // waitFor after the end: refused at once with the same error, never waiting.
  await assert.rejects(lh.waitFor(oks[0]!.id, { timeoutMs: 10_000 }), JobNotKeptError);
});

test("switching at run time binds the next completions; bad settings are refused by name and change nothing", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.enqueueMany(Array.from({ length: 3 }, () => ({ task: "a" })));
  const before = await completeAll(lh, "a");
  await lh.setQueueHistory("default", { keepSucceeded: false });
  await lh.enqueueMany(Array.from({ length: 3 }, () => ({ task: "b" })));
  const during = await completeAll(lh, "b");
  assert.equal((await lh.setQueueHistory("default", { keepSucceeded: true })).keepSucceeded, true);
  await lh.enqueueMany(Array.from({ length: 3 }, () => ({ task: "c" })));
  const after = await completeAll(lh, "c");
  for (const id of [...before, ...after]) assert.equal(await whereIs(lh, id), "history:succeeded");
  for (const id of during) assert.equal(await whereIs(lh, id), "gone");

  await assert.rejects(lh.setQueueHistory("default", { keepSucceeded: "no" } as never), /keepSucceeded must be true or false \(got "no"\)/);
  await assert.rejects(lh.setQueueHistory("default", { keepSucceded: false } as never), /unknown queue history setting "keepSucceded"/);
  await assert.rejects(lh.setQueueHistory("default", null as never), ValidationError);
  await assert.rejects(lh.setQueueHistory("nowhere", { keepSucceeded: false }), /nowhere/);
  assert.deepEqual(
    (await lh.listQueues()).map((q) => [q.name, q.keepSucceeded]),
    [["default", true]],
  );
});

test("a result someone needs is still delivered: flow dependents, a batch callback, a waiter, a durable child's parent", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.setQueueHistory("default", { keepSucceeded: false }, { create: true });
  const seen = new Map<string, unknown>();
  const worker = lh.worker({
    handlers: {
      step: (p: { name: string }) => `result of ${p.name}`,
      join: async (p: { name: string }, ctx: JobContext) => {
        seen.set(
          p.name,
          (await ctx.parents()).map((x) => [x.state, x.result]),
        );
        return "joined";
      },
      fanOut: async (_: unknown, ctx: JobContext) => {
        const ends = await ctx.children("kids", [{ task: "step", payload: { name: "kid" } }]);
        return ends.map((e) => e.result);
      },
      gated: async () => {
        await eventually(async () => (await lh.pool.query("SELECT watched FROM jobs WHERE task = 'gated'")).rows[0]?.watched, "the waiter's mark");
        return "awaited";
      },
    },
    concurrency: 4,
    pollIntervalMs: 20,
  });
  await worker.start();
  t.after(() => worker.stop(0));

  const { jobs } = await lh.enqueueFlow([
    { ref: "a", task: "step", payload: { name: "a" } },
    { ref: "b", task: "join", payload: { name: "b" }, dependsOn: ["a"] },
  ]);
  const { callbackId, jobIds } = await lh.enqueueBatch({
    jobs: [
      { task: "step", payload: { name: "m1" } },
      { task: "step", payload: { name: "m2" } },
    ],
    onComplete: { task: "join", payload: { name: "callback" } },
  });
  const gated = await lh.enqueue("gated");
  const waited = await lh.waitFor(gated.id, { timeoutMs: 15_000 });
  assert.equal(waited.result, "awaited");
  const parent = await lh.enqueue("fanOut");
  await eventually(async () => (await unfinished(lh)) === 0, "everything ended");

  assert.deepEqual(seen.get("b"), [["succeeded", "result of a"]]);
  assert.deepEqual(seen.get("callback"), [
    ["succeeded", "result of m1"],
    ["succeeded", "result of m2"],
  ]);
  // Parents and the awaited child keep their records; the waited job too.
  for (const id of [jobs.a!, ...jobIds, gated.id]) assert.equal(await whereIs(lh, id), "history:succeeded");
  const { rows } = await lh.pool.query("SELECT id::text FROM job_history WHERE task = 'step' AND payload ->> 'name' = 'kid'");
  assert.equal(rows.length, 1, "the awaited durable child keeps its record");
  assert.deepEqual((await lh.getJob(parent.id)).job.result, ["result of kid"], "the durable parent (it has steps) keeps its record and result");
  // Jobs in a flow keep theirs (their edges are forgotten with them); a leaf of nobody's would not.
  assert.equal(await whereIs(lh, jobs.b!), "history:succeeded");
  assert.equal(await whereIs(lh, callbackId), "history:succeeded");
});

test("ctx.transaction's completion and a remote worker's (through the server) keep no record in an opted-out queue", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.setQueueHistory("default", { keepSucceeded: false }, { create: true });
  const app: FastifyInstance = createServer({ leasehold: lh, token: TOKEN });
  await app.listen({ host: "127.0.0.1", port: 0 });
  t.after(() => app.close());
  const base = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;

  const local = lh.worker({
    handlers: {
      inTx: async (_: unknown, ctx: JobContext) => {
        await ctx.transaction(async (tx) => void (await tx.query("SELECT 1")));
        return "tx";
      },
    },
    pollIntervalMs: 20,
  });
  await local.start();
  t.after(() => local.stop(0));
  const remote = remoteWorker(base, { viaHttp: () => "remote" });
  await remote.start();
  t.after(() => remote.stop(0));

  const tx = await lh.enqueueMany(Array.from({ length: 5 }, () => ({ task: "inTx" })));
  const http = await lh.enqueueMany(Array.from({ length: 5 }, () => ({ task: "viaHttp" })));
  await eventually(async () => (await unfinished(lh)) === 0, "every job ended");
  for (const j of [...tx, ...http]) await assert.rejects(lh.getJob(j.id), JobNotKeptError);
  const { rows } = await lh.pool.query("SELECT count(*)::int AS n FROM job_history");
  assert.equal(rows[0].n, 0);
});

test("a waiter whose job ends and is gone before its read is refused with JobNotKeptError, not left waiting", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.enqueue("w");
  const [job] = await store.claimJobs(lh.pool, { queues: ["default"], limit: 1, workerId: "w", leaseMs: 60_000, tasks: ["w"] });
  const waiting = lh.waitFor(job!.id, { timeoutMs: 10_000 });
  await eventually(async () => (await lh.pool.query("SELECT watched FROM jobs WHERE id = $1", [job!.id])).rows[0]?.watched, "the waiter's mark");
  // The end and the loss of its record in one transaction (as if retention forgot it at once):
  // the notification's read finds nothing.
  const client = await lh.pool.connect();
  try {
    await client.query("BEGIN");
    await store.completeJobs(client, { workerId: "w", jobs: [{ id: job!.id, attempt: job!.attempt }] });
    await client.query("DELETE FROM job_history WHERE id = $1", [job!.id]);
    await client.query("COMMIT");
  } finally {
    client.release();
  }
  const started = Date.now();
  await assert.rejects(waiting, JobNotKeptError);
  assert.ok(Date.now() - started < 5_000, "refused at the notification, not at the timeout");
});
