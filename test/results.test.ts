/**
 * Results and waiting (docs/flows.md#results-and-waiting): a handler's return value kept with
 * the attempt that succeeded, checked like a payload with a size cap; `lh.waitFor` on one shared
 * LISTEN session; retention forgetting results with their jobs. Through the library, a database
 * worker and a remote worker (the server in this process).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import type { FastifyInstance } from "fastify";
import pg from "pg";
import { createServer } from "../packages/cli/src/server/app.js";
import { JobNotFoundError, JobNotKeptError, ValidationError, WaitTimeoutError } from "../packages/leasehold/src/errors.js";
import type { JobContext } from "../packages/leasehold/src/worker/context.js";
import * as store from "../packages/leasehold/src/store/index.js";
import { databaseUrl, eventually, freshLeasehold } from "./helpers/db.js";
import { api as apiAt, remoteWorker, TOKEN } from "./helpers/server.js";

type Lh = Awaited<ReturnType<typeof freshLeasehold>>;

/** The job_history row of a job: its state and stored result, straight from the table. */
async function historyRow(lh: Lh, id: string) {
  const { rows } = await lh.pool.query("SELECT state, result FROM job_history WHERE id = $1", [id]);
  return rows[0] as { state: string; result: unknown } | undefined;
}

/** Every column of a job row, to show a job was not touched. */
async function rowOf(lh: Lh, id: string) {
  const { rows } = await lh.pool.query("SELECT * FROM jobs WHERE id = $1", [id]);
  return rows[0];
}

/** The backends listening for this schema's ended jobs (one per client that waits). */
async function waitSessions(lh: Lh): Promise<number[]> {
  const { rows } = await lh.pool.query(
    "SELECT pid FROM pg_stat_activity WHERE application_name = 'leasehold-wait' AND query = $1 AND pid <> pg_backend_pid()",
    [`LISTEN "leasehold:${lh.schema}:ended"`],
  );
  return rows.map((r) => r.pid as number);
}

/** A job claimed by hand (no worker), to end it with the store's statements when the test says. */
async function claimOne(lh: Lh, task: string, workerId = "w") {
  const [job] = await store.claimJobs(lh.pool, { queues: ["default"], limit: 1, workerId, leaseMs: 60_000, tasks: [task] });
  assert.ok(job, `a ${task} job to claim`);
  return job;
}

test("a handler's return value is the job's result: kept with the attempt that succeeded, read by getJob and lists; undefined and null keep none", async (t) => {
  const lh = await freshLeasehold(t);
  const worker = lh.worker({
    handlers: {
      echo: (p: { n: number }) => ({ n: p.n, doubled: p.n * 2, text: "résumé ✓" }),
      nothing: () => undefined,
      nil: () => null,
      scalar: (p: { n: number }) => p.n,
    },
    concurrency: 20,
    pollIntervalMs: 20,
  });
  await worker.start();
  t.after(() => worker.stop());
  // Several in one report batch, with and without results side by side.
  const jobs = await lh.enqueueMany([
    ...Array.from({ length: 12 }, (_, n) => ({ task: "echo", payload: { n } })),
    { task: "nothing" },
    { task: "nil" },
    { task: "scalar", payload: { n: 0 } },
    { task: "scalar", payload: { n: 7 } },
  ]);
  const ended = await Promise.all(jobs.map((j) => lh.waitFor(j.id, { timeoutMs: 15_000 })));
  for (let n = 0; n < 12; n++) {
    assert.equal(ended[n]!.state, "succeeded");
    assert.deepEqual(ended[n]!.result, { n, doubled: n * 2, text: "résumé ✓" });
    assert.deepEqual((await historyRow(lh, jobs[n]!.id))!.result, { n, doubled: n * 2, text: "résumé ✓" });
  }
  assert.deepEqual(
    ended.slice(12).map((j) => [j.state, j.result]),
    [
      ["succeeded", null],
      ["succeeded", null],
      ["succeeded", 0],
      ["succeeded", 7],
    ],
  );
  // SQL NULL, not a JSON null, for none.
  assert.equal((await lh.pool.query("SELECT result IS NULL AS none FROM job_history WHERE id = $1", [jobs[13]!.id])).rows[0].none, true);
  assert.deepEqual((await lh.getJob(jobs[0]!.id)).job.result, { n: 0, doubled: 0, text: "résumé ✓" });
  const listed = await lh.listJobs({ state: "succeeded", task: "echo", limit: 1 });
  assert.deepEqual(listed[0]!.result, { n: 11, doubled: 22, text: "résumé ✓" }, "lists carry results with payloads");
  assert.equal("result" in (await lh.listJobs({ includePayload: false, limit: 1 }))[0]!, false, "and leave both out together");
  // An unfinished job has none.
  const { id: later } = await lh.enqueue("echo", { n: 1 }, { delayMs: 60_000 });
  assert.equal((await lh.getJob(later)).job.result, null);
});

