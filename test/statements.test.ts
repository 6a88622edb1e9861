/**
 * Every store statement against the migrated schema: it prepares (the SQL is valid against
 * the tables as migrated), and the columns PostgreSQL describes for its result are, in order,
 * the names and types its declaration says (the row type the code reads is derived from that
 * declaration). A renamed or retyped column fails here before it fails a user.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import type pg from "pg";
import "../packages/leasehold/src/store/index.js"; // loads every store module, which registers its statements
import { registeredStatements, statement, type Statement } from "../packages/leasehold/src/store/sql.js";
import { freshLeasehold } from "./helpers/db.js";

/** What is wrong with `st` on this connection (search_path = a migrated schema); [] if nothing. */
async function checkStatement(client: pg.PoolClient, st: Statement): Promise<string[]> {
  await client.query("BEGIN");
  try {
    await client.query(`PREPARE leasehold_statement_check AS ${st.text}`);
    const { rows } = await client.query<{ types: string[] }>(
      "SELECT parameter_types::text[] AS types FROM pg_prepared_statements WHERE name = 'leasehold_statement_check'",
    );
    await client.query("DEALLOCATE leasehold_statement_check");
    // Run it on the empty schema with neutral values (empty arrays, nulls): nothing matches,
    // nothing is written (and it is rolled back), but the result's columns are described.
    const values = rows[0]!.types.map((t) => (t.endsWith("[]") ? [] : null));
    await client.query("SAVEPOINT run");
    let result: pg.QueryResult;
    try {
      result = await client.query(st.text, values);
    } catch (err) {
      // An INSERT ... VALUES of nulls breaks a NOT NULL constraint: the statement prepared
      // (so it is valid against the schema), and one that returns nothing has nothing more to check.
      if (!/^23/.test((err as { code?: string }).code ?? "")) throw err;
      if (Object.keys(st.columns).length === 0) return [];
      // One that returns rows runs again with a plain value of each parameter's type.
      await client.query("ROLLBACK TO SAVEPOINT run");
      result = await client.query(st.text, rows[0]!.types.map(sampleValue));
    }
    const types = await client.query<{ oid: number; typname: string }>("SELECT oid::int, typname FROM pg_type WHERE oid = ANY($1::oid[])", [
      result.fields.map((f) => f.dataTypeID),
    ]);
    const typeName = new Map(types.rows.map((r) => [r.oid, r.typname]));
    const actual = result.fields.map((f) => `${f.name} ${typeName.get(f.dataTypeID)}`);
    const declared = Object.entries(st.columns).map(([name, type]) => `${name} ${type.replace(/\?$/, "")}`);
    return JSON.stringify(actual) === JSON.stringify(declared)
      ? []
      : [`${st.name}: declared columns (${declared.join(", ")}) but the database returns (${actual.join(", ")})`];
  } catch (err) {
    return [`${st.name}: ${(err as Error).message}`];
  } finally {
    await client.query("ROLLBACK");
  }
}

/** A value of a parameter type that satisfies NOT NULL and CHECK constraints of ordinary columns. */
function sampleValue(type: string): unknown {
  if (type.endsWith("[]")) return [];
  if (/^(integer|bigint|smallint|numeric|double precision)$/.test(type)) return 1000; // within every CHECK (rate windows >= 10 ms, holds >= 1000 ms, backfill limits <= 1000)
  if (type === "boolean") return false;
  if (type === "jsonb" || type === "json") return "{}";
  if (type.startsWith("timestamp")) return new Date();
  return "x";
}

test("every store statement prepares against the migrated schema and returns the columns it declares", async (t) => {
  const lh = await freshLeasehold(t);
  const statements = registeredStatements();
  assert.ok(statements.length >= 15, `only ${statements.length} statements registered`);
  const client = await lh.pool.connect();
  try {
    const problems: string[] = [];
    for (const st of statements) problems.push(...(await checkStatement(client, st)));
    assert.deepEqual(problems, []);
  } finally {
    client.release();
  }
});

test("the check fails for a renamed column, a wrong type, a missing column and invalid SQL", async (t) => {
  const lh = await freshLeasehold(t);
  const client = await lh.pool.connect();
  try {
    const wrong = [
      statement("renamed", "SELECT id, queue FROM jobs WHERE id = $1", { id: "int8", queue_name: "text" }),
      statement("retyped", "SELECT id, attempt FROM jobs WHERE id = $1", { id: "int8", attempt: "int8" }),
      statement("missing", "SELECT id FROM jobs WHERE id = $1", { id: "int8", task: "text" }),
      statement("invalid", "SELECT id FROM jobz WHERE id = $1", { id: "int8" }),
    ];
    for (const st of wrong) {
      const problems = await checkStatement(client, st);
      assert.equal(problems.length, 1, `${st.name} was not caught`);
    }
  } finally {
    client.release();
  }
});
