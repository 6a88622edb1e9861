/**
 * The chaos suite's invariant checker must be able to fail: a clean history passes, and each
 * kind of corruption a broken core could leave behind is reported. Jobs here are driven
 * through the real store statements on the test server, then tampered with by hand.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import * as store from "../packages/leasehold/src/store/index.js";
import { fencedWrite } from "../packages/leasehold/src/index.js";
import { DOWNSTREAM_SQL } from "../chaos/downstream.js";
import { RESULTS_TABLE, TX_EFFECTS_TABLE } from "../chaos/config.js";
import { checkInvariants } from "../chaos/invariants.js";
import { recordOff } from "../chaos/record-off.js";
import type { FaultRecord } from "../chaos/faults.js";
import { WAKE_MS } from "../chaos/overlaps.js";
import type { ProcessEnd } from "../chaos/supervisor.js";
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
  // Attempt 1's handler ignores its signal and runs on past attempt 2's start: a duplicate
  // overlapping in time, but signalled first, so not a split execution.
  const logs: LogLine[] = [
    { ev: "start", t: Date.now() - 100, w: "w1", job: id, attempt: first!.attempt },
    { ev: "abort", t: Date.now() - 60, w: "w1", job: id, attempt: first!.attempt, reason: "lease_expired" },
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

/**
 * The overlap invariant, on crafted timelines over a real history: job J's attempt 1 ran on
 * w1 (pid 101) and was reaped; attempt 2 ran on w2 (pid 102) and succeeded. Only the
 * timeline, the faults and the process ends differ between the cases.
 */
async function twoAttempts() {
  const lh = await freshLeasehold();
  await lh.pool.query(DOWNSTREAM_SQL);
  const { id } = await lh.enqueue("chaos", { seq: 0 });
  const claim = (w: string) => store.claimJobs(lh.pool, { queues: ["default"], limit: 1, workerId: w, leaseMs: LEASE, tasks: ["chaos"] });
  await claim("w1");
  await lh.pool.query("UPDATE jobs SET lease_until = now() - interval '1 ms'");
  await store.reapExpiredLeases(lh.pool, { limit: 10, backoff: { baseMs: 0, factor: 1, maxMs: 0, jitter: 0 } });
  await claim("w2");
  await store.completeJobs(lh.pool, { workerId: "w2", jobs: [{ id, attempt: 2 }] });
  const T = Date.now();
  const at = (w: "w1" | "w2", attempt: number) => ({ w, job: id, attempt });
  const base: LogLine[] = [
    { ev: "hello", t: T - 5_000, w: "w1", pid: 101 },
    { ev: "hello", t: T - 5_000, w: "w2", pid: 102 },
  ];
  const check = (logs: LogLine[], faults: FaultRecord[] = [], processEnds: ProcessEnd[] = []) =>
    checkInvariants({ admin: lh.pool, jobs: 1, logs: [...base, ...logs], faults, unexpectedExits: [], processEnds });
  return { lh, id, T, at, check };
}

const OVERLAP = "no attempt starts while another runs unsignalled";

test("overlap avoided: the older attempt's signal fired before the newer one started (its handler ran on, ignoring it)", async () => {
  const { lh, T, at, check } = await twoAttempts();
  const r = await check([
    { ev: "start", t: T, ...at("w1", 1) },
    { ev: "abort", t: T + 900, ...at("w1", 1), reason: "lease_expired" },
    { ev: "start", t: T + 1_000, ...at("w2", 2) },
    { ev: "settled", t: T + 1_200, ...at("w2", 2), ok: true },
    { ev: "settled", t: T + 1_500, ...at("w1", 1), ok: true },
  ]);
  assert.deepEqual(r.violations, []);
  assert.deepEqual(r.overlaps.unavoidable, { frozen: 0, killed: 0 });
  assert.equal(r.overlaps.avoidable, 0);
  assert.deepEqual(r.overlaps.timeline, { started: 2, aborted: 1, settled: 2 });
  await lh.dispose();
});

