/** The fence: every heartbeat, completion, failure and supersession is guarded by (id, attempt, worker). */
import { test } from "node:test";
import assert from "node:assert/strict";
import * as store from "../packages/leasehold/src/store/index.js";
import type { JobContext, JobOutcome } from "../packages/leasehold/src/index.js";
import type { ClaimedJob } from "../packages/leasehold/src/jobs/types.js";
import { DEFAULT_BACKOFF } from "../packages/leasehold/src/worker/backoff.js";
import { freshLeasehold, databaseUrl, eventually, NO_BACKOFF } from "./helpers/db.js";
import { api, remoteWorker, startServe } from "./helpers/server.js";

const LEASE = 30_000;
const claimAs = (lh: { pool: store.Queryable }, workerId: string, limit = 10) =>
  store.claimJobs(lh.pool, { queues: ["default"], limit, workerId, leaseMs: LEASE, tasks: ["t"] });
const expireAll = (lh: { pool: store.Queryable }) => lh.pool.query("UPDATE jobs SET lease_until = now() - interval '1 ms' WHERE state = 'running'");
const reap = (lh: { pool: store.Queryable }) => store.reapExpiredLeases(lh.pool, { limit: 1000, backoff: { ...DEFAULT_BACKOFF, baseMs: 0 } });

test("a heartbeat extends the lease; a missed one lets it expire and the watchdog reaps it", async (t) => {
  const lh = await freshLeasehold(t);
  const { id } = await lh.enqueue("t", {}, { leaseMs: 2_000 });
  const [job] = await claimAs(lh, "w1");
  const leaseUntil = async () => (await lh.pool.query("SELECT lease_until FROM jobs WHERE id = $1", [id])).rows[0]?.lease_until as Date;
  const before = await leaseUntil();
  await new Promise((r) => setTimeout(r, 50));
  const beat = await store.extendLeases(lh.pool, { workerId: "w1", leaseMs: LEASE, beats: [{ id, attempt: job!.attempt }] });
  assert.deepEqual(beat.lost, []);
  assert.ok((await leaseUntil()).getTime() > before.getTime(), "the beat should move lease_until forward");
  // No more beats: the 2 s lease runs out and the watchdog reaps it.
  assert.equal((await reap(lh)).size, 0, "a live lease is not reaped");
  await new Promise((r) => setTimeout(r, 2_100));
  assert.equal((await reap(lh)).get(id), "waiting");
  const { job: after, attempts } = await lh.getJob(id);
  assert.equal(after.state, "waiting");
  assert.equal(after.lastError, "lease expired");
  assert.equal(after.spentAttempts, 1, "a reaped attempt spends the retry budget");
  assert.deepEqual(
    attempts.map((a) => [a.attempt, a.workerId, a.outcome]),
    [[1, "w1", "lease_expired"]],
  );
});

test("the self-zombie: after its lease was reaped and it re-claimed the job, a worker cannot beat or finish the old attempt", async (t) => {
  const lh = await freshLeasehold(t);
  const { id } = await lh.enqueue("t");
  const [first] = await claimAs(lh, "w1");
  await expireAll(lh);
  await reap(lh);
  const [second] = await claimAs(lh, "w1"); // the same worker id claims it again
  assert.equal(second!.id, id);
  assert.equal(second!.attempt, first!.attempt + 1);
  const old = { id, attempt: first!.attempt };

  const beat = await store.extendLeases(lh.pool, { workerId: "w1", leaseMs: LEASE, beats: [old] });
  assert.deepEqual(beat.lost, [id]);
  assert.equal((await store.completeJobs(lh.pool, { workerId: "w1", jobs: [old] })).size, 0);
  assert.equal((await store.failJobs(lh.pool, { workerId: "w1", failures: [{ ...old, error: "late", backoff: NO_BACKOFF }] })).size, 0);
  assert.equal((await store.releaseJobs(lh.pool, { workerId: "w1", jobs: [old], reason: "late", backoff: NO_BACKOFF })).size, 0);
  const lost = await store.describeLostLeases(lh.pool, [old]);
  assert.equal(lost.get(id)!.reason, "reclaimed");

  // Nothing changed: the current attempt still holds its lease and can finish.
  const { job } = await lh.getJob(id);
  assert.equal(job.state, "running");
  assert.equal(job.attempt, second!.attempt);
  assert.equal((await store.completeJobs(lh.pool, { workerId: "w1", jobs: [{ id, attempt: second!.attempt }] })).get(id), "succeeded");
});

test("a report from another worker with the right attempt number is refused too", async (t) => {
  const lh = await freshLeasehold(t);
  const { id } = await lh.enqueue("t");
  const [job] = await claimAs(lh, "w1");
  assert.equal((await store.completeJobs(lh.pool, { workerId: "w2", jobs: [{ id, attempt: job!.attempt }] })).size, 0);
  assert.equal((await lh.getJob(id)).job.state, "running");
});

