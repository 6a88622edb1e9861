/**
 * The chaos suite's flow-control invariants (chaos/flow-checks.ts) must be able to fail: an
 * audit trail left by real limited claims passes, and each way a broken limit, pause or crash
 * detection would show in it is reported. Times are µs on the database's clock.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import * as store from "../packages/leasehold/src/store/index.js";
import { NEXT_START_MS, SLOT_BACK_MS, checkFlow, loadFlowAttempts, type FlowAttempt } from "../chaos/flow-checks.js";
import type { FlowQueue } from "../chaos/flow-queues.js";
import { pauseWindow, resumeWindow, type FaultRecord } from "../chaos/faults.js";
import { checkInvariants } from "../chaos/invariants.js";
import { DOWNSTREAM_SQL } from "../chaos/downstream.js";
import { freshLeasehold } from "./helpers/db.js";

const LEASE = 30_000;
const S = 1_000_000; // 1 s in µs
const T0 = Date.UTC(2026, 10, 26) * 1000;

function attempt(job: string, started: number, ended: number, more: Partial<FlowAttempt> = {}): FlowAttempt {
  return { job, attempt: 1, worker: "w1", outcome: "succeeded", queue: "q", key: null, started: T0 + started, ended: T0 + ended, ...more };
}
const invariantsOf = (r: { violations: { invariant: string }[] }) => r.violations.map((v) => v.invariant);

test("limited claims through claim_flow leave an audit trail the flow checker passes; an attempt past a limit breaks it", async () => {
  const lh = await freshLeasehold();
  await lh.pool.query(DOWNSTREAM_SQL); // the run's schema: the checker reads its audit views
  const queues: FlowQueue[] = [
    { name: "lim", share: 0, limits: { concurrency: 2 } },
    { name: "keyed", share: 0, limits: { keyConcurrency: 1 } },
    { name: "rated", share: 0, limits: { rate: { limit: 3, windowMs: 60_000 } } },
  ];
  for (const q of queues) await lh.setQueueLimits(q.name, q.limits, { create: true });
  await lh.enqueueMany([
    ...[0, 1, 2, 3, 4].map((i) => ({ task: "chaos", queue: "lim", payload: { seq: i } })),
    ...["a", "a", "b"].map((key, i) => ({ task: "chaos", queue: "keyed", key, payload: { seq: 10 + i, key } })),
    ...[0, 1, 2, 3, 4].map((i) => ({ task: "chaos", queue: "rated", payload: { seq: 20 + i } })),
  ]);
  const names = queues.map((q) => q.name);
  const claim = () => store.claimJobs(lh.pool, { queues: names, flowQueues: names, limit: 50, workerId: "w1", leaseMs: LEASE, tasks: ["chaos"] });
  const complete = (jobs: { id: string; attempt: number }[]) =>
    store.completeJobs(lh.pool, { workerId: "w1", jobs: jobs.map((j) => ({ id: j.id, attempt: j.attempt })) });
  const rounds: number[][] = [];
  for (let i = 0; i < 3; i++) {
    const jobs = await claim();
    rounds.push(names.map((q) => jobs.filter((j) => j.queue === q).length));
    await complete(jobs);
  }
  // Each round within the limits: 2 of lim, one per key, the rate's 3 and then none.
  assert.deepEqual(rounds, [
    [2, 2, 3],
    [2, 1, 0],
    [1, 0, 0],
  ]);
  const held = await claim(); // rated's rest stays waiting; nothing else is left
  assert.equal(held.length, 0);

  const attempts = await loadFlowAttempts(lh.pool, names);
  assert.equal(attempts.length, 11); // 5 of lim, 3 keyed, 3 of rated (2 left waiting by the rate)
  assert.deepEqual([...new Set(attempts.filter((a) => a.queue === "keyed").map((a) => a.key))].sort(), ["a", "b"]);
  const clean = checkFlow(attempts, [], queues);
  assert.deepEqual(clean.violations, []);
  assert.deepEqual(
    clean.result.limits.map((l) => [l.queue, l.peak, l.max]),
    [
      ["lim", 2, 2],
      ["keyed", 1, 1],
      ["rated", 3, 3],
    ],
  );

  // One more attempt of a lim job, recorded over the whole history: three at once.
  const [first] = attempts.filter((a) => a.queue === "lim");
  await lh.pool.query(
    `INSERT INTO job_attempts (job_id, attempt, worker_id, started_at, ended_at, outcome)
     VALUES ($1, 7, 'w9', now() - interval '1 hour', now(), 'lease_expired')`,
    [first!.job],
  );
  // A keyed job's attempt moved to overlap the other attempt of its key, and a fourth start in the rate's window.
  const keyA = attempts.filter((a) => a.key === "a").sort((x, y) => x.started - y.started);
  await lh.pool.query("UPDATE job_history SET started_at = started_at - interval '1 minute' WHERE id = $1", [keyA[1]!.job]);
  const rated = attempts.find((a) => a.queue === "rated")!;
  await lh.pool.query(
    `INSERT INTO job_attempts (job_id, attempt, worker_id, started_at, ended_at, outcome) VALUES ($1, 8, 'w9', now(), now(), 'failed')`,
    [rated.job],
  );
  const broken = checkFlow(await loadFlowAttempts(lh.pool, names), [], queues);
  // The extra lim attempt overlaps both rounds of two: two instants with three.
  assert.deepEqual([...new Set(invariantsOf(broken))].sort(), [
    "key concurrency within its limit",
    "queue concurrency within its limit",
    "starts within the queue's rate",
  ]);
  assert.match(broken.violations[0]!.detail, /lim: 3 attempts held slots .* \(limit 2\)/);
  await lh.dispose();
});

test("a slot is held from the claim to the attempt's recorded end: recovery frees it then, whatever the frozen handler did", () => {
  const queues: FlowQueue[] = [{ name: "q", share: 0, limits: { concurrency: 1 } }];
  // A frozen worker's attempt, recovered when its lease ran out at 10 s; the next claim starts after.
  const frozen = attempt("1", 0, 10 * S, { outcome: "lease_expired" });
  assert.deepEqual(checkFlow([frozen, attempt("2", 10 * S + 1, 11 * S, { worker: "w2" })], [], queues).violations, []);
  // Ending at the very instant the next claim starts, it has freed its slot.
  assert.deepEqual(checkFlow([frozen, attempt("2", 10 * S, 11 * S, { worker: "w2" })], [], queues).violations, []);
  // A claim a microsecond before the recovery took a slot the queue did not have.
  const r = checkFlow([frozen, attempt("2", 10 * S - 1, 11 * S, { worker: "w2" })], [], queues);
  assert.deepEqual(invariantsOf(r), ["queue concurrency within its limit"]);
  assert.match(r.violations[0]!.detail, /2 attempts held slots .*job 1 attempt 1 \(w1.*job 2 attempt 1 \(w2/);
});

test("key concurrency counts per key: three at once on a key is its limit, a fourth breaks it, other keys apart", () => {
  const queues: FlowQueue[] = [{ name: "q", share: 0, limits: { keyConcurrency: 3 } }];
  const onKey = (key: string, n: number) => Array.from({ length: n }, (_, i) => attempt(`${key}${i}`, i, 5 * S, { key }));
  const ok = checkFlow([...onKey("a", 3), ...onKey("b", 3)], [], queues);
  assert.deepEqual(ok.violations, []);
  assert.equal(ok.result.limits[0]!.peak, 3);
  const over = checkFlow([...onKey("a", 4), ...onKey("b", 3)], [], queues);
  assert.deepEqual(invariantsOf(over), ["key concurrency within its limit"]);
  assert.match(over.violations[0]!.detail, /key a: 4 attempts/);
});

test("a rate counts the starts in every window (t - window, t], a claim's jobs together", () => {
  const queues: FlowQueue[] = [{ name: "q", share: 0, limits: { rate: { limit: 2, windowMs: 1_000 } } }];
  const at = (...ts: number[]) => ts.map((t, i) => attempt(String(i), t, t + 10));
  // A start exactly one window later no longer sees the first.
  assert.deepEqual(checkFlow(at(0, S / 2, S), [], queues).violations, []);
  assert.deepEqual(invariantsOf(checkFlow(at(0, S / 2, S - 1), [], queues)), ["starts within the queue's rate"]);
  // One claim of three jobs at once.
  assert.deepEqual(invariantsOf(checkFlow(at(0, 5 * S, 5 * S, 5 * S), [], queues)), ["starts within the queue's rate"]);
});

test("a paused queue starts nothing between the pause's commit and the resume; a claim that raced the pause is counted, not failed", () => {
  const queues: FlowQueue[] = [];
  const pause = (resumeFromUs?: number): FaultRecord => ({
    kind: "pause",
    at: 0,
    durationMs: 4_000,
    held: [],
    pause: { queue: "q", pausedAtUs: T0 + S, confirmedUs: T0 + S + 2_000, ...(resumeFromUs !== undefined && { resumeFromUs }) },
  });
  const raced = attempt("1", S + 1_000, 2 * S);
  const after = attempt("2", 5 * S, 6 * S);
  const r = checkFlow([raced, after], [pause(T0 + 5 * S)], queues);
  assert.deepEqual(r.violations, []);
  assert.deepEqual(r.result.pauses, [{ queue: "q", durationMs: 4_000, startsInside: 0, raced: 1, waitingAtResume: null }]);
  const inside = checkFlow([raced, attempt("3", S + 2_001, 2 * S)], [pause(T0 + 5 * S)], queues);
  assert.deepEqual(
    inside.violations.map((v) => [v.invariant, v.job]),
    [["a paused queue starts nothing", "3"]],
  );
  // Never resumed: any later start is inside.
  assert.deepEqual(invariantsOf(checkFlow([after], [pause()], queues)), ["a paused queue starts nothing"]);
});

test("a killed worker's slot comes back within crash detection, and the job waiting for it starts; a slot freed only by its lease breaks it", () => {
  const queues: FlowQueue[] = [];
  const kill = T0 / 1000 + 100_000; // ms, wall clock
  const probe: FaultRecord = {
    kind: "flow_kill",
    target: "w1",
    at: kill,
    held: [],
    probe: { queue: "q", blocker: { job: "1", attempt: 1 }, blocked: "2" },
  };
  const trail = (slotBackMs: number, nextMs: number) => [
    attempt("1", 99_000 * 1000, (100_000 + slotBackMs) * 1000, { outcome: "worker_lost" }),
    attempt("2", (100_000 + nextMs) * 1000, (100_000 + nextMs + 50) * 1000, { worker: "w2" }),
    attempt("1", (100_000 + nextMs + 60) * 1000, (100_000 + nextMs + 6_000) * 1000, { attempt: 2, worker: "w2" }),
  ];
  const ok = checkFlow(trail(1_200, 1_400), [probe], queues);
  assert.deepEqual(ok.violations, []);
  assert.deepEqual(ok.result.probes, { n: 1, slotBackMs: [1_200], nextStartMs: [1_400], notMeasured: [] });
  // Crash detection off: the slot came back when its 30 s lease ran out.
  const late = checkFlow(trail(30_500, 30_600), [probe], queues);
  assert.deepEqual(
    late.violations.map((v) => [v.invariant, v.job]),
    [
      ["a crashed worker's slot comes back in time", "1"],
      ["a crashed worker's slot comes back in time", "2"],
    ],
  );
  // The slot came back in time, but nothing took it for longer than a claim takes.
  const idle = checkFlow(trail(SLOT_BACK_MS, NEXT_START_MS + 1), [probe], queues);
  assert.deepEqual(
    idle.violations.map((v) => v.job),
    ["2"],
  );
  // A database restart just before the kill: no worker is called lost in its start-up grace.
  const restart: FaultRecord = { kind: "pg_restart", at: kill - 3_000, durationMs: 1_000, held: [] };
  const excused = checkFlow(trail(30_500, 30_600), [restart, probe], queues);
  assert.deepEqual(excused.violations, []);
  assert.equal(excused.result.probes.notMeasured.length, 1);
  // A late start after a terminate storm, or after two other workers went down, measures those
  // faults: the slot's return is still checked, the start is not. One other worker down is no excuse.
  const storm: FaultRecord = { kind: "terminate_storm", at: kill + 2_000, held: [] };
  const stormed = checkFlow(trail(1_200, NEXT_START_MS + 2_000), [probe, storm], queues);
  assert.deepEqual(stormed.violations, []);
  assert.deepEqual(stormed.result.probes.nextStartMs, []);
  assert.match(stormed.result.probes.notMeasured[0]!, /^2: its start, after terminate_storm$/);
  const killed = (target: string, at: number): FaultRecord => ({ kind: "kill", target, at, held: [] });
  const twoDown = checkFlow(trail(1_200, NEXT_START_MS + 2_000), [probe, killed("w2", kill + 1_000), killed("w4", kill + 2_500)], queues);
  assert.deepEqual(twoDown.violations, []);
  const oneDown = checkFlow(trail(1_200, NEXT_START_MS + 2_000), [probe, killed("w2", kill + 1_000)], queues);
  assert.deepEqual(
    oneDown.violations.map((v) => v.job),
    ["2"],
  );
  const slowSlot = checkFlow(trail(30_500, 30_600), [probe, storm], queues);
  assert.deepEqual(
    slowSlot.violations.map((v) => v.job),
    ["1"],
    "a storm excuses the start, never the slot",
  );
});

test("a paused queue without limits is checked too: a claim that ignored the pause breaks the run, claims after the resume do not", async () => {
  const lh = await freshLeasehold();
  await lh.pool.query(DOWNSTREAM_SQL);
  await lh.enqueueMany([0, 1, 2].map((seq) => ({ task: "chaos", queue: "plain", payload: { seq } })));
  const [first] = await lh.enqueueMany([{ task: "chaos", queue: "plain", payload: { seq: 3 } }]);
  const claimAndComplete = async () => {
    const settings = await store.queueSettings(lh.pool);
    const flowQueues = settings.filter((q) => q.flow).map((q) => q.name);
    const jobs = await store.claimJobs(lh.pool, { queues: ["plain"], flowQueues, limit: 10, workerId: "w1", leaseMs: LEASE, tasks: ["chaos"] });
    await store.completeJobs(lh.pool, { workerId: "w1", jobs: jobs.map((j) => ({ id: j.id, attempt: j.attempt })) });
    return jobs.length;
  };
  const window = await pauseWindow(lh, lh.pool, "plain");
  assert.equal(await claimAndComplete(), 0, "the pause holds the claim back");
  // A claim that ignored the pause: job 3 leased and completed inside the window.
  await lh.pool.query(
    `UPDATE jobs SET state = 'running', attempt = attempt + 1, fence = nextval('fence_seq'), locked_by = 'w1',
            lease_until = now() + interval '30 seconds', heartbeat_at = now(), started_at = now(), progress_at = now()
      WHERE id = $1`,
    [first!.id],
  );
  await store.completeJobs(lh.pool, { workerId: "w1", jobs: [{ id: first!.id, attempt: 1 }] });
  await resumeWindow(lh, lh.pool, window);
  assert.equal(window.waitingAtResume, 3);
  assert.equal(await claimAndComplete(), 3);
  const pause: FaultRecord = { kind: "pause", target: "plain", at: 0, durationMs: 0, held: [], pause: window };
  const check = (faults: FaultRecord[]) => checkInvariants({ admin: lh.pool, jobs: 4, logs: [], faults, unexpectedExits: [] });
  const r = await check([pause]);
  assert.deepEqual(
    r.violations.map((v) => [v.invariant, v.job]),
    [["a paused queue starts nothing", first!.id]],
  );
  assert.deepEqual(r.flow.pauses, [{ queue: "plain", durationMs: 0, startsInside: 1, raced: 0, waitingAtResume: 3 }]);
  await lh.dispose();
});
