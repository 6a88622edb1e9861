/**
 * The app's tests, with leasehold/testing: a queue on a fresh database for this file (cloned
 * from a migrated template), the app's real handlers, and fake time for backoff and schedules.
 * Run with a PostgreSQL in DATABASE_URL: `DATABASE_URL=postgres://... npm test`.
 */
import { after, before, beforeEach, test } from "node:test";
import assert from "node:assert/strict";
import { createTestQueue, type TestQueue } from "leasehold/testing";
import { declareSchedules, importContacts, signUp, startWorker } from "../src/app.js";
import { createTasks, type Mail, type Mailer } from "../src/tasks.js";

/** Keeps what it sends (once per idempotency key, like a real provider); can be made to fail. */
class FakeMailer implements Mailer {
  sent: Mail[] = [];
  failNext = 0;
  async send(mail: Mail): Promise<void> {
    if (this.failNext > 0) {
      this.failNext--;
      throw new Error("mail provider unavailable");
    }
    if (!this.sent.some((m) => m.idempotencyKey === mail.idempotencyKey)) this.sent.push(mail);
  }
}

const mailer = new FakeMailer();
let queue: TestQueue;

before(async () => {
  queue = await createTestQueue({ handlers: createTasks(mailer) });
});
after(() => queue.close());
beforeEach(() => {
  mailer.sent = [];
  mailer.failNext = 0;
});

test("signing up enqueues a welcome email, and running the queue sends it", async () => {
  await signUp(queue.lh, "ada@example.com");
  await queue.expectEnqueued("send-welcome-email", { to: "ada@example.com" });

  const result = await queue.drain();
  assert.deepEqual(result.failed, []);
  assert.deepEqual(
    mailer.sent.map((m) => [m.to, m.subject]),
    [["ada@example.com", "Welcome!"]],
  );
});

test("a mail provider outage is retried after the task's backoff, not before", async () => {
  mailer.failNext = 2;
  const id = await signUp(queue.lh, "bob@example.com");

  const first = await queue.drain();
  assert.deepEqual(
    first.failed.map((j) => [j.state, (j.error as Error).message]),
    [["waiting", "mail provider unavailable"]],
  );
  assert.equal(mailer.sent.length, 0);
  // 30 s of backoff, to the millisecond of the database's clock...
  const { job: waiting, attempts } = await queue.lh.getJob(id);
  assert.equal(waiting.runAt!.getTime() - attempts[0]!.endedAt.getTime(), 30_000);
  // ...so nothing runs early. (The clock's real time goes on too, under the fake offset: leave a
  // margin a slow machine cannot eat, not the last second.)
  await queue.clock.advance(20_000);
  assert.deepEqual((await queue.drain()).ran, []);
  // ...and with the clock moved on to each retry, it gets through on the third attempt.
  const rest = await queue.drain({ advanceClock: true });
  assert.deepEqual(
    rest.ran.map((j) => j.state),
    ["waiting", "succeeded"],
  );
  const job = await queue.waitFor(id);
  assert.equal(job.state, "succeeded");
  assert.equal(job.attempt, 3);
  assert.deepEqual(
    mailer.sent.map((m) => m.to),
    ["bob@example.com"],
  );
});

test("a payload the task's schema refuses ends its job dead at once, naming the field, and sends nothing", async () => {
  const result = await queue.runInline("send-welcome-email", { to: "not an address" });
  assert.equal(result.state, "dead");
  assert.match((result.error as Error).message, /invalid payload: payload\.to: /);
  assert.equal(mailer.sent.length, 0);
});

test("the daily digest goes out once a day", async () => {
  await declareSchedules(queue.lh);
  await queue.clock.advance(3 * 24 * 3600_000);
  await queue.expectEnqueued("send-digest", { to: "team@example.com" }, { count: 3 });

  await queue.drain();
  assert.equal(mailer.sent.filter((m) => m.subject === "Your daily digest").length, 3);
});

test("the contacts import reports progress and resumes from its checkpoint", async () => {
  const contacts = ["a@example.com", "b@example.com", "c@example.com"];
  const whole = await queue.runInline("import-contacts", { contacts });
  assert.equal(whole.state, "succeeded");
  assert.deepEqual(whole.value, { imported: 3 });
  assert.deepEqual(whole.progress.at(-1), { done: 3, of: 3 });

  // A retry after a crash gets the last checkpoint and sends only what is left.
  mailer.sent = [];
  const resumed = await queue.runInline(
    "import-contacts",
    { contacts },
    { attempt: 2, previousCheckpoint: { next: 2 }, previousOutcome: "worker_lost" },
  );
  assert.deepEqual(resumed.value, { imported: 1 });
  assert.deepEqual(
    mailer.sent.map((m) => m.to),
    ["c@example.com"],
  );

  // A cancelled job stops before sending anything.
  mailer.sent = [];
  const cancelled = await queue.runInline("import-contacts", { contacts }, { signal: AbortSignal.abort("cancelled") });
  assert.equal(cancelled.aborted?.reason, "cancelled");
  assert.equal(mailer.sent.length, 0);
});

test("with the app's own worker running, waitFor waits for the job it runs", async () => {
  const worker = await startWorker(queue.lh, mailer);
  try {
    const id = await importContacts(queue.lh, ["d@example.com", "e@example.com"]);
    const job = await queue.waitFor(id);
    assert.equal(job.state, "succeeded");
    assert.deepEqual(
      mailer.sent.map((m) => m.to),
      ["d@example.com", "e@example.com"],
    );
  } finally {
    await worker.stop();
  }
});
