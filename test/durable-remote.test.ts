/**
 * Durable steps through `leasehold serve` (docs/durable.md, docs/server.md): a real server with a
 * real token, and the same Worker runtime over RemoteTransport. Steps are recorded and replayed,
 * a sleep suspends and the server's watchdog resumes it, an event sent over HTTP wakes a wait, a
 * stale attempt's record is refused (409) and its handler aborted, ctx.children's children are
 * checked again and started by the server (exactly once per job), and ctx.step.transaction on a
 * remote worker ends its job dead, saying why. A job's steps are loaded in pages of at most
 * the server's answer cap.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { Registry } from "prom-client";
import { StaleLeaseError } from "../packages/leasehold/src/errors.js";
import type { JobContext, TaskHandlers } from "../packages/leasehold/src/worker/context.js";
import { RemoteTransport } from "../packages/leasehold/src/worker/remote-transport.js";
import { Worker } from "../packages/leasehold/src/worker/worker.js";
import { eventually, freshLeasehold, NO_BACKOFF, rawClient, silent, settled } from "./helpers/db.js";
import type { startCli } from "./helpers/cli.js";
import { api as apiAt, startServe } from "./helpers/server.js";

const WORKER_TOKEN = "worker-token-0123456789abcdef";

let lh: Awaited<ReturnType<typeof freshLeasehold>>;
let serve: Awaited<ReturnType<typeof startCli>>;
let base: string;
const api = (method: string, path: string, body?: unknown, headers?: Record<string, string>) => apiAt(base, method, path, body, headers);

before(async () => {
  lh = await freshLeasehold();
  serve = await startServe(lh.schema, [], { LEASEHOLD_WORKER_TOKEN: WORKER_TOKEN });
  base = serve.match[1]!;
});

after(async () => {
  await serve.stop();
  await lh.dispose();
});

function remote(t: { after(fn: () => Promise<void>): void }, handlers: TaskHandlers): Worker {
  const worker = new Worker({
    handlers,
    backoff: NO_BACKOFF,
    leaseMs: 3_000,
    concurrency: 5,
    logger: silent,
    metricsRegistry: new Registry(),
    transport: new RemoteTransport({ serverUrl: base, token: WORKER_TOKEN, waitMs: 500, requestTimeoutMs: 5_000 }),
  });
  t.after(() => worker.stop(0));
  return worker;
}

const inState = (id: string, state: string, timeoutMs?: number) => settled(lh, id, state, timeoutMs);

test("a remote worker's step recorded once never runs again: the retry after a failure replays it", async (t) => {
  const runs: string[] = [];
  let failOnce = true;
  const worker = remote(t, {
    "remote-checkout": async (p: { order: string }, ctx: JobContext) => {
      const charge = await ctx.step("charge", () => {
        runs.push(`charge ${ctx.attempt}`);
        return { chargeId: `ch_${p.order}` };
      });
      const nothing = await ctx.step("log", () => void runs.push(`log ${ctx.attempt}`));
      assert.equal(nothing, undefined);
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
  });
  await worker.start();
  const { id } = await lh.enqueue("remote-checkout", { order: "o1" });
  const { job, attempts } = await inState(id, "succeeded");
  assert.deepEqual(runs, ["charge 1", "log 1", "receipt 1", "receipt 2"], "charge and log ran once; the failed receipt ran again");
  assert.deepEqual(job.result, { charge: { chargeId: "ch_o1" }, receipt: "sent for ch_o1" });
  assert.deepEqual(
    attempts.map((a) => a.outcome),
    ["failed", "succeeded"],
  );
  const db = await rawClient(lh.schema);
  try {
    const steps = await db.query("SELECT seq, name, state, attempt, result FROM job_steps WHERE job_id = $1 ORDER BY seq", [id]);
    assert.deepEqual(steps.rows, [
      { seq: 0, name: "charge", state: "succeeded", attempt: 1, result: { chargeId: "ch_o1" } },
      { seq: 1, name: "log", state: "succeeded", attempt: 1, result: null },
      { seq: 2, name: "receipt", state: "succeeded", attempt: 2, result: "sent for ch_o1" },
    ]);
  } finally {
    await db.end();
  }
});

test("a remote worker's ctx.sleep suspends the job and the server's watchdog resumes it at the next step", async (t) => {
  const runs: string[] = [];
  const worker = remote(t, {
    "remote-nap": async (_: unknown, ctx: JobContext) => {
      await ctx.step("before", () => void runs.push(`before ${ctx.attempt}`));
      await ctx.sleep("nap", 800);
      await ctx.step("after", () => void runs.push(`after ${ctx.attempt}`));
      return "rested";
    },
  });
  await worker.start();
  const { id } = await lh.enqueue("remote-nap", {});
  await inState(id, "suspended");
  const { job, attempts } = await inState(id, "succeeded");
  assert.equal(job.result, "rested");
  assert.deepEqual(runs, ["before 1", "after 2"], "the step before the sleep ran once");
  assert.deepEqual(
    attempts.map((a) => a.outcome),
    ["suspended", "succeeded"],
  );
  assert.equal(job.spentAttempts, 0, "a sleep spends no retry");
});

test("a remote worker's waitForEvent is woken by an event sent over HTTP, and only the operator token may send one", async (t) => {
  const worker = remote(t, {
    "remote-approval": async (p: { order: string }, ctx: JobContext) => {
      const approval = await ctx.waitForEvent("approval", { event: "remote.approved", match: { order: p.order } });
      return { approval };
    },
  });
  await worker.start();
  const { id } = await lh.enqueue("remote-approval", { order: "o7" });
  await inState(id, "suspended");

  const asWorker = await api("POST", "/v1/events", { event: "remote.approved", data: { order: "o7" } }, { authorization: `Bearer ${WORKER_TOKEN}` });
  assert.equal(asWorker.status, 403, "the worker token may not send events");
  const badName = await api("POST", "/v1/events", { event: "bad\u0001name" });
  assert.equal(badName.status, 400);
  assert.match(badName.json.error.message, /event name/);
  const noName = await api("POST", "/v1/events", { data: {} });
  assert.equal(noName.status, 400);
  assert.match(noName.json.error.message, /event/);
  const other = await api("POST", "/v1/events", { event: "remote.approved", data: { order: "o8", by: "bob" } });
  assert.equal(other.status, 201);
  assert.equal((await lh.getJob(id)).job.state, "suspended", "an event that does not match leaves the wait alone");

  const sent = await api("POST", "/v1/events", { event: "remote.approved", data: { order: "o7", by: "ann" } });
  assert.equal(sent.status, 201);
  assert.match(sent.json.id, /^[1-9][0-9]*$/);
  const { job } = await inState(id, "succeeded");
  assert.deepEqual(job.result, { approval: { order: "o7", by: "ann" } });
});

test("a stale attempt's step record, sleep or wait is refused with 409 and changes nothing; bad values are 400 naming the field", async () => {
  const { id } = await lh.enqueue("remote-fenced", {}, { queue: "remote-fenced" });
  const claimOnce = async () => {
    const claim = await api("POST", "/v1/worker/claim", {
      workerId: "w-steps",
      queues: ["remote-fenced"],
      tasks: ["remote-fenced"],
      limit: 1,
      leaseMs: 60_000,
    });
    assert.equal(claim.status, 200);
    return { id, attempt: claim.json.jobs[0].attempt as number, receipt: claim.json.jobs[0].receipt as string };
  };
  const first = await claimOnce();
  const step = (job: typeof first, extra: Record<string, unknown> = {}) => ({
    ...job,
    seq: 0,
    name: "charge",
    occurrence: 0,
    kind: "step",
    state: "succeeded",
    result: { by: job.attempt },
    durationMs: 5,
    ...extra,
  });
  const place = (job: typeof first) => ({ workerId: "w-steps", job, seq: 1, name: "later", occurrence: 0 });

  // Bad values are refused before anything is written, naming the field.
  const big = await api("POST", "/v1/worker/steps/record", { workerId: "w-steps", steps: [step(first, { result: "x".repeat(300 * 1024) })] });
  assert.equal(big.status, 400);
  assert.match(big.json.error.message, /steps\[0\].*result/);
  const noError = await api("POST", "/v1/worker/steps/record", { workerId: "w-steps", steps: [step(first, { state: "failed", result: undefined })] });
  assert.equal(noError.status, 400);
  assert.match(noError.json.error.message, /steps\[0\]: error is required/);
  const badName = await api("POST", "/v1/worker/steps/record", { workerId: "w-steps", steps: [step(first, { name: "a\u0000b" })] });
  assert.equal(badName.status, 400);
  assert.match(badName.json.error.message, /steps\[0\].*step name/);
  const both = await api("POST", "/v1/worker/sleep", { ...place(first), ms: 1000, until: new Date().toISOString() });
  assert.equal(both.status, 400);
  assert.match(both.json.error.message, /until .* ms/);
  const badMatch = await api("POST", "/v1/worker/wait-for-event", { ...place(first), event: "x", timeoutMs: -1 });
  assert.equal(badMatch.status, 400);
  assert.match(badMatch.json.error.message, /timeoutMs/);
  // A missing receipt is refused on its own.
  const noReceipt = await api("POST", "/v1/worker/steps/load", { workerId: "w-steps", job: { id, attempt: first.attempt } });
  assert.equal(noReceipt.status, 409);
  assert.equal(noReceipt.json.error.code, "invalid_receipt");

  // The first attempt is given back and the job claimed again: the first is stale, its receipt still valid.
  assert.equal((await api("POST", "/v1/worker/release", { workerId: "w-steps", jobs: [first], reason: "test" })).status, 200);
  const second = await claimOnce();
  assert.equal(second.attempt, first.attempt + 1);

  const stale = await api("POST", "/v1/worker/steps/record", { workerId: "w-steps", steps: [step(first)] });
  assert.equal(stale.status, 409);
  assert.equal(stale.json.error.code, "stale_lease");
  assert.deepEqual(stale.json.error.jobs, [{ id, attempt: first.attempt, reason: "reclaimed" }]);
  const staleSleep = await api("POST", "/v1/worker/sleep", { ...place(first), ms: 60_000 });
  assert.equal(staleSleep.status, 409);
  assert.equal(staleSleep.json.error.code, "stale_lease");
  const staleWait = await api("POST", "/v1/worker/wait-for-event", { ...place(first), event: "never" });
  assert.equal(staleWait.status, 409);
  assert.equal((await lh.getJob(id)).job.state, "running", "the stale suspensions changed nothing");
  assert.deepEqual((await api("POST", "/v1/worker/steps/load", { workerId: "w-steps", job: second })).json.steps, []);

  // The holder records; a second record of its place gives way (it stays the first's).
  const good = await api("POST", "/v1/worker/steps/record", { workerId: "w-steps", steps: [step(second)] });
  assert.equal(good.status, 200);
  assert.deepEqual(good.json.recorded, [{ id, seq: 0 }]);
  const again = await api("POST", "/v1/worker/steps/record", { workerId: "w-steps", steps: [step(second, { result: "other" })] });
  assert.equal(again.status, 200);
  assert.deepEqual(again.json.refused, [{ id, attempt: second.attempt, seq: 0, held: true }]);
  const loaded = (await api("POST", "/v1/worker/steps/load", { workerId: "w-steps", job: second })).json.steps;
  assert.equal(loaded.length, 1);
  assert.deepEqual(loaded[0].result, { by: second.attempt });
  const fate = await api("POST", "/v1/worker/steps/fate", { workerId: "w-steps", job: first, seq: 0 });
  assert.equal(fate.json.held, false);
});

test("a remote handler whose attempt lost its job is refused at its next step and aborted", async (t) => {
  let stolen!: () => void;
  const gate = new Promise<void>((resolve) => (stolen = resolve));
  let seen: unknown;
  let aborted = false;
  const worker = remote(t, {
    "remote-zombie": async (_: unknown, ctx: JobContext) => {
      await ctx.step("first", () => "one");
      await gate;
      try {
        await ctx.step("second", () => "two");
      } catch (err) {
        seen = err;
        aborted = ctx.signal.aborted;
        throw err;
      }
    },
  });
  await worker.start();
  const { id } = await lh.enqueue("remote-zombie", {});
  const db = await rawClient(lh.schema);
  try {
    await eventually(async () => (await db.query("SELECT 1 FROM job_steps WHERE job_id = $1", [id])).rowCount, "the first step recorded");
    // Another claim overtakes the attempt (as if its lease had run out and the job was claimed again).
    await db.query("UPDATE jobs SET attempt = attempt + 1, locked_by = 'someone-else' WHERE id = $1", [id]);
    stolen();
    await eventually(async () => seen, "the handler's step refused");
    assert.ok(seen instanceof StaleLeaseError, `got ${String(seen)}`);
    assert.ok(aborted, "the handler's signal is aborted");
    const steps = await db.query("SELECT name FROM job_steps WHERE job_id = $1 ORDER BY seq", [id]);
    assert.deepEqual(
      steps.rows.map((r) => r.name),
      ["first"],
    );
  } finally {
    await db.end();
  }
});

test("ctx.step.transaction on a remote worker ends the job dead, saying it needs a worker on the database", async (t) => {
  const worker = remote(t, {
    "remote-tx": async (_: unknown, ctx: JobContext) => ctx.step.transaction("write", async () => "never"),
  });
  await worker.start();
  const { id } = await lh.enqueue("remote-tx", {}, { maxAttempts: 5 });
  const { job, attempts } = await inState(id, "dead");
  assert.equal(attempts.length, 1, "no retries");
  assert.match(job.lastError ?? "", /ctx\.step\.transaction needs a worker on the database/);
});

/** Claims the one job of a queue over HTTP, as a remote worker does: its attempt and receipt. */
async function claimOver(queue: string, task: string, workerId: string) {
  const claim = await api("POST", "/v1/worker/claim", { workerId, queues: [queue], tasks: [task], limit: 1, leaseMs: 60_000 });
  assert.equal(claim.status, 200);
  const [job] = claim.json.jobs;
  return { id: job.id as string, attempt: job.attempt as number, receipt: job.receipt as string };
}

