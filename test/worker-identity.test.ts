/**
 * Remote-worker identity over a real `leasehold serve` with a real worker token: a worker
 * token is shared by a fleet, so what one worker may do to another is decided by proofs
 * (claim receipts for attempts, the identity proof attach returns for the worker itself),
 * never by the token. Every string a worker route takes is refused with a 400 naming it
 * when PostgreSQL could not store it.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { eventually, freshLeasehold, NO_BACKOFF } from "./helpers/db.js";
import { api as apiAt, startServe } from "./helpers/server.js";
import type { startCli } from "./helpers/cli.js";

const WORKER_TOKEN = "worker-token-identity-0123456789";
const asWorker = { authorization: `Bearer ${WORKER_TOKEN}` };
const DAY_MS = 86_400_000;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

let lh: Awaited<ReturnType<typeof freshLeasehold>>;
let serve: Awaited<ReturnType<typeof startCli>>;
let base: string;

/** Every call below holds the worker token, as any host of the fleet does. */
const post = (path: string, body: unknown) => apiAt(base, "POST", path, body, asWorker);
const attach = (workerId: string, extra: Record<string, unknown> = {}) =>
  post("/v1/worker/attach", { workerId, queues: ["default"], concurrency: 5, leaseMs: 1_000, policies: [], ...extra });
const claimOne = async (workerId: string, queue: string, task: string, leaseMs = 30_000) => {
  const res = await post("/v1/worker/claim", { workerId, queues: [queue], tasks: [task], limit: 1, leaseMs, waitMs: 5_000 });
  assert.equal(res.status, 200, res.text);
  assert.equal(res.json.jobs.length, 1, `${workerId} claimed a job of ${queue}`);
  return res.json.jobs[0] as { id: string; attempt: number; receipt: string };
};

before(async () => {
  lh = await freshLeasehold();
  // The watchdog runs in the tests that need it, at a short interval.
  serve = await startServe(lh.schema, ["--no-watchdog", "--min-lease", "1000"], { LEASEHOLD_WORKER_TOKEN: WORKER_TOKEN });
  base = serve.match[1]!;
});

after(async () => {
  const stopped = await serve.stop("SIGTERM");
  assert.equal(stopped.code, 0, stopped.stderr);
  await lh.dispose();
});

test("another holder of the worker token cannot detach worker A, take its name, recover its jobs or attach as A", async () => {
  const a = await attach("pod-a/1", { name: "pod-a" });
  assert.equal(a.status, 200, a.text);
  const { id } = await lh.enqueue("id.work", {}, { queue: "id-a" });
  const held = await claimOne("pod-a/1", "id-a", "id.work");

  // Detach without a proof, with a made-up one, or with the attacker's own: refused, A stays attached.
  const evil = await attach("evil/1", { name: "evil" });
  assert.equal(evil.status, 200, evil.text);
  const evilProof: string | undefined = evil.json.identity;
  for (const identity of [undefined, "x".repeat(43), evilProof]) {
    const r = await post("/v1/worker/detach", { workerId: "pod-a/1", graceful: true, identity });
    assert.equal(r.status, 403, r.text);
    assert.equal(r.json.error.code, "invalid_identity");
    assert.match(r.json.error.message, /pod-a\/1/);
  }
  const [row] = (await lh.pool.query(`SELECT stopped_at FROM workers WHERE id = 'pod-a/1'`)).rows;
  assert.equal(row.stopped_at, null, "A is not marked stopped");
  assert.equal((await attach("evil/2", { name: "pod-a" })).status, 409, "A's name is still A's");

  // Reconcile in A's name: without a proof nothing is recovered; the attacker's proof is not for that name.
  const bare = await post("/v1/worker/reconcile", {
    workerName: "pod-a",
    currentWorkerId: "evil/1",
    backoff: { ...NO_BACKOFF, baseMs: DAY_MS, maxMs: DAY_MS },
  });
  assert.equal(bare.status, 200, bare.text);
  assert.equal(bare.json.released, 0);
  assert.match(bare.json.skipped, /identity/);
  const wrongName = await post("/v1/worker/reconcile", { workerName: "pod-a", currentWorkerId: "evil/1", identity: evilProof });
  assert.equal(wrongName.status, 403, wrongName.text);
  assert.equal(wrongName.json.error.code, "invalid_identity");
  const forged = await post("/v1/worker/reconcile", { workerName: "pod-a", currentWorkerId: "pod-a/evil", identity: evilProof });
  assert.equal(forged.status, 403, forged.text);

  const { job, attempts } = await lh.getJob(id);
  assert.equal(job.state, "running", "A's job still runs");
  assert.equal(job.attempt, held.attempt);
  assert.deepEqual(attempts, [], "none of A's attempts was ended");
  assert.equal(job.spentAttempts, 0, "no attempt of A's was spent");

  // Nor can the attacker attach under A's worker id, to be handed A's proof or declare A's limits.
  const asA = await attach("pod-a/1");
  assert.equal(asA.status, 409, asA.text);
  assert.equal(asA.json.error.code, "worker_id_in_use");
  assert.equal(asA.json.identity, undefined);
});

