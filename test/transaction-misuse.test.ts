/**
 * A handler that breaks out of `ctx.transaction`'s transaction, against the real server: a
 * COMMIT, ROLLBACK or BEGIN on `tx`, a `tx` kept past its callback (and so reaching another
 * job's transaction on the same pooled connection), a failed statement the handler swallowed.
 * Each fails its attempt with a TransactionMisuseError and never lets the job's completion
 * commit apart from the handler's writes. SAVEPOINTs, which nest, still work.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import pg from "pg";
import { TransactionMisuseError } from "../packages/leasehold/src/errors.js";
import type { JobContext } from "../packages/leasehold/src/worker/context.js";
import { transactionControl } from "../packages/leasehold/src/worker/transaction-guard.js";
import { databaseUrl, eventually, freshLeasehold, NO_BACKOFF, uniqueSchema } from "./helpers/db.js";

type Lh = Awaited<ReturnType<typeof freshLeasehold>>;

/** An application table of the test's own (in a schema dropped at the end). */
async function effectsTable(lh: Lh, t: { after(fn: () => Promise<void>): void }): Promise<{ table: string; rows: () => Promise<string[]> }> {
  const schema = uniqueSchema("app");
  t.after(async () => void (await lh.pool.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`).catch(() => {})));
  await lh.pool.query(`CREATE SCHEMA ${schema}; CREATE TABLE ${schema}.effects (label text)`);
  const table = `${schema}.effects`;
  return { table, rows: async () => (await lh.pool.query<{ label: string }>(`SELECT label FROM ${table} ORDER BY label`)).rows.map((r) => r.label) };
}

async function endedDead(lh: Lh, id: string): Promise<string> {
  const { job, attempts } = await eventually(async () => {
    const record = await lh.getJob(id);
    return record.job.state === "dead" ? record : undefined;
  }, `job ${id} died`);
  assert.equal(job.state, "dead");
  assert.deepEqual(
    attempts.map((a) => a.outcome),
    ["failed"],
  );
  return attempts[0]!.error!;
}

test("a handler's COMMIT, ROLLBACK, BEGIN or END on tx fails its attempt with a clear error, caught or not; none of its writes survive", async (t) => {
  const lh = await freshLeasehold(t);
  const effects = await effectsTable(lh, t);
  const worker = lh.worker({
    handlers: {
      escape: async (p: { sql: string; swallow: boolean; label: string }, ctx: JobContext) => {
        await ctx.transaction(async (tx) => {
          await tx.query(`INSERT INTO ${effects.table} VALUES ($1)`, [p.label]);
          const sent = tx.query(p.sql);
          // A handler that swallows the refusal still fails: its transaction is not what it thinks.
          if (p.swallow) await sent.catch(() => {});
          else await sent;
          await tx.query(`INSERT INTO ${effects.table} VALUES ($1)`, [`${p.label} after`]);
        });
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const cases = [
    { sql: "COMMIT", swallow: false, named: "COMMIT" },
    { sql: "commit; BEGIN", swallow: true, named: "COMMIT" },
    { sql: "ROLLBACK", swallow: true, named: "ROLLBACK" },
    { sql: "BEGIN", swallow: false, named: "BEGIN" },
    { sql: "/* done */ END", swallow: false, named: "END" },
    { sql: `INSERT INTO ${effects.table} VALUES ('; COMMIT'); START TRANSACTION`, swallow: true, named: "START TRANSACTION" },
    { sql: "ROLLBACK AND CHAIN", swallow: false, named: "ROLLBACK" },
  ];
  for (const [i, c] of cases.entries()) {
    const { id } = await lh.enqueue("escape", { sql: c.sql, swallow: c.swallow, label: `case ${i}` }, { maxAttempts: 1 });
    const error = await endedDead(lh, id);
    assert.match(error, /^TransactionMisuseError: /, c.sql);
    assert.ok(error.includes(`the handler sent ${c.named} on tx, which was not run`), `${c.sql}: ${error}`);
  }
  assert.deepEqual(await effects.rows(), [], "every write was rolled back with the failed attempt");
});

test("a COMMIT that slips past tx.query is caught by the database: the completion does not run, the attempt fails", async (t) => {
  const lh = await freshLeasehold(t);
  const effects = await effectsTable(lh, t);
  const worker = lh.worker({
    handlers: {
      sneaky: async (_p: unknown, ctx: JobContext) => {
        await ctx.transaction(async (tx) => {
          await tx.query(`INSERT INTO ${effects.table} VALUES ('sneaky')`);
          // pg's own query, called on tx: the text never goes through the guard's.
          await (pg.Client.prototype.query as (this: unknown, text: string) => Promise<unknown>).call(tx, "COMMIT");
        });
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const { id } = await lh.enqueue("sneaky", {}, { maxAttempts: 1 });
  const error = await endedDead(lh, id);
  assert.match(error, /TransactionMisuseError: .*the handler ended the transaction ctx\.transaction began/);
  // Its write committed with its own COMMIT (the database cannot take that back), but the job
  // was not recorded as succeeded on the strength of it.
  assert.deepEqual(await effects.rows(), ["sneaky"]);
});

test("a tx kept after its callback is dead: it cannot roll back the next job's transaction on the same connection", async (t) => {
  const lh = await freshLeasehold(t);
  const effects = await effectsTable(lh, t);
  // One connection: the second job's transaction runs on the connection the first one kept.
  const pool = new pg.Pool({ connectionString: databaseUrl(), max: 1 });
  t.after(() => pool.end());
  let kept: pg.PoolClient | undefined;
  let firstDone!: () => void;
  const firstCommitted = new Promise<void>((r) => (firstDone = r));
  let secondInside!: () => void;
  const secondOpen = new Promise<void>((r) => (secondInside = r));
  let keptTried!: () => void;
  const keptUsed = new Promise<void>((r) => (keptTried = r));
  const keptErrors: unknown[] = [];
  const worker = lh.worker({
    concurrency: 2,
    handlers: {
      keeper: async (_p: unknown, ctx: JobContext) => {
        await ctx.transaction(
          async (tx) => {
            kept = tx;
            await tx.query(`INSERT INTO ${effects.table} VALUES ('keeper')`);
          },
          { pool },
        );
        firstDone();
        await secondOpen;
        for (const use of [() => kept!.query("ROLLBACK"), () => kept!.query("SELECT 1"), async () => kept!.release()]) {
          await use().catch((err: unknown) => void keptErrors.push(err));
        }
        keptTried();
      },
      victim: async (_p: unknown, ctx: JobContext) => {
        await ctx.transaction(
          async (tx) => {
            await tx.query(`INSERT INTO ${effects.table} VALUES ('victim')`);
            secondInside();
            await keptUsed;
          },
          { pool },
        );
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const keeper = await lh.enqueue("keeper", {}, { maxAttempts: 1 });
  await firstCommitted;
  const victim = await lh.enqueue("victim", {}, { maxAttempts: 1 });
  await eventually(async () => (await lh.getJob(victim.id)).job.state === "succeeded", "the second job succeeded");
  assert.equal(keptErrors.length, 3);
  for (const err of keptErrors) {
    assert.ok(err instanceof TransactionMisuseError, String(err));
    assert.match(err.message, /tx was used after its callback returned/);
  }
  assert.deepEqual(await effects.rows(), ["keeper", "victim"], "both jobs' writes committed with their completions");
  await eventually(async () => (await lh.getJob(keeper.id)).job.state === "succeeded", "the first job stays succeeded");
});

test("SAVEPOINT and ROLLBACK TO SAVEPOINT nest; a failed statement swallowed without them fails the attempt by name", async (t) => {
  const lh = await freshLeasehold(t);
  const effects = await effectsTable(lh, t);
  const worker = lh.worker({
    handlers: {
      nested: {
        backoff: NO_BACKOFF,
        handler: async (p: { savepoint: boolean }, ctx: JobContext) => {
          await ctx.transaction(async (tx) => {
            const label = p.savepoint ? "with savepoint" : "without";
            await tx.query(`INSERT INTO ${effects.table} VALUES ($1)`, [label]);
            if (p.savepoint) await tx.query("SAVEPOINT maybe");
            await tx.query(`INSERT INTO ${effects.table} VALUES ($1)`, [`${label}: undone`]);
            await tx.query("SELECT 1 / 0").catch(() => {});
            if (p.savepoint) await tx.query("ROLLBACK TRANSACTION TO SAVEPOINT maybe; RELEASE SAVEPOINT maybe");
          });
        },
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const ok = await lh.enqueue("nested", { savepoint: true });
  await eventually(async () => (await lh.getJob(ok.id)).job.state === "succeeded", "the job with a savepoint succeeded");
  const swallowed = await lh.enqueue("nested", { savepoint: false }, { maxAttempts: 1 });
  const error = await endedDead(lh, swallowed.id);
  assert.match(error, /TransactionMisuseError: .*a statement on tx failed and the callback went on/);
  assert.deepEqual(await effects.rows(), ["with savepoint"]);
});

test("transactionControl names what would end the transaction, and nothing that nests or is quoted", () => {
  const refused: [string, string][] = [
    ["COMMIT", "COMMIT"],
    ["commit work", "COMMIT"],
    ["COMMIT PREPARED 'x'", "COMMIT PREPARED"],
    ["end", "END"],
    ["abort", "ABORT"],
    ["begin isolation level serializable", "BEGIN"],
    ["start transaction", "START TRANSACTION"],
    ["PREPARE TRANSACTION 'x'", "PREPARE TRANSACTION"],
    ["ROLLBACK", "ROLLBACK"],
    ["rollback work", "ROLLBACK"],
    ["ROLLBACK PREPARED 'x'", "ROLLBACK"],
    ["SELECT 1; -- a comment\n COMMIT", "COMMIT"],
    ["SELECT $$;$$; COMMIT", "COMMIT"],
    ["CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC END; COMMIT", "COMMIT"],
  ];
  for (const [sql, named] of refused) assert.equal(transactionControl(sql), named, sql);
  const allowed = [
    "SAVEPOINT a",
    "ROLLBACK TO a",
    "rollback to savepoint a",
    "ROLLBACK TRANSACTION TO SAVEPOINT a",
    "RELEASE SAVEPOINT a",
    "RELEASE a",
    "PREPARE q AS SELECT 1",
    "SELECT 'COMMIT'",
    "SELECT E'\\'; COMMIT'",
    'SELECT 1 AS "x; COMMIT"',
    "/* COMMIT */ SELECT 1 -- ; COMMIT",
    "/* nested /* COMMIT; */ still; COMMIT */ SELECT 1",
    "DO $body$ BEGIN COMMIT; END $body$",
    "SELECT $1::text; SELECT CASE WHEN true THEN 1 END",
    "CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; SELECT 2; END",
    "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
  ];
  for (const sql of allowed) assert.equal(transactionControl(sql), undefined, sql);
});
