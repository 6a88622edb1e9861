/** The worker runtime against the real server: handlers, aborts, retries, shutdown. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { Leasehold } from "../packages/leasehold/src/client.js";
import { ConfigError, StaleLeaseError } from "../packages/leasehold/src/errors.js";
import { JobAbortedError, PermanentJobError, type JobContext } from "../packages/leasehold/src/worker/context.js";
import { Worker } from "../packages/leasehold/src/worker/worker.js";
import { DatabaseTransport } from "../packages/leasehold/src/worker/transport.js";
import { Registry } from "prom-client";
import * as store from "../packages/leasehold/src/store/index.js";
import { freshLeasehold, recordEvents, waitForEvent, eventually, databaseUrl, silent, NO_BACKOFF, untilAborted } from "./helpers/db.js";
import { TcpProxy } from "./helpers/proxy.js";
import { Heartbeater, attemptKey, type InFlight } from "../packages/leasehold/src/worker/heartbeat.js";
import { Outage } from "../packages/leasehold/src/worker/outage.js";
import { Reporter } from "../packages/leasehold/src/worker/reporter.js";
import { Claimer, type ClaimerHost } from "../packages/leasehold/src/worker/claimer.js";
import { resolveWorkerSettings } from "../packages/leasehold/src/worker/options.js";
import type { WorkerTransport } from "../packages/leasehold/src/worker/transport.js";
import { metricsFor } from "../packages/leasehold/src/metrics.js";

type Ended = [{ id: string }, { state: string; reason?: string; error?: unknown }];
const endOf = (worker: Worker, id: string, timeoutMs?: number) =>
  waitForEvent<Ended>(worker, "job:end", (job) => job.id === id, timeoutMs).then(([, outcome]) => outcome);

test("a failing job retries with backoff, then goes to the dead letter; manual retry revives it", async (t) => {
  const lh = await freshLeasehold(t);
  let calls = 0;
  const worker = lh.worker({
    handlers: {
      flaky: {
        handler: () => {
          calls++;
          throw new Error(`boom ${calls}`);
        },
        backoff: { baseMs: 50, maxMs: 50, jitter: 0 },
      },
    },
    pollIntervalMs: 20,
  });
  await worker.start();
  t.after(() => worker.stop());
  const { id } = await lh.enqueue("flaky", {}, { maxAttempts: 3 });
  const states: string[] = [];
  worker.on("job:end", (job: { id: string }, o: { state: string }) => job.id === id && states.push(o.state));
  await eventually(async () => (await lh.getJob(id)).job.state === "dead", "job dead");
  assert.deepEqual(states, ["waiting", "waiting", "dead"]);
  const { job, attempts } = await lh.getJob(id);
  assert.match(job.lastError!, /boom 3/);
  assert.deepEqual(
    attempts.map((a) => a.outcome),
    ["failed", "failed", "failed"],
  );
  // Backoff: each retry waited at least the policy's delay, by the database clock.
  for (let i = 1; i < attempts.length; i++) {
    assert.ok(attempts[i]!.startedAt.getTime() - attempts[i - 1]!.endedAt.getTime() >= 45, "retry came before its backoff");
  }
  // A manual retry gives a fresh budget of three attempts.
  await lh.retry(id);
  await eventually(async () => (await lh.getJob(id)).attempts.length === 6, "three more attempts after the manual retry");
  const revived = await lh.getJob(id);
  assert.equal(revived.job.state, "dead");
  assert.equal(revived.job.attempt, 6, "the token kept growing through the manual retry");
});

test("what a handler set just before it ended is stored with its end: the checkpoint before a throw reaches the retry, the last progress stays with the finished job (also one finished by ctx.transaction)", async (t) => {
  const lh = await freshLeasehold(t);
  const resumedFrom: unknown[] = [];
  const worker = lh.worker({
    // No beat falls due while these handlers run: only the end can carry their values.
    leaseMs: 60_000,
    heartbeatMs: 20_000,
    pollIntervalMs: 20,
    handlers: {
      resumable: {
        handler: (_p: unknown, ctx: JobContext) => {
          resumedFrom.push(ctx.previousCheckpoint);
          if (ctx.attempt > 1) return;
          ctx.checkpoint({ done: 40 });
          throw new Error("item 41 failed");
        },
        backoff: NO_BACKOFF,
      },
      counted: (_p: unknown, ctx: JobContext) => ctx.progress({ done: 10, of: 10 }),
      committed: async (_p: unknown, ctx: JobContext) => {
        ctx.progress({ done: 3, of: 3 });
        await ctx.transaction(async (tx) => tx.query("SELECT 1"));
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop());
  const resumable = await lh.enqueue("resumable", {}, { maxAttempts: 2 });
  const counted = await lh.enqueue("counted");
  assert.equal((await lh.waitFor(resumable.id, { timeoutMs: 10_000 })).state, "succeeded");
  assert.deepEqual(resumedFrom, [null, { done: 40 }]);
  const finished = await lh.waitFor(counted.id, { timeoutMs: 10_000 });
  assert.equal(finished.state, "succeeded");
  assert.deepEqual(finished.progress, { done: 10, of: 10 });
  const committed = await lh.waitFor((await lh.enqueue("committed")).id, { timeoutMs: 10_000 });
  assert.equal(committed.state, "succeeded");
  assert.deepEqual(committed.progress, { done: 3, of: 3 }, "finished by ctx.transaction");
});

test("a handler that throws PermanentJobError goes to the dead letter at once", async (t) => {
  const lh = await freshLeasehold(t);
  const worker = lh.worker({
    handlers: {
      bad: () => {
        throw new PermanentJobError("invalid address");
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop());
  const { id } = await lh.enqueue("bad", {}, { maxAttempts: 10 });
  assert.equal((await endOf(worker, id)).state, "dead");
  assert.equal((await lh.getJob(id)).job.spentAttempts, 1);
});

test("cancelling a running job aborts its handler (by notice, or at the next beat at the latest), and its late success is refused", async (t) => {
  const lh = await freshLeasehold(t);
  let release!: () => void;
  const aborted: unknown[] = [];
  const worker = lh.worker({
    heartbeatMs: 200,
    leaseMs: 2_000,
    handlers: {
      // Notices the abort but finishes "successfully" anyway, late.
      stubborn: (_: unknown, ctx: JobContext) =>
        new Promise<void>((resolve) => {
          release = resolve;
          ctx.signal.addEventListener("abort", () => {
            aborted.push((ctx.signal.reason as JobAbortedError).reason);
            setTimeout(resolve, 50);
          });
        }),
    },
  });
  await worker.start();
  t.after(() => worker.stop());
  const starts = recordEvents(worker, "job:start");
  const { id } = await lh.enqueue("stubborn");
  await starts.waitFor((job: { id: string }) => job.id === id);
  assert.equal(await lh.cancel(id), "cancel_requested");
  const outcome = await endOf(worker, id);
  assert.deepEqual(aborted, ["cancelled"]);
  assert.equal(outcome.state, "cancelled", "the late success ends the job as cancelled, not succeeded");
  const { job, attempts } = await lh.getJob(id);
  assert.equal(job.state, "cancelled");
  assert.deepEqual(
    attempts.map((a) => a.outcome),
    ["cancelled"],
  );
  void release;
});

test("cancelling a waiting job ends it at once; cancelling a finished one is a clear error", async (t) => {
  const lh = await freshLeasehold(t);
  const { id } = await lh.enqueue("nobody-handles-this");
  assert.equal(await lh.cancel(id), "cancelled");
  assert.equal((await lh.getJob(id)).job.state, "cancelled");
  await assert.rejects(lh.cancel(id), { code: "invalid_state", message: /already finished \(cancelled\)/ });
  await assert.rejects(lh.cancel("999999"), { code: "job_not_found" });
  await assert.rejects(lh.cancel("abc"), { code: "invalid_input" });
});

test("a lease reaped under a running handler aborts it (reason lease_expired) and its late report is refused and counted", async (t) => {
  const lh = await freshLeasehold(t);
  const aborted: unknown[] = [];
  const worker = lh.worker({ heartbeatMs: 300, leaseMs: 3_000, watchdog: false, handlers: { slow: untilAborted(aborted) } });
  await worker.start();
  t.after(() => worker.stop());
  const starts = recordEvents(worker, "job:start");
  const { id } = await lh.enqueue("slow");
  await starts.waitFor((job: { id: string }) => job.id === id);
  // Another watchdog reaps it as if the lease had run out (the worker hung, say).
  await lh.pool.query("UPDATE jobs SET lease_until = now() - interval '1 ms' WHERE id = $1", [id]);
  await lh.watchdog().runOnce();
  const outcome = await endOf(worker, id);
  assert.deepEqual(aborted, ["lease_expired"]);
  assert.equal(outcome.state, "lost");
  const stale = await lh.metrics.fencingRejections.get();
  assert.equal(stale.values.find((v) => v.labels.kind === "heartbeat")?.value, 1);
});

test("a stale completion (the job was reaped and re-claimed while the handler ran) is refused with StaleLeaseError", async (t) => {
  const lh = await freshLeasehold(t);
  let finish!: () => void;
  const worker = lh.worker({
    heartbeatMs: 60_000, // no beat will notice before the handler finishes
    leaseMs: 180_000,
    watchdog: false,
    concurrency: 1, // its one slot stays busy, so this worker cannot re-claim the job itself
    // The task's policy (announced by the worker) is what the watchdog retries the job with.
    handlers: { t: { handler: () => new Promise<void>((resolve) => (finish = resolve)), backoff: NO_BACKOFF } },
  });
  await worker.start();
  t.after(() => worker.stop());
  const starts = recordEvents<[{ id: string; attempt: number }]>(worker, "job:start");
  const { id } = await lh.enqueue("t");
  const [job] = await starts.waitFor((j) => j.id === id);
  await lh.pool.query("UPDATE jobs SET lease_until = now() - interval '1 ms' WHERE id = $1", [id]);
  await lh.watchdog().runOnce();
  const [reclaimed] = await store.claimJobs(lh.pool, { queues: ["default"], limit: 1, workerId: "other", leaseMs: 30_000, tasks: ["t"] });
  assert.equal(reclaimed!.attempt, job.attempt + 1);
  const stale = waitForEvent<[unknown, StaleLeaseError]>(worker, "job:stale");
  finish();
  const [, error] = await stale;
  assert.ok(error instanceof StaleLeaseError);
  assert.equal(error.code, "stale_lease");
  assert.equal(error.reason, "reclaimed");
  const { job: now } = await lh.getJob(id);
  assert.equal(now.state, "running");
  assert.equal(now.lockedBy, "other");
});

test("progress and checkpoints ride on heartbeats; a retry resumes from the checkpoint", async (t) => {
  const lh = await freshLeasehold(t);
  const seen: unknown[] = [];
  const worker = lh.worker({
    heartbeatMs: 100,
    leaseMs: 1_000,
    pollIntervalMs: 20,
    handlers: {
      resumable: {
        backoff: { baseMs: 10, jitter: 0 },
        handler: async (_: unknown, ctx: JobContext) => {
          seen.push(ctx.previousCheckpoint);
          if (ctx.previousCheckpoint === null) {
            ctx.progress({ done: 40 });
            ctx.checkpoint({ page: 4 });
            await new Promise((r) => setTimeout(r, 300)); // long enough for a beat to carry them
            throw new Error("interrupted");
          }
        },
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop());
  const { id } = await lh.enqueue("resumable");
  await eventually(async () => (await lh.getJob(id)).job.state === "succeeded", "job succeeded");
  assert.deepEqual(seen, [null, { page: 4 }]);
  assert.deepEqual((await lh.getJob(id)).job.progress, { done: 40 });
});

test("graceful shutdown lets short jobs finish and releases long ones without spending an attempt", async (t) => {
  const lh = await freshLeasehold(t);
  const aborted: unknown[] = [];
  const worker = lh.worker({
    concurrency: 4,
    handlers: { quick: () => new Promise((r) => setTimeout(r, 200)), endless: untilAborted(aborted) },
  });
  await worker.start();
  const quick = await lh.enqueue("quick");
  const endless = await lh.enqueue("endless");
  await eventually(async () => worker.inFlightCount === 2, "both jobs running");
  await worker.stop(1_000);
  assert.deepEqual(aborted, ["shutdown"]);
  assert.equal((await lh.getJob(quick.id)).job.state, "succeeded");
  const { job, attempts } = await lh.getJob(endless.id);
  assert.equal(job.state, "waiting");
  assert.equal(job.spentAttempts, 0, "a release spends no attempt");
  assert.deepEqual(
    attempts.map((a) => a.outcome),
    ["released"],
  );
  // Released to run at once: another worker picks it up without waiting for a lease.
  const next = lh.worker({ handlers: { endless: () => undefined } });
  await next.start();
  t.after(() => next.stop());
  await eventually(async () => (await lh.getJob(endless.id)).job.state === "succeeded", "released job runs again");
});

test("a worker with a stable name recovers at start-up the jobs its dead previous process held, spending an attempt each", async (t) => {
  const lh = await freshLeasehold(t);
  const { id } = await lh.enqueue("t");
  // The previous process of "pod-7" claimed it and died (no stop, no release).
  await store.claimJobs(lh.pool, { queues: ["default"], limit: 1, workerId: "pod-7/host-1-abc", leaseMs: 3_600_000, tasks: ["t"] });
  const other = await lh.enqueue("t");
  await store.claimJobs(lh.pool, { queues: ["default"], limit: 1, workerId: "pod-8/host-1-def", leaseMs: 3_600_000, tasks: ["t"] });
  const worker = lh.worker({ name: "pod-7", handlers: { t: { handler: () => undefined, backoff: NO_BACKOFF } } });
  await worker.start();
  t.after(() => worker.stop());
  await eventually(async () => (await lh.getJob(id)).job.state === "succeeded", "reconciled job ran again");
  const { job, attempts } = await lh.getJob(id);
  assert.deepEqual(
    attempts.map((a) => [a.outcome, a.workerId.split("/")[0]]),
    [
      ["worker_lost", "pod-7"],
      ["succeeded", "pod-7"],
    ],
  );
  assert.equal(job.spentAttempts, 1, "a crash recovered at start-up spends an attempt");
  assert.equal((await lh.getJob(other.id)).job.state, "running", "another name's job is left alone");
});

test("a worker cut off from the database aborts its handlers before their leases can run out (liveness recovery off)", async (t) => {
  const { proxy, proxiedUrl } = TcpProxy.forUrl(databaseUrl());
  await proxy.start();
  t.after(() => proxy.stop());
  const schema = `t_cut_${process.pid}`;
  const lh = await Leasehold.connect({ databaseUrl: proxiedUrl(), schema, logger: silent });
  const admin = await Leasehold.connect({ databaseUrl: databaseUrl(), schema, logger: silent });
  t.after(async () => {
    await admin.pool.query(`DROP SCHEMA ${schema} CASCADE`);
    await admin.close();
  });
  const aborted: unknown[] = [];
  // Without a liveness session only the lease protects the job; with one, the worker gives
  // up sooner (liveness_lost: test/split-execution.test.ts).
  const worker = lh.worker({ leaseMs: 3_000, heartbeatMs: 500, livenessGraceMs: null, watchdog: false, handlers: { long: untilAborted(aborted) } });
  await worker.start();
  const starts = recordEvents(worker, "job:start");
  const { id } = await admin.enqueue("long");
  await starts.waitFor((job: { id: string }) => job.id === id);
  const cutAt = Date.now();
  proxy.cut();
  await waitForEvent(worker, "job:aborted", (job: { id: string }) => job.id === id, 10_000);
  const abortedAfter = Date.now() - cutAt;
  assert.deepEqual(aborted, ["renewal_failed"]);
  const { rows } = await admin.pool.query("SELECT lease_until > now() AS live FROM jobs WHERE id = $1", [id]);
  assert.equal(rows[0].live, true, `the handler should stop while the lease is still live (aborted ${abortedAfter} ms after the cut)`);
  // Back online: the aborted handler's failure is reported, fenced, while the lease is still
  // live, so the job goes straight back to waiting for a retry; nothing is lost or stuck.
  proxy.restore();
  await eventually(async () => (await admin.getJob(id)).job.state === "waiting", "job back to waiting", 10_000);
  const { attempts } = await admin.getJob(id);
  assert.deepEqual(
    attempts.map((a) => a.outcome),
    ["failed"],
  );
  assert.match(attempts[0]!.error!, /lease could not be renewed/);
  await worker.stop(0);
  await lh.close();
});

test("a sleeping worker wakes on NOTIFY, and listens again after its connection is killed", async (t) => {
  const lh = await freshLeasehold(t);
  const worker = lh.worker({ pollIntervalMs: 3_600_000, handlers: { t: () => undefined } });
  await worker.start();
  t.after(() => worker.stop());
  await waitForEvent(worker, "idle");
  const first = await lh.enqueue("t");
  await endOf(worker, first.id, 5_000); // far sooner than the hour-long poll
  // Kill the LISTEN connection; the worker must reconnect, LISTEN again and poll at once.
  await lh.pool.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'leasehold-listen' AND query LIKE $1", [
    `LISTEN "leasehold:${lh.schema}"`,
  ]);
  await new Promise((r) => setTimeout(r, 500));
  const second = await lh.enqueue("t");
  await endOf(worker, second.id, 5_000);
});

test("bad worker settings are refused at construction with a clear error", async (t) => {
  const lh = await freshLeasehold(t);
  const handlers = { t: () => undefined };
  assert.throws(() => lh.worker({ handlers, leaseMs: 30_000, heartbeatMs: 15_000 }), {
    name: "ConfigError",
    message: /heartbeatMs \(15000\) must be at most a third of leaseMs \(30000\)/,
  });
  assert.throws(() => lh.worker({ handlers, concurrency: 0 }), ConfigError);
  assert.throws(() => lh.worker({ handlers: {} }), /at least one task handler/);
  assert.throws(() => lh.worker({ handlers, concurency: 5 } as never), /unknown worker option "concurency" \(did you mean "concurrency"\?\)/);
  assert.throws(() => lh.worker({ handlers: { t: "nope" } } as never), /handler for task "t" is not a function/);
});

test("a completion whose commit is ambiguous (connection lost after commit) is retried and known to have landed", async (t) => {
  const lh = await freshLeasehold(t);
  const transport = new DatabaseTransport(lh.pool, databaseUrl(), lh.schema);
  let dropped = 0;
  const realComplete = transport.complete.bind(transport);
  // The statement commits on the real server; then the reply is "lost" on the way back.
  transport.complete = async (p) => {
    const applied = await realComplete(p);
    if (dropped++ === 0) throw Object.assign(new Error("Connection terminated unexpectedly"), { code: "ECONNRESET" });
    return applied;
  };
  const worker = new Worker({ transport, logger: silent, metricsRegistry: new Registry(), handlers: { t: () => undefined } });
  await worker.start();
  t.after(() => worker.stop());
  const { id } = await lh.enqueue("t");
  const outcome = await endOf(worker, id);
  assert.equal(dropped, 2, "the completion was sent again after the ambiguous failure");
  assert.deepEqual(outcome, { state: "succeeded" }, "the retry matched nothing, and the audit row showed our success");
  assert.equal((await lh.getJob(id)).job.state, "succeeded");
});

test("a worker that claims again a job whose older attempt it still runs stops the older one and keeps the new one alive", async (t) => {
  const lh = await freshLeasehold(t);
  const finishers = new Map<number, () => void>();
  const aborted: [number, unknown][] = [];
  const worker = lh.worker({
    concurrency: 2,
    heartbeatMs: 60_000, // beats only when the test asks: the first lease runs out unnoticed
    leaseMs: 180_000,
    watchdog: false,
    handlers: {
      t: (_: unknown, ctx: JobContext) =>
        new Promise<void>((resolve, reject) => {
          finishers.set(ctx.attempt, resolve);
          ctx.signal.addEventListener("abort", () => {
            aborted.push([ctx.attempt, (ctx.signal.reason as JobAbortedError).reason]);
            reject(ctx.signal.reason);
          });
        }),
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const starts = recordEvents(worker, "job:start");
  const { id } = await lh.enqueue("t");
  await starts.waitFor((job: { id: string; attempt: number }) => job.id === id && job.attempt === 1);
  const ends: [number, string][] = [];
  worker.on("job:end", (job: { id: string; attempt: number }, o: { state: string }) => job.id === id && ends.push([job.attempt, o.state]));
  // Attempt 1's lease runs out and is reaped; the NOTIFY brings this same worker to claim it again.
  await lh.pool.query("UPDATE jobs SET lease_until = now() - interval '1 ms' WHERE id = $1", [id]);
  await lh.watchdog({ backoff: { baseMs: 0, factor: 1, maxMs: 0, jitter: 0 } }).runOnce();
  await starts.waitFor((job: { id: string; attempt: number }) => job.id === id && job.attempt === 2);
  await eventually(async () => ends.length === 1, "the older attempt ended");
  assert.deepEqual(aborted, [[1, "reclaimed"]]);
  assert.deepEqual(ends, [[1, "lost"]]);
  assert.equal(worker.inFlightCount, 1, "the new attempt is still tracked after the old one ended");
  // The new attempt's lease is still renewed by beats, and its success lands.
  const before = (await lh.getJob(id)).job.leaseUntil!;
  await new Promise((r) => setTimeout(r, 20));
  await worker.heartbeatNow();
  assert.ok((await lh.getJob(id)).job.leaseUntil! > before, "attempt 2 is still beaten");
  finishers.get(2)!();
  await eventually(async () => ends.length === 2, "the new attempt ended");
  assert.deepEqual(ends, [
    [1, "lost"],
    [2, "succeeded"],
  ]);
  const { job, attempts } = await lh.getJob(id);
  assert.equal(job.state, "succeeded");
  assert.deepEqual(
    attempts.map((a) => [a.attempt, a.outcome]),
    [
      [1, "lease_expired"],
      [2, "succeeded"],
    ],
  );
});

test("while reports hang, a worker stops claiming once more than its concurrency wait for their reports", async (t) => {
  const lh = await freshLeasehold(t);
  const transport = new DatabaseTransport(lh.pool, databaseUrl(), lh.schema);
  // Completions never answer, as on a half-open connection; claims still work.
  transport.complete = () => new Promise(() => {});
  // Every handler that ended waits for its report (none lands).
  let ended = 0;
  const concurrency = 3;
  const worker = new Worker({
    transport,
    logger: silent,
    metricsRegistry: new Registry(),
    concurrency,
    pollIntervalMs: 20,
    handlers: {
      t: () => {
        ended++;
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  await lh.enqueueMany(Array.from({ length: 200 }, () => ({ task: "t" })));
  await eventually(async () => ended > concurrency, "more reports waiting than the concurrency");
  // Claims have stopped: the leases held no longer grow. (How many were claimed before they
  // stopped depends on the finishing rate the worker measured, hence no exact count.)
  await new Promise((r) => setTimeout(r, 300));
  const held = worker.inFlightCount;
  await new Promise((r) => setTimeout(r, 500));
  assert.equal(worker.inFlightCount, held, "still claiming while reports hang");
  assert.ok(ended <= held, "a job whose report never landed let go of its lease");
  assert.ok(held < 50, `${held} leases held: the bound did not stop the claims`);
  const { rows } = await lh.pool.query("SELECT count(*)::int AS n FROM jobs WHERE state = 'running'");
  assert.equal(rows[0].n, held, "the database holds as many leases as the worker knows of");
});

test("a beat renews only the newest attempt a worker holds of a job: an older one it still reports is not counted as renewed", async (t) => {
  const lh = await freshLeasehold(t);
  const transport = new DatabaseTransport(lh.pool, databaseUrl(), lh.schema);
  const { id } = await lh.enqueue("t");
  const workerId = "beat-keying";
  const [claimed] = await store.claimJobs(lh.pool, { queues: ["default"], limit: 1, workerId, leaseMs: 30_000, tasks: ["t"] });
  assert.equal(claimed!.id, id);
  // The same worker holds an older attempt of the job too (its end still being reported after
  // a limit, while the job was claimed again): only the newer one holds the lease.
  const entry = (job: typeof claimed, phase: InFlight["phase"]): InFlight => ({
    job: job!,
    renewedAt: 0,
    claimedAt: 0,
    phase,
    progressTimeoutMs: null,
    maxRunMs: null,
  });
  const older = entry({ ...claimed!, attempt: claimed!.attempt - 1 }, "reporting");
  const newer = entry(claimed, "running");
  const inFlight = new Map([older, newer].map((e) => [attemptKey(e.job), e]));
  const lost: InFlight[] = [];
  const beater = new Heartbeater(
    inFlight,
    { lost: (e) => lost.push(e), cancelRequested: () => {}, refused: () => {}, unrenewable: () => {} },
    transport,
    workerId,
    30_000,
    10_000,
    metricsFor(new Registry()),
    new Outage(silent),
    silent,
  );
  await beater.beatNow();
  await beater.stop();
  assert.ok(newer.renewedAt > 0, "the newest attempt's lease was renewed");
  assert.equal(older.renewedAt, 0, "the older attempt has no lease to renew");
  assert.deepEqual(lost, []);
});

test("a buffered job given back after waiting too long is never started from the buffer afterwards", async (t) => {
  const lh = await freshLeasehold(t);
  // Quick jobs first, so the worker claims ahead; the victim is claimed into the buffer behind
  // the slow job, waits there past its share of the lease (a quarter of 4 s), and is released.
  await lh.enqueueMany(Array.from({ length: 300 }, () => ({ task: "quick", priority: 0 })));
  const victim = await lh.enqueue("victim", {}, { priority: 2 });
  await lh.enqueue("slow", {}, { priority: 1 });
  const starts: number[] = [];
  const worker: Worker = lh.worker({
    concurrency: 1,
    leaseMs: 4_000,
    heartbeatMs: 1_000,
    watchdog: false,
    handlers: {
      quick: () => undefined,
      victim: (_p: unknown, ctx: JobContext) => void starts.push(ctx.attempt),
      slow: async () => {
        await eventually(
          async () => (await lh.pool.query("SELECT 1 FROM jobs WHERE id = $1 AND locked_by = $2", [victim.id, worker.id])).rowCount === 1,
          "the victim claimed behind the slow job",
        );
        const claimedAttempt = (await lh.getJob(victim.id)).job.attempt;
        await eventually(
          async () => (await lh.getJob(victim.id)).attempts.some((a) => a.attempt === claimedAttempt && a.outcome === "released"),
          "the victim released from the buffer",
        );
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  await eventually(async () => (await lh.getJob(victim.id)).job.state === "succeeded", "the victim ran", 20_000);
  const { attempts } = await lh.getJob(victim.id);
  const released = attempts.filter((a) => a.outcome === "released").map((a) => a.attempt);
  assert.ok(released.length > 0);
  assert.deepEqual(
    starts.filter((n) => released.includes(n)),
    [],
    `released attempt(s) ${released} started from the buffer`,
  );
});

test("ends handed to the reporter in one turn of the event loop go out in one completion statement", async (t) => {
  const lh = await freshLeasehold(t);
  const transport = new DatabaseTransport(lh.pool, databaseUrl(), lh.schema);
  const batches: number[] = [];
  const complete = transport.complete.bind(transport);
  transport.complete = (p) => {
    batches.push(p.jobs.length);
    return complete(p);
  };
  await lh.enqueueMany(Array.from({ length: 30 }, () => ({ task: "t" })));
  const workerId = "one-turn";
  const claimed = await store.claimJobs(lh.pool, { queues: ["default"], limit: 30, workerId, leaseMs: 30_000, tasks: ["t"] });
  assert.equal(claimed.length, 30);
  const reporter = new Reporter(transport, workerId);
  // As the handlers of one claim's jobs do when they end in the same turn.
  const outcomes = await Promise.all(claimed.map((j) => reporter.succeed({ id: j.id, attempt: j.attempt })));
  assert.ok(outcomes.every((o) => o.applied));
  assert.deepEqual(batches, [30], "one statement for the turn's 30 ends, not the first alone");
});

test("while more jobs are buffered than the handlers can start, a claim waits until half the prefetch is missing", async () => {
  const concurrency = 10;
  let buffered = 0;
  const asked: number[] = [];
  const host: ClaimerHost = {
    buffered: () => buffered,
    running: () => concurrency,
    reporting: () => 0,
    deliver: () => {},
    idle: () => {},
    queues: () => ({ queues: ["default"], flowQueues: [], pacedQueues: [] }),
    queuesStale: () => {},
  };
  // Claims never answer: each asks once, and what it asked for stays counted as on its way.
  const transport = { claim: (p: { limit: number }) => (asked.push(p.limit), new Promise(() => {})) } as unknown as WorkerTransport;
  const settings = resolveWorkerSettings({ handlers: { t: () => undefined }, concurrency });
  const claimer = new Claimer(host, transport, "half-prefetch", settings, ["t"], metricsFor(new Registry()), new Outage(silent), silent);
  // A finishing rate of thousands of jobs/s: a prefetch of hundreds to thousands (250 ms of work).
  for (let i = 0; i < 2_000; i++) claimer.jobFinished();
  // Past the 100 ms sample period with room to spare: a timer may fire a little before its
  // time by performance.now(), and then no sample is taken (prefetch 0).
  await new Promise((r) => setTimeout(r, 150));
  const prefetch = claimer.target() - concurrency;
  assert.ok(prefetch >= 200, `prefetch ${prefetch}`);

  // A quarter of the prefetch is missing: no claim yet.
  buffered = Math.ceil(prefetch * 0.75);
  claimer.start();
  claimer.kick();
  assert.deepEqual(asked, [], "a claim went out for a quarter of the prefetch");

  // Half of it is missing: one claim for all of it.
  buffered = Math.floor(prefetch * 0.45);
  claimer.kick();
  assert.equal(asked.length, 1);
  assert.ok(asked[0]! >= prefetch / 2, `claimed ${asked[0]} of a prefetch of ${prefetch}`);
});

test("a rate-limited (paced) queue is claimed only for free handler slots: no prefetch, and none at all while every slot is busy", async () => {
  const concurrency = 10;
  let running = concurrency;
  const asked: { limit: number; queues: string[]; flowQueues: string[] }[] = [];
  let answer: (jobs: unknown[]) => void = () => {};
  const host: ClaimerHost = {
    buffered: () => 0,
    running: () => running,
    reporting: () => 0,
    deliver: () => {},
    idle: () => {},
    queues: () => ({ queues: ["plain", "paced"], flowQueues: ["paced"], pacedQueues: ["paced"] }),
    queuesStale: () => {},
  };
  const transport = {
    claim: (p: { limit: number; queues: string[]; flowQueues: string[] }) => {
      asked.push({ limit: p.limit, queues: p.queues, flowQueues: p.flowQueues });
      return new Promise((resolve) => (answer = resolve));
    },
  } as unknown as WorkerTransport;
  const settings = resolveWorkerSettings({ handlers: { t: () => undefined }, concurrency });
  const claimer = new Claimer(host, transport, "paced", settings, ["t"], metricsFor(new Registry()), new Outage(silent), silent);
  // A finishing rate of thousands of jobs/s: a prefetch of hundreds (250 ms of work).
  for (let i = 0; i < 2_000; i++) claimer.jobFinished();
  await new Promise((r) => setTimeout(r, 150)); // past the 100 ms sample period (see the test above)
  assert.ok(claimer.target() - concurrency >= 100);

  // Every slot busy: the prefetch claim leaves the paced queue out.
  claimer.start();
  assert.equal(asked.length, 1);
  assert.deepEqual([asked[0]!.queues, asked[0]!.flowQueues], [["plain"], []]);
  // Whatever it found (here nothing: the plain queue is drained) is in; 3 slots free up.
  running = concurrency - 3;
  answer([]);
  await new Promise((r) => setImmediate(r));
  assert.equal(asked.length, 2, "a freed slot claims the paced queue, though the plain one was drained");
  assert.deepEqual(asked[1], { limit: 3, queues: ["plain", "paced"], flowQueues: ["paced"] });
  answer([{}, {}, {}]);
  await claimer.stop();
});
