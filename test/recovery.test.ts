/**
 * Recovery the design promises, against the real server: handlers that hang while their
 * process lives, recoveries that spend the retry budget, a stable name held by one live
 * process, the watchdog's orphan scan (and its periodic run), a retry that uses its task's own
 * policy, and `ctx.recovered` after each way an attempt can end.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { WorkerNameInUseError } from "../packages/leasehold/src/errors.js";
import type { JobAbortedError, JobContext } from "../packages/leasehold/src/worker/context.js";
import * as store from "../packages/leasehold/src/store/index.js";
import { NO_BACKOFF, databaseUrl, eventually, freshLeasehold, recordEvents } from "./helpers/db.js";
import { cliWorker, workerChild } from "./helpers/processes.js";

const forever = () => new Promise<never>(() => {});
const finalOf = async (lh: Awaited<ReturnType<typeof freshLeasehold>>, id: string) => {
  const { job } = await lh.getJob(id);
  return ["succeeded", "dead", "cancelled"].includes(job.state) ? job : undefined;
};

test("a handler that hangs while its process lives ends as stalled at its progress timeout; its slot is freed", async (t) => {
  const lh = await freshLeasehold(t);
  const reasons: string[] = [];
  const ran: string[] = [];
  const worker = lh.worker({
    leaseMs: 1_500,
    concurrency: 1,
    pollIntervalMs: 50,
    handlers: {
      hangs: {
        progressTimeoutMs: 1_000,
        backoff: NO_BACKOFF,
        handler: (_p: unknown, ctx: JobContext) => {
          ctx.signal.addEventListener("abort", () => reasons.push((ctx.signal.reason as JobAbortedError).reason));
          return forever(); // a socket that never answers
        },
      },
      quick: (_p: unknown, ctx: JobContext) => void ran.push(ctx.jobId),
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const starts = recordEvents(worker, "job:start");
  const hung = await lh.enqueue("hangs", {}, { maxAttempts: 1 });
  await starts.waitFor((j: { id: string }) => j.id === hung.id);
  const startedAt = Date.now();
  const next = await lh.enqueue("quick");
  const job = await eventually(() => finalOf(lh, hung.id), "the hung job ended", 5_000);
  const took = Date.now() - startedAt;
  assert.equal(job.state, "dead");
  assert.ok(took >= 900 && took < 2_500, `ended after ${took} ms (progress timeout 1000 ms)`);
  assert.deepEqual(reasons, ["stalled"]);
  const { attempts } = await lh.getJob(hung.id);
  assert.deepEqual(
    attempts.map((a) => a.outcome),
    ["stalled"],
  );
  assert.match(attempts[0]!.error!, /stalled: no progress for 1000 ms/);
  // The one slot came back: the next job ran although the hung promise never settles.
  await eventually(async () => ran.includes(next.id), "the next job ran in the freed slot");
});

test("progress keeps a long job alive; its maximum run time ends it as timed_out; a job's own limit beats its task's", async (t) => {
  const lh = await freshLeasehold(t);
  const worker = lh.worker({
    leaseMs: 3_000,
    pollIntervalMs: 50,
    handlers: {
      busy: {
        progressTimeoutMs: 1_000,
        backoff: NO_BACKOFF,
        handler: async (p: { ms: number; silentMs?: number }, ctx: JobContext) => {
          if (p.silentMs) await new Promise((r) => setTimeout(r, p.silentMs));
          for (let i = 0; i * 200 < p.ms; i++) {
            ctx.progress({ i });
            await new Promise((r) => setTimeout(r, 200));
          }
        },
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  // 2.5 s, well past the progress timeout, but always progressing.
  const steady = await lh.enqueue("busy", { ms: 2_500 }, { maxAttempts: 1 });
  const capped = await lh.enqueue("busy", { ms: 5_000 }, { maxAttempts: 1, maxRunMs: 1_000 });
  const [a, b] = await Promise.all([steady, capped].map(({ id }) => eventually(() => finalOf(lh, id), `job ${id} ended`, 8_000)));
  assert.equal(a!.state, "succeeded");
  assert.equal(b!.state, "dead");
  const { attempts } = await lh.getJob(capped.id);
  assert.deepEqual(
    attempts.map((x) => x.outcome),
    ["timed_out"],
  );
  assert.ok(attempts[0]!.endedAt.getTime() - attempts[0]!.startedAt.getTime() < 2_000);
  // A job's own progress timeout overrides its task's (1 s, too short for a 1.5 s silence).
  const quiet = await lh.enqueue("busy", { ms: 0, silentMs: 1_500 }, { maxAttempts: 1, progressTimeoutMs: 60_000 });
  assert.equal((await eventually(() => finalOf(lh, quiet.id), "quiet job ended"))!.state, "succeeded");
});

test("the watchdog ends, from the database, an attempt whose worker beats on but never ends it (stalled)", async (t) => {
  const lh = await freshLeasehold(t);
  // The task's policy, as its workers announced it: a 1 s progress timeout.
  await store.announceWorker(lh.pool, {
    workerId: "w-wedged",
    kind: "worker",
    host: "h",
    pid: 1,
    queues: ["default"],
    livenessKey: null,
    policies: [{ task: "t", backoff: NO_BACKOFF, progressTimeoutMs: 1_000, maxRunMs: null }],
  });
  const { id } = await lh.enqueue("t", {}, { maxAttempts: 1 });
  const [job] = await store.claimJobs(lh.pool, { queues: ["default"], limit: 1, workerId: "w-wedged", leaseMs: 1_000, tasks: ["t"] });
  // A worker whose beats go on (its lease stays live) but whose handler never moves.
  const beat = setInterval(
    () => void store.extendLeases(lh.pool, { workerId: "w-wedged", leaseMs: 1_000, beats: [{ id, attempt: job!.attempt }] }),
    200,
  );
  t.after(() => clearInterval(beat));
  const watchdog = lh.watchdog({ intervalMs: 100 });
  await watchdog.runOnce();
  assert.equal((await lh.getJob(id)).job.state, "running", "not before the timeout and a lease of slack");
  const ended = await eventually(
    async () => {
      await watchdog.runOnce();
      return finalOf(lh, id);
    },
    "the watchdog ended it",
    6_000,
  );
  assert.equal(ended.state, "dead");
  const { attempts } = await lh.getJob(id);
  assert.deepEqual(
    attempts.map((a) => a.outcome),
    ["stalled"],
  );
  assert.match(attempts[0]!.error!, /ended by the watchdog/);
});

test("a job that crashes its worker every time reaches the dead letter through start-up reconciliation (it spends its budget)", async (t) => {
  const lh = await freshLeasehold(t);
  const { id } = await lh.enqueue("oom", {}, { maxAttempts: 3 });
  for (let restart = 1; restart <= 3; restart++) {
    // The pod's process claims the job and dies with it (no stop, no release) ...
    await eventually(
      async () =>
        (await store.claimJobs(lh.pool, { queues: ["default"], limit: 1, workerId: `pod-x/host-${restart}`, leaseMs: 3_600_000, tasks: ["oom"] }))
          .length === 1,
      "claimed",
    );
    // ... and its restarted process, holding the name, recovers what it held.
    const worker = lh.worker({ name: "pod-x", watchdog: false, handlers: { other: () => undefined } });
    await worker.start();
    await worker.stop(0);
    await lh.pool.query("UPDATE jobs SET run_at = now() WHERE id = $1", [id]); // skip the backoff
  }
  const { job, attempts } = await lh.getJob(id);
  assert.equal(job.state, "dead");
  assert.equal(job.spentAttempts, 3);
  assert.deepEqual(
    attempts.map((a) => a.outcome),
    ["worker_lost", "worker_lost", "worker_lost"],
  );
});

test("a release on behalf of an attempt whose client is gone spends budget; a live worker's graceful release does not", async (t) => {
  const lh = await freshLeasehold(t);
  const a = await lh.enqueue("t", {}, { maxAttempts: 1 });
  const b = await lh.enqueue("t", {}, { maxAttempts: 1 });
  const claimed = await store.claimJobs(lh.pool, { queues: ["default"], limit: 2, workerId: "w", leaseMs: 30_000, tasks: ["t"] });
  const ref = (id: string) => claimed.filter((j) => j.id === id).map((j) => ({ id: j.id, attempt: j.attempt }));
  const undelivered = await store.releaseJobs(lh.pool, { workerId: "w", jobs: ref(a.id), reason: "gone", spend: true, backoff: NO_BACKOFF });
  const graceful = await store.releaseJobs(lh.pool, { workerId: "w", jobs: ref(b.id), reason: "shutdown", backoff: NO_BACKOFF });
  assert.equal(undelivered.get(a.id), "dead");
  assert.equal(graceful.get(b.id), "waiting");
  assert.deepEqual(
    (await lh.getJob(a.id)).attempts.map((x) => x.outcome),
    ["worker_lost"],
  );
  assert.deepEqual(
    (await lh.getJob(b.id)).attempts.map((x) => x.outcome),
    ["released"],
  );
});

test("a stable name stands for one live process: a second is refused (its jobs untouched), or waits with waitForName", async (t) => {
  const lh = await freshLeasehold(t);
  let release!: () => void;
  const first = lh.worker({ name: "pod-y", handlers: { t: () => new Promise<void>((r) => (release = r)) } });
  await first.start();
  t.after(() => first.stop(0));
  const starts = recordEvents(first, "job:start");
  const { id } = await lh.enqueue("t");
  await starts.waitFor((j: { id: string }) => j.id === id);
  const second = lh.worker({ name: "pod-y", handlers: { t: () => undefined } });
  await assert.rejects(second.start(), (err: unknown) => err instanceof WorkerNameInUseError && /pod-y/.test(err.message));
  const { job } = await lh.getJob(id);
  assert.equal(job.state, "running", "the first process's job was not taken from it");
  assert.equal(job.attempt, 1);
  // A third waits for the name, and takes it over once the first has stopped.
  const third = lh.worker({ name: "pod-y", waitForName: true, handlers: { t: () => undefined } });
  let started = false;
  const starting = third.start().then(() => (started = true));
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(started, false, "it waits while the name is held");
  release();
  await first.stop();
  await starting;
  t.after(() => third.stop(0));
  assert.equal((await lh.getJob(id)).job.state, "succeeded");
});

test("the watchdog retries a reaped job with its task's announced policy, not the default", async (t) => {
  const lh = await freshLeasehold(t);
  await store.announceWorker(lh.pool, {
    workerId: "w-policy",
    kind: "worker",
    host: "h",
    pid: 1,
    queues: ["default"],
    livenessKey: null,
    policies: [{ task: "slow-retry", backoff: { baseMs: 60_000, factor: 1, maxMs: 60_000, jitter: 0 }, progressTimeoutMs: null, maxRunMs: null }],
  });
  const { id } = await lh.enqueue("slow-retry");
  await store.claimJobs(lh.pool, { queues: ["default"], limit: 1, workerId: "w-policy", leaseMs: 30_000, tasks: ["slow-retry"] });
  await lh.pool.query("UPDATE jobs SET lease_until = now() - interval '1 ms' WHERE id = $1", [id]);
  await lh.watchdog({ backoff: NO_BACKOFF }).runOnce();
  const { rows } = await lh.pool.query<{ wait_s: number }>("SELECT extract(epoch FROM run_at - now())::float8 AS wait_s FROM jobs WHERE id = $1", [
    id,
  ]);
  assert.ok(rows[0]!.wait_s > 55 && rows[0]!.wait_s <= 60, `retries in ${rows[0]!.wait_s} s (the task's 60 s backoff)`);
});

test("a job's first crash retries at once; a job that crashed or failed before backs off by its task's policy", async (t) => {
  const lh = await freshLeasehold(t);
  const slow = { baseMs: 60_000, factor: 1, maxMs: 60_000, jitter: 0 };
  await store.announceWorker(lh.pool, {
    workerId: "w-crashes",
    kind: "worker",
    host: "h",
    pid: 1,
    queues: ["default"],
    livenessKey: null,
    policies: [{ task: "crashy", backoff: slow, progressTimeoutMs: null, maxRunMs: null }],
  });
  const { id } = await lh.enqueue("crashy", {}, { maxAttempts: 5 });
  const waitSeconds = async () =>
    (await lh.pool.query<{ s: number }>("SELECT extract(epoch FROM run_at - now())::float8 AS s FROM jobs WHERE id = $1", [id])).rows[0]!.s;
  const crash = async () => {
    await store.claimJobs(lh.pool, { queues: ["default"], limit: 1, workerId: "w-crashes", leaseMs: 30_000, tasks: ["crashy"] });
    // The watchdog saw its liveness lock gone two seconds ago: past the grace.
    await lh.pool.query("UPDATE workers SET lost_at = now() - interval '2 seconds' WHERE id = 'w-crashes'");
    const ended = await store.recoverLostWorkers(lh.pool, { limit: 10, graceMs: 1_000, backoff: NO_BACKOFF });
    assert.equal(ended.get(id), "waiting");
  };
  await crash();
  assert.ok((await waitSeconds()) <= 0, "the first crash: claimable at once");
  await lh.pool.query("UPDATE jobs SET run_at = now() WHERE id = $1", [id]);
  await crash();
  const wait = await waitSeconds();
  assert.ok(wait > 55 && wait <= 60, `the second crash waits the task's 60 s backoff (${wait} s)`);
  const { job, attempts } = await lh.getJob(id);
  assert.equal(job.spentAttempts, 2, "both crashes spent the budget");
  assert.deepEqual(
    attempts.map((a) => a.outcome),
    ["worker_lost", "worker_lost"],
  );
});

test("the orphan scan counts jobs no live worker runs and finished jobs missing audit rows, and moves over-budget jobs to the dead letter", async (t) => {
  const lh = await freshLeasehold(t);
  const nobody = await lh.enqueue("no-such-worker", {}, { queue: "orphans" });
  const over = await lh.enqueue("t", {}, { queue: "orphans" });
  await lh.pool.query("UPDATE jobs SET spent_attempts = max_attempts, run_at = now() - interval '1 hour' WHERE id = ANY($1::bigint[])", [
    [nobody.id, over.id],
  ]);
  const done = await lh.enqueue("t", {}, { queue: "orphans-done", maxAttempts: 5 });
  const [c1] = await store.claimJobs(lh.pool, { queues: ["orphans-done"], limit: 1, workerId: "w", leaseMs: 30_000, tasks: ["t"] });
  await store.failJobs(lh.pool, { workerId: "w", failures: [{ id: done.id, attempt: c1!.attempt, error: "x", backoff: NO_BACKOFF }] });
  const [c2] = await store.claimJobs(lh.pool, { queues: ["orphans-done"], limit: 1, workerId: "w", leaseMs: 30_000, tasks: ["t"] });
  await store.completeJobs(lh.pool, { workerId: "w", jobs: [{ id: done.id, attempt: c2!.attempt }] });
  await lh.pool.query("DELETE FROM job_attempts WHERE job_id = $1", [done.id]); // an audit row lost
  const found = await lh.watchdog({ orphanAfterMs: 60_000 }).scanOrphans();
  assert.deepEqual(found, { no_worker_for_task: 2, missing_audit: 1, over_budget: 2 });
  for (const id of [nobody.id, over.id]) {
    const { job } = await lh.getJob(id);
    assert.equal(job.state, "dead");
    assert.match(job.lastError!, /retry budget was already spent/);
  }
  const gauge = await lh.metrics.orphanedJobs.get();
  assert.deepEqual(Object.fromEntries(gauge.values.map((v) => [v.labels.kind, v.value])), found);
});

test("a recovery run sees how the previous attempt ended, and its last error", async (t) => {
  const lh = await freshLeasehold(t);
  const seen: [string | null, string | null][] = [];
  const { id } = await lh.enqueue("t");
  await store.claimJobs(lh.pool, { queues: ["default"], limit: 1, workerId: "gone", leaseMs: 30_000, tasks: ["t"] });
  await lh.pool.query("UPDATE jobs SET lease_until = now() - interval '1 ms' WHERE id = $1", [id]);
  await lh.watchdog({ backoff: NO_BACKOFF }).runOnce();
  const worker = lh.worker({
    handlers: { t: { handler: (_p: unknown, ctx: JobContext) => void seen.push([ctx.previousOutcome, ctx.lastError]), backoff: NO_BACKOFF } },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  await eventually(() => finalOf(lh, id), "job ran again");
  assert.deepEqual(seen, [["lease_expired", "lease expired"]]);
});

test("the watchdog runs the orphan scan on its interval by itself: a job orphaned after a scan is found by a later one", async (t) => {
  const lh = await freshLeasehold(t);
  const gauge = async (kind: string) => (await lh.metrics.orphanedJobs.get()).values.find((v) => v.labels.kind === kind)?.value;
  // Only started, never run by hand: every scan below is one the watchdog chose to run.
  const watchdog = lh.watchdog({ intervalMs: 100, orphanScanIntervalMs: 300, orphanAfterMs: 100 }).start();
  t.after(() => watchdog.stop());
  await eventually(async () => (await gauge("no_worker_for_task")) === 0, "a first scan found nothing");
  await lh.enqueue("nobody-runs-this", {}, { queue: "orphans" });
  await eventually(async () => (await gauge("no_worker_for_task")) === 1, "a later scan found the job no worker runs");
});

/** What each attempt of a job saw: ctx.previousOutcome and ctx.recovered, by job id. */
function seenBy() {
  const seen = new Map<string, { previousOutcome: string | null; recovered: boolean }[]>();
  const record = (ctx: JobContext) => {
    const list = seen.get(ctx.jobId) ?? [];
    list.push({ previousOutcome: ctx.previousOutcome, recovered: ctx.recovered });
    seen.set(ctx.jobId, list);
    return list.length;
  };
  return { seen, record };
}