test("N concurrent watchdogs reap each expired job exactly once", async (t) => {
  const lh = await freshLeasehold(t);
  const n = 600;
  await lh.enqueueMany(Array.from({ length: n }, () => ({ task: "t" })));
  await claimAs(lh, "dead-worker", n);
  await expireAll(lh);
  const pools = Array.from({ length: 6 }, () => store.createPool({ connectionString: databaseUrl(), schema: lh.schema, max: 1 }));
  t.after(() => Promise.all(pools.map((p) => p.end())).then(() => {}));
  const results = await Promise.all(
    pools.map(async (pool) => {
      const mine: string[] = [];
      for (;;) {
        const reaped = await store.reapExpiredLeases(pool, { limit: 50, backoff: DEFAULT_BACKOFF });
        if (reaped.size === 0) return mine;
        mine.push(...reaped.keys());
      }
    }),
  );
  const all = results.flat();
  assert.equal(all.length, n);
  assert.equal(new Set(all).size, n, "a job was reaped twice");
  const audit = await lh.pool.query(
    "SELECT count(*)::int AS rows, count(DISTINCT job_id)::int AS jobs FROM all_attempts WHERE outcome = 'lease_expired'",
  );
  assert.deepEqual(audit.rows[0], { rows: n, jobs: n });
});

test("a job that kills its worker every time ends in the dead letter after its budget (poison pill)", async (t) => {
  const lh = await freshLeasehold(t);
  const { id } = await lh.enqueue("t", {}, { maxAttempts: 3 });
  for (let i = 1; i <= 3; i++) {
    const [job] = await claimAs(lh, `w${i}`);
    assert.equal(job!.attempt, i);
    await expireAll(lh);
    await reap(lh);
  }
  const { job, attempts } = await lh.getJob(id);
  assert.equal(job.state, "dead");
  assert.equal(job.spentAttempts, 3);
  assert.deepEqual(
    attempts.map((a) => a.outcome),
    ["lease_expired", "lease_expired", "lease_expired"],
  );
  assert.deepEqual(await claimAs(lh, "w4"), []);
});

test("the fencing token never goes backwards: release and manual retry keep attempt growing", async (t) => {
  const lh = await freshLeasehold(t);
  const { id } = await lh.enqueue("t", {}, { maxAttempts: 1 });
  const [a1] = await claimAs(lh, "w1");
  // Graceful release: back to waiting without spending budget, token kept.
  assert.equal(
    (await store.releaseJobs(lh.pool, { workerId: "w1", jobs: [{ id, attempt: a1!.attempt }], reason: "shutdown", backoff: NO_BACKOFF })).get(id),
    "waiting",
  );
  let { job } = await lh.getJob(id);
  assert.equal(job.spentAttempts, 0);
  const [a2] = await claimAs(lh, "w2");
  assert.equal(a2!.attempt, 2, "the claim after a release is a new token");
  // Fail it: the budget of 1 is spent, so it is dead.
  assert.equal(
    (await store.failJobs(lh.pool, { workerId: "w2", failures: [{ id, attempt: 2, error: "boom", backoff: NO_BACKOFF }] })).get(id),
    "dead",
  );
  // Manual retry: fresh budget, token kept; the next claim is attempt 3.
  await lh.retry(id);
  ({ job } = await lh.getJob(id));
  assert.equal(job.state, "waiting");
  assert.equal(job.spentAttempts, 0);
  assert.equal(job.attempt, 2);
  const [a3] = await claimAs(lh, "w3");
  assert.equal(a3!.attempt, 3);
  // Every older attempt's report is refused against the new lease.
  for (const [worker, attempt] of [
    ["w1", 1],
    ["w2", 2],
  ] as const) {
    assert.equal((await store.completeJobs(lh.pool, { workerId: worker, jobs: [{ id, attempt }] })).size, 0);
  }
  const { attempts } = await lh.getJob(id);
  assert.deepEqual(
    attempts.map((a) => [a.attempt, a.outcome]),
    [
      [1, "released"],
      [2, "failed"],
    ],
  );
});

test("after an ambiguous commit, the audit row tells a landed completion from a stale one", async (t) => {
  const lh = await freshLeasehold(t);
  const a = await lh.enqueue("t");
  const b = await lh.enqueue("t");
  const jobs = await claimAs(lh, "w1");
  const refs = jobs.map((j) => ({ id: j.id, attempt: j.attempt }));
  // a's completion commits; b's lease is reaped and b is re-claimed by someone else.
  await store.completeJobs(lh.pool, { workerId: "w1", jobs: refs.filter((r) => r.id === a.id) });
  await lh.pool.query("UPDATE jobs SET lease_until = now() - interval '1 ms' WHERE id = $1", [b.id]);
  await reap(lh);
  await claimAs(lh, "w2");
  const lost = await store.describeLostLeases(lh.pool, refs);
  assert.deepEqual(lost.get(a.id), { reason: "finished", endedAs: "succeeded", finishedState: "succeeded" });
  assert.deepEqual(lost.get(b.id), { reason: "reclaimed", endedAs: "lease_expired", finishedState: null });
});

