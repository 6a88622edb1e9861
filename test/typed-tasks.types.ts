/**
 * Type-level test of typed tasks, checked by `tsc` (npm run typecheck, through
 * tsconfig.check.json) and never run: each `@ts-expect-error` marks a misuse that must not
 * compile. Were the types to let one through, the directive itself would be the error.
 */
import { type } from "arktype";
import * as v from "valibot";
import { z } from "zod";
import {
  defineTask,
  type JobOutcome,
  type JsonValue,
  type Leasehold,
  type ClaimedJob,
  type ResultOf,
  type TaskInput,
  type TaskOutput,
  type TaskResult,
} from "../packages/leasehold/src/index.js";

/** Compile-time equality: `expectTypeOf(x).toBe<T>()` compiles only if x's type is exactly T. */
type Equal<A, B> = (<G>() => G extends A ? 1 : 2) extends <G>() => G extends B ? 1 : 2 ? true : false;
function expectTypeOf<Actual>(_value: Actual) {
  return { toBe: <Expected>(..._proof: Equal<Actual, Expected> extends true ? [] : [never]) => {} };
}
function expectType<T extends true>(_: T): void {}

const resize = defineTask({
  name: "resize",
  schema: z.object({ file: z.string(), width: z.number().int().default(800) }),
  handler: async (payload, ctx) => {
    expectTypeOf(payload).toBe<{ file: string; width: number }>();
    // @ts-expect-error wrong handler payload use: width is a number, not a string
    payload.width.toUpperCase();
    // @ts-expect-error wrong handler payload use: no such field
    void payload.height;
    ctx.progress({ step: "resizing" });
  },
  maxRunMs: 60_000,
});

const email = defineTask({
  name: "send-email",
  schema: v.object({ to: v.pipe(v.string(), v.email()), cc: v.optional(v.array(v.string())) }),
  handler: (payload) => {
    expectTypeOf(payload).toBe<{ to: string; cc?: string[] | undefined }>();
  },
});

const stamp = defineTask({
  name: "stamp",
  schema: type({ id: "number", "note?": "string" }),
  handler: (payload) => {
    expectTypeOf(payload).toBe<{ id: number; note?: string }>();
  },
});

const ping = defineTask({
  name: "ping",
  schema: z.undefined(),
  handler: () => {},
});

defineTask({
  name: "bad-handler",
  schema: z.object({ n: z.number() }),
  // @ts-expect-error wrong handler payload type: the schema's output has n: number
  handler: (payload: { n: string }) => payload.n,
});

type Tasks = readonly [typeof resize, typeof email, typeof stamp, typeof ping];
expectType<Equal<TaskInput<Tasks, "resize">, { file: string; width?: number | undefined }>>(true);
expectType<Equal<TaskOutput<Tasks, "resize">, { file: string; width: number }>>(true);

