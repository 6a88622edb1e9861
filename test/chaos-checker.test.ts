/**
 * The chaos suite's invariant checker must be able to fail: a clean history passes, and each
 * kind of corruption a broken core could leave behind is reported. Jobs here are driven
 * through the real store statements on the test server, then tampered with by hand.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import * as store from "../src/store/index.js";
import { fencedWrite } from "../src/index.js";
import { DOWNSTREAM_SQL } from "../chaos/downstream.js";
import { RESULTS_TABLE, TX_EFFECTS_TABLE } from "../chaos/config.js";
import { checkInvariants } from "../chaos/invariants.js";
import type { LogLine } from "../chaos/process-log.js";
import { freshLeasehold } from "./helpers/db.js";

const LEASE = 30_000;

async function scenario() {
  const lh = await freshLeasehold();
  await lh.pool.query(DOWNSTREAM_SQL);
  await lh.enqueueMany([0, 1, 2].map((seq) => ({ task: "chaos", payload: { seq, write: true } })));
  const jobs = await store.claimJobs(lh.pool, { queues: ["default"], limit: 10, workerId: "w1", leaseMs: LEASE, tasks: ["chaos"] });
  const logs: LogLine[] = [];
  const beatAt = Date.now();
  await store.extendLeases(lh.pool, { workerId: "w1", leaseMs: LEASE, beats: jobs.map((j) => ({ id: j.id, attempt: j.attempt })) });
  logs.push({
    ev: "report",
    kind: "heartbeat",
    t: Date.now(),
    sentAt: beatAt,
    w: "w1",
    sent: jobs.map((j) => [j.id, j.attempt]),
    accepted: jobs.map((j) => j.id),
  });
  for (const j of jobs) {
    logs.push({ ev: "start", t: Date.now(), w: "w1", job: j.id, attempt: j.attempt });
    const accepted = await fencedWrite(lh.pool, { table: RESULTS_TABLE, key: { job_id: j.id }, token: j.attempt, values: { worker_id: "w1" } });
    logs.push({ ev: "write", t: Date.now(), w: "w1", job: j.id, attempt: j.attempt, accepted });
  }
  const sentAt = Date.now();
  const done = await store.completeJobs(lh.pool, { workerId: "w1", jobs: jobs.map((j) => ({ id: j.id, attempt: j.attempt })) });
  logs.push({ ev: "report", kind: "complete", t: Date.now(), sentAt, w: "w1", sent: jobs.map((j) => [j.id, j.attempt]), accepted: [...done.keys()] });
  const check = () => checkInvariants({ admin: lh.pool, jobs: 3, logs, faults: [], unexpectedExits: [] });
  return { lh, jobs, logs, check };
}

const invariantsOf = (r: { violations: { invariant: string }[] }) => [...new Set(r.violations.map((v) => v.invariant))].sort();

test("a clean history passes the chaos checker", async () => {
  const { lh, check } = await scenario();
  const r = await check();
  assert.deepEqual(r.violations, []);
  assert.equal(r.finished.succeeded, 3);
  await lh.dispose();
});

test("the checker reports a lost job, a second success, a broken budget and a stale downstream write", async () => {
  const { lh, jobs, check } = await scenario();
  const [a, b, c] = jobs.map((j) => j.id);
  await lh.enqueue("chaos", { seq: 3 }); // never run: lost or stuck
  await lh.pool.query("INSERT INTO job_attempts (job_id, attempt, worker_id, started_at, outcome) VALUES ($1, 2, 'w2', now(), 'succeeded')", [a]);
  await lh.pool.query("UPDATE job_history SET spent_attempts = 4 WHERE id = $1", [b]);
  // A stale writer that bypassed the fence: the log shows attempt 0 after attempt 1.
  await lh.pool.query(`UPDATE ${RESULTS_TABLE} SET token = 0 WHERE job_id = $1`, [c]);
  const r = await check();
  assert.deepEqual(invariantsOf(r), [
    "attempts within the budget",
    "every attempt's audit row closed",
    "no job lost or stuck",
    "no stale downstream write accepted",
  ]);
  assert.ok(
    r.violations.some((v) => v.job === c && /attempt 0 accepted after attempt 1/.test(v.detail)),
    JSON.stringify(r.violations),
  );
  await lh.dispose();
});

test("the checker reports reports accepted from an attempt that did not hold the lease", async () => {
  const { lh, jobs, logs, check } = await scenario();
  const [a, b] = jobs.map((j) => j.id);
  // A completion the database accepted from a worker that never held the job,
  logs.push({ ev: "report", kind: "complete", t: Date.now(), sentAt: Date.now(), w: "zombie", sent: [[a!, 1]], accepted: [a!] });
  // and a heartbeat accepted five seconds after the attempt had ended.
  const later = Date.now() + 5_000;
  logs.push({ ev: "report", kind: "heartbeat", t: later, sentAt: later, w: "w1", sent: [[b!, 1]], accepted: [b!] });
  const r = await check();
  assert.deepEqual(invariantsOf(r), ["no stale report applied"]);
  assert.equal(r.violations.length, 2, JSON.stringify(r.violations));
  await lh.dispose();
});

test("the checker explains a duplicate execution by the reaped lease before it, and flags one after a success", async () => {
  const lh = await freshLeasehold();
  await lh.pool.query(DOWNSTREAM_SQL);
  const { id } = await lh.enqueue("chaos", { seq: 0 });
  const claim = (w: string) => store.claimJobs(lh.pool, { queues: ["default"], limit: 1, workerId: w, leaseMs: LEASE, tasks: ["chaos"] });
  const [first] = await claim("w1");
  await lh.pool.query("UPDATE jobs SET lease_until = now() - interval '1 ms'");
  await store.reapExpiredLeases(lh.pool, { limit: 10, backoff: { baseMs: 0, factor: 1, maxMs: 0, jitter: 0 } });
  const [second] = await claim("w2");
  await store.completeJobs(lh.pool, { workerId: "w2", jobs: [{ id, attempt: second!.attempt }] });
  const logs: LogLine[] = [
    { ev: "start", t: Date.now() - 100, w: "w1", job: id, attempt: first!.attempt },
    { ev: "start", t: Date.now() - 50, w: "w2", job: id, attempt: second!.attempt },
    { ev: "end", t: Date.now(), w: "w1", job: id, attempt: first!.attempt, outcome: "stale" },
  ];
  const r = await checkInvariants({ admin: lh.pool, jobs: 1, logs, faults: [], unexpectedExits: [] });
  assert.deepEqual(r.violations, []);
  assert.deepEqual(r.duplicates, { total: 1, afterLeaseExpired: 1, afterWorkerLost: 0, afterLimit: 0, afterRelease: 0, overlapping: 1 });
  // Rewrite history so that attempt 1 "succeeded": the rerun is now unexplained.
  await lh.pool.query("UPDATE job_attempts SET outcome = 'succeeded' WHERE job_id = $1 AND attempt = 1", [id]);
  const broken = await checkInvariants({ admin: lh.pool, jobs: 1, logs, faults: [], unexpectedExits: [] });
  assert.ok(
    broken.violations.some((v) => v.invariant === "duplicates explained"),
    JSON.stringify(broken.violations),
  );
  await lh.dispose();
});

test("the checker reports transactional writes that are missing, doubled or left behind by a dead job", async () => {
  const lh = await freshLeasehold();
  await lh.pool.query(DOWNSTREAM_SQL);
  await lh.enqueueMany([0, 1, 2, 3].map((seq) => ({ task: "chaos", payload: { seq, tx: true }, maxAttempts: seq === 3 ? 1 : 5 })));
  const jobs = await store.claimJobs(lh.pool, { queues: ["default"], limit: 10, workerId: "w1", leaseMs: LEASE, tasks: ["chaos"] });
  const [ok, missing, doubled, dead] = jobs.map((j) => j.id) as [string, string, string, string];
  const refs = jobs.map((j) => ({ id: j.id, attempt: j.attempt }));
  await store.completeJobs(lh.pool, { workerId: "w1", jobs: refs.slice(0, 3) });
  await store.failJobs(lh.pool, { workerId: "w1", failures: [{ ...refs[3]!, error: "x", backoff: { baseMs: 0, factor: 1, maxMs: 0, jitter: 0 } }] });
  const effect = (job: string) => lh.pool.query(`INSERT INTO ${TX_EFFECTS_TABLE} (job_id, attempt, worker_id) VALUES ($1, 1, 'w1')`, [job]);
  await effect(ok);
  await effect(doubled);
  await effect(doubled);
  await effect(dead);
  const r = await checkInvariants({ admin: lh.pool, jobs: 4, logs: [], faults: [], unexpectedExits: [] });
  const tx = r.violations.filter((v) => v.invariant === "transactional writes exactly once");
  assert.deepEqual(tx.map((v) => v.job).sort(), [missing, doubled, dead].sort(), JSON.stringify(tx));
  assert.equal(r.transactional, 4);
  await lh.dispose();
});
