/**
 * Seeing durable jobs (docs/api.md, docs/cli.md), against the real database and a
 * real server: getJob lists a job's steps (bounded: the latest 100, results within 1 MiB) and a
 * suspended job's wait; 'suspended' is a state lists, stats and queue depth count; the HTTP API
 * returns the steps and hides their results and errors from read-only callers; the watchdog's
 * gauges count suspended jobs by what they wait for and the step counters count records and
 * replays.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "../packages/cli/src/server/app.js";
import type { JobContext } from "../packages/leasehold/src/worker/context.js";
import { freshLeasehold, NO_BACKOFF, settled } from "./helpers/db.js";
import { api, TOKEN } from "./helpers/server.js";

const VIEWER = "viewer-token-0123456789abcdef";

interface Readable {
  get(): Promise<{ values: { value: number; labels: Record<string, unknown> }[] }>;
}

async function valueOf(metric: Readable, labels: Record<string, string> = {}): Promise<number> {
  const { values } = await metric.get();
  return values.filter((v) => Object.entries(labels).every(([k, x]) => v.labels[k] === x)).reduce((n, v) => n + v.value, 0);
}

/** An order: priced, reserved (the first try fails), then suspended until it is approved. */
function orderHandlers(runs: string[]) {
  let reserveFailed = false;
  return {
    order: async (p: { order: string }, ctx: JobContext) => {
      const priced = await ctx.step("price", () => {
        runs.push("price");
        return { total: 42 };
      });
      await ctx.step("reserve", () => {
        runs.push("reserve");
        if (!reserveFailed) {
          reserveFailed = true;
          throw new Error("stock service down");
        }
        return "reserved";
      });
      const approval = await ctx.waitForEvent("approval", { event: "order.approved", match: { order: p.order }, timeout: "1h" });
      return { priced, approval };
    },
    doomed: async (_: unknown, ctx: JobContext) => {
      await ctx.step("charge", () => {
        throw new Error("card declined");
      });
    },
  };
}