test("an avoidable overlap breaks the run: the newer attempt started while the older one ran unsignalled", async () => {
  const { lh, id, T, at, check } = await twoAttempts();
  const timeline: LogLine[] = [
    { ev: "start", t: T, ...at("w1", 1) },
    { ev: "start", t: T + 1_000, ...at("w2", 2) },
    { ev: "abort", t: T + 1_500, ...at("w1", 1), reason: "renewal_failed" },
  ];
  // A connection reset on w1 (not a freeze): the worker was running and could have aborted.
  const reset: FaultRecord = { kind: "reset", target: "w1", pid: 101, at: T + 100, durationMs: 3_000, endedAt: T + 3_100, held: [] };
  const r = await check(timeline, [reset]);
  assert.equal(r.overlaps.avoidable, 1);
  assert.deepEqual(r.overlaps.avoidableAround, { reset: 1 });
  assert.deepEqual(
    r.violations.map((v) => [v.invariant, v.job]),
    [[OVERLAP, id]],
  );
  assert.match(
    r.violations[0]!.detail,
    /attempt 2 \(w2\) started 1000 ms after attempt 1 \(w1\).*stopped 500 ms later by signal \(renewal_failed\).*reset at \+100 ms/,
  );
  // An older attempt starting while a newer one runs (a stale start) is avoidable too.
  const stale = await check([
    { ev: "start", t: T, ...at("w2", 2) },
    { ev: "start", t: T + 300, ...at("w1", 1) },
  ]);
  assert.equal(stale.overlaps.avoidable, 1);
  assert.match(
    stale.violations.find((v) => v.invariant === OVERLAP)?.detail ?? "",
    /attempt 1 \(w1\) started 300 ms after attempt 2 \(w2\), a stale start/,
  );
  await lh.dispose();
});

test("an overlap while the older attempt's process was frozen (SIGSTOP) is unavoidable, if it reacted on waking", async () => {
  const { lh, T, at, check } = await twoAttempts();
  const zombie: FaultRecord = { kind: "zombie", target: "w1", pid: 101, at: T + 200, durationMs: 1_250, endedAt: T + 1_450, held: [] };
  const abortAt = (t: number): LogLine[] => [
    { ev: "start", t: T, ...at("w1", 1) },
    { ev: "start", t: T + 1_000, ...at("w2", 2) },
    { ev: "abort", t, ...at("w1", 1), reason: "renewal_failed" },
  ];
  const r = await check(abortAt(T + 1_450 + WAKE_MS), [zombie]);
  assert.deepEqual(r.violations, []);
  assert.deepEqual(r.overlaps.unavoidable, { frozen: 1, killed: 0 });
  assert.equal(r.overlaps.avoidable, 0);
  // Awake for longer than WAKE_MS before firing the signal: it could have aborted sooner.
  const slow = await check(abortAt(T + 1_450 + WAKE_MS + 1), [zombie]);
  assert.equal(slow.overlaps.avoidable, 1);
  assert.equal(slow.overlaps.unavoidable.frozen, 0);
  // The freeze of another process explains nothing.
  const other = await check(abortAt(T + 1_450), [{ ...zombie, pid: 102 }]);
  assert.equal(other.overlaps.avoidable, 1);
  await lh.dispose();
});

test("a killed process's attempt ends at its death, whatever it last logged", async () => {
  const { lh, T, at, check } = await twoAttempts();
  // Attempt 1 never logged a signal or a settle: its process was killed.
  const timeline: LogLine[] = [
    { ev: "start", t: T, ...at("w1", 1) },
    { ev: "start", t: T + 1_000, ...at("w2", 2) },
  ];
  const r = await check(timeline, [], [{ pid: 101, at: T + 800 }]);
  assert.deepEqual(r.violations, []);
  assert.deepEqual(r.overlaps.unavoidable, { frozen: 0, killed: 1 });
  // Killed only after attempt 2 started: both ran at once.
  const late = await check(timeline, [], [{ pid: 101, at: T + 1_200 }]);
  assert.equal(late.overlaps.avoidable, 1);
  assert.match(late.violations.find((v) => v.invariant === OVERLAP)?.detail ?? "", /stopped 200 ms later by process ended/);
  // An end before the process said hello belongs to an earlier process with the same pid.
  const earlier = await check(timeline, [], [{ pid: 101, at: T - 6_000 }]);
  assert.equal(earlier.overlaps.avoidable, 1);
  await lh.dispose();
});

test("a beat accepted while a slow completion was committing is not stale; one sent after its answer came back is", async () => {
  const { lh, jobs, logs, check } = await scenario();
  const [, b, c] = jobs.map((j) => j.id);
  // Job b's completion answered 5 s late (it waited on a lock, say): a beat sent 3 s after its
  // statement began ran before it committed. Job c's completion answered at once.
  const late = Date.now() + 5_000;
  logs.push({ ev: "report", kind: "complete", t: late, sentAt: Date.now(), w: "w1", sent: [[b!, 1]], accepted: [b!] });
  const during = Date.now() + 3_000;
  logs.push({
    ev: "report",
    kind: "heartbeat",
    t: during,
    sentAt: during,
    w: "w1",
    sent: [
      [b!, 1],
      [c!, 1],
    ],
    accepted: [b!, c!],
  });
  const r = await check();
  assert.deepEqual(
    r.violations.map((v) => [v.invariant, v.job]),
    [["no stale report applied", c]],
  );
  await lh.dispose();
});

