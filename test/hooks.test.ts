/**
 * The hook API (src/hooks.ts) through a real worker on the real database: before-enqueue hooks
 * change what is written, handler middlewares wrap the handler in registration order,
 * after-attempt hooks see each attempt's outcome, and batch hooks see claims and reports.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { ConfigError, ValidationError, type LeaseholdHooks } from "../packages/leasehold/src/index.js";
import type { AttemptEnd } from "../packages/leasehold/src/hooks.js";
import type { ClaimedJob, JobHeaders } from "../packages/leasehold/src/jobs/types.js";
import type { JobContext } from "../packages/leasehold/src/worker/context.js";
import { eventually, freshLeasehold, waitForEvent } from "./helpers/db.js";

test("a before-enqueue hook adds headers: written with the job, read by the handler; the caller's objects are untouched", async (t) => {
  const lh = await freshLeasehold(t);
  lh.use({
    beforeEnqueue(jobs, info) {
      for (const job of jobs) {
        job.headers = { ...job.headers, tenant: "acme", inTransaction: String(info.db !== undefined) };
        job.priority = 7;
      }
    },
  });
  const mine = { task: "greet", payload: { to: "ada" }, headers: { correlation: "c-1" } };
  const [enqueued] = await lh.enqueueMany([mine]);
  assert.deepEqual(mine, { task: "greet", payload: { to: "ada" }, headers: { correlation: "c-1" } }, "the caller's job object is unchanged");
  const { rows } = await lh.pool.query("SELECT headers, priority FROM jobs WHERE id = $1", [enqueued!.id]);
  assert.deepEqual(rows[0], { headers: { correlation: "c-1", tenant: "acme", inTransaction: "false" }, priority: 7 });

  let seen: JobHeaders | null | undefined;
  const worker = lh.worker({
    handlers: {
      greet: async (_p, ctx) => {
        seen = ctx.headers;
      },
    },
    watchdog: false,
    scheduler: false,
  });
  const ended = waitForEvent(worker, "job:end");
  await worker.start();
  t.after(() => worker.stop());
  await ended;
  assert.deepEqual(seen, { correlation: "c-1", tenant: "acme", inTransaction: "false" });
});

test("handler middlewares wrap the handler in registration order: client's first, then the worker's own", async (t) => {
  const lh = await freshLeasehold(t);
  const order: string[] = [];
  const named =
    (name: string): LeaseholdHooks["aroundHandler"] =>
    async (job, ctx, next) => {
      order.push(`${name}:before ${job.task} ${ctx.attempt}`);
      const result = await next();
      order.push(`${name}:after`);
      return result;
    };
  lh.use({ aroundHandler: named("a") });
  lh.use({ aroundHandler: named("b") });
  await lh.enqueue("work");
  const worker = lh.worker({
    handlers: { work: async () => void order.push("handler") },
    hooks: { aroundHandler: named("c") },
    watchdog: false,
    scheduler: false,
  });
  const ended = waitForEvent(worker, "job:end");
  await worker.start();
  t.after(() => worker.stop());
  await ended;
  assert.deepEqual(order, ["a:before work 1", "b:before work 1", "c:before work 1", "handler", "c:after", "b:after", "a:after"]);
});

test("a middleware can fail an attempt, and after-attempt hooks see each attempt's outcome and error", async (t) => {
  const lh = await freshLeasehold(t);
  const ends: [ClaimedJob, AttemptEnd][] = [];
  lh.use({
    aroundHandler: async (job, _ctx, next) => {
      if (job.task === "refused") throw new Error("refused by middleware");
      return next();
    },
    afterAttempt: (job, end) => void ends.push([job, end]),
  });
  // A throwing after-attempt hook is logged and dropped: the others still run, the worker goes on.
  lh.use({
    afterAttempt: () => {
      throw new Error("a broken hook");
    },
  });
  await lh.enqueue("ok", {});
  await lh.enqueue("boom", {}, { maxAttempts: 1 });
  await lh.enqueue("refused", {}, { maxAttempts: 1 });
  const worker = lh.worker({
    handlers: {
      ok: async () => {},
      boom: async () => {
        throw new Error("handler failed");
      },
      refused: async () => assert.fail("the middleware did not call next"),
    },
    watchdog: false,
    scheduler: false,
  });
  let count = 0;
  const allEnded = waitForEvent(worker, "job:end", () => ++count === 3);
  await worker.start();
  t.after(() => worker.stop());
  await allEnded;
  const byTask = new Map(ends.map(([job, end]) => [job.task, end]));
  assert.deepEqual(byTask.get("ok")!.outcome, { state: "succeeded" });
  assert.equal(byTask.get("ok")!.error, undefined);
  assert.deepEqual(byTask.get("boom")!.outcome, { state: "dead" });
  assert.match(String(byTask.get("boom")!.error), /handler failed/);
  assert.deepEqual(byTask.get("refused")!.outcome, { state: "dead" });
  assert.match(String(byTask.get("refused")!.error), /refused by middleware/);
  for (const [, end] of ends) assert.ok(end.durationMs >= 0);
  const dead = await lh.listJobs({ state: "dead" });
  assert.deepEqual(dead.map((j) => j.task).sort(), ["boom", "refused"]);
});

test("claim and settle hooks see the worker's batches", async (t) => {
  const lh = await freshLeasehold(t);
  const claims: number[] = [];
  const settles: { kind: string; jobs: number; applied: number }[] = [];
  await lh.enqueueMany(Array.from({ length: 6 }, (_, i) => ({ task: i < 4 ? "ok" : "fail", maxAttempts: 1 })));
  const worker = lh.worker({
    handlers: {
      ok: async () => {},
      fail: async () => {
        throw new Error("no");
      },
    },
    hooks: {
      aroundClaim: async (batch, next) => {
        const jobs = await next();
        assert.deepEqual(batch.queues, ["default"]);
        if (jobs.length > 0) claims.push(jobs.length);
        return jobs;
      },
      aroundSettle: async (batch, next) => {
        const applied = await next();
        settles.push({ kind: batch.kind, jobs: batch.jobs.length, applied: applied.size });
        return applied;
      },
    },
    watchdog: false,
    scheduler: false,
  });
  let count = 0;
  const allEnded = waitForEvent(worker, "job:end", () => ++count === 6);
  await worker.start();
  t.after(() => worker.stop());
  await allEnded;
  assert.equal(
    claims.reduce((a, b) => a + b, 0),
    6,
  );
  const sum = (kind: string) => settles.filter((s) => s.kind === kind).reduce((a, s) => a + s.applied, 0);
  assert.equal(sum("complete"), 4);
  assert.equal(sum("fail"), 2);
  assert.ok(settles.every((s) => s.jobs === s.applied));
});

test("a worker with batch hooks runs durable steps, children and callbacks: its wrapped transport keeps the step methods", async (t) => {
  const lh = await freshLeasehold(t);
  const settled: string[] = [];
  const urls: (string | null)[] = [];
  const worker = lh.worker({
    hooks: {
      aroundSettle: (batch, next) => {
        settled.push(batch.kind);
        return next();
      },
    },
    handlers: {
      durable: async (_: unknown, ctx: JobContext) => {
        const a = await ctx.step("a", () => 1);
        await ctx.sleep("nap", 1);
        const [child] = await ctx.children("kids", [{ task: "child", payload: {} }]);
        const cb = await ctx.callback("approval");
        urls.push(cb.url);
        return a + (await ctx.step("b", () => 2)) + (child!.result as number);
      },
      child: async () => 4,
    },
    callbackBaseUrl: "https://jobs.example.com",
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const { id } = await lh.enqueue("durable", {});
  const job = await eventually(async () => {
    const { job } = await lh.getJob(id);
    return job.finishedAt ? job : undefined;
  }, "the job finished");
  assert.equal(job.lastError, null);
  assert.deepEqual([job.state, job.result], ["succeeded", 7]);
  assert.ok(
    urls.every((u) => u?.startsWith("https://jobs.example.com/v1/callbacks/")),
    `callback URLs: ${urls.join(", ")}`,
  );
  assert.ok(settled.includes("complete"));
});

test("bad hooks and bad headers are refused with errors that name the problem, writing nothing", async (t) => {
  const lh = await freshLeasehold(t);
  assert.throws(
    () => lh.use({ beforeEnqeue: () => {} } as never),
    (e: unknown) => e instanceof ConfigError && /unknown hook "beforeEnqeue"/.test(e.message),
  );
  assert.throws(
    () => lh.use({ afterAttempt: 5 } as never),
    (e: unknown) => e instanceof ConfigError && /afterAttempt must be a function/.test(e.message),
  );
  await assert.rejects(
    lh.enqueue("t", {}, { headers: { tenant: 5 } as never }),
    (e: unknown) => e instanceof ValidationError && /header tenant must be a string/.test(e.message),
  );
  await assert.rejects(
    lh.enqueue("t", {}, { headers: { "bad name": "x" } }),
    (e: unknown) => e instanceof ValidationError && /header name "bad name"/.test(e.message),
  );
  await assert.rejects(
    lh.enqueue("t", {}, { headers: { big: "x".repeat(9_000) } }),
    (e: unknown) => e instanceof ValidationError && /larger than 8192 bytes/.test(e.message),
  );
  lh.use({
    beforeEnqueue: () => {
      throw new Error("not today");
    },
  });
  await assert.rejects(lh.enqueue("t"), /not today/);
  const { rows } = await lh.pool.query("SELECT count(*)::int AS n FROM jobs");
  assert.equal(rows[0].n, 0);
});
