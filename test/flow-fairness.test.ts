/**
 * Flow control between keys and over time, against worker processes of their own: a key with a
 * 100,000-job backlog does not starve another (round-robin), a weight gives a key its share,
 * and a rate limit holds its rate (docs/flow-control.md). Times are the database's.
 * The 60 s rate measurement the issue asks for: bench/flow-rate.ts.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { eventually, freshLeasehold } from "./helpers/db.js";
import { auditTrail, flowWorkers, maxStartsInWindow, sleep } from "./helpers/flow.js";

type Lh = Awaited<ReturnType<typeof freshLeasehold>>;

const finishedCount = async (lh: Lh) => (await lh.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM finished_jobs")).rows[0]!.n;

test("fairness: while key A drains a 100,000-job backlog at full speed, each of 10 jobs for key B starts within 1 s of its enqueue", async (t) => {
  const lh = await freshLeasehold(t);
  const backlog = 100_000;
  for (let i = 0; i < backlog; i += 5_000) {
    await lh.enqueueMany(Array.from({ length: 5_000 }, () => ({ task: "quick", queue: "fair", key: "A" })));
  }
  await flowWorkers(t, lh.schema, [
    { queues: ["fair"], concurrency: 50 },
    { queues: ["fair"], concurrency: 50 },
  ]);
  await eventually(async () => (await finishedCount(lh)) >= 3_000, "A drains", 60_000);

  const b: string[] = [];
  for (let i = 0; i < 10; i++) {
    b.push((await lh.enqueue("quick", { i }, { queue: "fair", key: "B" })).id);
    await sleep(150);
  }
  await eventually(
    async () => (await lh.pool.query("SELECT count(*)::int AS n FROM finished_jobs WHERE id = ANY($1::bigint[])", [b])).rows[0].n === b.length,
    "B's jobs ran",
    30_000,
  );
  const { rows } = await lh.pool.query<{ waited_ms: number }>(
    `SELECT extract(epoch FROM min(a.started_at) - h.created_at)::float8 * 1000 AS waited_ms
       FROM all_attempts AS a JOIN finished_jobs AS h ON h.id = a.job_id
      WHERE a.job_id = ANY($1::bigint[]) GROUP BY a.job_id, h.created_at ORDER BY 1`,
    [b],
  );
  const waited = rows.map((r) => Math.round(r.waited_ms));
  const { rows: left } = await lh.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM jobs WHERE flow_key = 'A' AND state = 'waiting'");
  const trail = await auditTrail(lh.pool);
  const aRate = maxStartsInWindow(trail, 1_000).max;
  t.diagnostic(`B waited (ms, enqueue to start): ${waited.join(", ")}; A: ${left[0]!.n} still waiting, up to ${aRate} starts/s`);
  assert.ok(left[0]!.n > 0, "A still had a backlog when B was done");
  assert.equal(waited.length, 10);
  assert.ok(waited[waited.length - 1]! < 1_000, `a job of B waited ${waited[waited.length - 1]} ms behind A's backlog`);
});

test("weights: a key of weight 3 gets about three times the starts of a key of weight 1 while both have backlogs, in large claims and in claims of one slot", async (t) => {
  const lh = await freshLeasehold(t);
  // "w": claims of many jobs at once. "w4": at most 4 attempts at once, so each claim gets the
  // one slot that just freed: the weights must hold across claims, not only within one.
  const cases = [
    { queue: "w", each: 4_000, task: "quick", payload: {}, counted: 2_000, margin: 600 },
    { queue: "w4", each: 600, task: "sleep", payload: { min: 5, max: 15 }, counted: 400, margin: 40 },
  ];
  await lh.setQueueLimits("w", { keyWeights: { heavy: 3 } }, { create: true });
  await lh.setQueueLimits("w4", { keyWeights: { heavy: 3 }, concurrency: 4 }, { create: true });
  for (const c of cases) {
    await lh.enqueueMany(
      Array.from({ length: 2 * c.each }, (_, i) => ({ task: c.task, payload: c.payload, queue: c.queue, key: i % 2 === 0 ? "heavy" : "light" })),
    );
  }
  const jobOf = new Map(
    (await lh.pool.query<{ id: string; k: string; q: string }>("SELECT id::text, flow_key AS k, queue AS q FROM jobs")).rows.map((r) => [r.id, r]),
  );
  await flowWorkers(t, lh.schema, [
    { queues: ["w", "w4"], concurrency: 10 },
    { queues: ["w", "w4"], concurrency: 50 },
  ]);
  const finishedIn = async (queue: string) =>
    (await lh.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM finished_jobs WHERE queue = $1", [queue])).rows[0]!.n;
  const ratios: string[] = [];
  for (const c of cases) {
    // Heavy runs out after about 4/3 of its backlog in starts: count well before that, and wait
    // past it, so that every attempt among the first ones has ended and is in the audit trail.
    await eventually(async () => (await finishedIn(c.queue)) >= c.counted + c.margin, `${c.queue}: both keys drain`, 60_000);
    const first = (await auditTrail(lh.pool)).filter((a) => jobOf.get(a.jobId)!.q === c.queue).slice(0, c.counted);
    const heavy = first.filter((a) => jobOf.get(a.jobId)!.k === "heavy").length;
    ratios.push(`${c.queue}: heavy:light = ${heavy}:${c.counted - heavy} = ${(heavy / (c.counted - heavy)).toFixed(2)}`);
  }
  t.diagnostic(`first starts, weight 3:1: ${ratios.join("; ")}`);
  for (const r of ratios) {
    const ratio = Number(r.split(" = ").at(-1));
    assert.ok(ratio >= 2.5 && ratio <= 3.5, `${r} (weight 3:1)`);
  }
});

test("rate accuracy: 4 worker processes against 50 starts/s for 15 s start within ±5 % of the rate, no second over it by more than 10 %", async (t) => {
  const lh = await freshLeasehold(t);
  const limit = 50;
  const seconds = 15;
  await lh.setQueueLimits("r", { rate: { limit, windowMs: 1_000 } }, { create: true });
  await lh.enqueueMany(Array.from({ length: limit * (seconds + 5) }, () => ({ task: "quick", queue: "r" })));
  await flowWorkers(t, lh.schema, [
    { queues: ["r"], concurrency: 10 },
    { queues: ["r"], concurrency: 50 },
    { queues: ["r"], concurrency: 10 },
    { queues: ["r"], concurrency: 50 },
  ]);
  const t0 = await eventually(async () => (await auditTrail(lh.pool))[0]?.start, "the first start", 30_000);
  await sleep(seconds * 1_000 + 1_500);
  const starts = (await auditTrail(lh.pool)).filter((a) => a.start >= t0 && a.start < t0 + seconds * 1_000);
  const perSecond = Array.from(
    { length: seconds },
    (_, s) => starts.filter((a) => a.start >= t0 + s * 1_000 && a.start < t0 + (s + 1) * 1_000).length,
  );
  const sliding = maxStartsInWindow(starts, 1_000);
  t.diagnostic(
    `${starts.length} starts in ${seconds} s (configured ${limit * seconds}); per second: ${perSecond.join(" ")}; most in any 1 s window: ${sliding.max}`,
  );
  const expected = limit * seconds;
  assert.ok(Math.abs(starts.length - expected) <= expected * 0.05, `${starts.length} starts in ${seconds} s, configured ${expected} (±5 %)`);
  assert.ok(sliding.max <= limit * 1.1, `${sliding.max} starts in the second from ${new Date(sliding.at).toISOString()} (limit ${limit})`);
});
