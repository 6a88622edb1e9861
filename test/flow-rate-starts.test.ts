/**
 * A rate limit holds where the work happens: at the handlers' starts, not only at the claims
 * (docs/flow-control.md). Worker processes of their own, each handler stamping its start on the
 * database's clock; no window of the rate's length may hold more than the limit, but for the few
 * milliseconds between a claim and its handlers' start.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { eventually, freshLeasehold } from "./helpers/db.js";
import { flowWorkers } from "./helpers/flow.js";

/**
 * How far apart, at most, a claim's recorded start and its handlers' starts may drift between
 * two claims: the claim's own round trip and the handler's stamp (measured up to 23 ms on a loaded 2-core machine).
 */
const SLACK_MS = 30;

test("rate: 4 worker processes of concurrency 10, busy handlers, 20 starts/s: no window of 1 s (less the slack) holds more than 20 handler starts", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.pool.query("CREATE TABLE handler_starts (job_id bigint PRIMARY KEY, at timestamptz NOT NULL)");
  await lh.setQueueLimits("paced", { rate: { limit: 20, windowMs: 1_000 } }, { create: true });
  // Handlers run ~2 s: at 20 starts/s the 40 slots stay busy, so a job claimed ahead of a free
  // slot would wait in its worker's buffer, and start in the next window's starts.
  const jobs = 170;
  await lh.enqueueMany(Array.from({ length: jobs }, () => ({ task: "stamp", payload: { min: 1_500, max: 2_500 }, queue: "paced" })));
  await flowWorkers(
    t,
    lh.schema,
    Array.from({ length: 4 }, () => ({ queues: ["paced"], concurrency: 10 })),
  );
  const started = async () => (await lh.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM handler_starts")).rows[0]!.n;
  await eventually(async () => (await started()) === jobs, "every handler started", 60_000);

  const { rows } = await lh.pool.query<{ ms: number; claimed_ms: number }>(
    `SELECT extract(epoch FROM s.at)::float8 * 1000 AS ms, extract(epoch FROM coalesce(j.started_at, h.started_at))::float8 * 1000 AS claimed_ms
       FROM handler_starts AS s LEFT JOIN jobs AS j ON j.id = s.job_id LEFT JOIN all_attempts AS h ON h.job_id = s.job_id
      ORDER BY s.at`,
  );
  const starts = rows.map((r) => r.ms);
  // For a failure's message: when each start in the worst window was claimed, and started (ms after the window opens).
  const shown = (from: number) =>
    rows
      .filter((r) => r.ms >= from && r.ms < from + 1_000)
      .map((r) => `${Math.round(r.claimed_ms - from)}/${Math.round(r.ms - from)}`)
      .join(" ");
  let worst = { n: 0, at: NaN };
  for (let i = 0, j = 0; i < starts.length; i++) {
    while (j < starts.length && starts[j]! < starts[i]! + 1_000 - SLACK_MS) j++;
    if (j - i > worst.n) worst = { n: j - i, at: starts[i]! };
  }
  assert.ok(
    worst.n <= 20,
    `${worst.n} handler starts in the ${1_000 - SLACK_MS} ms from ${new Date(worst.at).toISOString()} (limit 20/s); claimed/started: ${shown(worst.at)}`,
  );
  assert.equal(worst.n, 20, "the rate was reached");
});