test("a worker's next process recovers its jobs with its proof; the caller's backoff is not taken", async () => {
  await attach("pod-b/1", { name: "pod-b" });
  const { id } = await lh.enqueue("id.work", {}, { queue: "id-b", maxAttempts: 5 });
  await claimOne("pod-b/1", "id-b", "id.work");
  // pod-b/1 stops beating; after two of its leases (1 s each) its name is free.
  let tries = 0;
  let workerId = "";
  const next = await eventually(async () => {
    workerId = `pod-b/${++tries + 1}`;
    const r = await attach(workerId, { name: "pod-b" });
    return r.status === 200 ? r : undefined;
  }, "pod-b's name is free again");
  const r = await post("/v1/worker/reconcile", {
    workerName: "pod-b",
    currentWorkerId: workerId,
    identity: next.json.identity,
    backoff: { baseMs: DAY_MS, factor: 1, maxMs: DAY_MS, jitter: 0 },
  });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.released, 1);
  const { job, attempts } = await lh.getJob(id);
  assert.equal(job.state, "waiting");
  assert.equal(attempts.at(-1)!.outcome, "worker_lost");
  assert.ok(new Date(job.runAt!).getTime() < Date.now() + 3_600_000, `the job runs again soon, not a day later (${String(job.runAt)})`);
});

test("the cancel poll tells a worker's cancels only to that worker's own proof", async () => {
  const a = await attach("pod-c/1", { name: "pod-c" });
  const { id } = await lh.enqueue("id.work", {}, { queue: "id-c" });
  await claimOne("pod-c/1", "id-c", "id.work");
  const other = await attach("spy/1");

  // Both polls are open when the cancel is requested: only A's hears it.
  const spying = post("/v1/worker/cancels", { workerId: "pod-c/1", attempts: [], waitMs: 5_000 });
  const own = post("/v1/worker/cancels", { workerId: "pod-c/1", attempts: [], waitMs: 5_000, identity: a.json.identity });
  await sleep(500);
  assert.equal((await apiAt(base, "POST", `/v1/jobs/${id}/cancel`)).status, 200);
  const [spied, heard] = await Promise.all([spying, own]);
  assert.equal(spied.status, 200, spied.text);
  assert.deepEqual(spied.json.cancels, [], "a poll without the proof learns nothing of A's cancels");
  assert.equal(spied.json.waited, false, "and is answered at once");
  assert.deepEqual(heard.json.cancels, [{ id, attempt: 1 }], "A's own poll hears its cancel");

  const wrong = await post("/v1/worker/cancels", { workerId: "pod-c/1", attempts: [], waitMs: 100, identity: other.json.identity });
  assert.equal(wrong.status, 403, wrong.text);
  assert.equal(wrong.json.error.code, "invalid_identity");
});

test("a remote worker's declared limits apply to the jobs it holds only: not to a database worker's, not to another remote worker's", async (t) => {
  const TASK = "id.limited";
  const RUN_MS = 4_000;
  const ready: string[] = [];
  // A database worker with its short lease, so the watchdog would act within the run if a 1 s limit applied.
  const dbWorker = lh.worker({
    queues: ["lim-db"],
    leaseMs: 1_000,
    watchdog: false,
    handlers: {
      [TASK]: async () => {
        ready.push("db");
        await sleep(RUN_MS);
      },
    },
  });
  await dbWorker.start();
  t.after(() => dbWorker.stop());
  const dbJob = await lh.enqueue(TASK, {}, { queue: "lim-db" });
  await eventually(async () => ready.length > 0 || undefined, "the database worker started its job");

  // Remote worker A declares no time limit for the task; its job runs past 1 s, beating.
  assert.equal(
    (await attach("lim-a/1", { queues: ["lim-a"], policies: [{ task: TASK, backoff: NO_BACKOFF, progressTimeoutMs: null, maxRunMs: null }] })).status,
    200,
  );
  const aJob = await lh.enqueue(TASK, {}, { queue: "lim-a" });
  const aHeld = await claimOne("lim-a/1", "lim-a", TASK, 1_000);

  // The attacker declares a 1 s limit and a day-long backoff for the same task, and holds a job of it.
  const harsh = { task: TASK, backoff: { baseMs: DAY_MS, factor: 1, maxMs: DAY_MS, jitter: 0 }, progressTimeoutMs: null, maxRunMs: 1_000 };
  assert.equal((await attach("lim-evil/1", { queues: ["lim-e"], policies: [harsh] })).status, 200);
  const eJob = await lh.enqueue(TASK, {}, { queue: "lim-e", maxAttempts: 3 });
  const eHeld = await claimOne("lim-evil/1", "lim-e", TASK, 1_000);

  const watchdog = lh.watchdog({ intervalMs: 100 }).start();
  t.after(() => watchdog.stop());
  const beat = (workerId: string, job: { id: string; attempt: number; receipt: string }) =>
    post("/v1/worker/heartbeat", { workerId, leaseMs: 1_000, beats: [{ id: job.id, attempt: job.attempt, receipt: job.receipt }] });
  for (const until = Date.now() + RUN_MS; Date.now() < until;) {
    await Promise.all([beat("lim-a/1", aHeld), beat("lim-evil/1", eHeld)]);
    await sleep(250);
  }

  const aDone = await post("/v1/worker/succeed", { workerId: "lim-a/1", jobs: [{ id: aHeld.id, attempt: aHeld.attempt, receipt: aHeld.receipt }] });
  assert.deepEqual(aDone.json.applied, [{ id: aJob.id, state: "succeeded" }], `A's job ran to its end: ${aDone.text}`);
  const db = await eventually(async () => {
    const { job } = await lh.getJob(dbJob.id);
    return job.state === "running" ? undefined : job;
  }, "the database worker's job ended");
  assert.equal(db.state, "succeeded", "the database worker's job was not timed out by the attacker's limit");
  assert.equal(db.attempt, 1);
  const fleetPolicy = (await lh.pool.query(`SELECT max_run_ms FROM task_policies WHERE task = $1`, [TASK])).rows[0];
  assert.notEqual(fleetPolicy.max_run_ms, 1_000, "the fleet's policy for the task is the database worker's, not the attacker's");

  // The attacker's own declaration does apply to the job it holds.
  const { job: e, attempts } = await lh.getJob(eJob.id);
  assert.deepEqual(
    attempts.map((x) => x.outcome),
    ["timed_out"],
  );
  assert.equal(e.state, "waiting");
  assert.ok(new Date(e.runAt!).getTime() > Date.now() + DAY_MS / 2, "retried after its holder's declared backoff");
});

