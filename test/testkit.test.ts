/**
 * leasehold/testing, the helpers for users' own test suites, against the real server: a queue
 * per database cloned from a migrated template (built once, race-safe), drain(), waitFor(),
 * expectEnqueued(), runInline() and the fake clock.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { AssertionError } from "node:assert";
import { randomBytes } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import pg from "pg";
import { createTestQueue, type TestQueue } from "../packages/leasehold/src/testkit/index.js";
import { TEMPLATE_PREFIX, templateName } from "../packages/leasehold/src/testkit/database.js";
import { z } from "zod";
import {
  ConfigError,
  defineTask,
  JobAbortedError,
  JobNotFoundError,
  PayloadValidationError,
  PermanentJobError,
  TransactionMisuseError,
  ValidationError,
  type JobContext,
  type TaskHandlers,
} from "../packages/leasehold/src/index.js";
import { databaseUrl, silent } from "./helpers/db.js";

const HOUR = 3600_000;
const DAY = 24 * HOUR;

async function queue(t: { after(fn: () => Promise<void>): void }, handlers: TaskHandlers = {}, schema?: string): Promise<TestQueue> {
  const q = await createTestQueue({ handlers, schema, logger: silent });
  t.after(() => q.close());
  return q;
}

async function admin<T>(work: (c: pg.Client) => Promise<T>): Promise<T> {
  const c = new pg.Client(databaseUrl());
  await c.connect();
  try {
    return await work(c);
  } finally {
    await c.end();
  }
}

const databasesLike = (prefix: string) =>
  admin(async (c) =>
    (await c.query<{ datname: string }>("SELECT datname FROM pg_database WHERE left(datname, $2) = $1", [prefix, prefix.length])).rows.map(
      (r) => r.datname,
    ),
  );

test("each queue gets a fresh migrated database of its own, cloned from one template, dropped at close", async (t) => {
  const a = await createTestQueue({ logger: silent });
  const b = await createTestQueue({ logger: silent });
  t.after(() => Promise.all([a.close(), b.close()]).then(() => {}));
  assert.notEqual(a.databaseName, b.databaseName);
  const migrations = fs
    .readdirSync(path.join(import.meta.dirname, "..", "packages", "leasehold", "migrations"))
    .filter((f) => f.endsWith(".sql")).length;
  const { rows } = await a.lh.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM schema_migrations");
  assert.equal(rows[0]!.n, migrations, "the template is fully migrated");
  await a.lh.enqueue("only-in-a", { n: 1 });
  assert.deepEqual((await b.lh.listJobs()).length, 0, "b does not see a's jobs");
  // Both cloned from the template named for these migrations.
  assert.deepEqual(await databasesLike(templateName("leasehold", true)), [templateName("leasehold", true)]);

  await a.close();
  assert.deepEqual(await databasesLike(a.databaseName), [], "close() drops the database");
  await a.close(); // twice is harmless
});

test("the template is built once under concurrent creation, published whole, and reused", async (t) => {
  // A schema of its own gives a template of its own, so this builds one from nothing.
  const schema = `tk_${randomBytes(4).toString("hex")}`;
  const name = templateName(schema, true);
  t.after(() =>
    admin(async (c) => {
      await c.query(`ALTER DATABASE ${name} WITH IS_TEMPLATE false`).catch(() => {});
      await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    }),
  );
  const queues = await Promise.all(Array.from({ length: 4 }, () => createTestQueue({ schema, logger: silent })));
  t.after(() => Promise.all(queues.map((q) => q.close())).then(() => {}));
  for (const q of queues) await q.lh.enqueue("x", {}); // every clone is usable: migrated in its schema
  assert.deepEqual(await databasesLike(name), [name], "one template, and no build left behind");
  const oid = await admin(async (c) => (await c.query("SELECT oid FROM pg_database WHERE datname = $1", [name])).rows[0]!.oid);
  const again = await createTestQueue({ schema, logger: silent });
  queues.push(again);
  const oidAfter = await admin(async (c) => (await c.query("SELECT oid FROM pg_database WHERE datname = $1", [name])).rows[0]!.oid);
  assert.equal(oidAfter, oid, "reused, not rebuilt");
  assert.ok(name.startsWith(TEMPLATE_PREFIX));
});

test("drain() runs every ready job with the handlers through a real worker, including the jobs they enqueue", async (t) => {
  const seen: string[] = [];
  const q = await queue(t, {
    parent: async (p: { n: number }) => void seen.push(`parent ${p.n}`),
    spawn: async (p: { n: number }) => {
      seen.push(`spawn ${p.n}`);
      // A child in another queue: drain must go on to it.
      await q.lh.enqueue("child", { of: p.n }, { queue: "other" });
    },
    child: async (p: { of: number }) => void seen.push(`child of ${p.of}`),
    broken: async () => {
      throw new Error("boom");
    },
    hopeless: async () => {
      throw new PermanentJobError("never");
    },
  });
  await q.lh.enqueue("spawn", { n: 1 });
  await q.lh.enqueue("parent", { n: 2 });
  const broken = await q.lh.enqueue("broken", {});
  await q.lh.enqueue("hopeless", {});
  await q.lh.enqueue("unknown-task", {});
  const later = await q.lh.enqueue("parent", { n: 3 }, { delayMs: HOUR });

  const result = await q.drain({ leaveUnhandled: ["unknown-task"] });
  assert.deepEqual(seen, ["spawn 1", "parent 2", "child of 1"]);
  const states = Object.fromEntries(result.ran.map((j) => [j.task, j.state]));
  assert.deepEqual(states, { spawn: "succeeded", parent: "succeeded", broken: "waiting", hopeless: "dead", child: "succeeded" });
  assert.deepEqual(
    result.failed.map((j) => [j.task, (j.error as Error).message]),
    [
      ["broken", "boom"],
      ["hopeless", "never"],
    ],
    "the error the handler threw comes back itself",
  );
  assert.deepEqual(
    result.left.map((j) => [j.id === later.id ? "later" : j.task, j.why]),
    [
      ["unknown-task", "no_handler"],
      ["broken", "not_due"],
      ["later", "not_due"],
    ],
  );
  assert.equal((await q.lh.getJob(broken.id)).job.state, "waiting", "a retry waits for its backoff");
});

test("drain({ advanceClock }) runs retries and delayed jobs at once by moving the queue's clock to them", async (t) => {
  let calls = 0;
  const q = await queue(t, {
    flaky: async () => {
      if (++calls < 3) throw new Error(`failure ${calls}`);
    },
  });
  const job = await q.lh.enqueue("flaky", {});
  await q.lh.enqueue("flaky", {}, { delayMs: 2 * DAY });
  const before = await q.clock.now();
  const result = await q.drain({ advanceClock: true });
  assert.deepEqual(
    result.ran.map((j) => [j.id === job.id ? "first" : "delayed", j.attempt, j.state]),
    [
      ["first", 1, "waiting"],
      ["first", 2, "waiting"],
      ["first", 3, "succeeded"],
      ["delayed", 1, "succeeded"],
    ],
  );
  assert.deepEqual(result.left, []);
  assert.ok((await q.clock.now()).getTime() - before.getTime() >= 2 * DAY, "the clock moved to the delayed job");
});

test("drain({ advanceClock }) runs a limited, keyed queue's delayed jobs too: flow control reads the same (fake) clock", async (t) => {
  const order: number[] = [];
  const q = await queue(t, { step: async (p: { n: number }) => void order.push(p.n) });
  await q.lh.setQueueLimits("default", { concurrency: 1, keyConcurrency: 1, rate: { limit: 100, windowMs: 1_000 } }, { create: true });
  await q.lh.enqueue("step", { n: 1 }, { key: "order-7", delayMs: DAY });
  await q.lh.enqueue("step", { n: 2 }, { key: "order-7" });
  const result = await q.drain({ advanceClock: true });
  assert.deepEqual(result.left, []);
  // One key at a time, in enqueue order: the delayed first job holds its place.
  assert.deepEqual(order, [1, 2]);

  // A paused queue's jobs are left, and the drain says why.
  await q.lh.pauseQueue("default");
  const { id } = await q.lh.enqueue("step", { n: 3 });
  const paused = await q.drain({ advanceClock: true });
  assert.deepEqual(
    paused.left.map((j) => [j.id, j.why]),
    [[id, "flow_control"]],
  );
});

test("drain() refuses without handlers, and stops a job that enqueues itself forever", async (t) => {
  const q = await queue(t);
  await assert.rejects(q.drain(), /no handlers/);
  q.register({ forever: async () => void (await q.lh.enqueue("forever", {})) });
  await q.lh.enqueue("forever", {});
  await assert.rejects(q.drain({ maxJobs: 5 }), /ran 5 jobs and the queue is still not empty/);
});

test("the fake clock: now() moves for every statement in the test database, never backwards", async (t) => {
  const q = await queue(t, { later: async () => {} });
  assert.equal(q.fakeTime, true);
  const real = Date.now();
  assert.equal(await q.clock.offsetMs(), 0);
  const job = await q.lh.enqueue("later", {}, { delayMs: 10 * 60_000 });
  assert.deepEqual((await q.drain()).ran, [], "not due yet");
  const now = await q.clock.advance(10 * 60_000);
  assert.ok(now.getTime() >= real + 10 * 60_000);
  assert.ok((await q.clock.offsetMs()) >= 10 * 60_000 - 1_000);
  // Column defaults and the application's own SQL see it too.
  const { rows } = await q.lh.pool.query<{ now: Date; ts: Date }>("SELECT now(), current_timestamp AS ts");
  assert.ok(rows[0]!.now.getTime() >= real + 10 * 60_000, "now()");
  const other = await q.lh.enqueue("later", {});
  assert.ok((await q.lh.getJob(other.id)).job.createdAt.getTime() >= real + 10 * 60_000, "created_at's DEFAULT now()");
  assert.deepEqual(
    (await q.drain()).ran.map((j) => j.id),
    [job.id, other.id],
  );
  await assert.rejects(q.clock.advance(-1), RangeError);
  await q.clock.advanceTo(new Date(real)); // in the past: no change
  assert.ok((await q.clock.now()).getTime() >= real + 10 * 60_000, "never backwards");
});

test("clock.advance steps through schedule ticks, as a scheduler running all along would have", async (t) => {
  const ran: string[] = [];
  const q = await queue(t, { digest: async (_p: unknown, ctx: JobContext) => void ran.push(ctx.jobId) });
  await q.lh.schedule({ name: "daily", cron: "0 3 * * *", task: "digest" });
  const [schedule] = await q.lh.listSchedules();
  await q.clock.advance(3 * DAY);
  const jobs = (await q.lh.listJobs({ task: "digest" })).reverse();
  assert.deepEqual(
    jobs.map((j) => j.uniqueKey),
    [0, 1, 2].map((d) => `schedule:daily:${new Date(schedule!.nextRunAt.getTime() + d * DAY).toISOString()}`),
    "three ticks, each at its own time",
  );
  assert.equal((await q.drain()).ran.length, 3);
  assert.equal(ran.length, 3);
});

test("expectEnqueued: a partial payload match, or an AssertionError that shows what is there", async (t) => {
  const q = await queue(t);
  await q.lh.enqueue("send-email", { to: "ada@example.com", template: "welcome", meta: { lang: "en" } });
  await q.lh.enqueue("send-email", { to: "bob@example.com", template: "welcome" });
  await q.lh.enqueue("resize", { w: 10 });

  const [ada] = await q.expectEnqueued("send-email", { to: "ada@example.com", meta: { lang: "en" } });
  assert.equal((ada!.payload as { template: string }).template, "welcome");
  assert.equal((await q.expectEnqueued("send-email")).length, 2);
  await q.expectEnqueued("send-email", (p) => (p as { to: string }).to.startsWith("bob"));
  await q.expectEnqueued("send-email", { to: /@example\.com$/ }, { count: 2 });
  // vitest's and jest's asymmetric matchers have this shape.
  await q.expectEnqueued("resize", { w: { asymmetricMatch: (v: unknown) => typeof v === "number" } });
  await q.expectEnqueued("resize", { w: 11 }, { count: 0 });

  const failure = async (promise: Promise<unknown>, message: RegExp) => {
    const err = await promise.then(
      () => assert.fail("expected a failure"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof AssertionError, `an AssertionError, got ${String(err)}`);
    assert.match(err.message, message);
  };
  await failure(
    q.expectEnqueued("send-email", { to: "cy@example.com" }),
    /expected a "send-email" job with payload matching \{"to":"cy@example.com"\}, found none among the 2 "send-email" jobs:\n {2}job \d+ send-email \(waiting\) payload \{.*ada@example.com/,
  );
  await failure(q.expectEnqueued("send-emial"), /no "send-emial" job\. Enqueued tasks: resize \(1\), send-email \(2\)/);
  await failure(q.expectEnqueued("send-email", { template: "welcome" }, { count: 1 }), /expected 1 "send-email" job .*found 2/);
  await failure(q.expectEnqueued("send-email", { meta: {} }, { state: "succeeded" }), /no "send-email" job in state succeeded/);
  await failure(q.expectEnqueued("send-email", { to: ["ada@example.com"] }), /found none/);
});

test("waitFor(id) and waitFor(predicate) wait for what a running worker does, and say what they saw on timeout", async (t) => {
  const q = await queue(t);
  const worker = q.lh.worker({ handlers: { quick: async () => {} }, watchdog: false, scheduler: false, pollIntervalMs: 50 });
  await worker.start();
  t.after(() => worker.stop());
  const job = await q.lh.enqueue("quick", { n: 1 });
  const done = await q.waitFor(job.id);
  assert.equal(done.state, "succeeded");
  const matched = await q.waitFor((j) => j.task === "quick" && j.state === "succeeded");
  assert.equal(matched.id, job.id);

  const stuck = await q.lh.enqueue("nobody-runs-this", {});
  await assert.rejects(q.waitFor(stuck.id, { timeoutMs: 100 }), (err: Error) => {
    assert.ok(err instanceof AssertionError);
    assert.match(err.message, /job \d+ \(nobody-runs-this\) did not finish within 100 ms: it is waiting, attempt 0/);
    return true;
  });
  await assert.rejects(
    q.waitFor(() => false, { timeoutMs: 100 }),
    /no job matched the waitFor predicate within 100 ms; the jobs are:\n.*quick/,
  );
  await assert.rejects(q.waitFor("999999"), JobNotFoundError);
});

test("runInline: one handler call with a real context, no worker and no job row", async (t) => {
  let started!: () => void;
  const handlerStarted = new Promise<void>((resolve) => (started = resolve));
  const q = await queue(t, {
    import: async (p: { rows: number }, ctx: JobContext) => {
      const from = (ctx.previousCheckpoint as { row: number } | null)?.row ?? 0;
      for (let row = from; row < p.rows; row++) {
        ctx.progress({ done: row + 1, of: p.rows });
        if ((row + 1) % 2 === 0) ctx.checkpoint({ row: row + 1 });
      }
      return { imported: p.rows - from, attempt: ctx.attempt, recovered: ctx.recovered };
    },
    wait: (_p: unknown, ctx: JobContext) =>
      new Promise((_resolve, reject) => {
        if (ctx.signal.aborted) return reject(ctx.signal.reason as Error);
        ctx.signal.addEventListener("abort", () => reject(ctx.signal.reason as Error), { once: true });
        started();
      }),
    permanent: async () => {
      throw new PermanentJobError("bad input");
    },
    flaky: async () => {
      throw new Error("try again");
    },
    "bad-progress": async (_p: unknown, ctx: JobContext) => ctx.progress({ n: Number.NaN }),
    record: async (p: { v: string }, ctx: JobContext) => {
      await ctx.transaction(async (tx) => {
        await tx.query("INSERT INTO inline_results (job_id, v) VALUES ($1, $2)", [ctx.jobId, p.v]);
      });
    },
    fenced: async (p: { v: string }, ctx: JobContext) => {
      const ok = await ctx.fencedWrite(q.lh.pool, { table: "public.fenced", key: { k: "row" }, values: { v: p.v } });
      if (!ok) throw ctx.signal.reason;
    },
  });

  const first = await q.runInline("import", { rows: 5 });
  assert.equal(first.state, "succeeded");
  assert.deepEqual(first.value, { imported: 5, attempt: 1, recovered: false });
  assert.deepEqual(first.progress.at(-1), { done: 5, of: 5 });
  assert.deepEqual(first.checkpoints, [{ row: 2 }, { row: 4 }]);
  assert.match(first.ctx.jobId, /^\d+$/);
  await assert.rejects(q.lh.getJob(first.ctx.jobId), JobNotFoundError, "no job row");

  const resumed = await q.runInline("import", { rows: 5 }, { attempt: 2, previousCheckpoint: { row: 4 }, previousOutcome: "worker_lost" });
  assert.deepEqual(resumed.value, { imported: 1, attempt: 2, recovered: true });

  const ac = new AbortController();
  const waiting = q.runInline("wait", {}, { signal: ac.signal });
  await handlerStarted;
  ac.abort("lease_expired");
  const aborted = await waiting;
  assert.equal(aborted.state, "failed");
  assert.ok(aborted.error instanceof JobAbortedError);
  assert.equal(aborted.aborted?.reason, "lease_expired");
  const early = await q.runInline("wait", {}, { signal: AbortSignal.abort(new Error("not a reason")) });
  assert.equal(early.aborted?.reason, "cancelled", "an abort that names no reason is a cancel");

  assert.equal((await q.runInline("permanent", {})).state, "dead");
  assert.equal((await q.runInline("flaky", {})).state, "failed");
  assert.equal((await q.runInline("flaky", {}, { attempt: 25, maxAttempts: 25 })).state, "dead", "the last attempt's failure is the end");
  const bad = await q.runInline("bad-progress", {});
  assert.ok(bad.error instanceof ValidationError);
  assert.match((bad.error as Error).message, /progress\.n is NaN/);
  await assert.rejects(q.runInline("nope", {}), /no handler registered for task "nope" \(registered: import, wait/);

  const app = new pg.Client(q.databaseUrl);
  await app.connect();
  await app.query("CREATE TABLE inline_results (job_id bigint, v text)");
  await app.query("CREATE TABLE fenced (k text PRIMARY KEY, token bigint NOT NULL, v text)");
  const recorded = await q.runInline("record", { v: "x" });
  assert.equal(recorded.state, "succeeded");
  assert.deepEqual((await app.query("SELECT job_id::text, v FROM inline_results")).rows, [{ job_id: recorded.ctx.jobId, v: "x" }]);

  // A later claim's fence wins: an inline call with an older fence is superseded.
  const newer = await q.runInline("fenced", { v: "newer" });
  assert.equal(newer.state, "succeeded");
  await app.query("UPDATE fenced SET token = token + 1000");
  const older = await q.runInline("fenced", { v: "older" });
  assert.equal(older.state, "superseded");
  assert.equal(older.aborted?.reason, "fence_refused");
  assert.deepEqual((await app.query("SELECT v FROM fenced")).rows, [{ v: "newer" }]);
  await app.end(); // before close() drops the database under it
});

const resize = defineTask({
  name: "resize",
  schema: z.object({ file: z.string(), width: z.number().int().default(800) }),
  handler: async (payload) => ({ file: payload.file, width: payload.width }),
});
const sendEmail = defineTask({
  name: "send-email",
  schema: z.object({ to: z.email() }),
  handler: async (payload) => ({ sent: payload.to }),
});

test("typed tasks run in the test kit behind their schema, as a typed worker runs them: defaults filled, a bad payload dead with its field named", async (t) => {
  // A list of tasks, and a task in a map under its name, both run.
  const q = await createTestQueue({ handlers: [resize], logger: silent });
  t.after(() => q.close());
  q.register({ "send-email": sendEmail, plain: (p: { n: number }) => p.n + 1 });

  const ok = await q.runInline("resize", { file: "a.png" });
  assert.equal(ok.state, "succeeded");
  assert.deepEqual(ok.value, { file: "a.png", width: 800 }, "the schema's default is filled in");
  const bad = await q.runInline("resize", { file: 42 });
  assert.equal(bad.state, "dead", "a payload the schema refuses ends the attempt for good");
  assert.ok(bad.error instanceof PermanentJobError);
  assert.ok(bad.error.cause instanceof PayloadValidationError);
  assert.match(bad.error.message, /task "resize"\): invalid payload: payload\.file: /);
  assert.equal((await q.runInline("plain", { n: 1 })).value, 2);

  const good = await q.lh.enqueue("send-email", { to: "ada@example.com" });
  const wrong = await q.lh.enqueue("send-email", { to: "not an address" });
  const result = await q.drain();
  assert.deepEqual(
    result.ran.map((j) => [j.id, j.state]),
    [
      [good.id, "succeeded"],
      [wrong.id, "dead"],
    ],
  );
  assert.deepEqual((await q.lh.getJob(good.id)).job.result, { sent: "ada@example.com" });
  const dead = (await q.lh.getJob(wrong.id)).job;
  assert.match(dead.lastError!, /invalid payload: payload\.to: /);
  assert.ok((result.failed[0]!.error as Error).cause instanceof PayloadValidationError);

  assert.throws(() => q.register({ email: sendEmail }), ConfigError, "a task under another task's name");
  assert.throws(() => q.register([resize.handler] as never), /register\[0\] is not a task made by defineTask/);
});

test("drain() fails, naming the tasks, when a due job's task has no handler, unless the test says it means to leave them", async (t) => {
  const q = await queue(t, { known: () => {} });
  await q.lh.enqueue("known", {});
  await q.lh.enqueue("forgotten", {});
  await q.lh.enqueue("forgotten", {});
  await q.lh.enqueue("also-forgotten", {});
  await q.lh.enqueue("later-forgotten", {}, { delayMs: HOUR });
  await assert.rejects(q.drain(), (err: Error) => {
    assert.ok(err instanceof AssertionError);
    assert.match(err.message, /no handler: also-forgotten \(1 job\), forgotten \(2 jobs\)\. .*leaveUnhandled: \["also-forgotten","forgotten"\]/);
    return true;
  });
  const result = await q.drain({ leaveUnhandled: ["forgotten", "also-forgotten"] });
  assert.deepEqual(
    result.left.map((j) => [j.task, j.why]),
    [
      ["forgotten", "no_handler"],
      ["forgotten", "no_handler"],
      ["also-forgotten", "no_handler"],
      ["later-forgotten", "no_handler"],
    ],
  );
});

test("runInline's ctx.transaction hands out the tx a worker does: COMMIT refused and the attempt failed even if caught; tx dead after the callback", async (t) => {
  let kept: pg.PoolClient | undefined;
  const q = await queue(t, {
    commits: (_p: unknown, ctx: JobContext) => ctx.transaction((tx) => tx.query("COMMIT")),
    catches: async (_p: unknown, ctx: JobContext) => {
      await ctx.transaction((tx) => tx.query("ROLLBACK")).catch(() => {});
      return "carried on";
    },
    keeps: async (_p: unknown, ctx: JobContext) => {
      await ctx.transaction(async (tx) => void (kept = tx));
      return "ok";
    },
  });
  const commits = await q.runInline("commits", {});
  assert.equal(commits.state, "failed");
  assert.ok(commits.error instanceof TransactionMisuseError);
  assert.match(commits.error.message, /sent COMMIT on tx, which was not run/);
  const catches = await q.runInline("catches", {});
  assert.equal(catches.state, "failed", "a worker fails the attempt even though the handler caught the refusal");
  assert.match((catches.error as Error).message, /sent ROLLBACK on tx/);
  assert.equal((await q.runInline("keeps", {})).state, "succeeded");
  await assert.rejects(kept!.query("SELECT 1"), /tx was used after its callback returned/);
});

test("runInline ends a result a worker could not store as the worker does (dead, naming the field); a Date is stored as its ISO string", async (t) => {
  const q = await queue(t, {
    row: () => ({ created_at: new Date(0) }),
    map: () => ({ byId: new Map([["a", 1]]) }),
    big: () => ({ blob: "x".repeat(100) }),
  });
  assert.equal((await q.runInline("row", {})).state, "succeeded");
  const map = await q.runInline("map", {});
  assert.equal(map.state, "dead");
  assert.match((map.error as Error).message, /^the handler's result was refused: result\.byId is a Map object/);
  const big = await q.runInline("big", {}, { maxResultBytes: 50 });
  assert.equal(big.state, "dead");
  assert.match((big.error as Error).message, /over maxResultBytes \(50\)/);
});

test("runInline: ctx.parents(task) gives the parents that are jobs of that task, as a worker's context does", async (t) => {
  const measure = defineTask({ name: "measure", schema: z.object({ file: z.string() }), handler: ({ file }) => ({ bytes: file.length }) });
  const q = await queue(t, {
    report: async (_p: unknown, ctx: JobContext) => {
      const measured = await ctx.parents(measure);
      return { total: measured.reduce((n, p) => n + (p.result?.bytes ?? 0), 0), all: (await ctx.parents()).length };
    },
    misuse: async (_p: unknown, ctx: JobContext) => ctx.parents("measure" as never),
  });
  const parent = (id: string, task: string, result: { bytes: number }) => ({ id, ref: null, task, state: "succeeded", result, error: null }) as const;
  const parents = [parent("1", "measure", { bytes: 3 }), parent("2", "measure", { bytes: 4 }), parent("3", "note", { bytes: 100 })];
  const run = await q.runInline("report", {}, { parents: [...parents] });
  assert.deepEqual(run.value, { total: 7, all: 3 });
  const misuse = await q.runInline("misuse", {}, { parents: [...parents] });
  assert.match(String(misuse.error), /ctx\.parents\(task\) takes a task made by defineTask/);
});

test("the testkit uses the library through its public entry points only (so it can move to a package of its own)", () => {
  const dir = path.join(import.meta.dirname, "..", "packages", "leasehold", "src", "testkit");
  const own = new Set(fs.readdirSync(dir).map((f) => `./${f.replace(/\.ts$/, ".js")}`));
  // The public entry, and the few internals with no state of their own (a quiet logger, the
  // optional-package loader, a private metrics registry, the embedded server's option types,
  // how a worker runs a defined task, the guard a worker puts on ctx.transaction's tx, the
  // worker's durable step runner and its host's contract, the step limits, the watchdog's wake
  // of suspended jobs, the event a callback's wait is for).
  const allowed = new Set([
    "../index.js",
    "../logger.js",
    "../optional.js",
    "../metrics.js",
    "../embedded-options.js",
    "../tasks/define.js",
    "../jobs/validate.js",
    "../worker/transaction-guard.js",
    "../worker/steps.js",
    "../worker/step-host.js",
    "../jobs/steps.js",
    "../store/steps.js",
    "../jobs/callbacks.js",
    "pg",
  ]);
  for (const file of fs.readdirSync(dir)) {
    const source = fs.readFileSync(path.join(dir, file), "utf8");
    for (const [, spec] of source.matchAll(/(?:from|import\()\s*"([^"]+)"/g)) {
      assert.ok(spec!.startsWith("node:") || own.has(spec!) || allowed.has(spec!), `${file} imports ${spec}`);
    }
  }
});
