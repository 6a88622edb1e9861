/**
 * Durable steps when a worker process dies (kill -9) in the middle of a durable job: between a
 * step's body and its record, right after a record, inside and after a transactional step's
 * commit, during a sleep and during a wait for an event. Another worker finishes each job; the
 * side-effect rows the step bodies write (app.effects) and the transactional step's ledger rows
 * show that no recorded step ran again and no transactional write landed twice.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { eventually, freshLeasehold, uniqueSchema } from "./helpers/db.js";
import { APP_TABLES, tripTask, type TripPayload } from "./helpers/durable-trip.js";
import { durableWorkerChild } from "./helpers/processes.js";

type Lh = Awaited<ReturnType<typeof freshLeasehold>>;

async function appSchema(t: { after(fn: () => Promise<void>): void }, lh: Lh): Promise<string> {
  const app = uniqueSchema("app");
  await lh.pool.query(`CREATE SCHEMA ${app}; ${APP_TABLES(app)}`);
  t.after(async () => void (await lh.pool.query(`DROP SCHEMA IF EXISTS ${app} CASCADE`).catch(() => {})));
  return app;
}

/** Which attempts ran each step body ("step": [attempts]), and which attempts' ledger rows stand. */
async function sideEffects(lh: Lh, app: string, id: string) {
  const effects = await lh.pool.query<{ step: string; attempts: number[] }>(
    `SELECT step, array_agg(attempt ORDER BY attempt) AS attempts FROM ${app}.effects WHERE job_id = $1 GROUP BY step`,
    [id],
  );
  const ledger = await lh.pool.query<{ attempt: number }>(`SELECT attempt FROM ${app}.ledger WHERE job_id = $1 ORDER BY attempt`, [id]);
  return { ran: Object.fromEntries(effects.rows.map((r) => [r.step, r.attempts])), ledger: ledger.rows.map((r) => r.attempt) };
}

