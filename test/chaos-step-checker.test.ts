/**
 * The chaos suite's invariants for durable jobs (chaos/step-checks.ts) must be able to fail: the
 * chaos workload's own durable jobs, run by a real worker with their events sent by the harness's
 * EventSender (one before its wait, one once the job is seen waiting, one never: it times out),
 * leave an audit trail the checker passes; each way a step run again, an unexplained re-execution,
 * a transactional step's row, a job left suspended past its wake or a lost event would show in it
 * is reported.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { DOWNSTREAM_SQL } from "../chaos/downstream.js";
import { EventSender } from "../chaos/event-sender.js";
import { ProcessLog } from "../chaos/process-log.js";
import { checkSteps, loadStepAudit } from "../chaos/step-checks.js";
import { TASK, chaosHandler, makeJob, type ChaosPayload } from "../chaos/workload.js";
import { seededRandom } from "../chaos/config.js";
import type { DurablePlan } from "../chaos/durable-workload.js";
import { freshLeasehold } from "./helpers/db.js";

test("durable chaos jobs run by a real worker pass the step checker; a step run again, an unexplained run, a lost transactional row or a lost event break it", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.pool.query(DOWNSTREAM_SQL);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "chaos-steps-"));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const random = seededRandom(27);
  // Short work, and the three ways an event comes: before the wait, after it began, never (timed out).
  const sends: DurablePlan["send"][] = [{ from: "enqueued", afterMs: 0 }, { from: "suspended", afterMs: 100 }, null];
  const jobs = sends.map((send, i) => {
    const job = makeJob(i + 1, random, 2_500, 5, 1);
    const p = job.payload as ChaosPayload;
    // No injected failure: attempts are then exactly what the test expects.
    const durable: DurablePlan = { ...p.durable!, stepMs: p.durable!.stepMs.map(() => 20), sleepMs: 200, send };
    if (send === null) durable.timeoutMs = 300;
    else delete durable.timeoutMs;
    return { ...job, payload: { ...p, failRate: 0, durable } };
  });
  let workerId = "";
  const handler = chaosHandler(lh.pool, new ProcessLog(path.join(dir, "w.jsonl")), () => workerId, { hangNext: 0 }, undefined, lh.schema);
  const worker = lh.worker({ handlers: { [TASK]: handler }, queues: ["chaos"], concurrency: 3 });
  workerId = worker.id;
  await worker.start();
  t.after(() => worker.stop(0));
  const events = new EventSender(lh, () => {});
  events.start();
  t.after(() => events.stop());
  const ids = (await lh.enqueueMany(jobs)).map((j) => j.id);
  events.schedule(jobs);
  for (let i = 0; i < 750 && (await lh.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM jobs")).rows[0]!.n > 0; i++) {
    await new Promise((r) => setTimeout(r, 20));
  }
  const [early, late, never] = ids as [string, string, string];

  const clean = checkSteps(await loadStepAudit(lh.pool));
  assert.deepEqual(clean.violations, []);
  assert.equal(clean.result.durableJobs, 3);
  assert.equal(clean.result.transactionalSteps, 3);
  assert.equal(clean.result.reExecutions.length, 0);
  assert.equal(clean.result.runs, clean.result.stepsRecorded);
  assert.deepEqual(clean.result.waits, { received: 2, eventBeforeWait: 1, timedOut: 1, neverSent: 1 });
  // Every job slept (suspended); the late one and the timed-out one also suspended in their wait.
  assert.equal(clean.result.suspensions.sleeps, 3);
  assert.equal(clean.result.suspensions.waits, 2);

  // A later attempt ran a step recorded before it; a step recorded by an attempt that succeeded
  // without running it leaves that run unexplained; a transactional row lost; an event sent well
  // before the wait's deadline, yet the wait timed out.
  await lh.pool.query(
    `INSERT INTO step_runs (job_id, name, attempt, worker_id, began)
     SELECT job_id, name, attempt + 1, worker_id, now() FROM step_runs WHERE job_id = $1 AND name = 'work-0'`,
    [early],
  );
  await lh.pool.query(`UPDATE job_steps SET attempt = attempt + 5 WHERE job_id = $1 AND name = 'finish'`, [late]);
  // Its sleep ended a minute earlier: jobs enqueued long after that wake started before it ran again.
  await lh.pool.query(`UPDATE job_steps SET wake_at = wake_at - interval '1 minute' WHERE job_id = $1 AND name = 'nap'`, [early]);
  await lh.pool.query(`DELETE FROM step_effects WHERE job_id = $1`, [late]);
  await lh.pool.query(
    `INSERT INTO events (name, data, sent_at) SELECT $2, '{}', s.wake_at - interval '5 seconds' FROM job_steps AS s WHERE s.job_id = $1 AND s.name = 'signal'`,
    [never, (jobs[2]!.payload as ChaosPayload).durable!.event],
  );
  const broken = checkSteps(await loadStepAudit(lh.pool));
  assert.deepEqual(
    broken.violations.map((v) => [v.invariant, v.job]),
    [
      ["a recorded step is never executed again", early],
      ["a recorded step is never executed again", late],
      ["every step re-execution is explained", early], // by an attempt with no audit row
      ["every step re-execution is explained", late],
      ["durable jobs end and receive their events", early],
      ["durable jobs end and receive their events", never],
      ["transactional steps exactly once", late],
    ],
  );
});
