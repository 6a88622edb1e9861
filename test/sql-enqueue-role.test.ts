/**
 * The SQL function `enqueue` as an application's own role would call it: a role created here
 * with exactly the privileges docs/transactions.md lists, and nothing more. It works with them
 * (every option that writes somewhere else: a flow-control key, replace, cancel_running, NATS
 * dispatch); a caller's temporary tables never take its writes or answer its reads; unique keys
 * are matched within the task unless asked wider; run times out of range are refused; `send_event`
 * from a trigger on an application table wakes the job waiting for the event.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import fs from "node:fs";
import pg from "pg";
import type { JobContext } from "../packages/leasehold/src/worker/context.js";
import { databaseUrl, eventually, freshLeasehold } from "./helpers/db.js";

type Lh = Awaited<ReturnType<typeof freshLeasehold>>;

/**
 * The GRANT statements docs/transactions.md lists for calling `enqueue`, as written there, for
 * schema `s` and role `role`: the doc and the test cannot drift apart.
 */
function documentedGrants(s: string, role: string): string[] {
  const doc = fs.readFileSync(new URL("../docs/transactions.md", import.meta.url), "utf8");
  const grants = doc.match(/^GRANT .* TO app;$/gm) ?? [];
  assert.ok(grants.length > 0, "docs/transactions.md lists the grants enqueue needs");
  return grants.map((g) =>
    g
      .replaceAll("leasehold.", `${s}.`)
      .replace("SCHEMA leasehold ", `SCHEMA ${s} `)
      .replace(/ TO app;$/, ` TO ${role}`),
  );
}

/** A connection acting as a fresh role with exactly the documented grants; dropped after the test. */
async function asRestrictedRole(lh: Lh, t: { after(fn: () => Promise<void>): void }): Promise<pg.Client> {
  const role = `app_${randomBytes(4).toString("hex")}`;
  await lh.pool.query(`CREATE ROLE ${role} NOLOGIN`);
  for (const grant of documentedGrants(lh.schema, role)) await lh.pool.query(grant);
  const client = new pg.Client({ connectionString: databaseUrl() });
  await client.connect();
  await client.query(`SET ROLE ${role}`);
  t.after(async () => {
    // On a connection of its own: the test's pool may be closed by now.
    await client.query("RESET ROLE");
    await client.query(`DROP OWNED BY ${role}`);
    await client.query(`DROP ROLE ${role}`);
    await client.end();
  });
  return client;
}

const enqueueAs = async (client: pg.Client, schema: string, task: string, payload: unknown, options: unknown = {}) =>
  (
    await client.query<{ id: string }>(`SELECT ${schema}.enqueue($1, $2::jsonb, $3::jsonb)::text AS id`, [
      task,
      JSON.stringify(payload),
      JSON.stringify(options),
    ])
  ).rows[0]!.id;

const jobRow = async (lh: Lh, id: string) =>
  (
    await lh.pool.query<{ task: string; payload: unknown; unique_key: string | null; cancel_requested: boolean }>(
      "SELECT task, payload, unique_key, cancel_requested_at IS NOT NULL AS cancel_requested FROM jobs WHERE id = $1",
      [id],
    )
  ).rows[0];

const runningNow = (lh: Lh, id: string) =>
  lh.pool.query("UPDATE jobs SET state = 'running', lease_until = now() + interval '1 hour', locked_by = 'w', attempt = 1 WHERE id = $1", [id]);

test("a role with exactly the documented grants can call enqueue with every option that writes elsewhere", async (t) => {
  const lh = await freshLeasehold(t);
  const app = await asRestrictedRole(lh, t);
  const plain = await enqueueAs(app, lh.schema, "ship", { order: 1 });
  assert.equal((await jobRow(lh, plain))!.task, "ship");
  // A flow-control key marks its queue keyed (queues).
  const keyed = await enqueueAs(app, lh.schema, "ship", { order: 2 }, { queue: "tenants", key: "tenant-1" });
  assert.equal((await lh.pool.query("SELECT keyed FROM queues WHERE name = 'tenants'")).rows[0].keyed, true);
  assert.ok(keyed);
  // A unique key: kept, replaced (with NATS dispatch on: its doorbell moves), a running holder cancelled.
  await lh.pool.query("UPDATE dispatch_settings SET active_until = now() + interval '1 hour'");
  const held = await enqueueAs(app, lh.schema, "sync", { v: 1 }, { uniqueKey: "doc-7", delayMs: 60_000 });
  assert.equal(await enqueueAs(app, lh.schema, "sync", { v: 2 }, { uniqueKey: "doc-7" }), held);
  assert.equal(await enqueueAs(app, lh.schema, "sync", { v: 3 }, { uniqueKey: "doc-7", onDuplicate: "replace" }), held);
  assert.deepEqual((await jobRow(lh, held))!.payload, { v: 3 });
  await runningNow(lh, held);
  const next = await enqueueAs(app, lh.schema, "sync", { v: 4 }, { uniqueKey: "doc-7", onDuplicate: "cancel_running" });
  assert.notEqual(next, held);
  assert.equal((await jobRow(lh, held))!.cancel_requested, true);
});

