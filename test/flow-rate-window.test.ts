/**
 * A long rate window costs a claim no more as its starts accumulate (docs/flow-control.md): the
 * starts are rows of flow_starts with a running count, read by index descents, where they were
 * arrays each claim read and rewrote whole. The limit still holds exactly, and starts the old
 * arrays recorded before an upgrade go on counting.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import pg from "pg";
import { Leasehold } from "../packages/leasehold/src/client.js";
import { loadMigrations } from "../packages/leasehold/src/store/migrate.js";
import { pruneFlowStarts } from "../packages/leasehold/src/store/index.js";
import { databaseUrl, freshLeasehold, rawClient, silent, uniqueSchema } from "./helpers/db.js";
import { Registry } from "prom-client";

const DAY_MS = 86_400_000;

interface Claimed {
  jobs: { id: string; flowKey: string | null }[];
  retryMs: number | null;
}

/** One claim_flow() call of up to `lim` jobs of task "t", as a worker makes it. */
async function claim(db: pg.ClientBase | pg.Pool, queue: string, lim: number): Promise<Claimed> {
  const { rows } = await db.query<{ id: string | null; flow_key: string | null; retry_ms: number | null }>(
    "SELECT id, flow_key, retry_ms FROM claim_flow($1, $2, 'w', 30000, '{t}')",
    [queue, lim],
  );
  return {
    jobs: rows.filter((r) => r.id !== null).map((r) => ({ id: r.id!, flowKey: r.flow_key })),
    retryMs: rows.find((r) => r.id === null)?.retry_ms ?? null,
  };
}

/**
 * What one claim of one job reads of the rate's state, in its own transaction: the rows of
 * flow_starts it reads (by index or scan), and the length of the old arrays (read whole).
 */
async function claimReads(db: pg.Client, queue: string, key: string | null): Promise<{ rows: number; arrays: number; claimed: number }> {
  await db.query("BEGIN");
  try {
    const claimed = (await claim(db, queue, 1)).jobs.length;
    const { rows } = await db.query<{ read: string }>(
      `SELECT (coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0))::text AS read
         FROM pg_stat_xact_user_tables WHERE schemaname = current_schema() AND relname = 'flow_starts'`,
    );
    const arrays =
      key === null
        ? await db.query<{ n: number }>("SELECT coalesce(max(cardinality(start_times)), 0)::int AS n FROM flow_state WHERE queue = $1", [queue])
        : await db.query<{ n: number }>(
            "SELECT coalesce(max(cardinality(start_times)), 0)::int AS n FROM flow_key_state WHERE queue = $1 AND flow_key = $2",
            [queue, key],
          );
    return { rows: Number(rows[0]?.read ?? 0), arrays: arrays.rows[0]!.n, claimed };
  } finally {
    await db.query("COMMIT");
  }
}

test("a one-day rate of 8,000: after 8,000 starts a claim reads a few rows as after none, and lets in exactly up to the limit", async (t) => {
  const lh = await freshLeasehold(t);
  const db = await rawClient(lh.schema);
  t.after(() => db.end());
  await lh.setQueueLimits("daily", { rate: { limit: 8_000, windowMs: DAY_MS } }, { create: true });
  await lh.enqueueMany(Array.from({ length: 8_010 }, () => ({ task: "t", queue: "daily" })));

  const first = await claimReads(db, "daily", null);
  assert.equal(first.claimed, 1);
  // One claim per start: each its own entry in the window (as 8,000 claims of a busy day).
  for (let i = 1; i < 7_995; i++) assert.equal((await claim(lh.pool, "daily", 1)).jobs.length, 1);
  const late = await claimReads(db, "daily", null);
  assert.equal(late.claimed, 1, "the 7,996th start");
  assert.equal(late.arrays, 0, "no array of starts is read whole");
  assert.ok(late.rows <= 3, `a claim after 7,995 starts read ${late.rows} rows of flow_starts (after none: ${first.rows})`);
  t.diagnostic(`rows of flow_starts a claim read: ${first.rows} after no start, ${late.rows} after 7,995`);

  // 7,996 started: a claim of 10 gets the 4 left, and says when the window frees the next.
  const last = await claim(lh.pool, "daily", 10);
  assert.equal(last.jobs.length, 4, "exactly up to the limit");
  assert.ok(last.retryMs !== null && last.retryMs > DAY_MS - 10 * 60_000, `retry in ${last.retryMs} ms: when the first start leaves the window`);
  const refused = await claim(lh.pool, "daily", 1);
  assert.equal(refused.jobs.length, 0, "the 8,001st start is refused");
  assert.ok(refused.retryMs !== null && refused.retryMs > DAY_MS - 10 * 60_000);
  const { rows } = await lh.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM jobs WHERE queue = 'daily' AND state = 'running'");
  assert.equal(rows[0]!.n, 8_000);
});

