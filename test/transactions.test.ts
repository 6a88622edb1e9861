/**
 * Jobs born and finished inside the application's own transactions, against the real server:
 * enqueue on the caller's client (the job exists if and only if the transaction commits, and
 * the wake-up goes out at commit), the SQL function `enqueue` from a trigger with the same
 * checks as the client, and `ctx.transaction`, whose writes commit with the job's completion
 * or not at all.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import pg from "pg";
import { StaleLeaseError, ValidationError } from "../packages/leasehold/src/errors.js";
import type { JobContext } from "../packages/leasehold/src/worker/context.js";
import * as store from "../packages/leasehold/src/store/index.js";
import { databaseUrl, eventually, freshLeasehold, uniqueSchema, recordEvents } from "./helpers/db.js";

type Lh = Awaited<ReturnType<typeof freshLeasehold>>;

/** A plain application connection (the server's default search_path), closed after the test. */
async function appClient(t: { after(fn: () => Promise<void>): void }): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: databaseUrl() });
  await client.connect();
  t.after(() => client.end());
  return client;
}

/** Collects the NOTIFY wake-ups of the schema's channel. */
async function wakeups(lh: Lh, t: { after(fn: () => Promise<void>): void }): Promise<string[]> {
  const listener = await appClient(t);
  const seen: string[] = [];
  listener.on("notification", (n) => seen.push(n.payload ?? ""));
  await listener.query(`LISTEN "${store.notifyChannel(lh.schema)}"`);
  return seen;
}