async function jobsOfTask(task: string): Promise<number> {
  const { rows } = await lh.pool.query<{ n: string }>(
    "SELECT (SELECT count(*) FROM jobs WHERE task = $1) + (SELECT count(*) FROM finished_jobs WHERE task = $1) AS n",
    [task],
  );
  return Number(rows[0]!.n);
}

test("a remote worker's ctx.children starts children the remote worker runs, suspends, resumes with their ends; a replay starts none again", async (t) => {
  const runs: string[] = [];
  let failOnce = true;
  const worker = remote(t, {
    "remote-fan-out": async (p: { n: number }, ctx: JobContext) => {
      const ends = await ctx.children("squares", [
        { task: "remote-square", payload: { i: p.n } },
        { task: "remote-square", payload: { i: p.n + 1 }, runAt: new Date(Date.now() - 1_000) },
        { task: "remote-square", payload: { i: -1 }, maxAttempts: 1 },
      ]);
      runs.push(`resumed ${ctx.attempt}`);
      await ctx.step("after", () => {
        if (failOnce) {
          failOnce = false;
          throw new Error("after failed once");
        }
      });
      return ends.map((e) => ({ ref: e.ref, task: e.task, state: e.state, result: e.result, error: e.error }));
    },
    "remote-square": async (p: { i: number }) => {
      if (p.i < 0) throw new Error("no square of a negative");
      runs.push(`square ${p.i}`);
      return p.i * p.i;
    },
  });
  await worker.start();
  const { id } = await lh.enqueue("remote-fan-out", { n: 2 });
  const { job, attempts } = await inState(id, "succeeded");
  const ends = job.result as { error: string | null }[];
  assert.match(ends[2]?.error ?? "", /^Error: no square of a negative/);
  assert.deepEqual(
    ends.map((e) => ({ ...e, error: e.error === null ? null : "(an error)" })),
    [
      { ref: null, task: "remote-square", state: "succeeded", result: 4, error: null },
      { ref: null, task: "remote-square", state: "succeeded", result: 9, error: null },
      { ref: null, task: "remote-square", state: "dead", result: null, error: "(an error)" },
    ],
  );
  assert.deepEqual(
    attempts.map((a) => a.outcome),
    ["suspended", "failed", "succeeded"],
    "suspended for its children, resumed, failed after them, and replayed their ends",
  );
  assert.deepEqual(runs.filter((r) => r.startsWith("square")).sort(), ["square 2", "square 3"], "each child ran once");
  assert.deepEqual(
    runs.filter((r) => r.startsWith("resumed")),
    ["resumed 2", "resumed 3"],
  );
  assert.equal(await jobsOfTask("remote-square"), 3, "the replays started no children again");
  const { rows } = await lh.pool.query("SELECT kind, state, attempt FROM job_steps WHERE job_id = $1 AND name = 'squares'", [id]);
  assert.deepEqual(rows, [{ kind: "children", state: "succeeded", attempt: 2 }]);
});