test("a result that is not JSON or over maxResultBytes ends its attempt dead at once, naming the problem and the cap; no other job is touched", async (t) => {
  const lh = await freshLeasehold(t);
  const lone = "\uD83D";
  const bad: Record<string, () => unknown> = {
    big: () => ({ blob: "x".repeat(2_000) }),
    bigint: () => ({ total: 10n }),
    fn: () => ({ callback: () => 1 }),
    surrogate: () => ({ name: `half an emoji ${lone}` }),
    nul: () => ({ text: "a\u0000b" }),
  };
  // The hooks and the job:end event see the refusal as the attempt's error.
  const hookErrors = new Map<string, unknown>();
  lh.use({ afterAttempt: (job, end) => void hookErrors.set(job.id, end.error) });
  const worker = lh.worker({
    handlers: { ...bad, good: (p: { n: number }) => ({ ok: p.n }) },
    maxResultBytes: 1_000,
    concurrency: 10,
    pollIntervalMs: 20,
  });
  // A job of another queue no worker takes: it must come out of this unchanged.
  const { id: bystander } = await lh.enqueue("good", { n: -1 }, { queue: "elsewhere" });
  const before = await rowOf(lh, bystander);
  await worker.start();
  t.after(() => worker.stop());
  const badJobs = await lh.enqueueMany(Object.keys(bad).map((task) => ({ task, maxAttempts: 5 })));
  const goodJobs = await lh.enqueueMany([1, 2, 3].map((n) => ({ task: "good", payload: { n } })));
  const expected: Record<string, RegExp> = {
    big: /^the handler's result was refused: result is 2,011 bytes, over maxResultBytes \(1,000\)$/,
    bigint: /result\.total is a bigint, which is not JSON; a result must be JSON of at most maxResultBytes \(1,000\) bytes/,
    fn: /result\.callback is a function, which is not JSON; .*maxResultBytes \(1,000\)/,
    surrogate: /result\.name is not well-formed Unicode .*maxResultBytes \(1,000\)/,
    nul: /result\.text contains a NUL character, which PostgreSQL cannot store; .*maxResultBytes \(1,000\)/,
  };
  for (const [i, task] of Object.keys(bad).entries()) {
    const job = await lh.waitFor(badJobs[i]!.id, { timeoutMs: 15_000 });
    assert.equal(job.state, "dead", task);
    assert.equal(job.attempt, 1, `${task}: no retry (the same code would return the same value)`);
    assert.match(job.lastError!, expected[task]!);
    await eventually(async () => hookErrors.has(job.id), `${task}: afterAttempt ran`);
    assert.match(String((hookErrors.get(job.id) as Error | undefined)?.message), expected[task]!, `${task}: afterAttempt's error`);
    assert.equal(job.result, null);
    const { attempts } = await lh.getJob(job.id);
    assert.deepEqual(
      attempts.map((a) => a.outcome),
      ["failed"],
    );
  }
  for (const [i, j] of goodJobs.entries()) assert.deepEqual((await lh.waitFor(j.id, { timeoutMs: 15_000 })).result, { ok: i + 1 });
  assert.deepEqual(await rowOf(lh, bystander), before, "a job of another queue is untouched");
  const { rows } = await lh.pool.query("SELECT state, count(*)::int AS n FROM finished_jobs GROUP BY state ORDER BY state");
  assert.deepEqual(rows, [
    { state: "dead", n: 5 },
    { state: "succeeded", n: 3 },
  ]);
});