test("a one-day rate per key: after 2,000 starts of a key its claim reads a few rows, refuses its 2,001st, and other keys go on", async (t) => {
  const lh = await freshLeasehold(t);
  const db = await rawClient(lh.schema);
  t.after(() => db.end());
  await lh.setQueueLimits("tenants", { keyRate: { limit: 2_000, windowMs: DAY_MS } }, { create: true });
  await lh.enqueueMany(Array.from({ length: 2_005 }, () => ({ task: "t", queue: "tenants", key: "acme" })));

  const first = await claimReads(db, "tenants", "acme");
  for (let i = 1; i < 1_999; i++) assert.equal((await claim(lh.pool, "tenants", 1)).jobs.length, 1);
  const late = await claimReads(db, "tenants", "acme");
  assert.equal(late.claimed, 1, "the 2,000th start of acme");
  assert.equal(late.arrays, 0, "no array of starts is read whole");
  assert.ok(late.rows <= 4, `a claim after 1,999 starts of its key read ${late.rows} rows of flow_starts (after none: ${first.rows})`);
  t.diagnostic(`rows of flow_starts a claim read: ${first.rows} after no start of its key, ${late.rows} after 1,999`);

  assert.deepEqual((await claim(lh.pool, "tenants", 5)).jobs, [], "acme's 2,001st start is refused");
  await lh.enqueue("t", {}, { queue: "tenants", key: "globex" });
  assert.deepEqual(
    (await claim(lh.pool, "tenants", 5)).jobs.map((j) => j.flowKey),
    ["globex"],
    "another key starts beside it",
  );
});

test("an upgrade keeps the starts of the old arrays: version 26 counts them, and those a previous release's claim appends after it", async (t) => {
  // A schema as the previous release left it (migrations before 26), its rate's starts
  // recorded by the old claim_flow() in flow_state's and flow_key_state's arrays.
  const schema = uniqueSchema();
  const admin = new pg.Pool({ connectionString: databaseUrl(), max: 2 });
  t.after(async () => {
    await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
    await admin.end();
  });
  const setup = await admin.connect();
  try {
    await setup.query("BEGIN");
    await setup.query(`CREATE SCHEMA ${schema}`);
    await setup.query(`SET LOCAL search_path = ${schema}, pg_temp`);
    await setup.query(
      "CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now(), breaking boolean NOT NULL DEFAULT false)",
    );
    for (const m of loadMigrations().filter((m) => m.version < 26)) {
      await setup.query(m.sql);
      await setup.query("INSERT INTO schema_migrations (version, name, breaking) VALUES ($1, $2, $3)", [m.version, m.name, m.breaking]);
    }
    await setup.query("COMMIT");
  } finally {
    setup.release();
  }
  const old = await rawClient(schema);
  t.after(() => old.end());
  await old.query(
    `INSERT INTO queues (name, rate_limit, rate_window_ms) VALUES ('daily', 10, ${DAY_MS});
     INSERT INTO queues (name, keyed, key_rate_limit, key_rate_window_ms) VALUES ('tenants', true, 4, ${DAY_MS});
     SELECT enqueue('t', '{}', '{"queue": "daily"}') FROM generate_series(1, 20);
     SELECT enqueue('t', '{}', '{"queue": "tenants", "key": "acme"}') FROM generate_series(1, 10)`,
  );
  for (let i = 0; i < 3; i++) assert.equal((await claim(old, "daily", 2)).jobs.length, 2, "the old claim");
  for (let i = 0; i < 3; i++) assert.equal((await claim(old, "tenants", 1)).jobs.length, 1, "the old claim, per key");
  const arrays = await old.query<{ n: number }>(
    "SELECT (SELECT cardinality(start_times) FROM flow_state WHERE queue = 'daily') + (SELECT cardinality(start_times) FROM flow_key_state WHERE flow_key = 'acme') AS n",
  );
  assert.equal(arrays.rows[0]!.n, 6, "the previous release's claims logged their starts in the arrays");

  // This release migrates (version 26); a previous release's claim already running then
  // appends to the arrays after it.
  const lh = await Leasehold.connect({ databaseUrl: databaseUrl(), schema, logger: silent, metricsRegistry: new Registry() });
  t.after(() => lh.close());
  await old.query(
    `UPDATE flow_state SET start_times = start_times || now(), start_counts = start_counts || 1 WHERE queue = 'daily';
     UPDATE flow_key_state SET start_times = start_times || now(), start_counts = start_counts || 1 WHERE flow_key = 'acme'`,
  );

  // 6 + 1 of 10 started in the queue's window: 3 more; 3 + 1 of 4 for acme: none.
  assert.equal((await claim(lh.pool, "daily", 10)).jobs.length, 3, "the queue's old starts count");
  assert.equal((await claim(lh.pool, "daily", 10)).jobs.length, 0);
  assert.equal((await claim(lh.pool, "tenants", 10)).jobs.length, 0, "the key's old starts count");
  const { rows } = await lh.pool.query<{ n: number }>("SELECT cardinality(start_times) AS n FROM flow_state WHERE queue = 'daily'");
  assert.equal(rows[0]!.n, 0, "the queue's next claim took its arrays over");
});

test("retention forgets the starts of queues and keys no longer claimed once no window (a day at most) holds them", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.pool.query(
    `INSERT INTO flow_starts (queue, flow_key, total, started_at, n) VALUES
       ('quiet', '', 3, now() - interval '26 hours', 3),
       ('quiet', 'acme', 1, now() - interval '26 hours', 1),
       ('busy', '', 5, now() - interval '23 hours', 5)`,
  );
  assert.equal(await pruneFlowStarts(lh.pool, { limit: 100 }), 2);
  const { rows } = await lh.pool.query<{ queue: string }>("SELECT queue FROM flow_starts");
  assert.deepEqual(
    rows.map((r) => r.queue),
    ["busy"],
    "a start still inside a day's window stays",
  );
});