test("ctx.recovered after a crash: a worker process killed (-9) with the job, recovered by the watchdog", async (t) => {
  const lh = await freshLeasehold(t);
  const victim = await workerChild(t, lh.schema);
  const { id } = await lh.enqueue("hold", {}, { maxAttempts: 5 });
  await eventually(async () => victim.output().includes(`started ${id}`), "the job started in the worker process");
  const watchdog = lh.watchdog().start();
  t.after(() => watchdog.stop());
  const { seen, record } = seenBy();
  const rescuer = lh.worker({ watchdog: false, handlers: { hold: (_p: unknown, ctx: JobContext) => void record(ctx) } });
  await rescuer.start();
  t.after(() => rescuer.stop(0));
  victim.child.kill("SIGKILL");
  await eventually(() => finalOf(lh, id), "the job ran again", 20_000);
  assert.deepEqual(seen.get(id), [{ previousOutcome: "worker_lost", recovered: true }]);
});

test("ctx.recovered after a lost lease: a worker process frozen (SIGSTOP) past its lease, the lease reaped", async (t) => {
  const lh = await freshLeasehold(t);
  const frozen = await cliWorker(t, lh.schema, "export default { hold: () => new Promise(() => {}) };\n", ["--lease", "1000"]);
  const { id } = await lh.enqueue("hold", {}, { maxAttempts: 5 });
  await eventually(async () => frozen.started(id), "the job started in the worker process");
  frozen.child.kill("SIGSTOP"); // alive (its session and liveness lock stay), but silent
  const watchdog = lh.watchdog({ intervalMs: 100 }).start();
  t.after(() => watchdog.stop());
  const { seen, record } = seenBy();
  const rescuer = lh.worker({ watchdog: false, handlers: { hold: (_p: unknown, ctx: JobContext) => void record(ctx) } });
  await rescuer.start();
  t.after(() => rescuer.stop(0));
  await eventually(() => finalOf(lh, id), "the job ran again", 20_000);
  assert.deepEqual(seen.get(id), [{ previousOutcome: "lease_expired", recovered: true }]);
});

