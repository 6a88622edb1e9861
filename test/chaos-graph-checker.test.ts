/**
 * The chaos suite's invariants for jobs that build on jobs (chaos/graph-checks.ts) must be able
 * to fail: a clean audit trail of a chain, a 'run' node after a dead parent and a batch passes,
 * and each way a broken dependency, release, callback or result would show in it is reported.
 * Times are µs on the database's clock.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { checkGraphs, loadGraphAudit, type GraphAttempt, type GraphAudit, type GraphJob } from "../chaos/graph-checks.js";
import type { JobContext } from "../packages/leasehold/src/index.js";
import { freshLeasehold } from "./helpers/db.js";

test("a real graph and batch run by a worker leave an audit trail the graph checker passes; tampered rows break it", async (t) => {
  const lh = await freshLeasehold(t);
  let workerId = "";
  // The chaos handler's result in short: its attempt and worker, what it read of its parents.
  const handler = async (p: { seq: number; poison?: boolean; callback?: boolean }, ctx: JobContext) => {
    if (p.poison) throw new Error("poison");
    const result = { seq: p.seq, attempt: ctx.attempt, worker: workerId };
    if (p.callback) return { ...result, dependencies: await ctx.dependencies() };
    return { ...result, parents: (await ctx.parents()).map((x) => ({ id: x.id, state: x.state })) };
  };
  const node = (seq: number, more: object = {}) => ({ task: "chaos", payload: { seq, graph: { role: "node" }, ...more }, maxAttempts: 1 });
  const { jobs } = await lh.enqueueFlow([
    { ref: "a", ...node(1) },
    { ref: "b", ...node(2), dependsOn: ["a"] },
    { ref: "c", ...node(3, { poison: true }) },
    { ref: "d", ...node(4), dependsOn: ["c"] },
    { ref: "e", ...node(5, { graph: { role: "node", onParentFailure: "run" } }), dependsOn: ["c", "a"], onParentFailure: "run" },
  ]);
  const member = (seq: number, poison = false) => ({ task: "chaos", payload: { seq, poison, graph: { role: "member" } }, maxAttempts: 1 });
  const batch = await lh.enqueueBatch({
    jobs: [member(6), member(7, true)],
    onComplete: { task: "chaos", payload: { seq: 8, callback: true, graph: { role: "callback", onParentFailure: "run" } } },
  });
  const worker = lh.worker({ handlers: { chaos: handler }, concurrency: 4 });
  workerId = worker.id;
  await worker.start();
  for (let i = 0; i < 500 && (await lh.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM jobs")).rows[0]!.n > 0; i++) {
    await new Promise((r) => setTimeout(r, 20));
  }
  await worker.stop();

  const audit = await loadGraphAudit(lh.pool);
  const clean = checkGraphs(audit);
  assert.deepEqual(clean.violations, []);
  assert.deepEqual(clean.result.dependents, { succeeded: 3, cancelled: 1 }); // b, e, the callback; d
  assert.equal(clean.result.batches, 1);
  assert.equal(clean.result.runOnFailure, 2);
  assert.equal(clean.result.results, 5); // a, b, e, member 6, the callback

  // b's start moved onto a's end; e's result names another attempt; the callback's counts miss the dead member.
  await lh.pool.query("UPDATE job_history SET started_at = (SELECT finished_at FROM job_history WHERE id = $1) WHERE id = $2", [jobs.a, jobs.b]);
  await lh.pool.query(`UPDATE job_history SET result = jsonb_set(result, '{attempt}', '2') WHERE id = $1`, [jobs.e]);
  await lh.pool.query(`UPDATE job_history SET result = jsonb_set(result, '{dependencies,dead}', '0') WHERE id = $1`, [batch.callbackId]);
  const broken = checkGraphs(await loadGraphAudit(lh.pool));
  assert.deepEqual(
    broken.violations.map((v) => [v.invariant, v.job]),
    [
      ["no job starts before its parents allow it", jobs.b],
      ["every batch callback succeeds exactly once", batch.callbackId],
      ["results belong to the attempt that succeeded", jobs.e],
    ],
  );
});

const MS = 1_000; // 1 ms in µs
const T0 = Date.UTC(2026, 10, 26) * 1000;

function job(id: string, state: string, more: Partial<GraphJob> = {}): GraphJob {
  const attempt = more.attempt ?? (state === "cancelled" || state === "blocked" ? 0 : 1);
  return {
    id,
    state,
    attempt,
    graph: { role: "node" },
    result: state === "succeeded" ? { seq: Number(id), attempt, worker: "w1" } : null,
    finished: null,
    ...more,
  };
}
const run = (job: string, started: number, ended: number, more: Partial<GraphAttempt> = {}): GraphAttempt => ({
  job,
  attempt: 1,
  worker: "w1",
  outcome: "succeeded",
  started: T0 + started,
  ended: T0 + ended,
  ...more,
});

/**
 * A chain 1 → 2 → 3, a dead parent 4 with a cancelled child 5 and a 'run' child 6, and a batch
 * of 7 (succeeded) and 8 (dead) with callback 9. Each start 1 ms after what it waits for.
 */