test("a result is serialised as JSON.stringify would: a pg row's Date is stored as its ISO string, toJSON is honoured, an undefined field left out, and the limits apply to what it becomes", async (t) => {
  const lh = await freshLeasehold(t);
  const worker = lh.worker({
    handlers: {
      // A row as pg returns it: timestamptz columns are Dates.
      row: async () => (await lh.pool.query("SELECT 7 AS id, timestamptz '2026-01-02T03:04:05.678Z' AS created_at")).rows[0],
      custom: () => ({ money: { toJSON: (key: string) => ({ key, cents: 1234 }) }, list: [new Date(0)], note: undefined }),
      nul: () => ({ money: { toJSON: () => "a\u0000b" } }),
    },
    maxResultBytes: 1_000,
    pollIntervalMs: 20,
  });
  await worker.start();
  t.after(() => worker.stop());
  const [row, custom, nul] = await lh.enqueueMany(["row", "custom", "nul"].map((task) => ({ task })));
  const rowJob = await lh.waitFor(row!.id, { timeoutMs: 15_000 });
  assert.equal(rowJob.state, "succeeded", rowJob.lastError ?? "");
  assert.deepEqual(rowJob.result, { id: 7, created_at: "2026-01-02T03:04:05.678Z" });
  const customJob = await lh.waitFor(custom!.id, { timeoutMs: 15_000 });
  assert.deepEqual(customJob.result, { money: { key: "money", cents: 1234 }, list: ["1970-01-01T00:00:00.000Z"] });
  const nulJob = await lh.waitFor(nul!.id, { timeoutMs: 15_000 });
  assert.equal(nulJob.state, "dead");
  assert.match(nulJob.lastError!, /result\.money contains a NUL character/);
});

test("maxResultBytes is checked when the worker is made", async (t) => {
  const lh = await freshLeasehold(t);
  for (const v of [0, 1.5, 17 * 1024 * 1024, "64k"]) {
    assert.throws(() => lh.worker({ handlers: { t: () => 1 }, maxResultBytes: v as number }), /maxResultBytes must be an integer from 1 to 16777216/);
  }
});

test("ctx.transaction stores its { result } with the completion in the same transaction; a bad one rolls back and ends the job dead", async (t) => {
  const lh = await freshLeasehold(t);
  const app = new pg.Client({ connectionString: databaseUrl() });
  await app.connect();
  t.after(() => app.end());
  const table = `${lh.schema}.orders`;
  await app.query(`CREATE TABLE ${table} (id int PRIMARY KEY)`);
  const worker = lh.worker({
    handlers: {
      order: async (p: { id: number }, ctx: JobContext) => {
        await ctx.transaction(async (tx) => (await tx.query(`INSERT INTO ${table} (id) VALUES ($1) RETURNING id`, [p.id])).rows[0].id as number, {
          result: (id) => ({ stored: id }),
        });
        return "after the commit: not stored";
      },
      plain: async (p: { id: number }, ctx: JobContext) => {
        await ctx.transaction((tx) => tx.query(`INSERT INTO ${table} (id) VALUES ($1)`, [p.id]), { result: { fixed: true } });
      },
      bad: async (p: { id: number }, ctx: JobContext) => {
        await ctx.transaction((tx) => tx.query(`INSERT INTO ${table} (id) VALUES ($1)`, [p.id]), { result: () => ({ n: 1n }) });
      },
    },
    pollIntervalMs: 20,
  });
  await worker.start();
  t.after(() => worker.stop());
  const [a, b, c] = await lh.enqueueMany([
    { task: "order", payload: { id: 1 } },
    { task: "plain", payload: { id: 2 } },
    { task: "bad", payload: { id: 3 }, maxAttempts: 5 },
  ]);
  assert.deepEqual((await lh.waitFor(a!.id, { timeoutMs: 15_000 })).result, { stored: 1 });
  assert.deepEqual((await lh.waitFor(b!.id, { timeoutMs: 15_000 })).result, { fixed: true });
  const dead = await lh.waitFor(c!.id, { timeoutMs: 15_000 });
  assert.equal(dead.state, "dead");
  assert.equal(dead.attempt, 1);
  assert.match(dead.lastError!, /ctx\.transaction's result was refused: result\.n is a bigint, which is not JSON/);
  assert.deepEqual(
    (await app.query(`SELECT id FROM ${table} ORDER BY id`)).rows.map((r) => r.id),
    [1, 2],
    "the refused job's write was rolled back",
  );
});

test("a success refused by a cancel keeps no result, a stale success changes nothing, and a batch without results stores none", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.enqueueMany([{ task: "a" }, { task: "a" }, { task: "a" }]);
  const first = await claimOne(lh, "a");
  const second = await claimOne(lh, "a");
  const third = await claimOne(lh, "a");
  await lh.cancel(first.id);
  const applied = await store.completeJobs(lh.pool, {
    workerId: "w",
    jobs: [
      { id: first.id, attempt: first.attempt, resultJson: '{"won":false}' },
      { id: second.id, attempt: second.attempt, resultJson: '{"kept":2}' },
      { id: third.id, attempt: third.attempt + 1, resultJson: '{"stale":true}' },
    ],
  });
  assert.deepEqual(
    [...applied],
    [
      [first.id, "cancelled"],
      [second.id, "succeeded"],
    ],
  );
  assert.deepEqual(await historyRow(lh, first.id), { state: "cancelled", result: null });
  assert.deepEqual(await historyRow(lh, second.id), { state: "succeeded", result: { kept: 2 } });
  assert.equal((await rowOf(lh, third.id)).state, "running", "the stale report did not touch its job");
  assert.equal(store.resultsObject([{ id: "1", attempt: 1 }]), null, "a batch without results sends null");
  assert.equal(
    store.resultsObject([
      { id: "1", attempt: 1, resultJson: "[1]" },
      { id: "2", attempt: 1 },
    ]),
    '{"1":[1]}',
  );
});