test("ctx.recovered after a time limit or a stall is true; after a failure the handler reported, false", async (t) => {
  const lh = await freshLeasehold(t);
  const { seen, record } = seenBy();
  const firstHangs = (_p: unknown, ctx: JobContext) => (record(ctx) === 1 ? forever() : undefined);
  const worker = lh.worker({
    watchdog: false,
    pollIntervalMs: 50,
    handlers: {
      limited: { maxRunMs: 1_000, backoff: NO_BACKOFF, handler: firstHangs },
      quiet: { progressTimeoutMs: 1_000, backoff: NO_BACKOFF, handler: firstHangs },
      flaky: {
        backoff: NO_BACKOFF,
        handler: (_p: unknown, ctx: JobContext) => {
          if (record(ctx) === 1) throw new Error("the first try fails");
        },
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const jobs = { limited: "timed_out", quiet: "stalled", flaky: "failed" } as const;
  for (const [task, outcome] of Object.entries(jobs)) {
    const { id } = await lh.enqueue(task, {}, { maxAttempts: 2 });
    await eventually(() => finalOf(lh, id), `job ${task} ended`, 10_000);
    assert.deepEqual(
      seen.get(id),
      [
        { previousOutcome: null, recovered: false },
        { previousOutcome: outcome, recovered: outcome !== "failed" },
      ],
      task,
    );
  }
});

test("ctx.recovered is false after a graceful shutdown released the job: the worker was alive and gave it back", async (t) => {
  const lh = await freshLeasehold(t);
  const { seen, record } = seenBy();
  // Runs until aborted, as a well-behaved handler does when its worker shuts down.
  const untilAborted = (_p: unknown, ctx: JobContext) => {
    if (record(ctx) > 1) return;
    return new Promise<void>((resolve) => ctx.signal.addEventListener("abort", () => resolve()));
  };
  const leaving = lh.worker({ watchdog: false, handlers: { t: untilAborted } });
  await leaving.start();
  t.after(() => leaving.stop(0));
  const starts = recordEvents(leaving, "job:start");
  const { id } = await lh.enqueue("t", {}, { maxAttempts: 5 });
  await starts.waitFor((j: { id: string }) => j.id === id);
  await leaving.stop(0); // past its deadline at once: the handler is aborted and the job released
  const next = lh.worker({ watchdog: false, handlers: { t: untilAborted } });
  await next.start();
  t.after(() => next.stop(0));
  await eventually(() => finalOf(lh, id), "the job ran again");
  assert.deepEqual(
    (await lh.getJob(id)).attempts.map((a) => a.outcome),
    ["released", "succeeded"],
  );
  assert.deepEqual(seen.get(id), [
    { previousOutcome: null, recovered: false },
    { previousOutcome: "released", recovered: false },
  ]);
});

test("a pooled connection that fails in the instant it is handed out does not crash the process, and the pool goes on", async (t) => {
  // pg-pool hands a client out with no 'error' listener of its own; a backend terminated right
  // after start-up delivers its FATAL in that gap (seen in chaos under terminate storms). The
  // microtask below runs there: after the pool hands the client out, before the caller resumes.
  const lh = await freshLeasehold(t);
  const pool = store.createPool({ connectionString: databaseUrl(), schema: lh.schema, max: 1 });
  try {
    let failNext = true;
    pool.on("acquire", (client) => {
      if (!failNext) return;
      failNext = false;
      queueMicrotask(() => client.emit("error", new Error("terminating connection due to administrator command")));
    });
    const { rows } = await store.withTransaction(pool, (client) => client.query<{ n: number }>("SELECT 1 AS n"));
    assert.equal(failNext, false, "the fault was not injected");
    assert.equal(rows[0]!.n, 1);
    assert.equal((await pool.query<{ n: number }>("SELECT 2 AS n")).rows[0]!.n, 2);
  } finally {
    await pool.end();
  }
});