test("a NUL or other control character in any string a worker route takes is a 400 naming the field", async () => {
  const ref = { id: "1", attempt: 1, receipt: "r" };
  const NUL = "w\u0000id";
  const cases: [string, Record<string, unknown>, string][] = [
    ["/v1/worker/claim", { workerId: NUL, queues: ["q"], tasks: ["t"], limit: 1, leaseMs: 5_000 }, "workerId"],
    ["/v1/worker/claim", { workerId: "w", queues: ["q\u0000"], tasks: ["t"], limit: 1, leaseMs: 5_000 }, "queues/0"],
    ["/v1/worker/claim", { workerId: "w", queues: ["q"], tasks: ["t\u0000"], limit: 1, leaseMs: 5_000 }, "tasks/0"],
    ["/v1/worker/attach", { workerId: NUL, queues: ["q"], concurrency: 1, leaseMs: 5_000, policies: [] }, "workerId"],
    ["/v1/worker/attach", { workerId: "w", name: "n\u0000", queues: ["q"], concurrency: 1, leaseMs: 5_000, policies: [] }, "name"],
    [
      "/v1/worker/attach",
      { workerId: "w", queues: ["q"], concurrency: 1, leaseMs: 5_000, policies: [{ task: "t\u0000", backoff: NO_BACKOFF }] },
      "policies/0/task",
    ],
    ["/v1/worker/detach", { workerId: NUL }, "workerId"],
    ["/v1/worker/reconcile", { workerName: "n", currentWorkerId: NUL }, "currentWorkerId"],
    ["/v1/worker/reconcile", { workerName: "n\u0000", currentWorkerId: "w" }, "workerName"],
    ["/v1/worker/cancels", { workerId: NUL, attempts: [] }, "workerId"],
    ["/v1/worker/heartbeat", { workerId: NUL, leaseMs: 5_000, beats: [] }, "workerId"],
    ["/v1/worker/succeed", { workerId: NUL, jobs: [ref] }, "workerId"],
    ["/v1/worker/fail", { workerId: NUL, failures: [{ ...ref, error: "e" }] }, "workerId"],
    ["/v1/worker/supersede", { workerId: NUL, jobs: [{ ...ref, reason: "r" }] }, "workerId"],
    ["/v1/worker/release", { workerId: NUL, jobs: [ref], reason: "r" }, "workerId"],
    ["/v1/worker/rate-limited", { workerId: NUL, jobs: [{ ...ref, delayMs: 10, scope: "job" }] }, "workerId"],
    ["/v1/worker/lost", { workerId: NUL, attempts: [ref] }, "workerId"],
    ["/v1/worker/parents", { workerId: NUL, job: ref }, "workerId"],
    ["/v1/worker/dependencies", { workerId: NUL, job: ref }, "workerId"],
    ["/v1/worker/heartbeat", { workerId: "w\nid", leaseMs: 5_000, beats: [] }, "workerId"],
  ];
  for (const [path, body, field] of cases) {
    const r = await post(path, body);
    assert.equal(r.status, 400, `${path} ${field}: ${r.text}`);
    assert.equal(r.json.error.code, "invalid_input");
    assert.ok(r.json.error.message.includes(`body/${field}`), `${path}: the message names ${field}: ${r.json.error.message}`);
  }
});
