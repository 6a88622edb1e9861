/**
 * Durable handlers in leasehold/testing, against the real server: runInline runs ctx.step,
 * ctx.step.transaction, ctx.sleep and ctx.waitForEvent with the worker's own step runner and a
 * journal of the test kit's, and resumeInline runs the next attempt from it (replay); drain()
 * runs durable jobs through a real worker, waking sleeps on the fake clock and waits on
 * queue.sendEvent.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { z } from "zod";
import { createTestQueue, type TestQueue } from "../packages/leasehold/src/testkit/index.js";
import {
  ConfigError,
  defineEvent,
  defineTask,
  EventValidationError,
  StepMismatchError,
  TransactionMisuseError,
  type JobContext,
  type TaskHandlers,
} from "../packages/leasehold/src/index.js";
import { silent } from "./helpers/db.js";

const HOUR = 3600_000;
const DAY = 24 * HOUR;

async function queue(t: { after(fn: () => Promise<void>): void }, handlers: TaskHandlers = {}): Promise<TestQueue> {
  const q = await createTestQueue({ handlers, logger: silent });
  t.after(() => q.close());
  return q;
}

test("runInline runs steps and records them; resumeInline replays them: a step that succeeded does not run again", async (t) => {
  const runs: string[] = [];
  let failAfterSecond = true;
  const q = await queue(t, {
    checkout: async (payload: { order: string }, ctx: JobContext) => {
      const reserved = await ctx.step("reserve", () => (runs.push("reserve"), { sku: "a-1", order: payload.order }));
      const charged = await ctx.step("charge", () => (runs.push("charge"), 42));
      if (failAfterSecond) throw new Error("the mailer is down");
      const mailed = await ctx.step("mail", () => (runs.push("mail"), true));
      return { reserved, charged, mailed };
    },
  });
  const first = await q.runInline("checkout", { order: "o-1" });
  assert.equal(first.state, "failed");
  assert.match(String(first.error), /the mailer is down/);
  assert.deepEqual(runs, ["reserve", "charge"]);
  assert.deepEqual(
    first.steps.map((s) => [s.seq, s.name, s.kind, s.state, s.result]),
    [
      [0, "reserve", "step", "succeeded", { sku: "a-1", order: "o-1" }],
      [1, "charge", "step", "succeeded", 42],
    ],
  );
  assert.deepEqual(first.replayed, []);

  failAfterSecond = false;
  const second = await q.resumeInline(first);
  assert.equal(second.state, "succeeded");
  assert.deepEqual(runs, ["reserve", "charge", "mail"], "reserve and charge were replayed, not run again");
  assert.deepEqual(second.replayed, ["reserve", "charge"]);
  assert.deepEqual(second.value, { reserved: { sku: "a-1", order: "o-1" }, charged: 42, mailed: true });
  assert.equal(second.ctx.jobId, first.ctx.jobId, "the same job");
  assert.equal(second.ctx.attempt, 2);
  assert.equal(second.ctx.spentAttempts, 1, "the failure spent an attempt");
  assert.equal(second.ctx.previousOutcome, "failed");
  assert.equal(second.steps.length, 3);

  // A finished job has no next attempt; a result not from runInline is refused.
  await assert.rejects(q.resumeInline(second), (err: Error) => err instanceof ConfigError && /ended succeeded/.test(err.message));
  await assert.rejects(q.resumeInline({ ...second }), /resumeInline takes a result of queue\.runInline/);
});

test("resumeInline: a handler whose steps changed fails with StepMismatchError, as on a worker", async (t) => {
  let name = "first";
  const q = await queue(t, {
    changing: async (_: unknown, ctx: JobContext) => {
      await ctx.step(name, () => 1);
      throw new Error("fail once");
    },
  });
  const first = await q.runInline("changing");
  name = "renamed";
  const second = await q.resumeInline(first);
  assert.equal(second.state, "failed");
  assert.ok(second.error instanceof StepMismatchError, String(second.error));
});

test("runInline: ctx.sleep suspends on the fake clock; resumeInline runs on once the clock reaches its end", async (t) => {
  const runs: string[] = [];
  const q = await queue(t, {
    trial: async (_: unknown, ctx: JobContext) => {
      await ctx.step("welcome", () => runs.push("welcome"));
      await ctx.sleep("trial", "3d");
      await ctx.step("convert", () => runs.push("convert"));
      return "done";
    },
  });
  const start = await q.clock.now();
  const first = await q.runInline("trial");
  assert.equal(first.state, "suspended");
  assert.equal(first.error, undefined, "a suspension is not an error");
  assert.equal(first.suspended?.step, "trial");
  assert.equal(first.suspended?.kind, "sleep");
  const until = first.suspended!.until!;
  assert.ok(Math.abs(until.getTime() - start.getTime() - 3 * DAY) < 60_000, `sleeps 3 days from the queue's now (${until.toISOString()})`);
  assert.deepEqual(runs, ["welcome"]);

  // Too early: the sleep has not ended on the queue's clock.
  await q.clock.advance(DAY);
  await assert.rejects(
    q.resumeInline(first),
    (err: Error) => err instanceof ConfigError && err.message.includes(until.toISOString()) && /advance it first/.test(err.message),
  );
  await q.clock.advanceTo(until);
  const second = await q.resumeInline(first);
  assert.equal(second.state, "succeeded");
  assert.equal(second.value, "done");
  assert.deepEqual(runs, ["welcome", "convert"]);
  assert.deepEqual(second.replayed, ["welcome", "trial"]);
  assert.equal(second.ctx.spentAttempts, 0, "a sleep spends no attempt");
});

test("runInline: ctx.waitForEvent suspends until queue.sendEvent sends a matching event, or times out on the fake clock", async (t) => {
  const q = await queue(t, {
    pay: async (payload: { order: string }, ctx: JobContext) => {
      const paid = await ctx.waitForEvent("paid", { event: "payment.succeeded", match: { order: payload.order }, timeout: "1h" });
      return { paid };
    },
  });
  // Sent before the job's first run: not its to receive.
  await q.sendEvent("payment.succeeded", { order: "o-1", early: true });
  const first = await q.runInline("pay", { order: "o-1" });
  assert.equal(first.state, "suspended");
  assert.equal(first.suspended?.event, "payment.succeeded");
  assert.ok(first.suspended?.until instanceof Date, "a wait with a timeout wakes at its deadline");

  await q.sendEvent("payment.succeeded", { order: "o-2" }); // another order's: no match
  const second = await q.resumeInline(first);
  assert.equal(second.state, "suspended", "still waiting: the event did not match");

  await q.sendEvent("payment.succeeded", { order: "o-1", amount: 10 });
  const third = await q.resumeInline(second);
  assert.equal(third.state, "succeeded");
  assert.deepEqual(third.value, { paid: { order: "o-1", amount: 10 } });

  // Another job times out when the clock passes its deadline: the wait returns null.
  const waiting = await q.runInline("pay", { order: "o-9" });
  assert.equal(waiting.state, "suspended");
  await q.clock.advanceTo(waiting.suspended!.until!);
  const timedOut = await q.resumeInline(waiting);
  assert.equal(timedOut.state, "succeeded");
  assert.deepEqual(timedOut.value, { paid: null });
});

test("runInline: ctx.step.transaction commits the step's writes with its record, exactly once across replays", async (t) => {
  let failAfter = true;
  const q = await queue(t, {
    ledger: async (_: unknown, ctx: JobContext) => {
      const id = await ctx.step.transaction("book", async (tx) => {
        const { rows } = await tx.query<{ id: number }>("INSERT INTO ledger (amount) VALUES (5) RETURNING id");
        return rows[0]!.id;
      });
      if (failAfter) throw new Error("after the booking");
      return id;
    },
    misuse: async (_: unknown, ctx: JobContext) => {
      await ctx.step.transaction("bad", async (tx) => {
        await tx.query("COMMIT").catch(() => {});
      });
    },
  });
  const app = new (await import("pg")).default.Client(q.databaseUrl);
  await app.connect();
  await app.query("CREATE TABLE ledger (id serial PRIMARY KEY, amount int NOT NULL)");
  const first = await q.runInline("ledger");
  assert.equal(first.state, "failed");
  assert.equal(first.steps[0]?.kind, "transaction");
  failAfter = false;
  const second = await q.resumeInline(first);
  assert.equal(second.state, "succeeded");
  assert.equal(second.value, first.steps[0]!.result);
  const { rows } = await app.query<{ n: number }>("SELECT count(*)::int AS n FROM ledger");
  assert.equal(rows[0]!.n, 1, "the booking was written once");

  const misused = await q.runInline("misuse");
  assert.equal(misused.state, "failed");
  assert.ok(misused.error instanceof TransactionMisuseError, String(misused.error));
  assert.deepEqual(misused.steps, [], "a misused step's transaction is not recorded");
  await app.end();
});

test("drain() runs durable jobs for real: sleeps end on the fake clock (advanceClock), waits wake on queue.sendEvent", async (t) => {
  const runs: string[] = [];
  const q = await queue(t, {
    trial: async (_: unknown, ctx: JobContext) => {
      await ctx.step("welcome", () => runs.push("welcome"));
      await ctx.sleep("trial", "3d");
      await ctx.step("convert", () => runs.push("convert"));
    },
    pay: async (payload: { order: string }, ctx: JobContext) => {
      const paid = await ctx.waitForEvent("paid", { event: "payment.succeeded", match: { order: payload.order } });
      return paid;
    },
  });
  const trial = await q.lh.enqueue("trial", {});
  const pay = await q.lh.enqueue("pay", { order: "o-1" });

  const first = await q.drain();
  assert.deepEqual(first.failed, [], "a suspension is not a failure");
  assert.deepEqual(
    first.ran.map((r) => [r.task, r.state]),
    [
      ["trial", "suspended"],
      ["pay", "suspended"],
    ],
  );
  assert.deepEqual(
    first.left.filter((l) => l.why === "suspended").map((l) => [l.id, l.suspended]),
    [
      [trial.id, { step: "trial", kind: "sleep" }],
      [pay.id, { step: "paid", kind: "event", event: "payment.succeeded" }],
    ],
  );
  assert.deepEqual(runs, ["welcome"]);

  // The clock moves to the sleep's end; a wait without a timeout is no time to move it to.
  const second = await q.drain({ advanceClock: true });
  assert.deepEqual(
    second.ran.map((r) => [r.task, r.state]),
    [["trial", "succeeded"]],
  );
  assert.deepEqual(runs, ["welcome", "convert"]);
  const offset = await q.clock.offsetMs();
  // The offset is from the real time, which moved on meanwhile: a minute's slack.
  assert.ok(offset >= 3 * DAY - 60_000 && offset < 4 * DAY, `the clock moved to the sleep's end, no further (${offset} ms)`);
  assert.equal((await q.lh.getJob(pay.id))?.job.state, "suspended");

  await q.sendEvent("payment.succeeded", { order: "o-1", amount: 10 });
  const third = await q.drain();
  assert.deepEqual(
    third.ran.map((r) => [r.task, r.state]),
    [["pay", "succeeded"]],
  );
  assert.deepEqual((await q.lh.getJob(pay.id))?.job.result, { order: "o-1", amount: 10 });
  assert.deepEqual(third.left, []);
});

test("drain() wakes a sleep that is due without moving the clock; drain({ advanceClock }) times out a wait with a timeout", async (t) => {
  const q = await queue(t, {
    wait: async (_: unknown, ctx: JobContext) => ({ got: await ctx.waitForEvent("w", { event: "never.sent", timeout: "2h" }) }),
    nap: async (_: unknown, ctx: JobContext) => {
      await ctx.sleep("nap", 1);
      return "rested";
    },
  });
  const nap = await q.lh.enqueue("nap", {});
  const napped = await q.drain();
  assert.deepEqual(
    napped.ran.map((r) => r.state),
    ["suspended", "succeeded"],
  );
  assert.equal((await q.lh.getJob(nap.id))?.job.result, "rested");
  assert.equal(await q.clock.offsetMs(), 0, "the clock did not move");

  const wait = await q.lh.enqueue("wait", {});
  const first = await q.drain();
  assert.deepEqual(
    first.left.map((l) => [l.id, l.why]),
    [[wait.id, "suspended"]],
    "without advanceClock the wait is left",
  );
  const drained = await q.drain({ advanceClock: true });
  assert.deepEqual(drained.failed, []);
  assert.deepEqual((await q.lh.getJob(wait.id))?.job.result, { got: null });
  assert.ok((await q.clock.offsetMs()) >= 2 * HOUR - 60_000, "the clock moved to the wait's timeout");
});

const paymentSucceeded = defineEvent(
  "payment.succeeded",
  z.object({ order: z.string(), amount: z.number().int().positive(), currency: z.string().default("EUR") }),
);

test("typed events: sendEvent checks the data at the edge (naming the field, sending nothing); the wait returns the schema's output", async (t) => {
  const checkout = defineTask({
    name: "checkout",
    schema: z.object({ order: z.string() }),
    handler: async (payload, ctx) => {
      const paid = await ctx.waitForEvent("paid", { event: paymentSucceeded, match: { order: payload.order }, timeout: "1d" });
      return paid === null ? "expired" : `${paid.amount} ${paid.currency}`;
    },
  });
  const q = await createTestQueue({ handlers: [checkout], logger: silent });
  t.after(() => q.close());
  const events = async () => (await q.lh.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM events")).rows[0]!.n;

  await assert.rejects(
    q.lh.sendEvent(paymentSucceeded, { order: "o-1", amount: "ten" as never }),
    (err: Error) => err instanceof EventValidationError && /sendEvent: invalid data for event "payment\.succeeded": data\.amount: /.test(err.message),
  );
  await assert.rejects(q.sendEvent(paymentSucceeded, { order: "o-1", amount: -1 }), /data\.amount/);
  assert.equal(await events(), 0, "nothing was sent");

  const job = await q.lh.enqueue("checkout", { order: "o-1" });
  await q.drain();
  assert.equal((await q.lh.getJob(job.id))?.job.state, "suspended");
  await q.sendEvent(paymentSucceeded, { order: "o-1", amount: 10 });
  await q.drain();
  assert.equal((await q.lh.getJob(job.id))?.job.result, "10 EUR", "the schema's default filled in on receipt");
  // Stored as sent: the schema's input.
  const { rows } = await q.lh.pool.query<{ data: unknown }>("SELECT data FROM events");
  assert.deepEqual(rows[0]!.data, { order: "o-1", amount: 10 });

  // A string name still works, and is not checked; a typed wait that receives bad data fails the job for good.
  const bad = await q.lh.enqueue("checkout", { order: "o-2" });
  await q.drain();
  await q.lh.sendEvent("payment.succeeded", { order: "o-2", amount: "lots" });
  const drained = await q.drain();
  assert.equal(drained.failed[0]?.state, "dead");
  const record = (await q.lh.getJob(bad.id))?.job;
  assert.equal(record?.state, "dead");
  assert.match(String(record?.lastError), /invalid data for event "payment\.succeeded": data\.amount/);

  // Inline too: the wait's data through the schema.
  const inline = await q.runInline("checkout", { order: "o-3" });
  assert.equal(inline.state, "suspended");
  await q.sendEvent(paymentSucceeded, { order: "o-3", amount: 7, currency: "USD" });
  assert.equal((await q.resumeInline(inline)).value, "7 USD");
});

test("defineEvent refuses a bad name or a schema that is not a Standard Schema", () => {
  assert.throws(
    () => defineEvent("", z.object({})),
    (err: Error) => err instanceof ConfigError && /event name must be a non-empty string/.test(err.message),
  );
  assert.throws(() => defineEvent("x", {} as never), /schema must implement Standard Schema v1/);
});
