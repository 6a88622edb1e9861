import { test } from "node:test";
import assert from "node:assert/strict";
import * as store from "../src/store/index.js";
import { freshLeasehold, databaseUrl, uniqueSchema, NO_BACKOFF } from "./helpers/db.js";

test("retention deletes old finished jobs with their audit rows, keeps dead jobs longer, and works in batches", async (t) => {
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
  // Ten succeeded jobs finished two days ago, ten just now; the ten dead ones two days ago.
  await lh.pool.query("UPDATE job_history SET finished_at = now() - interval '2 days' WHERE id = ANY($1::bigint[])", [
    [...ids.slice(0, 10), ...ids.slice(20)],
  ]);
  const retention = lh.retention({ retainMs: 24 * 3600_000, retainDeadMs: 7 * 24 * 3600_000, batchSize: 3 });
  assert.equal(await retention.runOnce(), 10);
  const left = await lh.pool.query("SELECT state, count(*)::int AS n FROM job_history GROUP BY state ORDER BY state");
  assert.deepEqual(left.rows, [{ state: "dead", n: 10 }, { state: "succeeded", n: 10 }]);
  assert.equal(await attemptsOf(ids.slice(0, 10)), 0, "audit rows go with their job");
  assert.equal(await retention.runOnce(), 0);
  // Past the dead retention, dead jobs go too.
  await lh.pool.query("UPDATE job_history SET finished_at = now() - interval '8 days' WHERE state = 'dead'");
  assert.equal(await retention.runOnce(), 10);
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
  const watchdog = lh.watchdog({ intervalMs: 20 });
  await lh.pool.query("ALTER TABLE jobs RENAME TO jobs_gone");
  watchdog.start();
  await new Promise((r) => setTimeout(r, 200));
  assert.ok(watchdog.failures >= 1, "the failing runs were counted");
  await lh.pool.query("ALTER TABLE jobs_gone RENAME TO jobs");
  const failures = watchdog.failures;
  await new Promise((r) => setTimeout(r, 200));
  await watchdog.stop();
  assert.equal(watchdog.failures, failures, "runs succeed again once the table is back");
});
