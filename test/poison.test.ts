/**
 * One bad value never touches another job: what PostgreSQL would refuse is refused to the
 * handler that made it, and a value that reaches the database anyway fails only its own job
 * (the heartbeat batch degrades to that job, never to its neighbours).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { ValidationError } from "../packages/leasehold/src/errors.js";
import type { JobContext } from "../packages/leasehold/src/worker/context.js";
import { DatabaseTransport, type WorkerTransport } from "../packages/leasehold/src/worker/transport.js";
import { Worker } from "../packages/leasehold/src/worker/worker.js";
import * as store from "../packages/leasehold/src/store/index.js";
import { Registry } from "prom-client";
import { eventually, freshLeasehold, silent } from "./helpers/db.js";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** The first half of an emoji: a lone UTF-16 surrogate, not Unicode. */
const HALF_EMOJI = "😀".slice(0, 1);

test("a handler's malformed progress is refused to that handler; the other jobs on its worker keep their leases", async (t) => {
  const lh = await freshLeasehold(t);
  const refused: unknown[] = [];
  const aborted: string[] = [];
  const worker = lh.worker({
    heartbeatMs: 100,
    leaseMs: 1_000,
    pollIntervalMs: 20,
    concurrency: 4,
    handlers: {
      work: async (p: { bad: boolean }, ctx: JobContext) => {
        ctx.signal.addEventListener("abort", () => aborted.push(ctx.jobId));
        for (let i = 0; i < 6; i++) {
          try {
            ctx.progress(p.bad ? { s: HALF_EMOJI, i } : { i });
          } catch (err) {
            refused.push(err);
          }
          try {
            if (p.bad) ctx.checkpoint({ ["k\u0000"]: i });
          } catch (err) {
            refused.push(err);
          }
          await sleep(100); // several beats go by while the job runs
        }
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop());
  const jobs = await lh.enqueueMany([0, 1, 2, 3].map((i) => ({ task: "work", payload: { bad: i === 0 } })));
  for (const { id } of jobs) await eventually(async () => (await lh.getJob(id)).job.state === "succeeded", `job ${id} succeeded`);
  assert.deepEqual(aborted, [], "no handler was aborted");
  assert.equal(refused.length, 12);
  assert.ok(refused.every((e) => e instanceof ValidationError));
  assert.match((refused[0] as Error).message, /progress\.s is not well-formed Unicode/);
  assert.match((refused[1] as Error).message, /checkpoint has a key that contains a NUL character/);
  assert.deepEqual((await lh.getJob(jobs[1]!.id)).job.progress, { i: 5 });
});

test("a heartbeat batch holding a value the database refuses renews every lease and refuses only that value", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.enqueueMany([{ task: "t" }, { task: "t" }, { task: "t" }]);
  const claimed = await store.claimJobs(lh.pool, { queues: ["default"], limit: 3, workerId: "w1", leaseMs: 5_000, tasks: ["t"] });
  assert.equal(claimed.length, 3);
  const transport = new DatabaseTransport(lh.pool, lh.databaseUrl, lh.schema);
  const [a, b, c] = claimed;
  const result = await transport.heartbeat({
    workerId: "w1",
    leaseMs: 5_000,
    beats: [
      { id: a!.id, attempt: a!.attempt, progressJson: '{"ok":1}' },
      // What validation refuses, sent raw: jsonb refuses a lone surrogate's escape.
      { id: b!.id, attempt: b!.attempt, progressJson: '{"s":"\\ud83d"}' },
      { id: c!.id, attempt: c!.attempt, checkpointJson: '{"ok":3}' },
    ],
  });
  assert.deepEqual([...result.renewed.keys()].sort(), [a!.id, b!.id, c!.id].sort());
  assert.deepEqual(result.lost, []);
  assert.deepEqual([...(result.refused ?? new Map()).keys()], [b!.id]);
  assert.deepEqual((await lh.getJob(a!.id)).job.progress, { ok: 1 });
  assert.deepEqual((await lh.getJob(c!.id)).job.checkpoint, { ok: 3 });
  assert.equal((await lh.getJob(b!.id)).job.progress, null);
});

test("a job whose progress the database refuses fails on its own; its neighbours succeed", async (t) => {
  const lh = await freshLeasehold(t);
  // A transport that lets one bad value through to the database, as a bug in validation would.
  const inner = new DatabaseTransport(lh.pool, lh.databaseUrl, lh.schema);
  const leaky: WorkerTransport = Object.assign(Object.create(inner) as WorkerTransport, {
    heartbeat: (p: Parameters<WorkerTransport["heartbeat"]>[0]) =>
      inner.heartbeat({ ...p, beats: p.beats.map((b) => (b.progressJson === '{"poison":true}' ? { ...b, progressJson: '"\\u0000"' } : b)) }),
  });
  const worker = new Worker({
    transport: leaky,
    logger: silent,
    metricsRegistry: new Registry(),
    heartbeatMs: 100,
    leaseMs: 1_000,
    pollIntervalMs: 20,
    concurrency: 3,
    handlers: {
      work: async (p: { poison: boolean }, ctx: JobContext) => {
        ctx.progress(p.poison ? { poison: true } : { fine: true });
        await sleep(500);
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop());
  const jobs = await lh.enqueueMany([true, false, false].map((poison) => ({ task: "work", payload: { poison }, maxAttempts: 1 })));
  const final = async (id: string) => {
    const { job } = await lh.getJob(id);
    return job.state === "succeeded" || job.state === "dead" ? job : undefined;
  };
  const [poisoned, ...neighbours] = await Promise.all(jobs.map(({ id }) => eventually(() => final(id), `job ${id} finished`)));
  assert.equal(poisoned!.state, "dead");
  assert.match(poisoned!.lastError!, /refused its progress or checkpoint/);
  assert.deepEqual(
    neighbours.map((j) => j.state),
    ["succeeded", "succeeded"],
  );
});

test("a handler error holding NUL and a lone surrogate is recorded at once, not lost to a lease expiry", async (t) => {
  const lh = await freshLeasehold(t);
  const worker = lh.worker({
    leaseMs: 30_000,
    pollIntervalMs: 20,
    handlers: {
      boom: () => {
        throw new Error(`bad\u0000bytes ${HALF_EMOJI} here`);
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop());
  const { id } = await lh.enqueue("boom", {}, { maxAttempts: 1 });
  // Within a few seconds, far inside the 30 s lease: the failure report itself landed.
  const job = await eventually(
    async () => {
      const { job } = await lh.getJob(id);
      return job.state === "dead" ? job : undefined;
    },
    "job dead",
    5_000,
  );
  assert.match(job.lastError!, /bad\uFFFDbytes \uFFFD here/);
  const { attempts } = await lh.getJob(id);
  assert.deepEqual(
    attempts.map((a) => a.outcome),
    ["failed"],
  );
});