test("when an end's answer was lost, a beat accepted up to a second after its ending statement began is not stale; one sent later is", async () => {
  const { lh, jobs, logs, check } = await scenario();
  const [a, , c] = jobs.map((j) => j.id);
  // The completion's answer never came back (a reset connection): only the database's
  // ended_at, the statement's start, says when it ran.
  const complete = logs.find((l) => l.ev === "report" && l.kind === "complete")!;
  Object.assign(complete, { accepted: null, error: "Error: read ECONNRESET" });
  const { rows } = await lh.pool.query<{ ended: number }>("SELECT (extract(epoch FROM max(ended_at)) * 1000)::float8 AS ended FROM all_attempts");
  const ended = rows[0]!.ended;
  for (const [job, afterMs] of [
    [a!, 500],
    [c!, 1_500],
  ] as const) {
    logs.push({ ev: "report", kind: "heartbeat", t: ended + afterMs + 5, sentAt: ended + afterMs, w: "w1", sent: [[job, 1]], accepted: [job] });
  }
  const r = await check();
  assert.deepEqual(
    r.violations.map((v) => [v.invariant, v.job]),
    [["no stale report applied", c]],
  );
  await lh.dispose();
});

test("a hung handler may end late by as long as a database restart held up its end, and no later", async () => {
  const { lh, jobs, logs } = await scenario();
  const a = jobs[0]!;
  const { rows } = await lh.pool.query<{ ended: Date }>("SELECT ended_at AS ended FROM all_attempts WHERE job_id = $1", [a.id]);
  const ended = rows[0]!.ended.getTime();
  // Hung 5 s before it ended; the bound without faults is 1.5 + 0.5 + 1 s.
  logs.push({ ev: "hang", t: ended - 5_000, w: "w1/host-1-a", job: a.id, attempt: a.attempt });
  const options = { progressTimeoutMs: 1_500, watchdogIntervalMs: 500, leaseMs: 0 };
  const restart: FaultRecord = { kind: "pg_restart", at: ended - 3_000, durationMs: 1_500, held: [] };
  const check = (faults: FaultRecord[]) =>
    checkInvariants({ admin: lh.pool, jobs: 3, logs, faults, unexpectedExits: [], options } as Parameters<typeof checkInvariants>[0]);
  assert.deepEqual(invariantsOf(await check([])), ["hung handlers end"]);
  assert.deepEqual(invariantsOf(await check([restart])), []);
  // A reset of another worker's connections explains nothing.
  const elsewhere: FaultRecord = { kind: "reset", target: "w2", at: ended - 3_000, durationMs: 1_500, endedAt: ended - 1_500, held: [] };
  assert.deepEqual(invariantsOf(await check([elsewhere])), ["hung handlers end"]);
  await lh.dispose();
});

test("--record off: jobs that left no record pass through the run's ledger when their attempt settled ok, and one deleted without that is a lost job", async () => {
  const lh = await freshLeasehold();
  await lh.pool.query(DOWNSTREAM_SQL);
  await recordOff(lh, lh.pool);
  await lh.enqueueMany([0, 1, 2].map((seq) => ({ task: "chaos", queue: "chaos", payload: { seq } })));
  const jobs = await store.claimJobs(lh.pool, { queues: ["chaos"], limit: 10, workerId: "w1", leaseMs: LEASE, tasks: ["chaos"] });
  assert.equal(jobs.length, 3);
  const logs: LogLine[] = [];
  for (const j of jobs) logs.push({ ev: "start", t: Date.now(), w: "w1", job: j.id, attempt: j.attempt });
  // Two handlers settled ok; the third never did (a core that deleted its row anyway loses it).
  for (const j of jobs.slice(0, 2)) logs.push({ ev: "settled", t: Date.now(), w: "w1", job: j.id, attempt: j.attempt, ok: true });
  const sentAt = Date.now();
  const done = await store.completeJobs(lh.pool, { workerId: "w1", jobs: jobs.map((j) => ({ id: j.id, attempt: j.attempt })) });
  logs.push({ ev: "report", kind: "complete", t: Date.now(), sentAt, w: "w1", sent: jobs.map((j) => [j.id, j.attempt]), accepted: [...done.keys()] });
  assert.equal((await lh.pool.query("SELECT count(*)::int AS n FROM finished_jobs")).rows[0].n, 0, "no record kept");

  const r = await checkInvariants({ admin: lh.pool, jobs: 3, logs, faults: [], unexpectedExits: [] });
  assert.equal(r.notKept, 3);
  assert.equal(r.finished.succeeded, 3, "every job accounted for through the ledger");
  assert.deepEqual(invariantsOf(r), ["no job lost or stuck"]);
  assert.equal(r.violations.length, 1, JSON.stringify(r.violations));
  assert.equal(r.violations[0]!.job, jobs[2]!.id);
  assert.match(r.violations[0]!.detail, /left jobs without a record, but attempt 1 by w1 neither settled ok nor committed its transaction/);
  await lh.dispose();
});