const SUPERSEDED = "superseded: a newer claim already wrote plan (test)";

test("a superseded report is fenced like a completion: a wrong attempt or worker changes nothing; the holder finishes the job, no budget spent", async (t) => {
  const lh = await freshLeasehold(t);
  const { id } = await lh.enqueue("t", {}, { maxAttempts: 5 });
  const [first] = await claimAs(lh, "w1");
  const supersede = (workerId: string, attempt: number) => store.supersedeJobs(lh.pool, { workerId, jobs: [{ id, attempt, reason: SUPERSEDED }] });
  const row = async () =>
    (await lh.pool.query("SELECT state, attempt, locked_by, lease_until, spent_attempts FROM jobs WHERE id = $1", [id])).rows[0];
  const before = await row();
  assert.equal((await supersede("w1", first!.attempt + 1)).size, 0, "an attempt the job never had");
  assert.equal((await supersede("w2", first!.attempt)).size, 0, "another worker naming the right attempt");
  assert.deepEqual(await row(), before);

  // The first attempt's lease is reaped (spending budget) and the job claimed again: its
  // superseded report now is a zombie's, refused like its completion would be.
  await expireAll(lh);
  await reap(lh);
  const [second] = await claimAs(lh, "w1");
  assert.equal((await supersede("w1", first!.attempt)).size, 0);
  assert.equal((await store.describeLostLeases(lh.pool, [{ id, attempt: first!.attempt }])).get(id)!.reason, "reclaimed");
  assert.equal((await lh.getJob(id)).job.state, "running");

  assert.equal((await supersede("w1", second!.attempt)).get(id), "superseded");
  const { job, attempts } = await lh.getJob(id);
  assert.equal(job.state, "succeeded");
  assert.equal(job.spentAttempts, 1, "the reaped attempt spent budget; the superseded one did not");
  assert.equal(job.lastError, SUPERSEDED);
  assert.deepEqual(
    attempts.map((a) => [a.attempt, a.outcome, a.error]),
    [
      [1, "lease_expired", "lease expired"],
      [2, "superseded", SUPERSEDED],
    ],
  );
  // A late repeat is refused as finished; after an ambiguous commit the audit row says it landed.
  assert.equal((await supersede("w1", second!.attempt)).size, 0);
  assert.deepEqual((await store.describeLostLeases(lh.pool, [{ id, attempt: second!.attempt }])).get(id), {
    reason: "finished",
    endedAs: "superseded",
    finishedState: "succeeded",
  });
});

test("a cancel requested while the attempt ran wins over its superseded report, as over a success", async (t) => {
  const lh = await freshLeasehold(t);
  const { id } = await lh.enqueue("t");
  const [job] = await claimAs(lh, "w1");
  assert.equal(await lh.cancel(id), "cancel_requested");
  assert.equal(
    (await store.supersedeJobs(lh.pool, { workerId: "w1", jobs: [{ id, attempt: job!.attempt, reason: SUPERSEDED }] })).get(id),
    "cancelled",
  );
  const after = await lh.getJob(id);
  assert.equal(after.job.state, "cancelled");
  assert.deepEqual(
    after.attempts.map((a) => a.outcome),
    ["cancelled"],
  );
});

/** Jobs A and B write one row with ctx.fencedWrite; A is claimed first and writes last. */
function planHandlers(lh: { pool: store.Queryable }, fences: Map<string, string>, aWaits: Promise<void>) {
  return {
    "sync-plan": async (p: { plan: string; waitFirst: boolean }, ctx: JobContext) => {
      fences.set(p.plan, ctx.fence);
      if (p.waitFirst) await aWaits;
      await ctx.fencedWrite(lh.pool, { table: "plan", key: { customer: "c1" }, values: { plan: p.plan } });
    },
  };
}

