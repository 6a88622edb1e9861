import { test } from "node:test";
import assert from "node:assert/strict";
import * as store from "../packages/leasehold/src/store/index.js";
import { freshLeasehold, databaseUrl, uniqueSchema, NO_BACKOFF, silent, eventually } from "./helpers/db.js";
import type { Queryable } from "../packages/leasehold/src/store/db.js";
import { ownsTurn, Watchdog } from "../packages/leasehold/src/maintenance/watchdog.js";

test("retention empties whole generations of finished jobs with their audit rows and keeps dead jobs longer", async (t) => {
  const lh = await freshLeasehold(t);
  const ids = (await lh.enqueueMany(Array.from({ length: 30 }, (_, i) => ({ task: "t", maxAttempts: i < 20 ? 2 : 1 })))).map((j) => j.id);
  const claim = () => store.claimJobs(lh.pool, { queues: ["default"], limit: 30, workerId: "w", leaseMs: 30_000, tasks: ["t"] });
  const refs = (await claim()).map((j) => ({ id: j.id, attempt: j.attempt }));
  // The first ten fail once (an audit row each) and then succeed; ten more succeed at once;
  // the last ten fail for good.
  await store.failJobs(lh.pool, { workerId: "w", failures: refs.slice(0, 10).map((r) => ({ ...r, error: "x", backoff: NO_BACKOFF })) });
  const again = (await claim()).map((j) => ({ id: j.id, attempt: j.attempt }));
  await store.completeJobs(lh.pool, { workerId: "w", jobs: [...again, ...refs.slice(10, 20)] });
  await store.failJobs(lh.pool, { workerId: "w", failures: refs.slice(20).map((r) => ({ ...r, error: "x", backoff: NO_BACKOFF })) });
  const attemptsOf = async (jobIds: string[]) =>
    (await lh.pool.query("SELECT count(*)::int AS n FROM all_attempts WHERE job_id = ANY($1::bigint[])", [jobIds])).rows[0].n as number;
  assert.equal(await attemptsOf(ids.slice(0, 10)), 20, "two attempts each: the failure's row and the history row's final attempt");
  const retention = lh.retention({ retainMs: 24 * 3600_000, retainDeadMs: 7 * 24 * 3600_000, batchSize: 3 });
  assert.equal(await retention.runOnce(), 0, "nothing is past retention yet");
  // Ten succeeded jobs finished two days ago (into the generation of that time), ten just now;
  // the ten dead ones two days ago.
  await lh.pool.query(
    `UPDATE job_history SET finished_at = now() - interval '2 days', generation = history_generation(now() - interval '2 days')
      WHERE id = ANY($1::bigint[])`,
    [ids.slice(0, 10)],
  );
  await lh.pool.query("UPDATE dead_jobs SET finished_at = now() - interval '2 days'");
  assert.equal(await retention.runOnce(), 10);
  const left = await lh.pool.query("SELECT state, count(*)::int AS n FROM finished_jobs GROUP BY state ORDER BY state");
  assert.deepEqual(left.rows, [
    { state: "dead", n: 10 },
    { state: "succeeded", n: 10 },
  ]);
  assert.equal(await attemptsOf(ids.slice(0, 10)), 0, "audit rows go with their job");
  assert.equal(await retention.runOnce(), 0);
  // Past the dead retention, dead jobs go too, in batches of three.
  await lh.pool.query("UPDATE dead_jobs SET finished_at = now() - interval '8 days'");
  assert.equal(await retention.runOnce(), 10);
  assert.equal((await lh.pool.query("SELECT count(*)::int AS n FROM finished_jobs")).rows[0].n, 10);
});