test("kill -9 at each point of a durable job: another worker finishes it, recorded steps never run again, transactional writes land once", async (t) => {
  const lh = await freshLeasehold(t);
  const app = await appSchema(t, lh);
  const victim = await durableWorkerChild(t, lh.schema, app);
  const at = (point: string, id: string) => victim.output().includes(`at ${point} ${id}\n`);
  const enqueue = async (p: TripPayload) => (await lh.enqueue("trip", p, { maxAttempts: 5 })).id;

  const afterReserve = await enqueue({ trip: "t1", hold: "after-reserve" });
  const inBook = await enqueue({ trip: "t2", hold: "in-book" });
  const afterBook = await enqueue({ trip: "t3", hold: "after-book" });
  const sleeping = await enqueue({ trip: "t4", sleep: "1s" });
  const waiting = await enqueue({ trip: "t5", wait: true });
  await eventually(async () => at("after-reserve", afterReserve) && at("in-book", inBook) && at("after-book", afterBook), "the jobs at their points");
  for (const id of [sleeping, waiting]) await eventually(async () => (await lh.getJob(id)).job.state === "suspended", `job ${id} suspended`);
  // Last, alone: the held record stops the worker's record batches, which the others needed.
  const recordHeld = await enqueue({ trip: "t6", hold: "record-charge" });
  await eventually(async () => at("record-charge", recordHeld), "the charge body ran, its record held");

  // Before the kill: what each job had done, as the database holds it.
  const recorded = async (id: string) =>
    (await lh.pool.query<{ name: string }>(`SELECT name FROM job_steps WHERE job_id = $1 ORDER BY seq`, [id])).rows.map((r) => r.name);
  assert.deepEqual((await sideEffects(lh, app, recordHeld)).ran, { reserve: [1], charge: [1] }, "the charge body ran");
  assert.deepEqual(await recorded(recordHeld), ["reserve"], "and its record does not exist");
  assert.deepEqual(await recorded(afterReserve), ["reserve"]);
  assert.deepEqual(await recorded(inBook), ["reserve", "charge"]);
  assert.deepEqual(await recorded(afterBook), ["reserve", "charge", "book"]);
  assert.deepEqual(await recorded(sleeping), ["reserve", "charge", "book", "cool off"]);
  assert.deepEqual(await recorded(waiting), ["reserve", "charge", "book", "approval"]);
  assert.deepEqual((await sideEffects(lh, app, inBook)).ledger, [], "the open transaction's write is not visible");

  victim.child.kill("SIGKILL");
  await new Promise((resolve) => victim.child.once("exit", resolve));
  // Sent after the process died: it wakes the waiting job, for whichever worker runs it next.
  await lh.sendEvent("trip.approved", { trip: "t5", by: "ann" });

  const watchdog = lh.watchdog({ intervalMs: 200 }).start();
  t.after(() => watchdog.stop());
  const rescuer = lh.worker({ watchdog: false, scheduler: false, handlers: { trip: tripTask(lh.pool, app, { holding: false }) } });
  await rescuer.start();
  t.after(() => rescuer.stop(0));

  const all = { afterReserve, recordHeld, inBook, afterBook, sleeping, waiting };
  const outcome: Record<string, { outcomes: string[]; spent: number; ran: Record<string, number[]>; ledger: number[] }> = {};
  for (const [name, id] of Object.entries(all)) {
    const { job, attempts } = await eventually(
      async () => {
        const r = await lh.getJob(id);
        return r.job.state === "succeeded" ? r : undefined;
      },
      `job ${name} succeeded`,
      30_000,
    );
    outcome[name] = { outcomes: attempts.map((a) => a.outcome ?? "?"), spent: job.spentAttempts, ...(await sideEffects(lh, app, id)) };
  }
  // The attempts the dead worker held were recovered (its liveness lock gone: worker_lost; or its
  // lease expired); the suspended ones held nothing and were simply resumed.
  const lost = (o: string[]) => o.length === 2 && ["worker_lost", "lease_expired"].includes(o[0]!) && o[1] === "succeeded";
  for (const name of ["afterReserve", "recordHeld", "inBook", "afterBook"])
    assert.ok(lost(outcome[name]!.outcomes), `${name}: ${outcome[name]!.outcomes}`);
  for (const name of ["sleeping", "waiting"]) {
    assert.deepEqual(outcome[name]!.outcomes, ["suspended", "succeeded"], name);
    assert.equal(outcome[name]!.spent, 0, `${name}: a suspension spends no retry`);
  }

  // The side effects per step body, by attempt. Only the charge whose record never existed ran
  // again (the one case where a step body runs twice: it had no record, by design at least once).
  assert.deepEqual(outcome.afterReserve!.ran, { reserve: [1], charge: [2], notify: [2] });
  assert.deepEqual(outcome.recordHeld!.ran, { reserve: [1], charge: [1, 2], notify: [2] });
  assert.deepEqual(outcome.inBook!.ran, { reserve: [1], charge: [1], notify: [2] });
  assert.deepEqual(outcome.afterBook!.ran, { reserve: [1], charge: [1], notify: [2] });
  assert.deepEqual(outcome.sleeping!.ran, { reserve: [1], charge: [1], notify: [2] });
  assert.deepEqual(outcome.waiting!.ran, { reserve: [1], charge: [1], notify: [2] });
  // The transactional step's write, exactly once: the killed transaction rolled back (in-book:
  // only the second attempt's), the committed one was replayed, not run again (the others).
  assert.deepEqual(outcome.inBook!.ledger, [2]);
  for (const name of ["afterReserve", "recordHeld"]) assert.deepEqual(outcome[name]!.ledger, [2], name);
  for (const name of ["afterBook", "sleeping", "waiting"]) assert.deepEqual(outcome[name]!.ledger, [1], name);
  assert.deepEqual((await lh.getJob(waiting)).job.result, { trip: "t5", approvedBy: "ann" });
});