/** An application schema of the test's own, dropped at the end on a connection of its own. */
async function appSchemaFor(t: { after(fn: () => Promise<void>): void }): Promise<string> {
  const schema = uniqueSchema("app");
  t.after(async () => {
    const c = new pg.Client({ connectionString: databaseUrl() });
    await c.connect();
    await c.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`).finally(() => c.end());
  });
  return schema;
}

const countJobs = async (lh: Lh) => (await lh.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM jobs")).rows[0]!.n;
const settle = () => new Promise((r) => setTimeout(r, 300));

test("a job enqueued in a rolled-back transaction never exists and wakes nobody; a committed one runs", async (t) => {
  const lh = await freshLeasehold(t);
  const seen = await wakeups(lh, t);
  const app = await appClient(t);
  await app.query("CREATE TEMP TABLE orders (id int PRIMARY KEY)");

  await app.query("BEGIN");
  await app.query("INSERT INTO orders VALUES (1)");
  const rolledBack = await lh.enqueue("ship", { order: 1 }, { db: app });
  assert.equal((await app.query("SELECT count(*)::int AS n FROM orders")).rows[0].n, 1);
  await app.query("ROLLBACK");
  await settle();
  assert.equal(await countJobs(lh), 0, "no job without the order");
  assert.deepEqual(seen, [], "no worker woken for a job that never existed");

  const ran: string[] = [];
  const worker = lh.worker({ handlers: { ship: (_p: unknown, ctx: JobContext) => void ran.push(ctx.jobId) } });
  await worker.start();
  t.after(() => worker.stop(0));
  await app.query("BEGIN");
  await app.query("INSERT INTO orders VALUES (2)");
  const committed = await lh.enqueue("ship", { order: 2 }, { db: app });
  await settle();
  assert.deepEqual(seen, [], "the wake-up waits for the commit");
  await app.query("COMMIT");
  await eventually(async () => ran.includes(committed.id), "the committed job ran");
  assert.deepEqual(seen, ["default"]);
  assert.ok(!ran.includes(rolledBack.id));
});

test("a pg Pool given as db is refused with a clear error, by every enqueue: its statements would not share one transaction", async (t) => {
  const lh = await freshLeasehold(t);
  const pool = new pg.Pool({ connectionString: databaseUrl(), max: 2 });
  t.after(() => pool.end());
  const refused = (err: unknown) => err instanceof ValidationError && /db is a pg Pool: pass one client/.test(err.message);
  await assert.rejects(lh.enqueue("t", {}, { db: pool }), refused);
  await assert.rejects(lh.enqueueMany([{ task: "t" }, { task: "t" }], { db: pool }), refused);
  await assert.rejects(
    lh.enqueueFlow(
      [
        { ref: "a", task: "t" },
        { ref: "b", task: "t", dependsOn: ["a"] },
      ],
      { db: pool },
    ),
    refused,
  );
  await assert.rejects(lh.enqueueBatch({ jobs: [{ task: "t" }], onComplete: { task: "done" } }, { db: pool }), refused);
  assert.equal(await countJobs(lh), 0, "nothing written");
  const client = await pool.connect();
  try {
    await lh.enqueue("t", {}, { db: client });
  } finally {
    client.release();
  }
  assert.equal(await countJobs(lh), 1, "a client checked out of the same pool is accepted");
});

test("bulk enqueue on the caller's client is part of its transaction, and all or nothing without one", async (t) => {
  const lh = await freshLeasehold(t);
  const app = await appClient(t);
  const many = (n: number, extra: object = {}) => Array.from({ length: n }, (_, i) => ({ task: "t", payload: { i }, ...extra }));

  await app.query("BEGIN");
  const jobs = await lh.enqueueMany(many(12_000), { db: app }); // three INSERTs of 5,000
  assert.equal(jobs.length, 12_000);
  assert.equal(await countJobs(lh), 0, "not visible before the commit");
  await app.query("ROLLBACK");
  assert.equal(await countJobs(lh), 0);

  await app.query("BEGIN");
  await lh.enqueueMany(many(12_000), { db: app });
  await app.query("COMMIT");
  assert.equal(await countJobs(lh), 12_000);

  // Outside a transaction, a batch that fails part-way (a key taken by another session, which
  // then rolls back: the third chunk's insert waits for it and, given a deadline, fails)
  // leaves nothing behind.
  const other = await appClient(t);
  await other.query("BEGIN");
  await lh.enqueue("t", {}, { db: other, uniqueKey: "held" });
  await app.query("SET statement_timeout = 500");
  await assert.rejects(lh.enqueueMany([...many(10_001), { task: "t", uniqueKey: "held" }], { db: app }), /statement timeout/);
  await app.query("RESET statement_timeout");
  await other.query("ROLLBACK");
  assert.equal(await countJobs(lh), 12_000, "none of the failed batch's chunks were kept");
  const txStatus = await app.query("SELECT 1 AS ok");
  assert.equal(txStatus.rows[0].ok, 1, "the client is usable afterwards (no transaction left open)");
});

test("the SQL function enqueues from a trigger in the same transaction; a bad option rolls the insert back", async (t) => {
  const lh = await freshLeasehold(t);
  const app = await appClient(t);
  const appSchema = await appSchemaFor(t);
  await app.query(`CREATE SCHEMA ${appSchema}; SET search_path = ${appSchema}`);
  await app.query(`
    CREATE TABLE orders (id int PRIMARY KEY, rush boolean NOT NULL DEFAULT false, bad_option boolean NOT NULL DEFAULT false);
    CREATE FUNCTION ship_order() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      PERFORM ${lh.schema}.enqueue('ship', jsonb_build_object('order', NEW.id),
        CASE WHEN NEW.bad_option THEN '{"queue": "orders", "maxAttempt": 3}'::jsonb
             ELSE jsonb_build_object('queue', 'orders', 'priority', CASE WHEN NEW.rush THEN -1 ELSE 0 END,
                                     'uniqueKey', 'ship:' || NEW.id) END);
      RETURN NEW;
    END $$;
    CREATE TRIGGER orders_ship AFTER INSERT ON orders FOR EACH ROW EXECUTE FUNCTION ship_order();`);

  const shipped: unknown[] = [];
  const worker = lh.worker({ queues: ["orders"], handlers: { ship: (p: { order: number }) => void shipped.push(p.order) } });
  await worker.start();
  t.after(() => worker.stop(0));
  await app.query("INSERT INTO orders (id, rush) VALUES (1, false), (2, true)");
  await eventually(async () => shipped.length === 2, "both orders shipped");
  assert.deepEqual([...shipped].sort(), [1, 2]);

  await assert.rejects(app.query("INSERT INTO orders (id, bad_option) VALUES (3, true)"), (err: Error & { code?: string }) => {
    assert.equal(err.code, "22023");
    assert.match(err.message, /leasehold\.enqueue: unknown option "maxAttempt"/);
    return true;
  });
  assert.equal((await app.query("SELECT count(*)::int AS n FROM orders WHERE id = 3")).rows[0].n, 0, "the order went with its job");
  await app.query("BEGIN");
  await app.query("INSERT INTO orders (id) VALUES (4)");
  await app.query("ROLLBACK");
  await settle();
  assert.equal(await countJobs(lh), 0, "a rolled-back order leaves no job");
});

test("the SQL function refuses what lh.enqueue refuses and stores what it stores", async (t) => {
  const lh = await freshLeasehold(t);
  const sql = (task: string, payload: string, options: object) =>
    lh.pool.query<{ id: string }>("SELECT enqueue($1, $2::jsonb, $3::jsonb)::text AS id", [task, payload, JSON.stringify(options)]);
  const deep = (n: number): unknown => (n === 0 ? 1 : [deep(n - 1)]);
  const refused: [string, unknown, Record<string, unknown>][] = [
    ["bad task", {}, {}],
    ["t", {}, { queue: "a b" }],
    ["t", {}, { queu: "x" }],
    ["t", {}, { priority: 1.5 }],
    ["t", {}, { priority: 40_000 }],
    ["t", {}, { maxAttempts: 0 }],
    ["t", {}, { leaseMs: 999 }],
    ["t", {}, { progressTimeoutMs: 8 * 86_400_000 }],
    ["t", {}, { delayMs: -1 }],
    ["t", {}, { uniqueKey: "" }],
    ["t", {}, { uniqueKey: "k".repeat(513) }],
    ["t", {}, { key: "" }],
    ["t", {}, { key: "k".repeat(513) }],
    ["t", {}, { key: 42 }],
    ["t", { a: deep(256) }, {}],
    ["t", { big: "x".repeat(1024 * 1024) }, {}],
  ];
  for (const [task, payload, options] of refused) {
    const what = JSON.stringify([task, options]).slice(0, 80);
    await assert.rejects(lh.enqueue(task, payload, options), /must|unknown option|deeper|larger/, `lh.enqueue accepted ${what}`);
    await assert.rejects(sql(task, JSON.stringify(payload), options), (err: { code?: string }) => err.code === "22023", `SQL accepted ${what}`);
  }
  await assert.rejects(sql("t", "{}", { runAt: "2030-01-01T00:00:00Z", delayMs: 5 }), /runAt or delayMs/);
  await assert.rejects(sql("t", "{}", { runAt: "soon" }), /runAt is not a valid timestamp/);
  assert.equal(await countJobs(lh), 0);

  const options = { queue: "q", priority: -3, maxAttempts: 7, uniqueKey: "same", leaseMs: 5_000, progressTimeoutMs: 2_000, maxRunMs: 60_000 };
  const fromClient = await lh.enqueue("t", { a: deep(255) }, options);
  const [fromSql] = (await sql("t", JSON.stringify({ a: deep(255) }), options)).rows;
  assert.equal(fromSql!.id, fromClient.id, "a key held by an unfinished job answers with that job");
  const runAt = "2030-01-01T00:00:00.000Z";
  const a = await lh.enqueue("t", { n: 1 }, { runAt: new Date(runAt), maxAttempts: 3, key: "tenant-1" });
  const [b] = (await sql("t", JSON.stringify({ n: 1 }), { runAt, maxAttempts: 3, key: "tenant-1" })).rows;
  const cols = "queue, task, payload, priority, run_at, max_attempts, unique_key, lease_ms, progress_timeout_ms, max_run_ms, flow_key";
  const rows = (await lh.pool.query(`SELECT ${cols} FROM jobs WHERE id = ANY($1::bigint[]) ORDER BY id`, [[a.id, b!.id]])).rows;
  assert.deepEqual(rows[0], rows[1]);
});

test("ctx.transaction: the handler's writes commit with the job's completion, exactly once", async (t) => {
  const lh = await freshLeasehold(t);
  const appSchema = await appSchemaFor(t);
  await lh.pool.query(`CREATE SCHEMA ${appSchema}; CREATE TABLE ${appSchema}.effects (job_id bigint, attempt int)`);
  const effects = async () => (await lh.pool.query(`SELECT job_id::text, attempt FROM ${appSchema}.effects ORDER BY job_id`)).rows;

  const worker = lh.worker({
    handlers: {
      pay: async (p: { fail?: boolean }, ctx: JobContext) => {
        await ctx.transaction(async (tx) => {
          await tx.query(`INSERT INTO ${appSchema}.effects VALUES ($1, $2)`, [ctx.jobId, ctx.attempt]);
          if (p.fail) throw new Error("card declined");
        });
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const ok = await lh.enqueue("pay", {});
  const declined = await lh.enqueue("pay", { fail: true }, { maxAttempts: 1 });
  await eventually(async () => (await lh.getJob(declined.id)).job.state === "dead", "the declined job died");
  await eventually(async () => (await lh.getJob(ok.id)).job.state === "succeeded", "the paid job succeeded");
  assert.deepEqual(await effects(), [{ job_id: ok.id, attempt: 1 }], "one write, from the job that succeeded");
  const { attempts } = await lh.getJob(ok.id);
  assert.deepEqual(
    attempts.map((a) => [a.attempt, a.outcome, a.workerId]),
    [[1, "succeeded", worker.id]],
  );
});

test("ctx.transaction of an attempt that lost its lease rolls back its writes and throws StaleLeaseError", async (t) => {
  const lh = await freshLeasehold(t);
  const appSchema = await appSchemaFor(t);
  await lh.pool.query(`CREATE SCHEMA ${appSchema}; CREATE TABLE ${appSchema}.effects (job_id bigint, attempt int)`);
  let wrote!: () => void;
  const written = new Promise<void>((r) => (wrote = r));
  let resume!: () => void;
  const resumed = new Promise<void>((r) => (resume = r));
  let thrown: unknown;
  // The zombie: it writes, then stalls (a GC pause, a partition) while its lease is reaped and
  // another attempt runs the job to its end; then its transaction tries to complete.
  const zombie = lh.worker({
    watchdog: false,
    scheduler: false,
    concurrency: 1,
    handlers: {
      pay: async (_p: unknown, ctx: JobContext) => {
        try {
          await ctx.transaction(async (tx) => {
            await tx.query(`INSERT INTO ${appSchema}.effects VALUES ($1, $2)`, [ctx.jobId, ctx.attempt]);
            wrote();
            await resumed;
          });
        } catch (err) {
          thrown = err;
          throw err;
        }
      },
    },
  });
  await zombie.start();
  t.after(async () => {
    resume(); // whatever happened, let the handler end so the worker can stop
    await zombie.stop(0);
  });
  const { id } = await lh.enqueue("pay", {}, { maxAttempts: 3 });
  await written;
  await lh.pool.query("UPDATE jobs SET lease_until = now() - interval '1 ms' WHERE id = $1", [id]);
  await lh.watchdog().runOnce();
  await lh.pool.query("UPDATE jobs SET run_at = now() WHERE id = $1", [id]); // past the retry backoff
  const [second] = await store.claimJobs(lh.pool, { queues: ["default"], limit: 1, workerId: "rescuer", leaseMs: 30_000, tasks: ["pay"] });
  assert.equal(second?.attempt, 2);
  await store.completeJobs(lh.pool, { workerId: "rescuer", jobs: [{ id, attempt: 2 }] });
  resume();
  await eventually(async () => thrown !== undefined, "the zombie's transaction ended", 5_000);
  assert.ok(thrown instanceof StaleLeaseError, String(thrown));
  assert.equal(thrown.reason, "finished");
  assert.deepEqual((await lh.pool.query(`SELECT * FROM ${appSchema}.effects`)).rows, [], "the zombie's write rolled back");
  const { job, attempts } = await lh.getJob(id);
  assert.deepEqual(
    [job.state, attempts.map((a) => `${a.attempt}:${a.outcome}:${a.workerId}`)],
    ["succeeded", ["1:lease_expired:" + zombie.id, "2:succeeded:rescuer"]],
  );
});

test("ctx.transaction of a job cancelled meanwhile rolls back its writes and throws StaleLeaseError (cancelled)", async (t) => {
  const lh = await freshLeasehold(t);
  const appSchema = await appSchemaFor(t);
  await lh.pool.query(`CREATE SCHEMA ${appSchema}; CREATE TABLE ${appSchema}.effects (job_id bigint)`);
  let release!: () => void;
  const waiting = new Promise<void>((r) => (release = r));
  const errors: unknown[] = [];
  const worker = lh.worker({
    handlers: {
      slow: async (_p: unknown, ctx: JobContext) => {
        await ctx
          .transaction(async (tx) => {
            await tx.query(`INSERT INTO ${appSchema}.effects VALUES ($1)`, [ctx.jobId]);
            await waiting;
          })
          .catch((err: unknown) => void errors.push(err));
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const starts = recordEvents(worker, "job:start");
  const { id } = await lh.enqueue("slow");
  await starts.waitFor((j: { id: string }) => j.id === id);
  assert.equal(await lh.cancel(id), "cancel_requested");
  release();
  await eventually(async () => errors.length === 1, "the transaction ended");
  assert.ok(errors[0] instanceof StaleLeaseError && errors[0].reason === "cancelled", String(errors[0]));
  assert.equal((await lh.pool.query(`SELECT count(*)::int AS n FROM ${appSchema}.effects`)).rows[0].n, 0);
  await eventually(async () => (await lh.getJob(id)).job.state === "cancelled", "the job ended cancelled");
});

test("a transaction whose connection is cut mid-way fails that attempt only: the process lives on and the job runs again", async (t) => {
  const lh = await freshLeasehold(t);
  const worker = lh.worker({
    handlers: {
      cut: {
        backoff: { baseMs: 0, maxMs: 0 },
        handler: async (_p: unknown, ctx: JobContext) => {
          await ctx.transaction(async (tx) => {
            if (ctx.attempt > 1) return;
            const { rows } = await tx.query<{ pid: number }>("SELECT pg_backend_pid() AS pid");
            await lh.pool.query("SELECT pg_terminate_backend($1)", [rows[0]!.pid]);
            // Idle in its transaction when the termination lands: the client emits 'error',
            // which must not reach the process as an unhandled event.
            await new Promise((r) => setTimeout(r, 300));
            await tx.query("SELECT 1");
          });
        },
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const { id } = await lh.enqueue("cut");
  await eventually(async () => (await lh.getJob(id)).job.state === "succeeded", "the job ran again and succeeded");
  const { attempts } = await lh.getJob(id);
  assert.deepEqual(
    attempts.map((a) => a.outcome),
    ["failed", "succeeded"],
  );
  assert.match(attempts[0]!.error!, /terminat|Connection/i);
});
