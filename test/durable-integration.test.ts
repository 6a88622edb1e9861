/**
 * Durable jobs with the rest of the queue: flows (a child waits while its parent sleeps), flow
 * control (a suspended job holds no slot of a limited queue; a rate counts each resume as a
 * start), cancel of a waiting job and of one about to suspend, a typed task using steps, and a
 * stale attempt whose step record the fence refuses.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { z } from "zod";
import { StaleLeaseError } from "../packages/leasehold/src/errors.js";
import { defineTask, type JobContext } from "../packages/leasehold/src/index.js";
import * as store from "../packages/leasehold/src/store/index.js";
import { eventually, freshLeasehold, rawClient, recordEvents, waitForEvent, settled } from "./helpers/db.js";
import { auditTrail } from "./helpers/flow.js";

type Lh = Awaited<ReturnType<typeof freshLeasehold>>;

const outcomes = async (lh: Lh, id: string) => (await lh.getJob(id)).attempts.map((a) => a.outcome);

test("flows: a dependsOn child stays blocked while its parent sleeps, and runs after the parent succeeds", async (t) => {
  const lh = await freshLeasehold(t);
  const worker = lh.worker({
    handlers: {
      parent: async (_: unknown, ctx: JobContext) => {
        await ctx.step("prepare", () => "ready");
        await ctx.sleep("settle", "1s");
        return "parent done";
      },
      child: async (_: unknown, ctx: JobContext) => (await ctx.parents()).map((p) => [p.ref, p.state]),
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const { jobs } = await lh.enqueueFlow([
    { ref: "parent", task: "parent" },
    { ref: "child", task: "child", dependsOn: ["parent"] },
  ]);
  await settled(lh, jobs.parent!, "suspended");
  assert.equal((await lh.getJob(jobs.child!)).job.state, "blocked", "a sleeping parent has not succeeded");
  const { job } = await settled(lh, jobs.child!, "succeeded");
  assert.deepEqual(job.result, [["parent", "succeeded"]]);
  assert.deepEqual(await outcomes(lh, jobs.parent!), ["suspended", "succeeded"]);
  const trail = await auditTrail(lh.pool);
  const parentEnd = Math.max(...trail.filter((a) => a.jobId === jobs.parent).map((a) => a.end));
  const childStart = trail.find((a) => a.jobId === jobs.child)!.start;
  assert.ok(childStart >= parentEnd, "the child started after its parent's last attempt ended");
});

test("flow control: a sleeping job does not hold its queue's only slot; another job runs while it sleeps", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.setQueueLimits("single", { concurrency: 1 }, { create: true });
  const worker = lh.worker({
    queues: ["single"],
    concurrency: 5,
    handlers: {
      nap: async (_: unknown, ctx: JobContext) => {
        await ctx.sleep("nap", "5s");
        return "rested";
      },
      quick: async () => "quick",
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const sleeper = await lh.enqueue("nap", {}, { queue: "single" });
  await settled(lh, sleeper.id, "suspended");
  const other = await lh.enqueue("quick", {}, { queue: "single" });
  await settled(lh, other.id, "succeeded");
  await settled(lh, sleeper.id, "succeeded");
  // From the audit trail: the other job ran between the sleeper's suspension and its resume.
  const trail = await auditTrail(lh.pool);
  const [suspended, resumed] = trail.filter((a) => a.jobId === sleeper.id);
  const ran = trail.find((a) => a.jobId === other.id)!;
  assert.equal(suspended!.outcome, "suspended");
  assert.ok(ran.start >= suspended!.end && ran.end <= resumed!.start, "the other job had the slot while the first slept");
});

test("flow control: a job waiting for an event does not block its key in an ordered queue (keyConcurrency 1); the next job of the key runs", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.setQueueLimits("ordered", { keyConcurrency: 1 }, { create: true });
  const worker = lh.worker({
    queues: ["ordered"],
    handlers: {
      wait: async (_: unknown, ctx: JobContext) => ctx.waitForEvent("go", { event: "account.go" }),
      quick: async () => "quick",
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const first = await lh.enqueue("wait", {}, { queue: "ordered", key: "acct-1" });
  await settled(lh, first.id, "suspended");
  const next = await lh.enqueue("quick", {}, { queue: "ordered", key: "acct-1" });
  await settled(lh, next.id, "succeeded");
  assert.equal((await lh.getJob(first.id)).job.state, "suspended", "the next job ran while the first waited");
  await lh.sendEvent("account.go", {});
  await settled(lh, first.id, "succeeded");
});

test("flow control: a rate counts each resume of a durable job as a start", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.setQueueLimits("paced", { rate: { limit: 100, windowMs: 3_600_000 } }, { create: true });
  const worker = lh.worker({
    queues: ["paced"],
    handlers: {
      twice: async (_: unknown, ctx: JobContext) => {
        await ctx.sleep("first", 200);
        await ctx.sleep("second", 200);
        return "done";
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const { id } = await lh.enqueue("twice", {}, { queue: "paced" });
  await settled(lh, id, "succeeded");
  assert.deepEqual(await outcomes(lh, id), ["suspended", "suspended", "succeeded"]);
  const { rows } = await lh.pool.query<{ starts: number }>(`SELECT sum(n)::int AS starts FROM flow_starts WHERE queue = 'paced'`);
  assert.equal(rows[0]!.starts, 3, "the first start and two resumes");
});

test("cancel reaches a job waiting for an event; an event sent later does not revive it", async (t) => {
  const lh = await freshLeasehold(t);
  const ran: string[] = [];
  const worker = lh.worker({
    handlers: {
      approve: async (_: unknown, ctx: JobContext) => {
        const ok = await ctx.waitForEvent("approval", { event: "order.approved" });
        ran.push("after the wait");
        return ok;
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const { id } = await lh.enqueue("approve", {});
  await settled(lh, id, "suspended");
  assert.equal(await lh.cancel(id), "cancelled");
  await lh.sendEvent("order.approved", { by: "ann" });
  await new Promise((r) => setTimeout(r, 300));
  const { job, attempts } = await lh.getJob(id);
  assert.equal(job.state, "cancelled");
  assert.deepEqual(
    attempts.map((a) => a.outcome),
    ["suspended"],
  );
  assert.deepEqual(ran, []);
});

test("a cancel requested while the handler is about to suspend: the job ends cancelled, not suspended", async (t) => {
  const lh = await freshLeasehold(t);
  const worker = lh.worker({
    heartbeatMs: 60_000, // no beat tells the worker of the cancel first
    leaseMs: 180_000,
    handlers: {
      // Cancelled from its own step (a user clicks cancel then), it suspends right after.
      viaCancel: async (_: unknown, ctx: JobContext) => {
        await ctx.step("ask", () => lh.cancel(ctx.jobId));
        await ctx.sleep("then nap", "1h");
      },
      // The cancel is marked in the database but its notification has not reached the worker:
      // the suspension itself must find it.
      unheard: async (_: unknown, ctx: JobContext) => {
        await ctx.step("mark", async () => {
          // Triggers off for this transaction: the cancel is marked, its notification never sent.
          const c = await lh.pool.connect();
          try {
            await c.query("BEGIN; SET LOCAL session_replication_role = replica");
            await c.query("UPDATE jobs SET cancel_requested_at = now() WHERE id = $1", [ctx.jobId]);
            await c.query("COMMIT");
          } finally {
            c.release();
          }
        });
        await ctx.waitForEvent("then wait", { event: "never.sent" });
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  for (const task of ["viaCancel", "unheard"]) {
    const { id } = await lh.enqueue(task, {});
    const { job, attempts } = await settled(lh, id, "cancelled");
    assert.equal(job.lockedBy ?? null, null, task);
    assert.deepEqual(
      attempts.map((a) => a.outcome),
      ["cancelled"],
      task,
    );
  }
});

test("a duplicate enqueue leaves a sleeping holder alone, as a running one: replace enqueues a new job, cancel_running cancels the sleeper", async (t) => {
  const lh = await freshLeasehold(t);
  const worker = lh.worker({
    handlers: {
      sync: async (p: { rev: number }, ctx: JobContext) => {
        await ctx.step("fetch", () => p.rev);
        await ctx.sleep("cool down", "1h");
        return p.rev;
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const sleeper = async (rev: number) => {
    const { id } = await lh.enqueue("sync", { rev }, { uniqueKey: "sync:doc" });
    const { job } = await settled(lh, id, "suspended");
    return job;
  };
  const first = await sleeper(1);
  const holder = async () =>
    (
      await lh.pool.query<{ state: string; payload: unknown; unique_key: string | null; run_at: string }>(
        "SELECT state, payload, unique_key, run_at::text FROM jobs WHERE id = $1",
        [first.id],
      )
    ).rows[0];
  const before = await holder();
  // "replace": the sleeper is mid-run (its steps recorded for payload 1): it keeps its payload
  // and its wake time, loses the key, and the new job is enqueued.
  const replaced = await lh.enqueue("sync", { rev: 2 }, { uniqueKey: "sync:doc", onDuplicate: "replace" });
  assert.equal(replaced.created, true, "a new job, not the sleeper changed");
  assert.notEqual(replaced.id, first.id);
  assert.deepEqual(await holder(), { ...before, unique_key: null });
  // "cancel_running": the sleeping holder (now the second job) is cancelled at once, as lh.cancel would.
  const second = (await settled(lh, replaced.id, "suspended")).job;
  const restarted = await lh.enqueue("sync", { rev: 3 }, { uniqueKey: "sync:doc", onDuplicate: "cancel_running" });
  assert.equal(restarted.created, true);
  assert.equal(restarted.cancelled, second.id);
  assert.equal((await lh.getJob(second.id)).job.state, "cancelled");
  assert.equal((await lh.getJob(first.id)).job.state, "suspended", "the first sleeper, keyless, is untouched");
  // The same on the caller's client, whose search_path lacks Leasehold's schema.
  const third = (await settled(lh, restarted.id, "suspended")).job;
  const client = await rawClient("public");
  t.after(() => client.end());
  const fourth = await lh.enqueue("sync", { rev: 4 }, { uniqueKey: "sync:doc", onDuplicate: "cancel_running", db: client });
  assert.equal(fourth.cancelled, third.id);
  assert.equal((await lh.getJob(third.id)).job.state, "cancelled");
  assert.deepEqual((await settled(lh, fourth.id, "suspended")).job.payload, { rev: 4 });
});

test("lh.waitFor a sleeping or waiting job resolves when it finishes, not at its suspension", async (t) => {
  const lh = await freshLeasehold(t);
  const worker = lh.worker({
    handlers: {
      nap: async (_: unknown, ctx: JobContext) => {
        await ctx.sleep("nap", "1s");
        return "rested";
      },
      approve: async (_: unknown, ctx: JobContext) => ctx.waitForEvent("approval", { event: "doc.approved" }),
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const nap = await lh.enqueue("nap", {});
  const approve = await lh.enqueue("approve", {});
  await settled(lh, nap.id, "suspended");
  await settled(lh, approve.id, "suspended");
  const napped = lh.waitFor(nap.id, { timeoutMs: 15_000 });
  const approved = lh.waitFor(approve.id, { timeoutMs: 15_000 });
  assert.deepEqual([(await napped).state, (await napped).result], ["succeeded", "rested"]);
  await lh.sendEvent("doc.approved", { by: "ann" });
  assert.deepEqual([(await approved).state, (await approved).result], ["succeeded", { by: "ann" }]);
});

test("a typed task (defineTask) runs steps on its schema's output and replays them on retry", async (t) => {
  const lh = await freshLeasehold(t);
  const bodies: string[] = [];
  let failOnce = true;
  const invoice = defineTask({
    name: "invoice",
    schema: z.object({ customer: z.string().transform((c) => c.toUpperCase()), cents: z.number().int() }),
    backoff: { baseMs: 0, factor: 1, maxMs: 0, jitter: 0 },
    handler: async (p, ctx) => {
      const number = await ctx.step("number", () => {
        bodies.push(`number ${ctx.attempt}`);
        return `INV-${p.customer}`;
      });
      if (failOnce) {
        failOnce = false;
        throw new Error("mailer down");
      }
      return { number, cents: p.cents };
    },
  });
  const typed = lh.typed([invoice] as const);
  const worker = typed.worker({});
  await worker.start();
  t.after(() => worker.stop(0));
  const { id } = await typed.enqueue("invoice", { customer: "acme", cents: 1200 });
  const { job } = await settled(lh, id, "succeeded");
  assert.deepEqual(job.result, { number: "INV-ACME", cents: 1200 });
  assert.deepEqual(bodies, ["number 1"], "the recorded step did not run again on the retry");
});

for (const kind of ["step", "transaction", "sleep", "wait"] as const) {
  test(`a stale attempt (its lease reaped while the handler runs): its ${kind} is refused, the handler gets StaleLeaseError and its signal aborts`, async (t) => {
    const lh = await freshLeasehold(t);
    let proceed!: () => void;
    const gate = new Promise<void>((r) => (proceed = r));
    const seen: { error?: unknown; aborted?: boolean } = {};
    const bodies: string[] = [];
    const next: Record<typeof kind, (ctx: JobContext) => Promise<unknown>> = {
      step: (ctx) => ctx.step("second", () => void bodies.push("second")),
      transaction: (ctx) => ctx.step.transaction("second", async (tx) => (await tx.query("SELECT 1 AS one")).rows[0]),
      sleep: (ctx) => ctx.sleep("second", "1h"),
      wait: (ctx) => ctx.waitForEvent("second", { event: "never.sent" }),
    };
    const worker = lh.worker({
      heartbeatMs: 60_000, // no beat notices the reap before the step does
      leaseMs: 180_000,
      watchdog: false,
      concurrency: 1,
      handlers: {
        t: async (_: unknown, ctx: JobContext) => {
          await ctx.step("first", () => void bodies.push("first"));
          await gate;
          try {
            await next[kind](ctx);
          } catch (err) {
            seen.error = err;
            seen.aborted = ctx.signal.aborted;
            throw err;
          }
        },
      },
    });
    await worker.start();
    t.after(() => worker.stop(0));
    const starts = recordEvents<[{ id: string; attempt: number }]>(worker, "job:start");
    const { id } = await lh.enqueue("t", {}, { maxAttempts: 3 });
    const [job] = await starts.waitFor((j) => j.id === id);
    await eventually(async () => bodies.includes("first") && (await store.loadSteps(lh.pool, id)).length === 1, "the first step recorded");
    // Another watchdog reaps the lease as if it had run out (the worker hung, say).
    await lh.pool.query("UPDATE jobs SET lease_until = now() - interval '1 ms' WHERE id = $1", [id]);
    await lh.watchdog().runOnce();
    const end = waitForEvent(worker, "job:end", (j: { id: string }) => j.id === id);
    proceed();
    await end;
    assert.ok(seen.error instanceof StaleLeaseError, `the handler got ${String(seen.error)}`);
    assert.equal(seen.aborted, true, "its signal aborted");
    assert.equal((await store.loadSteps(lh.pool, id)).length, 1, "the stale attempt recorded nothing");
    const refusals = await eventually(async () => {
      const { rows } = await lh.pool.query<{ attempt: number; kind: string; reason: string }>(
        "SELECT attempt, kind, reason FROM stale_refusals WHERE job_id = $1",
        [id],
      );
      return rows.length > 0 ? rows : undefined;
    }, "the refusal recorded");
    assert.deepEqual(refusals, [{ attempt: job.attempt, kind: "step", reason: "lease_expired" }]);
    const { job: now, attempts } = await lh.getJob(id);
    assert.equal(attempts[0]!.outcome, "lease_expired");
    assert.equal(now.state, "waiting", "back in line for its next attempt, as the reap left it");
  });
}

test("the SQL enqueue() keeps a suspended unique-key holder as it is, and cancel_running ends it at once", async (t) => {
  const lh = await freshLeasehold(t);
  const worker = lh.worker({ handlers: { nap: async (_: unknown, ctx: JobContext) => ctx.sleep("long", "3d") } });
  await worker.start();
  t.after(() => worker.stop(0));
  const { id } = await lh.enqueue("nap", { v: 1 }, { uniqueKey: "k" });
  await eventually(async () => (await lh.getJob(id)).job.state === "suspended", "asleep");
  const before = await lh.getJob(id);
  const { rows } = await lh.pool.query<{ id: string }>(`SELECT enqueue('nap', '{"v":2}', '{"uniqueKey":"k","onDuplicate":"replace"}')::text AS id`);
  assert.notEqual(rows[0]!.id, id, "a new job, not the sleeper changed");
  const after = await lh.getJob(id);
  assert.equal(after.job.state, "suspended");
  assert.deepEqual(after.job.payload, { v: 1 });
  assert.equal(after.job.runAt?.getTime(), before.job.runAt?.getTime(), "its wake time is its own");
  // The new holder sleeps in its turn; cancel_running ends it at once.
  await eventually(async () => (await lh.getJob(rows[0]!.id)).job.state === "suspended", "the new holder asleep");
  await lh.pool.query(`SELECT enqueue('nap', '{"v":3}', '{"uniqueKey":"k","onDuplicate":"cancel_running"}')`);
  assert.equal((await lh.getJob(rows[0]!.id)).job.state, "cancelled", "the suspended holder of the key is cancelled at once");
  assert.equal((await lh.getJob(id)).job.state, "suspended", "the first sleeper, no longer holding the key, sleeps on");
});