export async function misuse(lh: Leasehold): Promise<void> {
  const queue = lh.typed([resize, email, stamp, ping]);

  // Right: defaults may be left out (the input type), options and a transaction client too.
  await queue.enqueue("resize", { file: "a.png" });
  await queue.enqueue("resize", { file: "a.png", width: 100 }, { priority: 1, maxAttempts: 3 });
  await queue.enqueue("send-email", { to: "ada@example.com" });
  await queue.enqueue("stamp", { id: 1, note: "x" });
  await queue.enqueue("ping");

  // @ts-expect-error unknown task name
  await queue.enqueue("reszie", { file: "a.png" });
  // @ts-expect-error wrong payload field
  await queue.enqueue("resize", { fiel: 42 });
  // @ts-expect-error wrong payload field type
  await queue.enqueue("resize", { file: 42 });
  // @ts-expect-error unknown extra field (excess property)
  await queue.enqueue("resize", { file: "a.png", height: 3 });
  // @ts-expect-error missing required field
  await queue.enqueue("send-email", { cc: ["b@example.com"] });
  // @ts-expect-error missing payload altogether
  await queue.enqueue("stamp");
  // @ts-expect-error arktype schema: wrong field type
  await queue.enqueue("stamp", { id: "1" });
  // @ts-expect-error a task with no payload takes none
  await queue.enqueue("ping", { x: 1 });
  // @ts-expect-error unknown enqueue option
  await queue.enqueue("resize", { file: "a.png" }, { priorty: 1 });

  await queue.enqueueMany([
    { task: "resize", payload: { file: "a.png" } },
    { task: "send-email", payload: { to: "ada@example.com" }, queue: "mail" },
    { task: "ping" },
  ]);
  // @ts-expect-error enqueueMany: unknown task name
  await queue.enqueueMany([{ task: "reszie", payload: { file: "a.png" } }]);
  // @ts-expect-error enqueueMany: one task's payload under another's name
  await queue.enqueueMany([{ task: "send-email", payload: { file: "a.png" } }]);
  // @ts-expect-error enqueueMany: missing payload
  await queue.enqueueMany([{ task: "resize" }]);

  const flow = await queue.enqueueFlow([
    { ref: "fetch", task: "resize", payload: { file: "a.png" } },
    { ref: "mail", task: "send-email", payload: { to: "ada@example.com" }, dependsOn: ["fetch"], onParentFailure: "run" },
    { ref: "done", task: "ping", dependsOn: ["mail"] },
  ]);
  // The answer is keyed by the flow's refs, and dependsOn takes only those.
  expectTypeOf(flow).toBe<{ jobs: Record<"fetch" | "mail" | "done", string> }>();
  void flow.jobs.mail;
  // @ts-expect-error enqueueFlow: the answer has no such ref
  void flow.jobs.mial;
  await queue.enqueueFlow([
    { ref: "fetch", task: "resize", payload: { file: "a.png" } },
    // @ts-expect-error enqueueFlow: dependsOn names a ref the flow does not have
    { ref: "mail", task: "send-email", payload: { to: "ada@example.com" }, dependsOn: ["fecth"] },
  ]);
  // An existing job by id, and refs built at run time (Ref is then string), still compile.
  await queue.enqueueFlow([{ ref: "a", task: "ping", dependsOn: [{ id: "42" }] }]);
  const dynamic = ["x", "y"].map((ref, i) => ({ ref, task: "ping" as const, dependsOn: i ? ["x"] : [] }));
  expectTypeOf(await queue.enqueueFlow(dynamic)).toBe<{ jobs: Record<string, string> }>();
  // @ts-expect-error enqueueFlow: unknown task name
  await queue.enqueueFlow([{ ref: "a", task: "reszie", payload: { file: "a.png" } }]);
  // @ts-expect-error enqueueFlow: one task's payload under another's name
  await queue.enqueueFlow([{ ref: "a", task: "send-email", payload: { file: "a.png" } }]);
  // @ts-expect-error enqueueFlow: a node without its ref
  await queue.enqueueFlow([{ task: "resize", payload: { file: "a.png" } }]);

  const batch = await queue.enqueueBatch({
    jobs: [{ task: "resize", payload: { file: "a.png" } }, { task: "ping" }],
    onComplete: { task: "send-email", payload: { to: "ada@example.com" }, queue: "mail" },
  });
  expectTypeOf(batch).toBe<{ callbackId: string; jobIds: string[] }>();
  // @ts-expect-error enqueueBatch: a member with another task's payload
  await queue.enqueueBatch({ jobs: [{ task: "resize", payload: { to: "x" } }], onComplete: { task: "ping" } });
  // @ts-expect-error enqueueBatch: onComplete of an unknown task
  await queue.enqueueBatch({ jobs: [{ task: "ping" }], onComplete: { task: "pnig" } });
  // @ts-expect-error enqueueBatch: onComplete cannot have a unique key
  await queue.enqueueBatch({ jobs: [{ task: "ping" }], onComplete: { task: "ping", uniqueKey: "k" } });

  await queue.schedule({ name: "nightly", cron: "0 3 * * *", task: "resize", payload: { file: "nightly.png" } });
  await queue.schedule({ name: "pinger", cron: "* * * * *", task: "ping" });
  // @ts-expect-error schedule with wrong payload
  await queue.schedule({ name: "nightly", cron: "0 3 * * *", task: "resize", payload: { file: 3 } });
  // @ts-expect-error schedule of an unknown task
  await queue.schedule({ name: "nightly", cron: "0 3 * * *", task: "reszie", payload: { file: "x" } });
  // @ts-expect-error schedule missing its payload
  await queue.schedule({ name: "nightly", cron: "0 3 * * *", task: "stamp" });

  const worker = queue.worker({ concurrency: 5, tasks: ["resize", "ping"] });
  // @ts-expect-error a worker of tasks not in the set
  queue.worker({ tasks: ["reszie"] });

  worker.on("job:end", (job, outcome) => {
    expectTypeOf(job).toBe<ClaimedJob>();
    expectTypeOf(outcome).toBe<JobOutcome>();
  });
  worker.once("job:start", (job) => void job.id);
  worker.on("identity:lost", (err) => void err.message);
  // @ts-expect-error unknown event name
  worker.on("jb:end", () => {});
  // @ts-expect-error listener of the wrong shape: job:end gives a ClaimedJob, not a string
  worker.on("job:end", (job: string) => job);
  // Chaining keeps the Worker type.
  await worker.on("idle", () => {}).start();

  // Untyped use keeps working as before: any name, any payload, a handlers map.
  await lh.enqueue("reszie", { fiel: 42 });
  await lh.enqueueMany([{ task: "anything", payload: [1, 2] }]);
  await lh.schedule({ name: "x", cron: "* * * * *", task: "anything", payload: { a: 1 } });
  lh.worker({ handlers: { anything: async (payload: { a: number }) => payload.a } });
}