test("retention never empties a generation that holds a job within retention, nor waits for one in use", async (t) => {
  const lh = await freshLeasehold(t);
  const retention = lh.retention({ retainMs: 24 * 3600_000 });
  await retention.runOnce(); // sets the generation width: four hours
  const ids = (await lh.enqueueMany(Array.from({ length: 4 }, () => ({ task: "t" })))).map((j) => j.id);
  const jobs = await store.claimJobs(lh.pool, { queues: ["default"], limit: 4, workerId: "w", leaseMs: 30_000, tasks: ["t"] });
  await store.completeJobs(lh.pool, { workerId: "w", jobs: jobs.map((j) => ({ id: j.id, attempt: j.attempt })) });
  const old = "now() - interval '2 days'";
  await lh.pool.query(`UPDATE job_history SET finished_at = ${old}, generation = history_generation(${old}) WHERE id = ANY($1::bigint[])`, [
    ids.slice(0, 3),
  ]);
  // An hour-old job in the same generation (as after the width changed): the whole generation stays.
  await lh.pool.query(`UPDATE job_history SET finished_at = now() - interval '1 hour', generation = history_generation(${old}) WHERE id = $1`, [
    ids[3],
  ]);
  assert.equal(await retention.runOnce(), 0);
  await lh.pool.query(`UPDATE job_history SET finished_at = ${old} WHERE id = $1`, [ids[3]]);
  // A reader holds the generation: retention passes over it at once and comes back later.
  const { rows } = await lh.pool.query(`SELECT history_generation(${old}) AS g`);
  const reader = await lh.pool.connect();
  try {
    await reader.query("BEGIN");
    await reader.query(`SELECT count(*) FROM job_history_${rows[0].g}`);
    assert.equal(await retention.runOnce(), 0);
    await reader.query("COMMIT");
  } finally {
    reader.release();
  }
  assert.equal(await retention.runOnce(), 4);
});

test("finished jobs land in the current generation and leave once their generation is past retention", async (t) => {
  const lh = await freshLeasehold(t);
  // The shortest retention: one-second generations.
  const retention = lh.retention({ retainMs: 1_000 });
  await retention.runOnce();
  await lh.enqueueMany(Array.from({ length: 5 }, () => ({ task: "t" })));
  const jobs = await store.claimJobs(lh.pool, { queues: ["default"], limit: 5, workerId: "w", leaseMs: 30_000, tasks: ["t"] });
  await store.completeJobs(lh.pool, { workerId: "w", jobs: jobs.map((j) => ({ id: j.id, attempt: j.attempt })) });
  const { rows } = await lh.pool.query("SELECT DISTINCT generation = history_generation(finished_at) AS matches FROM job_history");
  assert.deepEqual(rows, [{ matches: true }], "each job is in the generation of when it finished");
  assert.equal(await retention.runOnce(), 0, "the current generation is never emptied");
  await new Promise((r) => setTimeout(r, 2_100));
  assert.equal(await retention.runOnce(), 5);
  assert.equal((await lh.pool.query("SELECT count(*)::int AS n FROM job_history")).rows[0].n, 0);
});

test("migrations are safe to run from many processes at once", async (t) => {
  const schema = uniqueSchema("mig");
  const pools = Array.from({ length: 6 }, () => store.createPool({ connectionString: databaseUrl(), schema, max: 1 }));
  t.after(async () => {
    await pools[0]!.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
    await Promise.all(pools.map((p) => p.end()));
  });
  const applied = await Promise.all(pools.map((p) => store.migrate(p, schema)));
  assert.equal(applied.flat().length, store.loadMigrations().length, "each migration applied exactly once");
  const { rows } = await pools[0]!.query("SELECT count(*)::int AS n FROM schema_migrations");
  assert.equal(rows[0].n, store.loadMigrations().length);
});

