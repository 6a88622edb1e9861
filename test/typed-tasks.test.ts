/**
 * Typed tasks against the real server, with schemas from zod, valibot and arktype: payloads
 * refused at enqueue naming the field, bad payloads that got in another way (SQL) dead at once
 * with the validation error, and handlers given the schema's output. The compile-time side is
 * test/typed-tasks.types.ts.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { type } from "arktype";
import * as v from "valibot";
import { z } from "zod";
import { ConfigError, ValidationError } from "../packages/leasehold/src/errors.js";
import { defineTask, type JobContext, type StandardSchemaV1 } from "../packages/leasehold/src/index.js";
import { PayloadValidationError } from "../packages/leasehold/src/tasks/validate.js";
import { loadTasks } from "../packages/cli/src/cli/tasks.js";
import type { Worker } from "../packages/leasehold/src/worker/worker.js";
import type { JobOutcome } from "../packages/leasehold/src/worker/report-end.js";
import { freshLeasehold, eventually, NO_BACKOFF } from "./helpers/db.js";

/** What each handler received, by job id. */
const seen = new Map<string, unknown>();
const record = (payload: unknown, ctx: JobContext) => void seen.set(ctx.jobId, payload);

const resize = defineTask({
  name: "resize",
  // zod: a default and a transform.
  schema: z.object({ file: z.string().transform((f) => f.toUpperCase()), width: z.number().int().default(800) }),
  handler: record,
});

const order = defineTask({
  name: "order",
  // valibot: nested array of objects, a default, a transform.
  schema: v.object({
    items: v.array(v.object({ sku: v.string(), qty: v.pipe(v.number(), v.integer()) })),
    note: v.optional(v.pipe(v.string(), v.trim()), "none"),
  }),
  handler: record,
  backoff: NO_BACKOFF,
});

const stamp = defineTask({
  name: "stamp",
  // arktype: a morph (a numeric string parsed to a number) and a default.
  schema: type({ id: "string.numeric.parse", "label?": "string", level: "number = 3" }),
  handler: record,
});

/** A hand-written Standard Schema whose validate is async: no library needed. */
const evenSchema: StandardSchemaV1<{ n: number }, { n: number; half: number }> = {
  "~standard": {
    version: 1,
    vendor: "test",
    validate: async (value) => {
      await new Promise((r) => setTimeout(r, 1));
      const n = (value as { n?: unknown } | null)?.n;
      if (typeof n !== "number" || n % 2 !== 0) return { issues: [{ message: "must be an even number", path: [{ key: "n" }] }] };
      return { value: { n, half: n / 2 } };
    },
  },
};
const halve = defineTask({ name: "halve", schema: evenSchema, handler: record });

const ALL = [resize, order, stamp, halve] as const;

/** Every attempt's end, from now on: `ends.of(id)` waits for that job's (a job may end before anyone asks). */
function collectEnds(worker: Worker) {
  const ended = new Map<string, JobOutcome>();
  worker.on("job:end", (job, outcome) => ended.set(job.id, outcome));
  return {
    of: (id: string) => eventually(async () => ended.get(id), `job ${id} ended`),
  };
}

