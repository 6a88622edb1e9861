/**
 * Flow control over HTTP (`leasehold serve`'s routes, in this process, on the test database):
 * the operators' queue routes (list, pause, resume, limits), the workers' (their view of the
 * settings, rate-limited reports fenced like a release), the claim's flow fields, keyed
 * enqueue, the paused-queues gauge, and a waiting long poll woken by a settings change.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import type { FastifyInstance } from "fastify";
import { Registry } from "prom-client";
import { createServer } from "../packages/cli/src/server/app.js";
import { ClaimWaiter } from "../packages/cli/src/server/claim-waiter.js";
import { serverMetrics } from "../packages/cli/src/server/http-metrics.js";
import * as store from "../packages/leasehold/src/store/index.js";
import { RateLimitedError } from "../packages/leasehold/src/worker/context.js";
import { RemoteTransport } from "../packages/leasehold/src/worker/remote-transport.js";
import { Worker } from "../packages/leasehold/src/worker/worker.js";
import { eventually, freshLeasehold, rawClient, silent } from "./helpers/db.js";
import { api as apiAt, TOKEN } from "./helpers/server.js";

const WORKER_TOKEN = "worker-token-0123456789abcdef";
const asWorker = { authorization: `Bearer ${WORKER_TOKEN}` };

let lh: Awaited<ReturnType<typeof freshLeasehold>>;
let app: FastifyInstance;
let base: string;
const api = (method: string, path: string, body?: unknown, headers?: Record<string, string>) => apiAt(base, method, path, body, headers);

before(async () => {
  lh = await freshLeasehold();
  app = createServer({ leasehold: lh, token: TOKEN, workerToken: WORKER_TOKEN });
  await app.listen({ host: "127.0.0.1", port: 0 });
  base = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
});

after(async () => {
  await app.close();
  await lh.dispose();
});

async function queueRow(name: string) {
  const { rows } = await lh.pool.query(
    "SELECT paused, concurrency, key_concurrency, rate_limit, rate_window_ms, key_rate_limit, key_rate_window_ms, key_weights FROM queues WHERE name = $1",
    [name],
  );
  return rows[0];
}

test("operators pause, resume and limit a queue: the database holds it; an unknown queue is 404 unless create=true; bad values are 400 naming them", async () => {
  await lh.enqueue("send", {}, { queue: "mail" });

  const unknown = await api("POST", "/v1/queues/mial/pause");
  assert.equal(unknown.status, 404);
  assert.equal(unknown.json.error.code, "unknown_queue");
  assert.match(unknown.json.error.message, /queue "mial" is unknown.*did you mean "mail"/);
  assert.equal(await queueRow("mial"), undefined, "nothing stored for an unknown queue");

  const paused = await api("POST", "/v1/queues/mail/pause");
  assert.equal(paused.status, 200, paused.text);
  assert.equal(paused.json.queue.name, "mail");
  assert.equal(paused.json.queue.paused, true);
  assert.ok(!Number.isNaN(Date.parse(paused.json.queue.pausedAt)));
  assert.equal((await queueRow("mail")).paused, true);

  const listed = await api("GET", "/v1/queues");
  assert.equal(listed.status, 200);
  const mail = listed.json.queues.find((q: { name: string }) => q.name === "mail");
  assert.deepEqual([mail.paused, mail.waiting, mail.running, mail.concurrency, mail.rate], [true, 1, 0, null, null]);

  const resumed = await api("POST", "/v1/queues/mail/resume");
  assert.equal(resumed.json.queue.paused, false);
  assert.equal((await queueRow("mail")).paused, false);

  const limited = await api("PATCH", "/v1/queues/mail/limits", {
    concurrency: 3,
    keyConcurrency: 1,
    rate: { limit: 50, windowMs: 1_000 },
    keyRate: { limit: 5, windowMs: 60_000 },
    keyWeights: { acme: 3 },
  });
  assert.equal(limited.status, 200, limited.text);
  assert.deepEqual(limited.json.queue.rate, { limit: 50, windowMs: 1_000 });
  assert.equal(limited.json.queue.flow, true);
  assert.deepEqual(await queueRow("mail"), {
    paused: false,
    concurrency: 3,
    key_concurrency: 1,
    rate_limit: 50,
    rate_window_ms: 1_000,
    key_rate_limit: 5,
    key_rate_window_ms: 60_000,
    key_weights: { acme: 3 },
  });
  // Only what is given changes; null removes a limit.
  const cleared = await api("PATCH", "/v1/queues/mail/limits", { rate: null, keyWeights: null });
  assert.equal(cleared.status, 200, cleared.text);
  assert.deepEqual(Object.values(await queueRow("mail")), [false, 3, 1, null, null, 5, 60_000, null]);

  // Bad values: 400 naming the value; nothing changes.
  const before = await queueRow("mail");
  for (const [body, message] of [
    [{ concurrency: 0 }, /concurrency must be an integer from 1 to 100000 \(got 0\)/],
    [{ rate: { limit: 10, windowMs: 5 } }, /rate\.windowMs must be an integer from 10 to 86400000 \(got 5\)/],
    [{ keyWeights: { acme: 1000 } }, /keyWeights\["acme"\] must be an integer from 1 to 100 \(got 1000\)/],
    [{ concurrency: "many" }, /concurrency/],
    [{ burst: 3 }, /burst/],
  ] as const) {
    const bad = await api("PATCH", "/v1/queues/mail/limits", body);
    assert.equal(bad.status, 400, `${JSON.stringify(body)}: ${bad.text}`);
    assert.equal(bad.json.error.code, "invalid_input");
    assert.match(bad.json.error.message, message);
  }
  assert.deepEqual(await queueRow("mail"), before);

  // A queue before its first job: create=true (query, or in the limits' body); names may hold a slash.
  assert.equal((await api("PATCH", "/v1/queues/tenant%2Fnew/limits", { concurrency: 2 })).status, 404);
  const created = await api("PATCH", "/v1/queues/tenant%2Fnew/limits", { concurrency: 2, create: true });
  assert.equal(created.status, 200, created.text);
  assert.equal((await queueRow("tenant/new")).concurrency, 2);
  assert.equal((await api("POST", "/v1/queues/later/pause?create=true")).status, 200);
  assert.equal((await queueRow("later")).paused, true);
  assert.equal((await api("POST", "/v1/queues/bad%20name/pause?create=true")).status, 400);

  // The worker token may not use the operators' routes.
  for (const [method, path] of [
    ["GET", "/v1/queues"],
    ["POST", "/v1/queues/mail/pause"],
    ["POST", "/v1/queues/mail/resume"],
    ["PATCH", "/v1/queues/mail/limits"],
  ] as const) {
    const refused = await api(method, path, method === "PATCH" ? { concurrency: 1 } : undefined, asWorker);
    assert.equal(refused.status, 403, `${method} ${path}`);
  }
  assert.equal((await queueRow("mail")).concurrency, 3);

  // The OpenAPI document describes them.
  const doc = (await api("GET", "/openapi.json")).json;
  assert.ok(doc.paths["/v1/queues/{name}/limits"].patch);
  assert.ok(doc.paths["/v1/worker/rate-limited"].post);
  assert.ok(doc.paths["/v1/worker/queues"].get);
});

test("workers read the settings, claim flow queues under their limits (paused, retryInMs) and get each job's key", async () => {
  await lh.setQueueLimits("keyed", { concurrency: 1 }, { create: true });
  await lh.pauseQueue("held", { create: true });
  const enq = await api("POST", "/v1/jobs", { task: "sync", queue: "keyed", key: "tenant-a" });
  assert.equal(enq.status, 201, enq.text);
  const batch = await api("POST", "/v1/jobs/batch", { jobs: [{ task: "sync", queue: "keyed", key: "tenant-b" }] });
  assert.equal(batch.status, 201, batch.text);
  const { rows } = await lh.pool.query("SELECT id::text, flow_key FROM jobs WHERE queue = 'keyed' ORDER BY id");
  assert.deepEqual(
    rows.map((r) => r.flow_key),
    ["tenant-a", "tenant-b"],
  );
  assert.equal((await api("POST", "/v1/jobs", { task: "sync", key: "" })).status, 400);
  assert.equal((await api("GET", `/v1/jobs/${enq.json.id}`)).json.job.key, "tenant-a");
  await lh.enqueue("sync", {}, { queue: "held" });

  const settings = await api("GET", "/v1/worker/queues", undefined, asWorker);
  assert.equal(settings.status, 200, settings.text);
  const byName = new Map((settings.json.queues as { name: string }[]).map((q) => [q.name, q as Record<string, unknown>]));
  assert.deepEqual([byName.get("keyed")!.concurrency, byName.get("keyed")!.flow, byName.get("held")!.paused], [1, true, true]);

  const claim = (body: Record<string, unknown>) =>
    api("POST", "/v1/worker/claim", { workerId: "w-flow", tasks: ["sync"], limit: 5, leaseMs: 60_000, ...body }, asWorker);
  const bad = await claim({ queues: ["keyed"], flowQueues: ["not a name"] });
  assert.equal(bad.status, 400, bad.text);
  assert.match(bad.json.error.message, /flowQueues/);

  // Claimed the plain way, a flow queue gives nothing (and says nothing about limits).
  const plain = await claim({ queues: ["keyed", "held"] });
  assert.deepEqual([plain.status, plain.json.jobs, "retryInMs" in plain.json, "paused" in plain.json], [200, [], false, false]);

  const first = await claim({ queues: ["keyed", "held"], flowQueues: ["keyed", "held"] });
  assert.equal(first.status, 200, first.text);
  assert.equal(first.json.jobs.length, 1, "concurrency 1");
  assert.equal(first.json.jobs[0].key, "tenant-a");
  assert.deepEqual(first.json.paused, ["held"]);
  assert.equal(typeof first.json.retryInMs, "number");
  const second = await claim({ queues: ["keyed"], flowQueues: ["keyed"] });
  assert.deepEqual([second.json.jobs, second.json.waited, second.json.retryInMs > 0, "paused" in second.json], [[], false, true, false]);

  // A long poll held back by the limit gets the next job once the slot frees.
  const waiting = claim({ queues: ["keyed"], flowQueues: ["keyed"], waitMs: 20_000 });
  const done = await api(
    "POST",
    "/v1/worker/succeed",
    { workerId: "w-flow", jobs: [first.json.jobs[0]].map(({ id, attempt, receipt }) => ({ id, attempt, receipt })) },
    asWorker,
  );
  assert.equal(done.status, 200, done.text);
  const next = await waiting;
  assert.deepEqual(
    next.json.jobs.map((j: { key: string }) => j.key),
    ["tenant-b"],
  );
});

test("rate-limited reports: the job waits without spending its budget and holds its key; a stale or receiptless one changes nothing", async () => {
  await lh.setQueueLimits("api-calls", { keyConcurrency: 2 }, { create: true });
  const { id } = await lh.enqueue("call", {}, { queue: "api-calls", key: "acme" });
  const claim = async () => {
    const r = await api(
      "POST",
      "/v1/worker/claim",
      { workerId: "w-rl", queues: ["api-calls"], flowQueues: ["api-calls"], tasks: ["call"], limit: 1, leaseMs: 60_000 },
      asWorker,
    );
    assert.equal(r.json.jobs.length, 1, r.text);
    const j = r.json.jobs[0];
    return { id: j.id as string, attempt: j.attempt as number, receipt: j.receipt as string };
  };
  const report = (jobs: unknown[], extra: Record<string, unknown> = {}) =>
    api("POST", "/v1/worker/rate-limited", { workerId: "w-rl", jobs, ...extra }, asWorker);

  // The first attempt is given back and the job claimed again: the first is stale, its receipt still valid.
  const first = await claim();
  assert.equal((await api("POST", "/v1/worker/release", { workerId: "w-rl", jobs: [first], reason: "test" }, asWorker)).status, 200);
  const second = await claim();
  assert.equal(second.attempt, first.attempt + 1);
  const db = await rawClient(lh.schema);
  const row = async () =>
    (await db.query("SELECT state, attempt, spent_attempts, run_at, locked_by, last_error FROM jobs WHERE id = $1", [id])).rows[0];
  try {
    const running = await row();
    const stale = await report([{ ...first, delayMs: 60_000, scope: "key" }]);
    assert.equal(stale.status, 409, stale.text);
    assert.equal(stale.json.error.code, "stale_lease");
    assert.deepEqual(stale.json.error.jobs, [{ id, attempt: first.attempt, reason: "reclaimed" }]);
    const forged = await report([{ ...second, receipt: "A".repeat(43), delayMs: 60_000, scope: "key" }]);
    assert.deepEqual(
      [forged.status, forged.json.applied, forged.json.refused],
      [200, [], [{ id, attempt: second.attempt, reason: "invalid_receipt" }]],
    );
    for (const bad of [
      { ...second, delayMs: 0, scope: "key" },
      { ...second, delayMs: 86_400_001, scope: "key" },
      { ...second, delayMs: 1_000, scope: "tenant" },
      { ...second, scope: "key" },
    ]) {
      const refused = await report([bad]);
      assert.equal(refused.status, 400, `${JSON.stringify(bad)}: ${refused.text}`);
    }
    assert.deepEqual(await row(), running, "nothing changed");
    const held = await db.query("SELECT held_until FROM flow_key_state WHERE queue = 'api-calls' AND flow_key = 'acme'");
    assert.ok(
      held.rows.every((r) => r.held_until === null),
      "no hold from a refused report",
    );

    const applied = await report([{ ...second, delayMs: 60_000, scope: "key" }], { message: "HTTP 429 from the API" });
    assert.equal(applied.status, 200, applied.text);
    assert.deepEqual(applied.json.applied, [{ id, state: "waiting" }]);
    const after = await row();
    assert.equal(after.state, "waiting");
    assert.equal(after.spent_attempts, running.spent_attempts, "no retry budget spent");
    assert.equal(after.locked_by, null);
    assert.ok(after.run_at.getTime() > Date.now() + 30_000, "waits its delay");
    assert.match(after.last_error, /rate-limited: retry in 60000 ms: HTTP 429 from the API/);
    const audit = await db.query("SELECT outcome FROM all_attempts WHERE job_id = $1 AND attempt = $2", [id, second.attempt]);
    assert.deepEqual(audit.rows, [{ outcome: "rate_limited" }]);
    const hold = await db.query("SELECT held_until FROM flow_key_state WHERE queue = 'api-calls' AND flow_key = 'acme'");
    assert.ok(hold.rows[0].held_until.getTime() > Date.now() + 30_000, "the key is held");
    // The same report again is stale: its attempt ended.
    assert.equal((await report([{ ...second, delayMs: 60_000, scope: "key" }])).status, 409);
  } finally {
    await db.end();
  }
});

test("leasehold_queues_paused counts the paused queues as the watchdog last sampled", async () => {
  const gauge = async () => (await lh.metrics.registry.getSingleMetric("leasehold_queues_paused")!.get()).values[0]?.value;
  const { rows } = await lh.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM queues WHERE paused");
  await lh.pauseQueue("gauge-a", { create: true });
  await lh.pauseQueue("gauge-b", { create: true });
  await lh.watchdog().runOnce();
  assert.equal(await gauge(), rows[0]!.n + 2);
  await lh.resumeQueue("gauge-a");
  await lh.watchdog().runOnce();
  assert.equal(await gauge(), rows[0]!.n + 1);
  assert.match(await lh.metrics.registry.metrics(), /^leasehold_queues_paused \d+$/m);
});

test("a long poll that began with the queue plain finds its job after the queue came under flow control meanwhile", async () => {
  const claim = (body: Record<string, unknown>) =>
    api("POST", "/v1/worker/claim", { workerId: "w-late", tasks: ["late"], limit: 5, leaseMs: 60_000, ...body }, asWorker);
  // The worker still thinks "turned" plain (it names no flowQueues): its long poll waits.
  const waiting = claim({ queues: ["turned"], waitMs: 10_000 });
  await new Promise((r) => setTimeout(r, 300));
  const startedAt = Date.now();
  await lh.setQueueLimits("turned", { concurrency: 2 }, { create: true });
  const { id } = await lh.enqueue("late", {}, { queue: "turned" });
  const answer = await waiting;
  assert.deepEqual(
    answer.json.jobs.map((j: { id: string }) => j.id),
    [id],
    "the claim asked again as the database sees the queue now",
  );
  assert.ok(Date.now() - startedAt < 5_000, "found on a wake-up, not at the end of the long poll");
});

test("a waiting long poll is woken when flow-control settings change (a resume), not only by its queue's jobs", async () => {
  const waiter = new ClaimWaiter({
    pool: lh.pool,
    connectionString: lh.databaseUrl,
    channel: store.notifyChannel(lh.schema),
    maxLongPolls: 10,
    metrics: serverMetrics(new Registry()),
    logger: silent,
  });
  try {
    // Nothing is due in this queue, so the once-a-second re-check never wakes it: only a notification can.
    const want = { queues: ["quiet"], tasks: ["t"] };
    assert.equal(await waiter.wait(want, 0, new AbortController().signal), "timeout"); // its LISTEN is in place
    const waiting = waiter.wait(want, 15_000, new AbortController().signal);
    await lh.resumeQueue("elsewhere", { create: true });
    assert.equal(await waiting, "woken");
  } finally {
    await waiter.close();
  }
});

test("a remote worker over the server: nothing starts while its queue is paused; then one at a time under concurrency 1; a RateLimitedError waits without spending an attempt", async () => {
  await lh.pauseQueue("remote-flow", { create: true });
  await lh.setQueueLimits("remote-flow", { concurrency: 1 });
  let running = 0;
  let mostAtOnce = 0;
  let limited = false;
  const worker = new Worker({
    queues: ["remote-flow"],
    concurrency: 4,
    leaseMs: 3_000,
    logger: silent,
    metricsRegistry: new Registry(),
    transport: new RemoteTransport({ serverUrl: base, token: WORKER_TOKEN, waitMs: 500, requestTimeoutMs: 5_000 }),
    handlers: {
      step: async (payload: { n: number }) => {
        running++;
        mostAtOnce = Math.max(mostAtOnce, running);
        try {
          if (payload.n === 0 && !limited) {
            limited = true;
            throw new RateLimitedError(300, "job", "the API said 429");
          }
          await new Promise((r) => setTimeout(r, 50));
        } finally {
          running--;
        }
      },
    },
  });
  await worker.start();
  try {
    const jobs = await lh.enqueueMany(Array.from({ length: 4 }, (_, n) => ({ task: "step", queue: "remote-flow", payload: { n } })));
    const ids = jobs.map((j) => j.id);
    const states = async () => (await lh.pool.query("SELECT state FROM jobs WHERE id = ANY($1::bigint[])", [ids])).rows.map((r) => r.state);
    await new Promise((r) => setTimeout(r, 1_000));
    assert.deepEqual(await states(), ["waiting", "waiting", "waiting", "waiting"], "a paused queue starts nothing");
    assert.equal(mostAtOnce, 0);
    await lh.resumeQueue("remote-flow");
    await eventually(async () => (await Promise.all(ids.map((id) => lh.getJob(id)))).every((j) => j.job.state === "succeeded"), "all four ran");
    assert.equal(mostAtOnce, 1, "concurrency 1 across the fleet");
    const first = await lh.getJob(ids[0]!);
    assert.deepEqual(
      first.attempts.map((a) => a.outcome),
      ["rate_limited", "succeeded"],
    );
    assert.equal(first.job.spentAttempts, 0, "the rate-limited attempt spent nothing");
    assert.match(first.attempts[0]!.error ?? "", /the API said 429/);
  } finally {
    await worker.stop();
  }
});

test("a queue's record of succeeded jobs over HTTP: PATCH /v1/queues/:name/history sets it (400 naming a bad field, 404 an unknown queue, 403 the worker token); a job not kept is 410 job_not_kept", async () => {
  const keeps = async (name: string) => (await lh.pool.query("SELECT keep_succeeded FROM queues WHERE name = $1", [name])).rows[0]?.keep_succeeded;
  assert.equal((await api("PATCH", "/v1/queues/lean/history", { keepSucceeded: false })).status, 404);
  const set = await api("PATCH", "/v1/queues/lean/history?create=true", { keepSucceeded: false });
  assert.equal(set.status, 200, set.text);
  assert.equal(set.json.queue.keepSucceeded, false);
  assert.equal(await keeps("lean"), false);
  const listed = (await api("GET", "/v1/queues")).json.queues as { name: string; keepSucceeded: boolean }[];
  assert.equal(listed.find((q) => q.name === "lean")!.keepSucceeded, false);
  assert.equal(listed.find((q) => q.name === "mail")!.keepSucceeded, true);
  const overview = (await api("GET", "/v1/overview")).json.flow as { name: string; keepSucceeded: boolean }[];
  assert.equal(overview.find((q) => q.name === "lean")!.keepSucceeded, false, "the dashboard's overview carries it");

  for (const [body, message] of [
    [{}, /keepSucceeded/],
    [{ keepSucceeded: "false" }, /keepSucceeded/],
    [{ keepSucceeded: false, keepFailed: false }, /keepFailed/],
  ] as const) {
    const bad = await api("PATCH", "/v1/queues/lean/history", body);
    assert.equal(bad.status, 400, `${JSON.stringify(body)}: ${bad.text}`);
    assert.equal(bad.json.error.code, "invalid_input");
    assert.match(bad.json.error.message, message);
  }
  assert.equal(await keeps("lean"), false, "nothing changed");
  assert.equal((await api("PATCH", "/v1/queues/lean/history", { keepSucceeded: true }, asWorker)).status, 403);

  // A job of the queue, completed: not kept, 410 on read and on wait; an id never issued stays 404.
  const [enqueued] = await lh.enqueueMany([{ task: "t", queue: "lean" }]);
  const [job] = await store.claimJobs(lh.pool, { queues: ["lean"], limit: 1, workerId: "w", leaseMs: 30_000, tasks: ["t"] });
  await store.completeJobs(lh.pool, { workerId: "w", jobs: [{ id: job!.id, attempt: job!.attempt }] });
  for (const path of [`/v1/jobs/${enqueued!.id}`, `/v1/jobs/${enqueued!.id}/wait?timeoutMs=5000`]) {
    const gone = await api("GET", path);
    assert.deepEqual([gone.status, gone.json.error.code], [410, "job_not_kept"], `${path}: ${gone.text}`);
    assert.match(gone.json.error.message, new RegExp(`job ${enqueued!.id} has finished and its record is not kept`));
  }
  const never = await api("GET", "/v1/jobs/987654321");
  assert.deepEqual([never.status, never.json.error.code], [404, "job_not_found"]);

  const back = await api("PATCH", "/v1/queues/lean/history", { keepSucceeded: true });
  assert.equal(back.json.queue.keepSucceeded, true);
});