test("a remote worker over HTTP: A's refused ctx.fencedWrite is reported superseded; A is finished, not retried, B's value stays", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.pool.query("CREATE TABLE plan (customer text PRIMARY KEY, token bigint NOT NULL, plan text NOT NULL)");
  const serve = await startServe(lh.schema);
  t.after(() => serve.stop("SIGTERM").then(() => {}));
  const fences = new Map<string, string>();
  let releaseA!: () => void;
  const worker = remoteWorker(serve.match[1]!, planHandlers(lh, fences, new Promise<void>((r) => (releaseA = r))), { concurrency: 2 });
  const ends: [string, JobOutcome["state"]][] = [];
  worker.on("job:end", (job: ClaimedJob, outcome: JobOutcome) => ends.push([job.id, outcome.state]));
  await worker.start();
  t.after(() => worker.stop(0));
  const a = await lh.enqueue("sync-plan", { plan: "A", waitFirst: true }, { maxAttempts: 3 });
  await eventually(async () => fences.has("A"), "A claimed");
  const b = await lh.enqueue("sync-plan", { plan: "B", waitFirst: false });
  await eventually(async () => ends.some(([id]) => id === b.id), "B wrote and ended");
  releaseA();
  await eventually(async () => ends.some(([id]) => id === a.id), "A ended");
  assert.deepEqual(
    ends.map(([id, state]) => [id === a.id ? "A" : "B", state]),
    [
      ["B", "succeeded"],
      ["A", "superseded"],
    ],
  );
  const { job, attempts } = await lh.getJob(a.id);
  assert.deepEqual([job.state, job.spentAttempts, job.attempt], ["succeeded", 0, 1]);
  assert.deepEqual(
    attempts.map((x) => x.outcome),
    ["superseded"],
  );
  assert.match(job.lastError ?? "", /^superseded: a newer claim already wrote plan/);
  assert.deepEqual((await lh.pool.query("SELECT plan, token::text FROM plan")).rows, [{ plan: "B", token: fences.get("B") }]);
});

test("over HTTP, a superseded report is fenced and validated: a stale attempt is 409, a wrong attempt has no receipt, a bad body is 400", async (t) => {
  const lh = await freshLeasehold(t);
  const serve = await startServe(lh.schema);
  t.after(() => serve.stop("SIGTERM").then(() => {}));
  const base = serve.match[1]!;
  const { id } = await lh.enqueue("t");
  const claimOnce = async () => {
    const claim = await api(base, "POST", "/v1/worker/claim", { workerId: "w-a", queues: ["default"], tasks: ["t"], limit: 1, leaseMs: 60_000 });
    assert.equal(claim.status, 200, claim.text);
    const j = claim.json.jobs[0] as { id: string; attempt: number; receipt: string };
    return { id: j.id, attempt: j.attempt, receipt: j.receipt };
  };
  const supersede = (jobs: unknown[]) => api(base, "POST", "/v1/worker/supersede", { workerId: "w-a", jobs });
  const first = await claimOnce();
  assert.equal((await api(base, "POST", "/v1/worker/release", { workerId: "w-a", jobs: [first], reason: "test" })).status, 200);
  const second = await claimOnce();
  const row = async () => (await lh.pool.query("SELECT state, attempt, locked_by, lease_until FROM jobs WHERE id = $1", [id])).rows[0];
  const before = await row();

  for (const bad of [
    [{ ...second }], // no reason
    [{ ...second, reason: "" }],
    [{ ...second, reason: "x".repeat(2_001) }],
    [{ ...second, reason: "r", outcome: "succeeded" }], // unknown field
    [{ id, attempt: 0, reason: "r" }],
  ]) {
    const res = await supersede(bad);
    assert.equal(res.status, 400, res.text);
    assert.equal(res.json.error.code, "invalid_input");
  }
  // The old attempt, with its (valid) receipt: stale, refused as any stale report is.
  const stale = await supersede([{ ...first, reason: SUPERSEDED }]);
  assert.equal(stale.status, 409, stale.text);
  assert.equal(stale.json.error.code, "stale_lease");
  assert.deepEqual(stale.json.error.jobs, [{ id, attempt: first.attempt, reason: "reclaimed" }]);
  // A wrong attempt number carries no receipt of its own.
  const wrong = await supersede([{ id, attempt: second.attempt + 1, receipt: second.receipt, reason: SUPERSEDED }]);
  assert.deepEqual(wrong.json.refused, [{ id, attempt: second.attempt + 1, reason: "invalid_receipt" }]);
  assert.deepEqual(await row(), before, "nothing changed");
  const recorded = await lh.pool.query("SELECT kind, reason, via FROM stale_refusals WHERE job_id = $1", [id]);
  assert.deepEqual(recorded.rows, [{ kind: "supersede", reason: "reclaimed", via: "server" }], "the refusal is on record, as kind supersede");

  const applied = await supersede([{ ...second, reason: `${SUPERSEDED}\u0000` }]);
  assert.equal(applied.status, 200, applied.text);
  assert.deepEqual(applied.json.applied, [{ id, state: "superseded" }]);
  const { job } = await lh.getJob(id);
  assert.deepEqual([job.state, job.spentAttempts], ["succeeded", 0]);
  assert.ok(job.lastError?.startsWith(SUPERSEDED), "the reason, cleaned of what PostgreSQL refuses, is the last error");
});