test("enqueue refuses a payload its schema refuses, naming the field, and writes nothing (zod, valibot, arktype, async)", async (t) => {
  const lh = await freshLeasehold(t);
  const queue = lh.typed(ALL);
  const refusals: [string, () => Promise<unknown>, RegExp][] = [
    ["zod: wrong type", () => queue.enqueue("resize", { file: 42 } as never), /task "resize": invalid payload: payload\.file: .*string/i],
    ["zod: missing field", () => queue.enqueue("resize", {} as never), /payload\.file: /],
    ["zod: not an integer", () => queue.enqueue("resize", { file: "a", width: 1.5 }), /payload\.width: .*int/i],
    [
      "valibot: nested field",
      () =>
        queue.enqueue("order", {
          items: [
            { sku: "a", qty: 1 },
            { sku: 7 as never, qty: 1 },
          ],
        }),
      /task "order": invalid payload: payload\.items\[1\]\.sku: /,
    ],
    ["arktype: not numeric", () => queue.enqueue("stamp", { id: "abc" }), /task "stamp": invalid payload: payload\.id: /],
    ["async schema", () => queue.enqueue("halve", { n: 3 }), /task "halve": invalid payload: payload\.n: must be an even number/],
    ["unknown task", () => queue.enqueue("reszie" as never, { file: "a" } as never), /unknown task "reszie" \(did you mean "resize"\?\)/],
  ];
  for (const [what, enqueue, message] of refusals) {
    await assert.rejects(enqueue, (err: unknown) => {
      assert.ok(err instanceof ValidationError, `${what}: a ValidationError`);
      assert.equal((err as ValidationError).code, "invalid_input");
      assert.match((err as Error).message, message, what);
      return true;
    });
  }
  const err = await queue.enqueue("order", { items: [{ sku: 1, qty: "x" }] } as never).catch((e: unknown) => e);
  assert.ok(err instanceof PayloadValidationError);
  assert.deepEqual(
    err.issues.map((i) => i.path),
    ["payload.items[0].sku", "payload.items[0].qty"],
  );
  // One bad job fails the whole batch, naming its index; an async refusal too.
  await assert.rejects(
    queue.enqueueMany([
      { task: "resize", payload: { file: "a" } },
      { task: "order", payload: { items: [] } },
      { task: "stamp", payload: { id: "x1" } },
    ]),
    /job 2 \(task "stamp"\): invalid payload: payload\.id: /,
  );
  await assert.rejects(
    queue.enqueueMany([
      { task: "halve", payload: { n: 2 } },
      { task: "halve", payload: { n: 5 } },
    ]),
    /job 1 \(task "halve"\): invalid payload: payload\.n: must be an even number/,
  );
  // A schedule's payload is checked when it is saved.
  await assert.rejects(
    queue.schedule({ name: "nightly", cron: "0 3 * * *", task: "resize", payload: { file: 3 } as never }),
    /schedule nightly \(task "resize"\): invalid payload: payload\.file: /,
  );
  const { rows } = await lh.pool.query("SELECT (SELECT count(*) FROM jobs)::int AS jobs, (SELECT count(*) FROM schedules)::int AS schedules");
  assert.deepEqual(rows[0], { jobs: 0, schedules: 0 });

  // Valid ones go in, stored as given (the schema's input: no default filled in, no transform).
  const { id } = await queue.enqueue("resize", { file: "a.png" });
  assert.deepEqual((await lh.getJob(id)).job.payload, { file: "a.png" });
  assert.equal(
    (
      await queue.enqueueMany([
        { task: "halve", payload: { n: 4 } },
        { task: "stamp", payload: { id: "12" } },
      ])
    ).length,
    2,
  );
  const saved = await queue.schedule({ name: "nightly", cron: "0 3 * * *", task: "order", payload: { items: [] } });
  assert.equal(saved.task, "order");
});