test("getJob reads the job, its attempts and its relations in one snapshot: never a finished job without its final attempt", async (t) => {
  const lh = await freshLeasehold(t);
  const jobs = await lh.enqueueMany(Array.from({ length: 200 }, () => ({ task: "t" })));
  const claimed = await store.claimJobs(lh.pool, { queues: ["default"], limit: jobs.length, workerId: "w", leaseMs: 60_000, tasks: ["t"] });
  assert.equal(claimed.length, jobs.length);
  const torn: string[] = [];
  // Each job is read while its completion commits: whichever side of it a read lands on, the
  // state and the attempts must agree.
  for (const job of claimed) {
    const [read] = await Promise.all([
      lh.getJob(job.id),
      store.completeJobs(lh.pool, { workerId: "w", jobs: [{ id: job.id, attempt: job.attempt }] }),
    ]);
    const final = read.attempts.some((a) => a.attempt === job.attempt);
    if ((read.job.state === "succeeded") !== final) torn.push(`${read.job.state} with attempts [${read.attempts.map((a) => a.outcome).join(", ")}]`);
  }
  assert.deepEqual(torn, []);
});

test("waitFor: already finished, woken when it finishes, dead and cancelled jobs; unknown ids, bad options, timeout and abort", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.enqueueMany([{ task: "done" }, { task: "later" }, { task: "dies" }]);
  const done = await claimOne(lh, "done");
  await store.completeJobs(lh.pool, { workerId: "w", jobs: [{ id: done.id, attempt: done.attempt, resultJson: '"yes"' }] });
  const finished = await lh.waitFor(done.id);
  assert.deepEqual([finished.state, finished.result], ["succeeded", "yes"]);

  // Woken by the notification: the waiter is registered before the job ends.
  const later = await claimOne(lh, "later");
  const waiting = lh.waitFor(later.id, { timeoutMs: 15_000 });
  await eventually(async () => (await rowOf(lh, later.id)).watched, "the waiter marked the job");
  await store.completeJobs(lh.pool, { workerId: "w", jobs: [{ id: later.id, attempt: later.attempt, resultJson: "42" }] });
  assert.equal((await waiting).result, 42);

  const dies = await claimOne(lh, "dies");
  const dying = lh.waitFor(dies.id, { timeoutMs: 15_000 });
  await eventually(async () => (await rowOf(lh, dies.id)).watched, "the waiter marked the job");
  await store.failJobs(lh.pool, {
    workerId: "w",
    failures: [{ id: dies.id, attempt: dies.attempt, error: "boom", backoff: { baseMs: 0, factor: 1, maxMs: 0, jitter: 0 }, giveUp: true }],
  });
  const dead = await dying;
  assert.deepEqual([dead.state, dead.lastError, dead.result], ["dead", "boom", null]);

  const { id: cancelMe } = await lh.enqueue("never");
  const cancelling = lh.waitFor(cancelMe, { timeoutMs: 15_000 });
  await eventually(async () => (await rowOf(lh, cancelMe)).watched, "the waiter marked the job");
  await lh.cancel(cancelMe);
  assert.equal((await cancelling).state, "cancelled");

  await assert.rejects(
    lh.waitFor("987654321"),
    (err: unknown) => err instanceof JobNotFoundError && /job 987654321 does not exist/.test(err.message),
  );
  await assert.rejects(lh.waitFor("abc"), ValidationError);
  await assert.rejects(lh.waitFor(cancelMe, { timeoutMs: -1 }), /timeoutMs must be an integer from 0/);

  const { id: slow } = await lh.enqueue("never");
  const before = await rowOf(lh, slow);
  await assert.rejects(
    lh.waitFor(slow, { timeoutMs: 200 }),
    (err: unknown) => err instanceof WaitTimeoutError && err.code === "wait_timeout" && /job \d+ did not finish within 200 ms/.test(err.message),
  );
  assert.deepEqual({ ...(await rowOf(lh, slow)), watched: false }, before, "a wait changes nothing but the job's watched mark");

  const controller = new AbortController();
  const aborted = lh.waitFor(slow, { signal: controller.signal });
  controller.abort(new Error("no longer needed"));
  await assert.rejects(aborted, /no longer needed/);
  await assert.rejects(lh.waitFor(slow, { signal: AbortSignal.abort(new Error("already aborted")) }), /already aborted/);
});