test("a caller's temporary tables named like Leasehold's never take enqueue's writes nor answer its reads", async (t) => {
  const lh = await freshLeasehold(t);
  const app = await asRestrictedRole(lh, t);
  // Same columns and defaults as the real tables: an INSERT that resolved them would succeed.
  await app.query(`CREATE TEMP TABLE jobs (LIKE ${lh.schema}.jobs INCLUDING DEFAULTS INCLUDING IDENTITY)`);
  await app.query(`CREATE TEMP TABLE queues (LIKE ${lh.schema}.queues INCLUDING DEFAULTS)`);
  // A decoy holding the key the real enqueue uses: answering from it would return its id.
  await app.query("INSERT INTO pg_temp.jobs (id, queue, task, payload, unique_key) VALUES (424242, 'default', 't', '{}', 'k')");

  const id = await enqueueAs(app, lh.schema, "t", { real: true }, { uniqueKey: "k", key: "tenant" });
  assert.notEqual(id, "424242", "not the decoy's id");
  assert.deepEqual((await jobRow(lh, id))!.payload, { real: true }, "the job is in Leasehold's table");
  assert.equal((await app.query("SELECT count(*)::int AS n FROM pg_temp.jobs")).rows[0].n, 1, "only the decoy in the temporary table");
  assert.equal((await app.query("SELECT count(*)::int AS n FROM pg_temp.queues")).rows[0].n, 0);
  assert.equal(await enqueueAs(app, lh.schema, "t", { again: true }, { uniqueKey: "k" }), id, "the real holder answers");
  // Every function of the schema that sets a search_path puts pg_temp last.
  const { rows } = await lh.pool.query<{ f: string; path: string }>(
    `SELECT p.oid::regprocedure::text AS f, c AS path FROM pg_proc AS p, unnest(p.proconfig) AS c
      WHERE p.pronamespace = $1::regnamespace AND c LIKE 'search\\_path=%'`,
    [lh.schema],
  );
  assert.ok(rows.some((r) => r.f.startsWith("enqueue(")));
  for (const r of rows) assert.match(r.path, /, pg_temp$/, r.f);
});

