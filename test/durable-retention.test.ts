/**
 * Retention of durable jobs' records (src/maintenance/retention.ts), on the real database: a
 * job's recorded steps go with the job (a history generation emptied, a dead job pruned), and
 * events are kept for their own window (7 days unless set), deleted in batches.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { Retention } from "../packages/leasehold/src/maintenance/retention.js";
import { ConfigError } from "../packages/leasehold/src/errors.js";
import { setGenerationWidth } from "../packages/leasehold/src/store/retention.js";
import type { JobContext } from "../packages/leasehold/src/worker/context.js";
import { freshLeasehold, NO_BACKOFF, silent, settled } from "./helpers/db.js";

test("retention forgets a job's steps with the job, and events past their window in batches", async (t) => {
  const lh = await freshLeasehold(t);
  const worker = lh.worker({
    backoff: NO_BACKOFF,
    watchdog: false,
    handlers: {
      done: async (_: unknown, ctx: JobContext) => ctx.step("once", () => "ok"),
      dies: async (_: unknown, ctx: JobContext) => {
        await ctx.step("before", () => 1);
        throw new Error("no");
      },
      kept: async (_: unknown, ctx: JobContext) => ctx.step("kept", () => "still here"),
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const done = await lh.enqueue("done", {});
  const dies = await lh.enqueue("dies", {}, { maxAttempts: 1 });
  await settled(lh, done.id, "succeeded");
  await settled(lh, dies.id, "dead");
  const q = (sql: string, values: unknown[] = []) => lh.pool.query(sql, values);
  // Past every window: finished and dead ten days ago, the history generations moved on.
  await q(`UPDATE job_history SET finished_at = now() - interval '10 days' WHERE id = $1`, [done.id]);
  await q(`UPDATE dead_jobs SET finished_at = now() - interval '10 days' WHERE id = $1`, [dies.id]);
  const kept = await lh.enqueue("kept", {});
  await settled(lh, kept.id, "succeeded");
  for (let i = 0; i < 7; i++) await lh.sendEvent("old", { i });
  await lh.sendEvent("new", {});
  await q(`UPDATE events SET sent_at = now() - interval '2 days' WHERE name = 'old'`);
  const stepsOf = async (id: string) => (await q(`SELECT count(*)::int AS n FROM job_steps WHERE job_id = $1`, [id])).rows[0].n as number;
  assert.equal(await stepsOf(done.id), 1);
  assert.equal(await stepsOf(dies.id), 1);

  // A generation is emptied whole, never the current one nor one with a recent job: put the old
  // job in one of its own, by the generation width the run below sets (it decides which is current).
  await setGenerationWidth(lh.pool, 3_600_000);
  await q(
    `UPDATE job_history SET generation = (SELECT g FROM generate_series(0, 7) AS g
                                           WHERE g <> history_generation(now())
                                             AND g NOT IN (SELECT generation FROM job_history WHERE id <> $1) LIMIT 1)
      WHERE id = $1`,
    [done.id],
  );
  const retention = new Retention(lh.pool, lh.metrics, silent, { retainMs: 3_600_000, retainEventsMs: 86_400_000, batchSize: 3 });
  await retention.runOnce();
  assert.equal(await stepsOf(done.id), 0, "a succeeded job's steps go with its history generation");
  assert.equal(await stepsOf(dies.id), 0, "a dead job's steps go with it");
  assert.equal(await stepsOf(kept.id), 1, "a job retention keeps keeps its steps");
  const names = (await q(`SELECT name FROM events ORDER BY id`)).rows.map((r) => r.name);
  assert.deepEqual(names, ["new"], "seven old events deleted in batches of three; the new one kept");

  assert.throws(
    () => new Retention(lh.pool, lh.metrics, silent, { retainEventsMs: 10 }),
    (err: unknown) =>
      err instanceof ConfigError && /retainEventsMs must be a whole number of milliseconds, at least 1000 \(got 10\)/.test(err.message),
  );
});

test("events are kept 7 days by default", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.sendEvent("recent", {});
  await lh.sendEvent("week-old", {});
  await lh.pool.query(`UPDATE events SET sent_at = now() - interval '6 days 23 hours' WHERE name = 'recent'`);
  await lh.pool.query(`UPDATE events SET sent_at = now() - interval '7 days 1 hour' WHERE name = 'week-old'`);
  await new Retention(lh.pool, lh.metrics, silent).runOnce();
  assert.deepEqual(
    (await lh.pool.query(`SELECT name FROM events`)).rows.map((r) => r.name),
    ["recent"],
  );
});
