/**
 * ctx.children against the real server (docs/durable-children.md): a durable handler starts
 * child jobs (or a child flow) as a step, exactly once per job, suspends holding no lease and no
 * slot while they run, and resumes with each child's end once the last has ended, whether it
 * succeeded, died or was cancelled.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import type { JobContext } from "../packages/leasehold/src/worker/context.js";
import { defineTask } from "../packages/leasehold/src/tasks/define.js";
import type { StandardSchemaV1 } from "../packages/leasehold/src/tasks/standard-schema.js";
import type { ChildEnd } from "../packages/leasehold/src/worker/children.js";
import { startOrAwaitChildren } from "../packages/leasehold/src/store/children.js";
import * as store from "../packages/leasehold/src/store/index.js";
import { prepareFlow } from "../packages/leasehold/src/jobs/flow-graph.js";
import { eventually, freshLeasehold, NO_BACKOFF, settled } from "./helpers/db.js";

type Lh = Awaited<ReturnType<typeof freshLeasehold>>;

async function jobsOfTask(lh: Lh, task: string): Promise<number> {
  const { rows } = await lh.pool.query<{ n: number }>(
    "SELECT (SELECT count(*) FROM jobs WHERE task = $1) + (SELECT count(*) FROM finished_jobs WHERE task = $1) AS n",
    [task],
  );
  return Number(rows[0]!.n);
}

test("a parent starts 3 children and suspends holding no slot: they run in the one slot, and it resumes with their results", async (t) => {
  const lh = await freshLeasehold(t);
  const runs: string[] = [];
  let release!: () => void;
  const gate = new Promise<void>((resolve) => (release = resolve));
  const worker = lh.worker({
    concurrency: 1,
    handlers: {
      fanOut: async (p: { n: number }, ctx: JobContext) => {
        await ctx.step("before", () => void runs.push(`before ${ctx.attempt}`));
        const ends = await ctx.children(
          "squares",
          [1, 2, 3].map((i) => ({ task: "square", payload: { i: i * p.n } })),
        );
        runs.push(`resumed ${ctx.attempt}`);
        return ends.map((e) => ({ state: e.state, result: e.result, ref: e.ref, task: e.task }));
      },
      square: async (p: { i: number }) => {
        await gate;
        runs.push(`square ${p.i}`);
        return p.i * p.i;
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const { id } = await lh.enqueue("fanOut", { n: 10 });
  const waiting = await settled(lh, id, "suspended");
  assert.equal(waiting.job.lockedBy ?? null, null, "no lease while its children run");
  const { rows: wait } = await lh.pool.query("SELECT wait ->> 'kind' AS kind, children_pending FROM jobs WHERE id = $1", [id]);
  assert.deepEqual(wait[0], { kind: "children", children_pending: 3 });
  // The one slot is free: the children run in it, one after another.
  release();
  const { job, attempts } = await settled(lh, id, "succeeded");
  assert.deepEqual(job.result, [
    { state: "succeeded", result: 100, ref: null, task: "square" },
    { state: "succeeded", result: 400, ref: null, task: "square" },
    { state: "succeeded", result: 900, ref: null, task: "square" },
  ]);
  assert.deepEqual(runs, ["before 1", "square 10", "square 20", "square 30", "resumed 2"]);
  assert.deepEqual(
    attempts.map((a) => a.outcome),
    ["suspended", "succeeded"],
  );
  assert.equal(job.spentAttempts, 0);
  assert.equal(await jobsOfTask(lh, "square"), 3);
  const { rows: steps } = await lh.pool.query("SELECT kind, state FROM job_steps WHERE job_id = $1 AND name = 'squares'", [id]);
  assert.deepEqual(steps, [{ kind: "children", state: "succeeded" }]);
});

test("a dead child and a cancelled child still wake the parent, and its result says how each ended", async (t) => {
  const lh = await freshLeasehold(t);
  const worker = lh.worker({
    backoff: NO_BACKOFF,
    handlers: {
      parent: async (_: unknown, ctx: JobContext) => {
        const ends = await ctx.children("mixed", [
          { task: "ok", payload: {} },
          { task: "broken", payload: {}, maxAttempts: 1 },
          { task: "ok", payload: {}, runAt: new Date(Date.now() + 86_400_000) },
        ]);
        return ends.map((e) => ({ state: e.state, result: e.result, error: e.error }));
      },
      ok: async () => "fine",
      broken: async () => {
        throw new Error("child exploded");
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const { id } = await lh.enqueue("parent", {});
  await settled(lh, id, "suspended");
  // The third child would wait a day: cancel it, and the parent wakes without it.
  const later = await lh.pool.query<{ id: string }>("SELECT id FROM jobs WHERE task = 'ok' AND run_at > now() + interval '1 hour'");
  await eventually(
    async () => (await lh.pool.query("SELECT 1 FROM jobs WHERE awaited_by = $1 AND task <> 'ok'", [id])).rowCount === 0,
    "broken child ended",
  );
  assert.equal(await lh.cancel(later.rows[0]!.id), "cancelled");
  const { job } = await settled(lh, id, "succeeded");
  const ends = job.result as { state: string; result: unknown; error: string | null }[];
  assert.deepEqual(ends[0], { state: "succeeded", result: "fine", error: null });
  assert.equal(ends[1]!.state, "dead");
  assert.match(ends[1]!.error ?? "", /child exploded/);
  assert.equal(ends[2]!.state, "cancelled");
  assert.equal(ends[2]!.result, null);
});

test("a child flow whose node dies: the nodes its death cancels end too, and the parent wakes listing each", async (t) => {
  const lh = await freshLeasehold(t);
  const worker = lh.worker({
    backoff: NO_BACKOFF,
    handlers: {
      parent: async (_: unknown, ctx: JobContext) => {
        const ends = await ctx.children("pipeline", {
          flow: [
            { ref: "extract", task: "fails", maxAttempts: 1 },
            { ref: "load", task: "fine", dependsOn: ["extract"] },
            { ref: "report", task: "fine", dependsOn: ["load"] },
          ],
        });
        return ends.map((e) => [e.ref, e.state]);
      },
      fails: async () => {
        throw new Error("source unreachable");
      },
      fine: async () => "ran",
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const { id } = await lh.enqueue("parent", {});
  const { job } = await settled(lh, id, "succeeded");
  assert.deepEqual(job.result, [
    ["extract", "dead"],
    ["load", "cancelled"],
    ["report", "cancelled"],
  ]);
});

test("a retry after a failure after the children step replays it: the children are never enqueued again", async (t) => {
  const lh = await freshLeasehold(t);
  let failedAfter = false;
  const worker = lh.worker({
    backoff: NO_BACKOFF,
    handlers: {
      parent: async (_: unknown, ctx: JobContext) => {
        const ends = await ctx.children("kids", [
          { task: "kid", payload: { n: 1 } },
          { task: "kid", payload: { n: 2 } },
        ]);
        if (!failedAfter) {
          failedAfter = true;
          throw new Error("after the children");
        }
        return ends.map((e) => e.result);
      },
      kid: async (p: { n: number }) => p.n,
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const { id } = await lh.enqueue("parent", {});
  const { job, attempts } = await settled(lh, id, "succeeded");
  assert.deepEqual(job.result, [1, 2]);
  assert.deepEqual(
    attempts.map((a) => a.outcome),
    ["suspended", "failed", "succeeded"],
  );
  assert.equal(await jobsOfTask(lh, "kid"), 2, "the children were enqueued once");
});

test("a child flow: its nodes run in their order and come back with their refs; typed tasks type the results", async (t) => {
  const lh = await freshLeasehold(t);
  const anySchema: StandardSchemaV1<{ word: string }> = {
    "~standard": {
      version: 1,
      vendor: "test",
      validate: (v) =>
        typeof (v as { word?: unknown })?.word === "string"
          ? { value: v as { word: string } }
          : { issues: [{ message: "word must be a string", path: ["word"] }] },
    },
  };
  const shout = defineTask({ name: "shout", schema: anySchema, handler: (p) => ({ loud: p.word.toUpperCase() }) });
  const order: string[] = [];
  const worker = lh.worker({
    handlers: {
      shout: async (p: { word: string }) => ({ loud: p.word.toUpperCase() }),
      step1: async () => void order.push("first"),
      step2: async (_: unknown, ctx: JobContext) => {
        order.push("second");
        return (await ctx.parents()).length;
      },
      parent: async (_: unknown, ctx: JobContext) => {
        const flow = await ctx.children("flow", {
          flow: [
            { ref: "a", task: "step1" },
            { ref: "b", task: "step2", dependsOn: ["a"] },
          ],
        });
        const typed: ChildEnd<{ loud: string }>[] = await ctx.children("typed", [{ task: shout, payload: { word: "hi" } }]);
        return { flow: flow.map((e) => [e.ref, e.state, e.result]), loud: typed[0]!.result!.loud };
      },
      badPayload: async (_: unknown, ctx: JobContext) => ctx.children("typed", [{ task: shout, payload: { word: 3 } as never }]),
      badShape: async (_: unknown, ctx: JobContext) => ctx.children("oops", [{ task: "x", dependsOn: ["y"] } as never]),
      badKey: async (_: unknown, ctx: JobContext) => ctx.children("keyed", [{ task: "x", uniqueKey: "k" } as never]),
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const { id } = await lh.enqueue("parent", {});
  const { job } = await settled(lh, id, "succeeded");
  assert.deepEqual(job.result, {
    flow: [
      ["a", "succeeded", null],
      ["b", "succeeded", 1],
    ],
    loud: "HI",
  });
  assert.deepEqual(order, ["first", "second"]);
  // Bad input names the call, the child and the problem, and starts nothing.
  const bad = await Promise.all(["badPayload", "badShape", "badKey"].map((task) => lh.enqueue(task, {}, { maxAttempts: 1 })));
  const errors = await Promise.all(bad.map(async (b) => (await settled(lh, b.id, "dead")).job.lastError ?? ""));
  assert.match(errors[0]!, /ctx.children\("typed"\): job 0 \(task "shout"\): invalid payload: payload.word: word must be a string/);
  assert.match(errors[1]!, /ctx.children\("oops"\): job 0: "dependsOn" belongs to a child flow/);
  assert.match(errors[2]!, /ctx.children\("keyed"\): .*uniqueKey is not allowed/);
  assert.equal(await jobsOfTask(lh, "x"), 0);
});

test("a zombie cannot start children, nor a job being cancelled: the start is fenced by the attempt, and writes nothing when refused", async (t) => {
  const lh = await freshLeasehold(t);
  const { id } = await lh.enqueue("parent", {});
  const start = async (workerId: string, attempt: number) => {
    const client = await lh.pool.connect();
    try {
      await client.query("BEGIN");
      const answer = await startOrAwaitChildren(client, {
        workerId,
        id,
        attempt,
        seq: 0,
        name: "kids",
        occurrence: 0,
        nodes: prepareFlow([{ ref: "job 0", task: "kid" }]),
        flow: false,
      });
      await client.query("COMMIT");
      return answer;
    } finally {
      client.release();
    }
  };
  // The job is waiting: no attempt holds it, so this worker's start is refused.
  assert.equal(await start("zombie", 1), "stale");
  // Held, but a cancel was requested: the job ends cancelled and no child is started.
  const [claimed] = await store.claimJobs(lh.pool, { queues: ["default"], limit: 1, workerId: "w1", leaseMs: 30_000, tasks: ["parent"] });
  await lh.pool.query("UPDATE jobs SET cancel_requested_at = now() WHERE id = $1", [id]);
  assert.deepEqual(await start("w1", claimed!.attempt), { ended: "cancelled" });
  assert.equal((await lh.getJob(id)).job.state, "cancelled");
  assert.equal(await jobsOfTask(lh, "kid"), 0);
  const { rows } = await lh.pool.query("SELECT count(*)::int AS n FROM job_steps WHERE job_id = $1", [id]);
  assert.equal(rows[0].n, 0);
});

test("the last child's end puts its suspended parent back to waiting in the same transaction; the replay reads the ends", async (t) => {
  const lh = await freshLeasehold(t);
  const { id } = await lh.enqueue("parent", {});
  const step = { id, seq: 0, name: "kids", occurrence: 0, flow: false };
  const inTransaction = async <T>(fn: (db: store.Queryable) => Promise<T>): Promise<T> => store.withTransaction(lh.pool, fn);
  const claim = async () =>
    (await store.claimJobs(lh.pool, { queues: ["default"], limit: 1, workerId: "w1", leaseMs: 30_000, tasks: ["parent"] }))[0]!;
  const first = await claim();
  const nodes = prepareFlow([
    { ref: "job 0", task: "kid" },
    { ref: "job 1", task: "kid" },
  ]);
  assert.deepEqual(await inTransaction((db) => startOrAwaitChildren(db, { ...step, workerId: "w1", attempt: first.attempt, nodes })), {
    ended: "suspended",
  });
  const kids = (await lh.pool.query<{ id: string }>("SELECT id FROM jobs WHERE awaited_by = $1 ORDER BY id", [id])).rows.map((r) => r.id);
  assert.equal(kids.length, 2);
  const parentRow = async () => (await lh.pool.query("SELECT state, children_pending, run_at <= now() AS due FROM jobs WHERE id = $1", [id])).rows[0];
  assert.deepEqual(await parentRow(), { state: "suspended", children_pending: 2, due: false });
  assert.equal(await lh.cancel(kids[0]!), "cancelled");
  assert.deepEqual(await parentRow(), { state: "suspended", children_pending: 1, due: false }, "one child is still running");
  assert.equal(await lh.cancel(kids[1]!), "cancelled");
  assert.deepEqual(await parentRow(), { state: "waiting", children_pending: 0, due: true }, "woken by the last end, not by a watchdog");
  const second = await claim();
  const answer = await inTransaction((db) => startOrAwaitChildren(db, { ...step, workerId: "w1", attempt: second.attempt, nodes: null }));
  assert.deepEqual(
    answer !== "stale" && "ends" in answer ? answer.ends.map((e) => [e.id, e.state]) : answer,
    kids.map((k) => [k, "cancelled"]),
  );
});
