/**
 * Durable steps against the real server (docs/durable.md): a recorded step never runs again for
 * its job, a replay that meets a step other than the recorded one fails naming both, a sleep
 * and a wait suspend the job without spending a retry or holding a slot, an event wakes its
 * waiter (and one sent before the wait began is not lost), and a transactional step's writes
 * and record commit together or not at all.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import type { JobContext } from "../packages/leasehold/src/worker/context.js";
import { eventually, freshLeasehold, NO_BACKOFF, uniqueSchema, settled } from "./helpers/db.js";

test("a step recorded once never runs again: a retry after a later failure replays it from its record", async (t) => {
  const lh = await freshLeasehold(t);
  const runs: string[] = [];
  let failOnce = true;
  const worker = lh.worker({
    backoff: NO_BACKOFF,
    handlers: {
      checkout: async (p: { order: string }, ctx: JobContext) => {
        const charge = await ctx.step("charge", () => {
          runs.push(`charge ${ctx.attempt}`);
          return { chargeId: `ch_${p.order}`, at: new Date(0) };
        });
        // The recorded result is JSON, the first time as on replay: the Date is its string.
        assert.equal(typeof charge.at, "string");
        const receipt = await ctx.step("receipt", async () => {
          runs.push(`receipt ${ctx.attempt}`);
          if (failOnce) {
            failOnce = false;
            throw new Error("mail server down");
          }
          return `sent for ${charge.chargeId}`;
        });
        return { charge, receipt };
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const { id } = await lh.enqueue("checkout", { order: "o1" });
  const { job, attempts } = await settled(lh, id, "succeeded");
  assert.deepEqual(runs, ["charge 1", "receipt 1", "receipt 2"], "charge ran once; the failed receipt ran again");
  assert.deepEqual(job.result, { charge: { chargeId: "ch_o1", at: "1970-01-01T00:00:00.000Z" }, receipt: "sent for ch_o1" });
  assert.deepEqual(
    attempts.map((a) => a.outcome),
    ["failed", "succeeded"],
  );
});

test("steps in a loop are told apart by occurrence, and a replay that meets another step fails naming both", async (t) => {
  const lh = await freshLeasehold(t);
  let version = 1;
  const worker = lh.worker({
    // Time to "deploy" between the attempts.
    backoff: { baseMs: 1_000, factor: 1, maxMs: 1_000, jitter: 0 },
    handlers: {
      loop: async (_: unknown, ctx: JobContext) => {
        for (let i = 0; i < 3; i++) await ctx.step(version === 1 ? "item" : "renamed", () => i);
        if (version === 1) throw new Error("deploy happens now");
        return "done";
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const { id } = await lh.enqueue("loop", {}, { maxAttempts: 2 });
  await eventually(async () => (await lh.getJob(id)).attempts.length === 1, "first attempt failed");
  version = 2;
  const { job } = await settled(lh, id, "dead");
  assert.match(job.lastError ?? "", /StepMismatchError/);
  assert.match(job.lastError ?? "", /step "renamed"/);
  assert.match(job.lastError ?? "", /step "item"/);
});

test("ctx.sleep suspends the job without a lease, a slot or a spent retry, and it resumes at the next step", async (t) => {
  const lh = await freshLeasehold(t);
  const runs: string[] = [];
  const worker = lh.worker({
    concurrency: 1,
    handlers: {
      remind: async (_: unknown, ctx: JobContext) => {
        await ctx.step("welcome", () => void runs.push("welcome"));
        await ctx.sleep("wait a bit", "1s");
        await ctx.step("reminder", () => void runs.push("reminder"));
        return "reminded";
      },
      quick: async () => "quick",
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const { id } = await lh.enqueue("remind", {});
  const sleeping = await settled(lh, id, "suspended");
  assert.equal(sleeping.job.spentAttempts, 0);
  assert.equal(sleeping.job.lockedBy ?? null, null, "no lease while it sleeps");
  // The one slot is free: another job runs while the first sleeps.
  const other = await lh.enqueue("quick", {});
  await settled(lh, other.id, "succeeded", 5_000);
  const { job, attempts } = await settled(lh, id, "succeeded");
  assert.equal(job.result, "reminded");
  assert.deepEqual(runs, ["welcome", "reminder"]);
  assert.deepEqual(
    attempts.map((a) => a.outcome),
    ["suspended", "succeeded"],
  );
  assert.equal(job.spentAttempts, 0);
});

test("waitForEvent: an event sent before the wait began is received, a later one wakes the job, match filters, a timeout gives null", async (t) => {
  const lh = await freshLeasehold(t);
  const worker = lh.worker({
    handlers: {
      pay: async (p: { order: string; timeout?: number }, ctx: JobContext) => {
        const paid = await ctx.waitForEvent<{ order: string; amount: number }>("paid", {
          event: "payment.succeeded",
          match: { order: p.order },
          timeout: p.timeout ?? 60_000,
        });
        return paid;
      },
    },
  });
  // Sent after the job was enqueued and before any worker ran it: kept for the wait.
  const early = await lh.enqueue("pay", { order: "early" });
  await lh.sendEvent("payment.succeeded", { order: "early", amount: 1 });
  await worker.start();
  t.after(() => worker.stop(0));
  assert.deepEqual((await settled(lh, early.id, "succeeded")).job.result, { order: "early", amount: 1 });

  const late = await lh.enqueue("pay", { order: "late" });
  await settled(lh, late.id, "suspended");
  await lh.sendEvent("payment.succeeded", { order: "someone else", amount: 2 });
  await new Promise((r) => setTimeout(r, 300));
  assert.equal((await lh.getJob(late.id)).job.state, "suspended", "an event that does not match leaves it waiting");
  await lh.sendEvent("payment.succeeded", { order: "late", amount: 3 });
  assert.deepEqual((await settled(lh, late.id, "succeeded", 5_000)).job.result, { order: "late", amount: 3 });

  const never = await lh.enqueue("pay", { order: "never", timeout: 500 });
  const { job } = await settled(lh, never.id, "succeeded");
  assert.equal(job.result, null, "the timeout resumes it with null");
});

test("an event sent in a transaction that rolls back does not exist; one that commits wakes its waiter", async (t) => {
  const lh = await freshLeasehold(t);
  const worker = lh.worker({
    handlers: { wait: async (_: unknown, ctx: JobContext) => ctx.waitForEvent("approval", { event: "approved" }) },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const { id } = await lh.enqueue("wait", {});
  await settled(lh, id, "suspended");
  const client = await lh.pool.connect();
  try {
    await client.query("BEGIN");
    await lh.sendEvent("approved", { by: "nobody" }, { db: client });
    await client.query("ROLLBACK");
    await new Promise((r) => setTimeout(r, 300));
    assert.equal((await lh.getJob(id)).job.state, "suspended");
    await client.query("BEGIN");
    await lh.sendEvent("approved", { by: "ann" }, { db: client });
    await client.query("COMMIT");
  } finally {
    client.release();
  }
  assert.deepEqual((await settled(lh, id, "succeeded", 5_000)).job.result, { by: "ann" });
});

test("a transactional step's writes and record commit together: a step that throws after writing leaves nothing, its retry writes once", async (t) => {
  const lh = await freshLeasehold(t);
  const app = uniqueSchema("app");
  await lh.pool.query(`CREATE SCHEMA ${app}; CREATE TABLE ${app}.ledger (entry text)`);
  t.after(async () => void (await lh.pool.query(`DROP SCHEMA IF EXISTS ${app} CASCADE`).catch(() => {})));
  let tries = 0;
  let failedAfter = false;
  const worker = lh.worker({
    backoff: NO_BACKOFF,
    handlers: {
      book: async (_: unknown, ctx: JobContext) => {
        const n = await ctx.step.transaction("book", async (tx) => {
          await tx.query(`INSERT INTO ${app}.ledger VALUES ('booked')`);
          if (++tries === 1) throw new Error("after the write");
          return tries;
        });
        // A failure after the step: the retry replays the booking, it does not book again.
        if (!failedAfter) {
          failedAfter = true;
          throw new Error("after the step");
        }
        return n;
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const { id } = await lh.enqueue("book", {});
  const { job } = await settled(lh, id, "succeeded");
  assert.equal(job.result, 2);
  const { rows } = await lh.pool.query(`SELECT entry FROM ${app}.ledger`);
  assert.equal(rows.length, 1, "booked exactly once");
});

test("cancel reaches a sleeping job at once", async (t) => {
  const lh = await freshLeasehold(t);
  const worker = lh.worker({ handlers: { nap: async (_: unknown, ctx: JobContext) => ctx.sleep("long", "3d") } });
  await worker.start();
  t.after(() => worker.stop(0));
  const { id } = await lh.enqueue("nap", {});
  await settled(lh, id, "suspended");
  assert.equal(await lh.cancel(id), "cancelled");
  assert.equal((await lh.getJob(id)).job.state, "cancelled");
});

test("bad input to a step, a sleep or an event names the value, and fails only its own job", async (t) => {
  const lh = await freshLeasehold(t);
  await assert.rejects(lh.sendEvent("", {}), /event name must be a non-empty string/);
  await assert.rejects(lh.sendEvent("x\u0000y", {}), /control character/);
  await assert.rejects(lh.sendEvent("big", { blob: "x".repeat(300_000) }), /event data is \d+ bytes as JSON; the limit is 262144/);
  const worker = lh.worker({
    backoff: NO_BACKOFF,
    handlers: {
      badSleep: async (_: unknown, ctx: JobContext) => ctx.sleep("nap", "forever" as never),
      badResult: async (_: unknown, ctx: JobContext) => ctx.step("huge", () => "x".repeat(300_000)),
      fine: async (_: unknown, ctx: JobContext) => ctx.step("small", () => 1),
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const a = await lh.enqueue("badSleep", {}, { maxAttempts: 1 });
  const b = await lh.enqueue("badResult", {}, { maxAttempts: 1 });
  const c = await lh.enqueue("fine", {});
  assert.match((await settled(lh, a.id, "dead")).job.lastError ?? "", /ctx.sleep\("nap"\) must be milliseconds or a duration such as "90s"/);
  assert.match((await settled(lh, b.id, "dead")).job.lastError ?? "", /step "huge": its result was refused/);
  assert.equal((await settled(lh, c.id, "succeeded")).job.result, 1);
});