function clean(): GraphAudit {
  const parentsOf6 = [{ id: "4", state: "dead" }];
  return {
    jobs: [
      job("1", "succeeded", { finished: T0 + 10 * MS }),
      job("2", "succeeded", { finished: T0 + 20 * MS, result: { seq: 2, attempt: 1, worker: "w1", parents: [{ id: "1", state: "succeeded" }] } }),
      job("3", "succeeded", { finished: T0 + 30 * MS, attempt: 2, result: { seq: 3, attempt: 2, worker: "w2" } }),
      job("4", "dead", { finished: T0 + 40 * MS }),
      job("5", "cancelled", { finished: T0 + 40 * MS }),
      job("6", "succeeded", {
        finished: T0 + 50 * MS,
        graph: { role: "node", onParentFailure: "run" },
        result: { seq: 6, attempt: 1, worker: "w1", parents: parentsOf6 },
      }),
      job("7", "succeeded", { finished: T0 + 10 * MS, graph: { role: "member" } }),
      job("8", "dead", { finished: T0 + 12 * MS, graph: { role: "member" } }),
      job("9", "succeeded", {
        finished: T0 + 20 * MS,
        graph: { role: "callback" },
        result: { seq: 9, attempt: 1, worker: "w1", dependencies: { total: 2, succeeded: 1, dead: 1, cancelled: 0 } },
      }),
    ],
    edges: [
      { child: "2", parent: "1" },
      { child: "3", parent: "2" },
      { child: "5", parent: "4" },
      { child: "6", parent: "4" },
      { child: "9", parent: "7" },
      { child: "9", parent: "8" },
    ],
    attempts: [
      run("1", 0, 10 * MS),
      run("2", 11 * MS, 20 * MS),
      run("3", 21 * MS, 25 * MS, { outcome: "lease_expired" }),
      run("3", 26 * MS, 30 * MS, { attempt: 2, worker: "w2" }),
      run("4", 0, 40 * MS, { outcome: "failed" }),
      run("6", 41 * MS, 50 * MS),
      run("7", 0, 10 * MS),
      run("8", 0, 12 * MS, { outcome: "failed" }),
      run("9", 13 * MS, 20 * MS),
    ],
  };
}
const invariantsOf = (audit: GraphAudit) => checkGraphs(audit).violations.map((v) => v.invariant);
const change = (audit: GraphAudit, id: string, more: Partial<GraphJob>): GraphAudit => ({
  ...audit,
  jobs: audit.jobs.map((j) => (j.id === id ? { ...j, ...more } : j)),
});

test("a clean audit trail of a chain, a failed parent's children and a batch passes, with its counts", () => {
  const r = checkGraphs(clean());
  assert.deepEqual(r.violations, []);
  assert.deepEqual(r.result.dependents, { succeeded: 4, cancelled: 1 });
  assert.equal(r.result.batches, 1);
  assert.equal(r.result.runOnFailure, 2); // the 'run' node and the callback
  assert.deepEqual(r.result.stepMs, [1, 1, 1]); // 2, 3 and 6: 1 ms after their last parent
});

test("a job that starts before its parent succeeded, or at all after a failed parent, breaks invariant 13", () => {
  const early = clean();
  early.attempts = early.attempts.map((a) => (a.job === "2" ? { ...a, started: T0 + 10 * MS } : a)); // the same µs as 1's end
  assert.deepEqual(invariantsOf(early), ["no job starts before its parents allow it"]);
  assert.match(checkGraphs(early).violations[0]!.detail, /0 µs before parent 1 ended succeeded/);

  // 3's first attempt started before 2's end, though its second (the one that succeeded) after.
  const firstEarly = clean();
  firstEarly.attempts = firstEarly.attempts.map((a) => (a.job === "3" && a.attempt === 1 ? { ...a, started: T0 + 19 * MS } : a));
  assert.deepEqual(invariantsOf(firstEarly), ["no job starts before its parents allow it"]);

  // 5 ran though its parent ended dead (it did not ask to run on failure).
  const ranAnyway = change(clean(), "5", { state: "succeeded", attempt: 1, result: { seq: 5, attempt: 1, worker: "w1" } });
  ranAnyway.attempts.push(run("5", 41 * MS, 42 * MS));
  assert.deepEqual(invariantsOf(ranAnyway), ["no job starts before its parents allow it"]);
  assert.match(checkGraphs(ranAnyway).violations[0]!.detail, /parent 4 ended dead/);

  // The 'run' node started while its parent still ran.
  const runEarly = change(clean(), "4", { state: "running", finished: null });
  assert.ok(invariantsOf(runEarly).includes("no job starts before its parents allow it"));
});