test("a service's failing run is counted and does not stop the service", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.enqueue("t");
  const [job] = await store.claimJobs(lh.pool, { queues: ["default"], limit: 1, workerId: "w", leaseMs: 30_000, tasks: ["t"] });
  const watchdog = lh.watchdog({ intervalMs: 20 });
  t.after(() => watchdog.stop());
  await lh.pool.query("ALTER TABLE jobs RENAME TO jobs_gone");
  watchdog.start();
  await eventually(async () => watchdog.failures >= 3, "the failing runs were counted, run after run");
  await lh.pool.query("ALTER TABLE jobs_gone RENAME TO jobs");
  // Once a run has reaped the expired lease, every earlier run has ended (runs never overlap):
  // a failure in flight while the table came back is counted by then.
  await lh.pool.query("UPDATE jobs SET lease_until = now() - interval '1 ms' WHERE id = $1", [job!.id]);
  await eventually(
    async () => (await lh.pool.query("SELECT state FROM jobs WHERE id = $1", [job!.id])).rows[0].state !== "running",
    "the same service reaps again once the table is back",
  );
  const failures = watchdog.failures;
  await new Promise((r) => setTimeout(r, 200));
  await watchdog.stop();
  assert.equal(watchdog.failures, failures, "runs succeed again once the table is back");
});

test("watchdogs take turns at crash detection: about one check per slot, and never more than two slots without one", () => {
  const slotMs = 250;
  const slots = 1_000;
  /** Check times of a fleet of `fleet` watchdogs, the ranks in `live` ticking from random phases. */
  const fleetChecks = (fleet: number, live: number[]) => {
    const checks: number[] = [];
    for (const rank of live) {
      let previous: number | undefined;
      // Each ticks every slot plus a little (its own statements' time).
      for (let at = Math.random() * slotMs; at < slots * slotMs; at += slotMs + Math.random() * 20) {
        const slot = Math.floor(at / slotMs);
        if (ownsTurn(previous, slot, fleet, rank)) checks.push(at);
        previous = slot;
      }
    }
    checks.sort((a, b) => a - b);
    return { count: checks.length, longestGapMs: Math.max(...checks.slice(1).map((c, i) => c - checks[i]!)) };
  };
  for (const fleet of [1, 2, 3, 5, 8]) {
    const all = fleetChecks(fleet, [...Array(fleet).keys()]);
    assert.ok(all.count <= slots + fleet, `fleet of ${fleet}: ${all.count} checks in ${slots} slots`);
    assert.ok(all.longestGapMs <= 2 * slotMs + 20, `fleet of ${fleet}: ${all.longestGapMs} ms without a check`);
    if (fleet === 1) continue;
    // One dead but still counted: its slots go unchecked, one at a time.
    const oneDead = fleetChecks(fleet, [...Array(fleet).keys()].slice(1));
    assert.ok(oneDead.longestGapMs <= 3 * slotMs + 20, `fleet of ${fleet}, one dead: ${oneDead.longestGapMs} ms without a check`);
  }
  // A watchdog that missed a whole round of slots (frozen, or its clock stepped back) checks at once.
  assert.equal(ownsTurn(10, 14, 4, 0), true);
  assert.equal(ownsTurn(10, 9, 4, 0), true);
  assert.equal(ownsTurn(10, 11, 4, 0), false);
});

test("watchdogs share crash detection: together they check liveness about once per interval, not once each", async (t) => {
  const lh = await freshLeasehold(t);
  let checks = 0;
  const counting: Queryable = {
    query: ((text: string, values?: unknown[]) => {
      if (text.includes("pg_locks") && text.includes("UPDATE workers")) checks++;
      return lh.pool.query(text, values);
    }) as Queryable["query"],
  };
  const livenessMs = 50;
  const watchdogs = Array.from({ length: 4 }, () => new Watchdog(counting, lh.metrics, silent, { intervalMs: 400, livenessIntervalMs: livenessMs }));
  for (const w of watchdogs) w.start();
  t.after(() => Promise.all(watchdogs.map((w) => w.stop())));
  await new Promise((r) => setTimeout(r, 1_500)); // every one has counted the fleet
  checks = 0;
  const windowMs = 3_000;
  await new Promise((r) => setTimeout(r, windowMs));
  // Alone, each would check every tick: 4 x 60 = 240. Shared: ~60, plus one per reap tick each (~30).
  const alone = (4 * windowMs) / livenessMs;
  assert.ok(checks > 0 && checks < alone / 2, `${checks} liveness checks in ${windowMs} ms (each alone: ${alone})`);
});