test("SQL: a unique key is matched within the task; a holder of another task is refused (23505) and untouched", async (t) => {
  const lh = await freshLeasehold(t);
  const app = await asRestrictedRole(lh, t);
  const refund = await enqueueAs(app, lh.schema, "refund", { cents: 500 }, { uniqueKey: "user-42" });
  const before = await lh.pool.query("SELECT j::text AS row FROM jobs AS j ORDER BY id");
  for (const onDuplicate of ["keep", "replace", "replace_payload", "cancel_running"]) {
    await assert.rejects(
      enqueueAs(app, lh.schema, "newsletter", { issue: 9 }, { uniqueKey: "user-42", onDuplicate }),
      (err: { code?: string; message: string }) =>
        err.code === "23505" && /uniqueKey "user-42" is held by unfinished job \d+ of task "refund" in queue "default"/.test(err.message),
      onDuplicate,
    );
  }
  await runningNow(lh, refund);
  const running = await lh.pool.query("SELECT j::text AS row FROM jobs AS j ORDER BY id");
  await assert.rejects(enqueueAs(app, lh.schema, "newsletter", {}, { uniqueKey: "user-42", onDuplicate: "cancel_running" }), /of task "refund"/);
  assert.deepEqual((await lh.pool.query("SELECT j::text AS row FROM jobs AS j ORDER BY id")).rows, running.rows, "the running holder untouched");
  assert.equal(before.rows.length, 1);
  assert.equal((await jobRow(lh, refund))!.cancel_requested, false);

  // Same task: a duplicate as before; "queue": any task in the queue; "global": any holder.
  assert.equal(await enqueueAs(app, lh.schema, "refund", {}, { uniqueKey: "user-42" }), refund);
  assert.equal(await enqueueAs(app, lh.schema, "newsletter", {}, { uniqueKey: "user-42", uniqueScope: "queue" }), refund);
  await assert.rejects(
    enqueueAs(app, lh.schema, "refund", {}, { uniqueKey: "user-42", uniqueScope: "queue", queue: "other" }),
    /in queue "default" \(unique keys are matched within the queue/,
  );
  assert.equal(await enqueueAs(app, lh.schema, "newsletter", {}, { uniqueKey: "user-42", uniqueScope: "global" }), refund);
  for (const [options, message] of [
    [{ uniqueKey: "k", uniqueScope: "tasks" }, /uniqueScope must be one of "task", "queue", "global" \(got "tasks"\)/],
    [{ uniqueScope: "global" }, /uniqueScope "global" needs a uniqueKey/],
  ] as const) {
    await assert.rejects(
      enqueueAs(app, lh.schema, "t", {}, options),
      (err: { code?: string; message: string }) => err.code === "22023" && message.test(err.message),
    );
  }
  assert.equal((await lh.pool.query("SELECT count(*)::int AS n FROM jobs")).rows[0].n, 1, "nothing else written");
});

test("SQL: runAt before 1970 or more than 3650 days ahead is refused (22023) naming runAt", async (t) => {
  const lh = await freshLeasehold(t);
  const app = await asRestrictedRole(lh, t);
  for (const runAt of ["0001-01-01T00:00:00Z", "1969-12-31T23:59:59Z", "2999-01-01T00:00:00Z", "infinity"]) {
    await assert.rejects(
      enqueueAs(app, lh.schema, "t", {}, { runAt }),
      (err: { code?: string; message: string }) =>
        err.code === "22023" && /runAt must be from 1970-01-01T00:00:00Z to 3650 days from now/.test(err.message),
      runAt,
    );
  }
  const edge = await enqueueAs(app, lh.schema, "t", {}, { runAt: "1970-01-01T00:00:00Z" });
  const ahead = await enqueueAs(app, lh.schema, "t", {}, { runAt: new Date(Date.now() + 3000 * 86_400_000).toISOString() });
  assert.ok(edge && ahead);
  assert.equal((await lh.pool.query("SELECT count(*)::int AS n FROM jobs")).rows[0].n, 2);
});

test("a role with exactly the documented grants sends events from a trigger on its own table, waking the job that waits", async (t) => {
  const lh = await freshLeasehold(t);
  const app = await asRestrictedRole(lh, t);
  const worker = lh.worker({
    handlers: {
      fulfil: async (p: { order: number }, ctx: JobContext) => ({
        paid: await ctx.waitForEvent("paid", { event: "order.paid", match: { order: p.order } }),
      }),
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const { id } = await lh.enqueue("fulfil", { order: 7 });
  await eventually(async () => (await lh.getJob(id)).job.state === "suspended" || undefined, "the job waits for its event");

  // The application's table and trigger, in the role's own schema: a paid order sends its event.
  const own = `app_tables_${randomBytes(4).toString("hex")}`;
  await lh.pool.query(`CREATE SCHEMA ${own}`);
  t.after(async () => {
    // On a connection of its own: the test's pool may be closed by now.
    const admin = new pg.Client({ connectionString: databaseUrl() });
    await admin.connect();
    await admin.query(`DROP SCHEMA ${own} CASCADE`);
    await admin.end();
  });
  await lh.pool.query(`CREATE TABLE ${own}.payments (order_id int NOT NULL, cents int NOT NULL)`);
  const role = (await app.query<{ r: string }>("SELECT current_user AS r")).rows[0]!.r;
  await lh.pool.query(`GRANT USAGE ON SCHEMA ${own} TO ${role}`);
  await lh.pool.query(`GRANT INSERT ON ${own}.payments TO ${role}`);
  await lh.pool.query(`
    CREATE FUNCTION ${own}.order_paid() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      PERFORM ${lh.schema}.send_event('order.paid', jsonb_build_object('order', NEW.order_id, 'cents', NEW.cents));
      RETURN NEW;
    END $$`);
  await lh.pool.query(`CREATE TRIGGER payments_paid AFTER INSERT ON ${own}.payments FOR EACH ROW EXECUTE FUNCTION ${own}.order_paid()`);
  // With NATS dispatch on, the woken job owes a doorbell too (dispatch_outbox).
  await lh.pool.query("UPDATE dispatch_settings SET active_until = now() + interval '1 hour'");

  await app.query(`INSERT INTO ${own}.payments VALUES (8, 100)`);
  assert.equal((await lh.getJob(id)).job.state, "suspended", "another order's event leaves the wait alone");
  await app.query("BEGIN");
  await app.query(`INSERT INTO ${own}.payments VALUES (7, 2500)`);
  await app.query("ROLLBACK");
  assert.equal((await lh.getJob(id)).job.state, "suspended", "an event in a rolled-back transaction never happened");
  await app.query(`INSERT INTO ${own}.payments VALUES (7, 2500)`);
  const doorbells = await lh.pool.query("SELECT 1 FROM dispatch_outbox WHERE job_id = $1", [id]);
  assert.equal(doorbells.rowCount, 1, "the woken job's doorbell is owed");
  await lh.pool.query("UPDATE dispatch_settings SET active_until = NULL");
  const done = await eventually(async () => {
    const r = await lh.getJob(id);
    return r.job.state === "succeeded" ? r : undefined;
  }, "the job woken and finished");
  assert.deepEqual(done.job.result, { paid: { order: 7, cents: 2500 } });
  // The role cannot read the events it sent (nor anyone else's).
  await assert.rejects(app.query(`SELECT data FROM ${lh.schema}.events`), /permission denied/);
});