test("200 waiters on one client share one LISTEN session and resolve together; a wait across a terminated session still resolves", async (t) => {
  const lh = await freshLeasehold(t);
  const ids = (await lh.enqueueMany(Array.from({ length: 200 }, () => ({ task: "fan" })))).map((j) => j.id);
  const waits = ids.map((id) => lh.waitFor(id, { timeoutMs: 30_000 }));
  await eventually(async () => (await lh.pool.query("SELECT count(*)::int AS n FROM jobs WHERE watched")).rows[0].n === 200, "all marked");
  assert.equal((await waitSessions(lh)).length, 1, "one session for 200 waiters");
  assert.ok(lh.pool.totalCount <= 20, "and no connection per waiter");
  const claimed = await store.claimJobs(lh.pool, { queues: ["default"], limit: 200, workerId: "w", leaseMs: 60_000, tasks: ["fan"] });
  await store.completeJobs(lh.pool, {
    workerId: "w",
    jobs: claimed.map((j) => ({ id: j.id, attempt: j.attempt, resultJson: JSON.stringify({ id: j.id }) })),
  });
  const ended = await Promise.all(waits);
  assert.deepEqual(
    ended.map((j) => j.result),
    ids.map((id) => ({ id })),
  );

  // The session is cut, and the job ends before it is back: its notification is lost, and
  // the re-check after the reconnect finds it finished.
  await lh.enqueue("cut");
  const job = await claimOne(lh, "cut");
  const waiting = lh.waitFor(job.id, { timeoutMs: 20_000 });
  await eventually(async () => (await rowOf(lh, job.id)).watched, "the waiter marked the job");
  const [pid] = await waitSessions(lh);
  const admin = new pg.Client({ connectionString: databaseUrl(), options: `-c search_path=${lh.schema}` });
  await admin.connect();
  t.after(() => admin.end());
  await admin.query("SELECT pg_terminate_backend($1)", [pid]);
  await store.completeJobs(admin, { workerId: "w", jobs: [{ id: job.id, attempt: job.attempt, resultJson: '"through the cut"' }] });
  assert.equal((await waiting).result, "through the cut");
  await eventually(async () => (await waitSessions(lh)).length === 1 && (await waitSessions(lh))[0] !== pid, "a new session");
});