// A handler's result is typed as what the worker stores (JSON, as JSON.stringify writes it).
interface Row {
  id: number;
  created_at: Date; // a toJSON value: stored as its ISO string
  tags: string[];
  note?: string;
}
defineTask({ name: "returns-row", schema: z.object({}), handler: async (): Promise<Row> => ({ id: 1, created_at: new Date(), tags: [] }) });
defineTask({ name: "returns-date", schema: z.object({}), handler: () => new Date() });
defineTask({ name: "returns-nothing", schema: z.object({}), handler: async () => {} });
defineTask({ name: "returns-json", schema: z.object({}), handler: (): JsonValue => ({ a: [1, "b", null] }) });
defineTask({ name: "returns-any", schema: z.object({}), handler: async (): Promise<any> => ({}) });
// @ts-expect-error a bigint is not JSON
defineTask({ name: "returns-bigint", schema: z.object({}), handler: async () => ({ total: 10n }) });
// @ts-expect-error a function is not JSON
defineTask({ name: "returns-function", schema: z.object({}), handler: () => ({ callback: () => 1 }) });
// @ts-expect-error a Map is not JSON (JSON.stringify would write {})
defineTask({ name: "returns-map", schema: z.object({}), handler: () => ({ byId: new Map<string, number>() }) });

// Results: typed from what the handler returns, through waitFor and ctx.parents(task).
const measure = defineTask({
  name: "measure",
  schema: z.object({ file: z.string() }),
  handler: async (payload) => ({ file: payload.file, bytes: 1024, tags: ["a"] }),
});
const count = defineTask({
  name: "count",
  schema: z.undefined(),
  handler: () => 7,
});
const report = defineTask({
  name: "report",
  schema: z.undefined(),
  handler: async (_payload, ctx) => {
    const measured = await ctx.parents(measure);
    expectTypeOf(measured[0]!.result).toBe<{ file: string; bytes: number; tags: string[] } | null>();
    expectTypeOf(measured[0]!.task).toBe<"measure">();
    // @ts-expect-error ctx.parents(task): a field the parent task's result does not have
    void measured[0]!.result?.byts;
    // Untyped, as before: every parent, results as JSON.
    const all = await ctx.parents();
    expectTypeOf(all[0]!.task).toBe<string | null>();
    // @ts-expect-error ctx.parents takes a task made by defineTask, not a name
    await ctx.parents("measure");
    return { total: measured.reduce((n, p) => n + (p.result?.bytes ?? 0), 0) };
  },
});
expectType<Equal<ResultOf<typeof measure>, { file: string; bytes: number; tags: string[] }>>(true);
expectType<Equal<ResultOf<typeof count>, number>>(true);
expectType<Equal<ResultOf<typeof resize>, null>>(true);
expectType<Equal<TaskResult<readonly [typeof measure, typeof report], "report">, { total: number }>>(true);

export async function results(lh: Leasehold): Promise<void> {
  const queue = lh.typed([measure, count, report, ping]);

  const job = await queue.enqueue("measure", { file: "a.png" });
  expectTypeOf(job.task).toBe<"measure">();
  const done = await queue.waitFor(job, { timeoutMs: 1000 });
  expectTypeOf(done.result).toBe<{ file: string; bytes: number; tags: string[] } | null>();
  expectTypeOf(done.task).toBe<"measure">();
  // @ts-expect-error waitFor: a field the task's result does not have
  void done.result?.size;

  const { jobs } = await queue.enqueueFlow([
    { ref: "m", task: "measure", payload: { file: "a.png" } },
    { ref: "r", task: "report", dependsOn: ["m"] },
  ]);
  const reported = await queue.waitFor("report", jobs.r);
  expectTypeOf(reported.result).toBe<{ total: number } | null>();
  expectTypeOf((await queue.waitFor("count", "1")).result).toBe<number | null>();
  expectTypeOf((await queue.waitFor("ping", "1")).result).toBe<null>();
  // @ts-expect-error waitFor: a field the report task's result does not have
  void reported.result?.totl;
  // @ts-expect-error waitFor: a task not in the set
  await queue.waitFor("resize", jobs.m);
  // @ts-expect-error waitFor: a handle of another client's task
  await queue.waitFor({ id: "1", task: "resize" });

  // Untyped waitFor is unchanged: any id, results as JSON.
  expectTypeOf((await lh.waitFor("1")).task).toBe<string>();
}