test("getJob, lists, stats, depth and the API show a suspended job's steps and wait; gauges and counters count them", async (t) => {
  const lh = await freshLeasehold(t);
  const runs: string[] = [];
  const worker = lh.worker({ backoff: NO_BACKOFF, watchdog: false, handlers: orderHandlers(runs) });
  await worker.start();
  t.after(() => worker.stop(0));
  const { id } = await lh.enqueue("order", { order: "o1" });
  const suspended = await settled(lh, id, "suspended");

  assert.equal(suspended.stepCount, 3);
  assert.deepEqual(
    suspended.steps.map((s) => [s.seq, s.name, s.occurrence, s.kind, s.state, s.attempt, s.resultBytes, s.error, s.event]),
    [
      [0, "price", 0, "step", "succeeded", 1, Buffer.byteLength('{"total": 42}'), null, null],
      [1, "reserve", 0, "step", "succeeded", 2, Buffer.byteLength('"reserved"'), null, null],
      [2, "approval", 0, "event", "waiting", 2, null, null, "order.approved"],
    ],
  );
  assert.deepEqual(suspended.steps[0]!.result, { total: 42 });
  assert.equal(suspended.steps[1]!.result, "reserved");
  assert.ok(!("result" in suspended.steps[2]!), "a wait not over has no result");
  assert.ok(suspended.steps.every((s) => s.recordedAt instanceof Date));
  assert.equal(typeof suspended.steps[0]!.durationMs, "number");
  const { wait } = suspended;
  assert.ok(wait);
  assert.deepEqual(
    { ...wait, until: undefined },
    { kind: "event", step: "approval", event: "order.approved", match: { order: "o1" }, until: undefined },
  );
  const untilIn = wait.until!.getTime() - Date.now();
  assert.ok(untilIn > 50 * 60_000 && untilIn <= 3600_000 + 5_000, `wakes within the hour's timeout (in ${untilIn} ms)`);
  assert.equal(suspended.steps[2]!.wakeAt?.getTime(), wait.until!.getTime(), "the wait's step holds the same deadline");

  // A failed step keeps its error for readers.
  const doomed = await lh.enqueue("doomed", {}, { maxAttempts: 1 });
  const dead = await settled(lh, doomed.id, "dead");
  assert.deepEqual(
    dead.steps.map((s) => [s.name, s.state, s.error]),
    [["charge", "failed", "Error: card declined"]],
  );
  assert.equal(dead.wait, null);

  // The state is one lists, stats and queue depth know.
  assert.deepEqual(
    (await lh.listJobs({ state: "suspended" })).map((j) => j.id),
    [id],
  );
  assert.equal((await lh.stats()).counts.find((c) => c.state === "suspended")?.count, 1);
  assert.equal((await lh.queueDepth()).find((d) => d.queue === "default")?.suspended, 1);

  // Through the API: the steps and wait, with results and errors hidden from the viewer token.
  const app = createServer({ leasehold: lh, token: TOKEN, viewerToken: VIEWER, dashboard: "off" });
  await app.listen({ host: "127.0.0.1", port: 0 });
  t.after(() => app.close());
  const base = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
  const full = await api(base, "GET", `/v1/jobs/${id}`);
  assert.equal(full.status, 200);
  assert.equal(full.json.stepCount, 3);
  assert.deepEqual(full.json.steps[0].result, { total: 42 });
  assert.equal(full.json.steps[2].wakeAt, wait.until!.toISOString());
  assert.deepEqual(full.json.wait, {
    kind: "event",
    step: "approval",
    until: wait.until!.toISOString(),
    event: "order.approved",
    match: { order: "o1" },
  });
  const seen = await api(base, "GET", `/v1/jobs/${id}`, undefined, { authorization: `Bearer ${VIEWER}` });
  assert.equal(seen.json.steps[0].result, "[hidden]");
  assert.equal(seen.json.steps[0].name, "price");
  const deadSeen = await api(base, "GET", `/v1/jobs/${doomed.id}`, undefined, { authorization: `Bearer ${VIEWER}` });
  assert.equal(deadSeen.json.steps[0].error, "[hidden]");
  const listed = await api(base, "GET", `/v1/jobs?state=suspended`);
  assert.deepEqual(
    listed.json.jobs.map((j: { id: string }) => j.id),
    [id],
  );
  const depth = await api(base, "GET", `/v1/queues/depth`);
  assert.equal(depth.json.queues.find((d: { queue: string }) => d.queue === "default").suspended, 1);

  // The watchdog's gauges: suspended jobs by what they wait for.
  const watchdog = lh.watchdog();
  await watchdog.runOnce();
  t.after(() => watchdog.stop());
  assert.equal(await valueOf(lh.metrics.suspendedJobs, { queue: "default", kind: "event" }), 1);
  assert.equal(await valueOf(lh.metrics.jobs, { queue: "default", state: "suspended" }), 1);

  // The counters: records (price, reserve, the wait's suspension) and, after the wake, replays.
  assert.equal(await valueOf(lh.metrics.stepsRecorded, { kind: "step" }), 2, "price, and reserve once it succeeded");
  assert.equal(await valueOf(lh.metrics.stepsRecorded, { kind: "event" }), 1, "the wait begun");
  assert.equal(await valueOf(lh.metrics.stepsReplayed, { kind: "step" }), 1, "price, replayed by the attempt that reserved");
  await lh.sendEvent("order.approved", { order: "o1", by: "ada" });
  const done = await settled(lh, id, "succeeded");
  assert.deepEqual(done.job.result, { priced: { total: 42 }, approval: { order: "o1", by: "ada" } });
  assert.deepEqual(runs, ["price", "reserve", "reserve"]);
  assert.equal(await valueOf(lh.metrics.stepsReplayed, { kind: "step" }), 3, "price and reserve, replayed by the woken attempt");
  assert.equal(done.wait, null, "a job no longer suspended shows no wait");
  assert.deepEqual(
    done.steps.map((s) => [s.name, s.state]),
    [
      ["price", "succeeded"],
      ["reserve", "succeeded"],
      ["approval", "succeeded"],
    ],
  );
  assert.deepEqual(done.steps[2]!.result, { order: "o1", by: "ada" });
  await watchdog.runOnce();
  assert.equal(await valueOf(lh.metrics.suspendedJobs), 0, "woken: no longer counted");
});

test("a job's steps are listed bounded: the latest 100, and results only within 1 MiB in all", async (t) => {
  const lh = await freshLeasehold(t);
  const big = "x".repeat(250_000);
  const worker = lh.worker({
    handlers: {
      many: async (_: unknown, ctx: JobContext) => {
        for (let i = 0; i < 150; i++) await ctx.step("item", () => i);
      },
      large: async (_: unknown, ctx: JobContext) => {
        for (let i = 0; i < 5; i++) await ctx.step(`part ${i}`, () => big);
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const many = await lh.enqueue("many", {});
  const large = await lh.enqueue("large", {});
  const m = await settled(lh, many.id, "succeeded");
  assert.equal(m.stepCount, 150);
  assert.equal(m.steps.length, 100);
  assert.deepEqual(
    [m.steps[0]!.seq, m.steps[0]!.occurrence, m.steps[0]!.result, m.steps.at(-1)!.seq],
    [50, 50, 50, 149],
    "the latest hundred, in call order",
  );
  const l = await settled(lh, large.id, "succeeded");
  assert.deepEqual(
    l.steps.map((s) => [s.name, s.resultBytes, "result" in s]),
    [
      ["part 0", 250_002, true],
      ["part 1", 250_002, true],
      ["part 2", 250_002, true],
      ["part 3", 250_002, true],
      ["part 4", 250_002, false],
    ],
    "the fifth result would pass 1 MiB: its size is shown, not its value",
  );
});