test("retention forgets results with their jobs", async (t) => {
  const lh = await freshLeasehold(t);
  const retention = lh.retention({ retainMs: 1_000 });
  await retention.runOnce();
  await lh.enqueueMany([{ task: "r" }, { task: "r" }]);
  const jobs = await store.claimJobs(lh.pool, { queues: ["default"], limit: 2, workerId: "w", leaseMs: 30_000, tasks: ["r"] });
  await store.completeJobs(lh.pool, { workerId: "w", jobs: jobs.map((j) => ({ id: j.id, attempt: j.attempt, resultJson: '{"big":"result"}' })) });
  assert.deepEqual((await lh.getJob(jobs[0]!.id)).job.result, { big: "result" });
  await new Promise((r) => setTimeout(r, 2_100));
  assert.equal(await retention.runOnce(), 2);
  assert.equal((await lh.pool.query("SELECT count(*)::int AS n FROM job_history WHERE result IS NOT NULL")).rows[0].n, 0);
  // Not "never existed": the ids were issued, so the jobs finished and their records are gone.
  await assert.rejects(lh.getJob(jobs[0]!.id), JobNotKeptError);
  await assert.rejects(lh.waitFor(jobs[1]!.id), { code: "job_not_kept", name: "JobNotKeptError" });
});

test("remote workers send their results; the server checks them against its own cap and ends a refused one dead", async (t) => {
  const lh = await freshLeasehold(t);
  const app: FastifyInstance = createServer({ leasehold: lh, token: TOKEN, limits: { maxResultBytes: 200 } });
  await app.listen({ host: "127.0.0.1", port: 0 });
  t.after(() => app.close());
  const base = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
  const api = (method: string, path: string, body?: unknown) => apiAt(base, method, path, body);

  const worker = remoteWorker(base, {
    small: (p: { n: number }) => ({ n: p.n }),
    // Under the worker's 64 KiB, over this server's 200 bytes.
    large: () => ({ blob: "y".repeat(500) }),
    odd: () => ({ total: 1n }),
  });
  await worker.start();
  t.after(() => worker.stop());
  const [small, large, odd] = await lh.enqueueMany([
    { task: "small", payload: { n: 5 } },
    { task: "large", maxAttempts: 5 },
    { task: "odd", maxAttempts: 5 },
  ]);
  assert.deepEqual((await lh.waitFor(small!.id, { timeoutMs: 15_000 })).result, { n: 5 });
  const tooLarge = await lh.waitFor(large!.id, { timeoutMs: 15_000 });
  assert.deepEqual([tooLarge.state, tooLarge.attempt], ["dead", 1]);
  assert.match(tooLarge.lastError!, /^the handler's result was refused by the server: result is 511 bytes, over maxResultBytes \(200\)$/);
  const notJson = await lh.waitFor(odd!.id, { timeoutMs: 15_000 });
  assert.equal(notJson.state, "dead");
  assert.match(notJson.lastError!, /^the handler's result was refused: result\.total is a bigint/, "refused by the worker before it was sent");
  await worker.stop();

  // A client that is not the Leasehold runtime: what JSON can carry but PostgreSQL cannot store.
  const { id: nul } = await lh.enqueue("raw", {}, { maxAttempts: 5 });
  const { id: fine } = await lh.enqueue("raw");
  const claim = await api("POST", "/v1/worker/claim", { workerId: "raw-w", queues: ["default"], tasks: ["raw"], limit: 2, leaseMs: 60_000 });
  assert.equal(claim.status, 200, claim.text);
  const byId = new Map(claim.json.jobs.map((j: { id: string; attempt: number; receipt: string }) => [j.id, j]));
  const ref = (id: string) => {
    const j = byId.get(id) as { id: string; attempt: number; receipt: string };
    return { id: j.id, attempt: j.attempt, receipt: j.receipt };
  };
  const answer = await api("POST", "/v1/worker/succeed", {
    workerId: "raw-w",
    jobs: [
      { ...ref(nul), result: { text: "a\u0000b" } },
      { ...ref(fine), result: ["ok"] },
    ],
  });
  assert.equal(answer.status, 200, answer.text);
  assert.deepEqual(
    answer.json.applied.sort((a: { id: string }, b: { id: string }) => Number(a.id) - Number(b.id)),
    [
      { id: nul, state: "dead" },
      { id: fine, state: "succeeded" },
    ],
  );
  const refused = (await lh.getJob(nul)).job;
  assert.equal(refused.state, "dead");
  assert.match(refused.lastError!, /refused by the server: result\.text contains a NUL character.*maxResultBytes \(200\)/);
  assert.deepEqual((await lh.getJob(fine)).job.result, ["ok"]);
});