test("a job still blocked once its parents ended, or cancelled without a failed parent, breaks invariant 14", () => {
  const stuck = change(clean(), "3", { state: "blocked", attempt: 0, finished: null, result: null });
  stuck.attempts = stuck.attempts.filter((a) => a.job !== "3");
  assert.deepEqual(invariantsOf(stuck), ["no job stays blocked once its parents have ended"]);
  assert.match(checkGraphs(stuck).violations[0]!.detail, /still blocked; its 1 parents all ended \(2 succeeded\)/);

  // Blocked while its parent runs is as it should be.
  const waitingParent = change(change(stuck, "2", { state: "running", finished: null, result: null }), "1", {});
  waitingParent.attempts = waitingParent.attempts.filter((a) => a.job !== "2");
  assert.deepEqual(invariantsOf(waitingParent), []);

  const cancelledForNothing = change(stuck, "3", { state: "cancelled", finished: T0 + 30 * MS });
  assert.deepEqual(invariantsOf(cancelledForNothing), ["no job stays blocked once its parents have ended"]);

  const runCancelled = change(clean(), "6", { state: "cancelled", attempt: 0, result: null });
  runCancelled.attempts = runCancelled.attempts.filter((a) => a.job !== "6");
  assert.deepEqual(invariantsOf(runCancelled), ["no job stays blocked once its parents have ended"]);
});

test("a batch callback that did not succeed exactly once, came twice, or read wrong counts breaks invariant 15", () => {
  const twice = clean();
  twice.attempts.push(run("9", 21 * MS, 22 * MS, { attempt: 2 }));
  assert.deepEqual(invariantsOf(twice), ["every batch callback succeeds exactly once"]);

  const dead = change(clean(), "9", { state: "dead", result: null });
  dead.attempts = dead.attempts.map((a) => (a.job === "9" ? { ...a, outcome: "failed" } : a));
  assert.deepEqual(invariantsOf(dead), ["every batch callback succeeds exactly once"]);

  const second = clean();
  second.jobs.push(job("10", "succeeded", { graph: { role: "callback" }, result: clean().jobs.find((j) => j.id === "9")!.result }));
  second.edges.push({ child: "10", parent: "7" });
  second.attempts.push(run("10", 13 * MS, 14 * MS));
  // Member 7 has two callbacks; callback 10 counted 2 members of its 1.
  assert.deepEqual(invariantsOf(second), ["every batch callback succeeds exactly once", "every batch callback succeeds exactly once"]);

  const miscounted = change(clean(), "9", {
    result: { seq: 9, attempt: 1, worker: "w1", dependencies: { total: 2, succeeded: 2, dead: 0, cancelled: 0 } },
  });
  assert.deepEqual(invariantsOf(miscounted), ["every batch callback succeeds exactly once"]);
  assert.match(checkGraphs(miscounted).violations[0]!.detail, /read counts .*"succeeded":2.*the members ended .*"succeeded":1,"dead":1/);

  const early = clean();
  early.attempts = early.attempts.map((a) => (a.job === "9" ? { ...a, started: T0 + 11 * MS } : a)); // before member 8 ended
  assert.deepEqual(invariantsOf(early), ["no job starts before its parents allow it"]);
});

test("a result from another attempt or worker, on a job that did not succeed, or parents misread breaks invariant 16", () => {
  const older = change(clean(), "3", { result: { seq: 3, attempt: 1, worker: "w1" } });
  assert.deepEqual(invariantsOf(older), ["results belong to the attempt that succeeded"]);
  assert.match(checkGraphs(older).violations[0]!.detail, /names attempt 1 by w1; attempt 2 by w2 ended succeeded/);

  // The same worker ran the older attempt: the attempt number alone tells them apart.
  const sameWorker = change(clean(), "3", { result: { seq: 3, attempt: 1, worker: "w2" } });
  assert.deepEqual(invariantsOf(sameWorker), ["results belong to the attempt that succeeded"]);

  const otherWorker = change(clean(), "3", { result: { seq: 3, attempt: 2, worker: "w1" } });
  assert.deepEqual(invariantsOf(otherWorker), ["results belong to the attempt that succeeded"]);

  const onDead = change(clean(), "4", { result: { seq: 4, attempt: 1, worker: "w1" } });
  assert.deepEqual(invariantsOf(onDead), ["results belong to the attempt that succeeded"]);

  const missing = change(clean(), "2", { result: null });
  assert.deepEqual(invariantsOf(missing), ["results belong to the attempt that succeeded"]);

  const misread = change(clean(), "6", { result: { seq: 6, attempt: 1, worker: "w1", parents: [{ id: "4", state: "succeeded" }] } });
  assert.deepEqual(invariantsOf(misread), ["results belong to the attempt that succeeded"]);
});