test("enqueueFlow and enqueueBatch of a typed set check every payload first, naming the node or member, and write nothing; valid ones go in as given", async (t) => {
  const lh = await freshLeasehold(t);
  const queue = lh.typed(ALL);
  await assert.rejects(
    queue.enqueueFlow([
      { ref: "fetch", task: "resize", payload: { file: "a.png" } },
      { ref: "split", task: "halve", payload: { n: 3 }, dependsOn: ["fetch"] },
    ]),
    /node "split" \(task "halve"\): invalid payload: payload\.n: must be an even number/,
  );
  await assert.rejects(
    queue.enqueueFlow([{ ref: "x", task: "reszie", payload: { file: "a" } } as never]),
    (err: unknown) => err instanceof ValidationError && /node "x": unknown task "reszie"/.test(err.message),
  );
  await assert.rejects(
    queue.enqueueBatch({ jobs: [{ task: "stamp", payload: { id: "1" } }], onComplete: { task: "order", payload: { items: "none" } as never } }),
    /onComplete \(task "order"\): invalid payload: payload\.items/,
  );
  await assert.rejects(
    queue.enqueueBatch({
      jobs: [
        { task: "stamp", payload: { id: "1" } },
        { task: "resize", payload: { file: 7 } as never },
      ],
      onComplete: { task: "order", payload: { items: [] } },
    }),
    /job 1 \(task "resize"\): invalid payload: payload\.file/,
  );
  await assert.rejects(queue.enqueueBatch(null as never), /enqueueBatch takes \{ jobs/);
  assert.equal((await lh.pool.query("SELECT count(*)::int AS n FROM jobs")).rows[0].n, 0);

  // Valid: the graph and the batch are enqueued as the untyped client would, payloads as given.
  const { jobs } = await queue.enqueueFlow([
    { ref: "fetch", task: "resize", payload: { file: "a.png" } },
    { ref: "split", task: "halve", payload: { n: 4 }, dependsOn: ["fetch"] },
  ]);
  assert.deepEqual(Object.keys(jobs).sort(), ["fetch", "split"]);
  const split = await lh.getJob(jobs.split!);
  assert.deepEqual([split.job.state, split.job.payload], ["blocked", { n: 4 }]);
  const batch = await queue.enqueueBatch({
    jobs: [
      { task: "stamp", payload: { id: "12" } },
      { task: "halve", payload: { n: 2 } },
    ],
    onComplete: { task: "order", payload: { items: [] } },
  });
  assert.equal(batch.jobIds.length, 2);
  const callback = await lh.getJob(batch.callbackId);
  assert.deepEqual([callback.job.task, callback.job.state, callback.job.payload], ["order", "blocked", { items: [] }]);
});

test("a batch refused at once while an async payload check still runs leaves no unhandled rejection behind", async (t) => {
  const lh = await freshLeasehold(t);
  const queue = lh.typed(ALL);
  const unhandled: unknown[] = [];
  const listen = (reason: unknown) => void unhandled.push(reason);
  process.on("unhandledRejection", listen);
  t.after(() => void process.off("unhandledRejection", listen));
  // Job 0's check is async and fails a moment later; job 1 is refused before it settles.
  await assert.rejects(queue.enqueueMany([{ task: "halve", payload: { n: 5 } }, { task: "nope" } as never]), /job 1: unknown task "nope"/);
  await assert.rejects(
    queue.enqueueFlow([{ ref: "a", task: "halve", payload: { n: 5 } }, { ref: "b", task: "nope" } as never]),
    /node "b": unknown task "nope"/,
  );
  await new Promise((r) => setTimeout(r, 100));
  assert.deepEqual(unhandled, []);
});

test("a bad payload that got in through SQL goes to the dead letter at once, with the validation error, without retries", async (t) => {
  const lh = await freshLeasehold(t);
  seen.clear();
  const worker = lh.typed(ALL).worker({ pollIntervalMs: 20, backoff: NO_BACKOFF });
  const ends = collectEnds(worker);
  await worker.start();
  t.after(() => worker.stop());
  const viaSql = async (task: string, payload: unknown) => {
    const { rows } = await lh.pool.query<{ id: string }>(`SELECT ${lh.schema}.enqueue($1, $2::jsonb)::text AS id`, [task, JSON.stringify(payload)]);
    return rows[0]!.id;
  };
  const cases: [string, unknown, RegExp][] = [
    ["resize", { file: 42 }, /job \d+ \(task "resize"\): invalid payload: payload\.file: /],
    ["order", { items: [{ sku: "a", qty: 2.5 }] }, /invalid payload: payload\.items\[0\]\.qty: /],
    ["stamp", { id: "twelve" }, /invalid payload: payload\.id: /],
    ["halve", { n: 7 }, /invalid payload: payload\.n: must be an even number/],
  ];
  for (const [task, payload, message] of cases) {
    const id = await viaSql(task, payload);
    assert.deepEqual(await ends.of(id), { state: "dead" }, `${task}: dead after one attempt`);
    const { job, attempts } = await lh.getJob(id);
    assert.equal(job.state, "dead");
    assert.equal(job.maxAttempts, 25, "the budget was there: giving up was the validation's doing");
    assert.equal(attempts.length, 1, `${task}: one attempt, no retries`);
    assert.equal(attempts[0]!.outcome, "failed");
    assert.match(job.lastError!, message);
    assert.match(job.lastError!, /PermanentJobError/);
  }
  assert.equal(seen.size, 0, "no handler ran on a bad payload");
});

test("handlers get the schema's output: defaults filled in, transforms and morphs applied (zod, valibot, arktype, async)", async (t) => {
  const lh = await freshLeasehold(t);
  seen.clear();
  const queue = lh.typed(ALL);
  const worker = queue.worker({ pollIntervalMs: 20 });
  const ends = collectEnds(worker);
  await worker.start();
  t.after(() => worker.stop());
  const runs: [{ id: string }, unknown][] = [
    [await queue.enqueue("resize", { file: "a.png" }), { file: "A.PNG", width: 800 }],
    [await queue.enqueue("order", { items: [{ sku: "x", qty: 2 }], note: "  gift  " }), { items: [{ sku: "x", qty: 2 }], note: "gift" }],
    [await queue.enqueue("order", { items: [] }), { items: [], note: "none" }],
    [await queue.enqueue("stamp", { id: "12" }), { id: 12, level: 3 }],
    [await queue.enqueue("halve", { n: 10 }), { n: 10, half: 5 }],
  ];
  // A job from SQL with a good payload is run like any other.
  const { rows } = await lh.pool.query<{ id: string }>(`SELECT ${lh.schema}.enqueue('resize', '{"file": "b.png", "width": 5}')::text AS id`);
  runs.push([rows[0]!, { file: "B.PNG", width: 5 }]);
  for (const [{ id }, expected] of runs) {
    assert.deepEqual(await ends.of(id), { state: "succeeded" });
    assert.deepEqual(seen.get(id), expected);
  }
});

test("a typed worker runs the tasks it is given, beside untyped handlers; misuse is a ConfigError", async (t) => {
  const lh = await freshLeasehold(t);
  seen.clear();
  const queue = lh.typed(ALL);
  const worker = queue.worker({ tasks: ["resize"], handlers: { plain: record }, pollIntervalMs: 20 });
  const ends = collectEnds(worker);
  assert.deepEqual([...worker.settings.tasks.keys()].sort(), ["plain", "resize"]);
  assert.throws(() => queue.worker({ handlers: { resize: () => {} } }), /task "resize" is both a defined task and in handlers/);
  assert.throws(() => queue.worker({ tasks: ["reszie" as never] }), ConfigError);
  assert.throws(() => lh.worker({ handlers: { resize } as never }), /handlers\.resize is a task made by defineTask/);
  assert.throws(() => lh.typed([resize, resize]), /task "resize" is defined twice/);
  assert.throws(() => lh.typed([{ name: "x" } as never]), /tasks\[0\] is not a task made by defineTask/);
  assert.throws(() => defineTask({ name: "x", schema: {} as never, handler: () => {} }), /schema must implement Standard Schema v1/);
  assert.throws(() => defineTask({ name: "x", schema: z.null(), handler: () => {}, maxRunMS: 5 } as never), /unknown option "maxRunMS"/);
  await worker.start();
  t.after(() => worker.stop());
  const plain = await lh.enqueue("plain", { anything: [1] });
  assert.deepEqual(await ends.of(plain.id), { state: "succeeded" });
  assert.deepEqual(seen.get(plain.id), { anything: [1] });
});

test("a tasks module for the CLI may export default an array of defined tasks", async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-typed-"));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const file = path.join(dir, "tasks.ts");
  const index = pathToFileURL(path.resolve("packages/leasehold/src/index.ts")).href;
  fs.writeFileSync(
    file,
    `import { defineTask } from ${JSON.stringify(index)};
const schema = { "~standard": { version: 1, vendor: "test", validate: (value: unknown) => typeof value === "number" ? { value: value * 2 } : { issues: [{ message: "not a number" }] } } };
export default [defineTask({ name: "double", schema, handler: (n: number) => n })];
`,
  );
  const { handlers } = await loadTasks(file);
  assert.deepEqual(Object.keys(handlers), ["double"]);
  const run = (handlers.double as { handler: (p: unknown, ctx: unknown) => Promise<unknown> }).handler;
  assert.equal(await run(21, { jobId: "1" }), 42, "the handler gets the schema's output");
  await assert.rejects(run("x", { jobId: "1" }), {
    name: "PermanentJobError",
    message: 'job 1 (task "double"): invalid payload: payload: not a number',
  });
});