test("a remote worker's child flow keeps its refs and order", async (t) => {
  const worker = remote(t, {
    "remote-flow-parent": async (_: unknown, ctx: JobContext) =>
      (
        await ctx.children("pipeline", {
          flow: [
            { ref: "fetch", task: "remote-step", payload: { v: "a" } },
            { ref: "parse", task: "remote-step", payload: { v: "b" }, dependsOn: ["fetch"] },
          ],
        })
      ).map((e) => [e.ref, e.result]),
    "remote-step": async (p: { v: string }) => p.v.toUpperCase(),
  });
  await worker.start();
  const { id } = await lh.enqueue("remote-flow-parent", {});
  const { job } = await inState(id, "succeeded");
  assert.deepEqual(job.result, [
    ["fetch", "A"],
    ["parse", "B"],
  ]);
});

test("bad children are refused with 400 naming the field and start nothing; a stale attempt's children are refused with 409", async () => {
  const { id } = await lh.enqueue("remote-kids-fenced", {}, { queue: "remote-kids-fenced" });
  const first = await claimOver("remote-kids-fenced", "remote-kids-fenced", "w-kids");
  const call = (job: typeof first, children?: unknown) =>
    api("POST", "/v1/worker/children", { workerId: "w-kids", job, seq: 0, name: "kids", occurrence: 0, ...(children !== undefined && { children }) });

  const cases: [unknown, RegExp][] = [
    ["three kids", /^children: children are an array of jobs, or \{ flow/],
    [[{ payload: {} }], /^children: .*job 0.*task/],
    [[{ task: "ok" }, { task: "" }], /^children: .*job 1.*task/],
    [[{ task: "ok", priority: "high" }], /^children: .*job 0.*priority/],
    [[{ task: "ok", runAt: "someday" }], /^children: job 0: runAt must be an ISO 8601 date-time/],
    [[{ task: "ok", uniqueKey: "k" }], /^children: .*job 0.*uniqueKey/],
    [[{ task: "ok", ref: "a" }], /^children: job 0: "ref" belongs to a child flow/],
    [{ flow: [{ ref: "a", task: "ok", dependsOn: ["missing"] }] }, /^children: .*missing/],
    [{ flow: [], extra: 1 }, /^children: unknown field "extra"/],
    [Array.from({ length: 1_001 }, () => ({ task: "ok" })), /^children: 1001 children, over the limit of 1000/],
  ];
  for (const [children, message] of cases) {
    const res = await call(first, children);
    assert.equal(res.status, 400, `${JSON.stringify(children).slice(0, 80)}: ${JSON.stringify(res.json)}`);
    assert.match(res.json.error.message, message);
  }
  const badName = await api("POST", "/v1/worker/children", { workerId: "w-kids", job: first, seq: 0, name: "a\u0000b", occurrence: 0, children: [] });
  assert.equal(badName.status, 400);
  assert.match(badName.json.error.message, /step name/);
  const noChildren = await call(first);
  assert.equal(noChildren.status, 400, "the first call must name its children");
  assert.match(noChildren.json.error.message, /^children: required here/);
  assert.equal(await jobsOfTask("ok"), 0, "nothing was started");
  assert.deepEqual((await lh.getJob(id)).job.state, "running");
  const noReceipt = await call({ ...first, receipt: undefined } as unknown as typeof first, [{ task: "ok" }]);
  assert.equal(noReceipt.status, 409);
  assert.equal(noReceipt.json.error.code, "invalid_receipt");

  // The first attempt is given back and the job claimed again: the first is stale, its receipt still valid.
  assert.equal((await api("POST", "/v1/worker/release", { workerId: "w-kids", jobs: [first], reason: "test" })).status, 200);
  const second = await claimOver("remote-kids-fenced", "remote-kids-fenced", "w-kids");
  const stale = await call(first, [{ task: "ok" }]);
  assert.equal(stale.status, 409);
  assert.equal(stale.json.error.code, "stale_lease");
  assert.deepEqual(stale.json.error.jobs, [{ id, attempt: first.attempt, reason: "reclaimed" }]);
  assert.equal(await jobsOfTask("ok"), 0, "the stale attempt started nothing");
  assert.equal((await lh.getJob(id)).job.state, "running");

  // The holder starts them once: its job suspends; the same call again (an answer lost in transit) starts no more.
  const started = await call(second, [{ task: "ok", queue: "remote-kids-none" }]);
  assert.equal(started.status, 200);
  assert.deepEqual(started.json, { state: "suspended" });
  assert.equal(await jobsOfTask("ok"), 1);
  assert.equal((await lh.getJob(id)).job.state, "suspended");
  const again = await call(second, [{ task: "ok", queue: "remote-kids-none" }]);
  assert.equal(again.status, 409, "the suspended attempt no longer holds its job");
  assert.equal(await jobsOfTask("ok"), 1);
});

test("a remote handler whose attempt lost its job is refused at ctx.children, aborted, and starts no child", async (t) => {
  let stolen!: () => void;
  const gate = new Promise<void>((resolve) => (stolen = resolve));
  let seen: unknown;
  let aborted = false;
  const worker = remote(t, {
    "remote-zombie-parent": async (_: unknown, ctx: JobContext) => {
      await ctx.step("first", () => "one");
      await gate;
      try {
        await ctx.children("kids", [{ task: "remote-zombie-kid" }]);
      } catch (err) {
        seen = err;
        aborted = ctx.signal.aborted;
        throw err;
      }
    },
  });
  await worker.start();
  const { id } = await lh.enqueue("remote-zombie-parent", {});
  await eventually(async () => (await lh.pool.query("SELECT 1 FROM job_steps WHERE job_id = $1", [id])).rowCount, "the first step recorded");
  await lh.pool.query("UPDATE jobs SET attempt = attempt + 1, locked_by = 'someone-else' WHERE id = $1", [id]);
  stolen();
  await eventually(async () => seen, "the handler's children refused");
  assert.ok(seen instanceof StaleLeaseError, `got ${String(seen)}`);
  assert.ok(aborted, "the handler's signal is aborted");
  assert.equal(await jobsOfTask("remote-zombie-kid"), 0);
});

const STEPS_ANSWER_CAP = 8 * 1024 * 1024;
/** 40 results of ~250 KiB: ~10 MiB of steps, more than one answer may carry. */
const BIG_STEPS = 40;
const bigResult = (i: number) => `${i}:`.padEnd(250 * 1024, String.fromCharCode(97 + (i % 26)));

test("a job's steps past one answer's cap are loaded in pages: the server never answers more than the cap, and an old client gets 413", async () => {
  await lh.enqueue("remote-big-steps", {}, { queue: "remote-big-steps" });
  const job = await claimOver("remote-big-steps", "remote-big-steps", "w-big");
  for (let i = 0; i < BIG_STEPS; i += 4) {
    const steps = [i, i + 1, i + 2, i + 3].map((seq) => ({
      ...job,
      seq,
      name: `s${seq}`,
      occurrence: 0,
      kind: "step",
      state: "succeeded",
      result: bigResult(seq),
      durationMs: 1,
    }));
    const res = await api("POST", "/v1/worker/steps/record", { workerId: "w-big", steps });
    assert.equal(res.status, 200, JSON.stringify(res.json));
  }
  const asOldClient = await api("POST", "/v1/worker/steps/load", { workerId: "w-big", job });
  assert.equal(asOldClient.status, 413, "a client that reads no pages is refused, not answered part of the steps");
  assert.equal(asOldClient.json.error.code, "answer_too_large");

  const loaded: { seq: number; result: string }[] = [];
  let after: number | null = null;
  let pages = 0;
  do {
    const res = await fetch(new URL("/v1/worker/steps/load", base), {
      method: "POST",
      headers: { authorization: `Bearer ${WORKER_TOKEN}`, "content-type": "application/json" },
      body: JSON.stringify({ workerId: "w-big", job, after }),
    });
    const body = Buffer.from(await res.arrayBuffer());
    assert.equal(res.status, 200);
    assert.ok(body.length <= STEPS_ANSWER_CAP, `page ${pages}: ${body.length} bytes, over the cap`);
    const page = JSON.parse(body.toString()) as { steps: { seq: number; result: string }[]; next: number | null };
    assert.ok(page.steps.length > 0);
    loaded.push(...page.steps);
    after = page.next;
    pages++;
  } while (after !== null);
  assert.ok(pages >= 2, `${pages} page(s)`);
  assert.deepEqual(
    loaded.map((s) => s.seq),
    Array.from({ length: BIG_STEPS }, (_, i) => i),
  );
  assert.ok(loaded.every((s) => s.result === bigResult(s.seq)));
  // Past the last step: an empty page, and no next.
  const past = await api("POST", "/v1/worker/steps/load", { workerId: "w-big", job, after: BIG_STEPS - 1 });
  assert.deepEqual(past.json, { steps: [], next: null });
});

test("a remote worker replays a job whose steps need several pages: every step's result comes back, none runs again", async (t) => {
  const answers: number[] = [];
  const realFetch = globalThis.fetch;
  globalThis.fetch = async (input, init) => {
    const res = await realFetch(input, init);
    if (String(input).endsWith("/v1/worker/steps/load")) answers.push((await res.clone().arrayBuffer()).byteLength);
    return res;
  };
  t.after(() => void (globalThis.fetch = realFetch));
  const runs: number[] = [];
  const worker = remote(t, {
    "remote-many-steps": async (_: unknown, ctx: JobContext) => {
      const results: string[] = [];
      for (let i = 0; i < BIG_STEPS; i++) {
        results.push(
          await ctx.step(`s${i}`, () => {
            runs.push(i);
            return bigResult(i);
          }),
        );
      }
      if (ctx.attempt === 1) throw new Error("fail once, after every step");
      return results.every((r, i) => r === bigResult(i)) ? `all ${results.length} replayed` : "a result came back wrong";
    },
  });
  await worker.start();
  const { id } = await lh.enqueue("remote-many-steps", {});
  const { job } = await inState(id, "succeeded", 60_000);
  assert.equal(job.result, `all ${BIG_STEPS} replayed`);
  assert.deepEqual(
    runs,
    Array.from({ length: BIG_STEPS }, (_, i) => i),
    "each step ran once",
  );
  assert.ok(answers.length >= 2, `the second attempt's load took pages: ${answers.join(", ")}`);
  assert.ok(
    answers.every((bytes) => bytes <= STEPS_ANSWER_CAP),
    `answers of ${answers.join(", ")} bytes`,
  );
});
