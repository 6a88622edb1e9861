/**
 * The short chaos run inside `npm test`: separate worker and watchdog processes against a
 * PostgreSQL of the run's own (it gets restarted), every fault kind injected several times,
 * and the invariants checked afterwards. The long run is `npm run chaos -- --jobs 100000`.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { optionsFor, faultKindsFor } from "../chaos/config.js";
import { runChaos } from "../chaos/harness.js";
import { REPO_ROOT } from "../chaos/supervisor.js";

test("under kills, zombies, partitions, connection resets, restarts and storms no job is lost, no stale report lands, no attempt starts while another runs unsignalled and no flow limit or pause is broken", async (t) => {
  const options = optionsFor({
    outDir: path.join(REPO_ROOT, "chaos", "results"),
    jobs: 2_000,
    faultWindowMs: 40_000,
    faultEveryMs: 1_600,
    idleTxnMs: 15_000,
    drainTimeoutMs: 180_000, // generous: a slow CI machine drains slower; a lost job still fails the run
    verbose: process.env.CHAOS_VERBOSE === "1",
  });
  const { report, markdown, files } = await runChaos(options);
  for (const line of markdown.split("\n")) t.diagnostic(line);
  t.diagnostic(`report: ${files.markdown}`);

  assert.deepEqual(report.violations, [], `invariants broke; see ${files.markdown}`);
  // Graph jobs may end cancelled after a failed parent (invariant 14 says whether rightly).
  assert.equal((report.finished.succeeded ?? 0) + (report.finished.dead ?? 0) + (report.finished.cancelled ?? 0), options.jobs);
  assert.ok(report.graphs.batches > 0 && report.graphs.runOnFailure > 0, `no batch or no 'run' node: ${JSON.stringify(report.graphs)}`);
  assert.ok(report.graphs.results >= (report.finished.succeeded ?? 0), `results missing: ${JSON.stringify(report.graphs)}`);
  // Durable jobs ran, slept, waited (receiving events and timing out), and faults caught some between steps.
  const s = report.steps;
  assert.ok(s.durableJobs > 0 && s.stepsRecorded > 0 && s.transactionalSteps === s.durableJobs, `durable jobs missing: ${JSON.stringify(s)}`);
  assert.ok(s.suspensions.sleeps > 0 && s.suspensions.waits > 0, `no durable job suspended: ${JSON.stringify(s.suspensions)}`);
  assert.ok(s.waits.received > 0 && s.waits.timedOut > 0, `waits not exercised: ${JSON.stringify(s.waits)}`);
  assert.ok(s.replays > 0, "no attempt replayed a recorded step");
  for (const kind of faultKindsFor(options.dispatch)) assert.ok(report.faults[kind]! >= 1, `fault ${kind} was never injected`);
  for (const kind of ["kill", "zombie", "partition", "reset"] as const) {
    assert.ok(report.faults[kind]! >= 2, `fault ${kind} injected only ${report.faults[kind]} times`);
  }
  // The faults must have bitten: leases were lost and recovered, and zombies were refused.
  const recovered = report.recoveryMs.kill.n + report.recoveryMs.zombie.n + report.recoveryMs.partition.n;
  assert.ok(recovered > 0, "no job held by a faulted worker was recovered: the faults did nothing");
  assert.ok(report.duplicates.total > 0, "no duplicate execution: no lease was ever taken away from a live handler");
  const refused = report.staleRefused.heartbeat + report.staleRefused.complete + report.staleRefused.fail;
  assert.ok(refused > 0, "no stale report was refused: the zombies never came back to report");
  // The overlap invariant had timelines to read: handlers started, signals fired, handlers settled.
  const { timeline } = report.overlaps;
  assert.ok(timeline.started > 0 && timeline.aborted > 0 && timeline.settled > 0, `attempt timelines missing: ${JSON.stringify(timeline)}`);
  // Flow control was exercised: every limited queue ran attempts, a pause held jobs back, and a
  // killed worker's slot was measured.
  for (const l of report.flow.limits) assert.ok(l.attempts > 0, `no attempt in ${l.queue}`);
  assert.ok(
    report.flow.pauses.some((p) => (p.waitingAtResume ?? 0) > 0),
    `no pause held a job back: ${JSON.stringify(report.flow.pauses)}`,
  );
  assert.ok(report.flow.probes.slotBack.max !== null, `no killed worker's slot was measured: ${JSON.stringify(report.flow.probes)}`);
});