test("past the job boundary: a typed flow keyed by its refs, ctx.parents(task) with that task's results, waitFor typed by task", async (t) => {
  const lh = await freshLeasehold(t);
  // A job enqueued without a payload stores {}, so payload-less tasks accept {}.
  const measure = defineTask({
    name: "measure",
    schema: z.object({ file: z.string() }),
    handler: async ({ file }) => ({ file, bytes: file.length * 100 }),
  });
  const note = defineTask({ name: "note", schema: z.object({}).optional(), handler: () => "a parent of another task" });
  const report = defineTask({
    name: "report",
    schema: z.object({}).optional(),
    handler: async (_payload, ctx) => {
      const measured = await ctx.parents(measure);
      return {
        files: measured.map((p) => p.result?.file ?? "?").sort(),
        total: measured.reduce((n, p) => n + (p.result?.bytes ?? 0), 0),
        parents: (await ctx.parents()).length,
      };
    },
  });
  const queue = lh.typed([measure, note, report]);
  const worker = queue.worker({ pollIntervalMs: 20 });
  await worker.start();
  t.after(() => worker.stop());

  const { jobs } = await queue.enqueueFlow([
    { ref: "a", task: "measure", payload: { file: "a.png" } },
    { ref: "bb", task: "measure", payload: { file: "bb.png" } },
    { ref: "n", task: "note" },
    { ref: "sum", task: "report", dependsOn: ["a", "bb", "n"] },
  ]);
  assert.deepEqual(Object.keys(jobs).sort(), ["a", "bb", "n", "sum"]);
  const summed = await queue.waitFor("report", jobs.sum, { timeoutMs: 20_000 });
  assert.equal(summed.state, "succeeded", JSON.stringify([summed.lastError, (await lh.getJob(jobs.n)).job.lastError]));
  assert.deepEqual(summed.result, { files: ["a.png", "bb.png"], total: 1100, parents: 3 }, "only the measure parents, with their results");

  const one = await queue.enqueue("measure", { file: "c.png" });
  assert.equal(one.task, "measure");
  const measured = await queue.waitFor(one, { timeoutMs: 20_000 });
  assert.deepEqual(measured.result, { file: "c.png", bytes: 500 });

  // An id of another task's job would give a result of another type: refused, naming both.
  await assert.rejects(queue.waitFor("measure", jobs.sum), (err) => {
    assert.ok(err instanceof ValidationError);
    assert.match(err.message, new RegExp(`waitFor: job ${jobs.sum} is a job of task "report", not "measure"`));
    return true;
  });
  await assert.rejects(queue.waitFor("mesure" as never, jobs.a), /waitFor: unknown task "mesure".*did you mean "measure"/i);
  await assert.rejects(queue.waitFor("measure", 42 as never), /waitFor: the job id must be a string \(got number\)/);
});
