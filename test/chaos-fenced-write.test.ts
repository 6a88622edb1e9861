/** fencedWrite, the downstream fence handlers copy: a stale attempt's write is refused by the table itself. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { fencedWrite, fencedWriteSql, ValidationError } from "../src/index.js";
import { freshLeasehold } from "./helpers/db.js";

async function withTable() {
  const lh = await freshLeasehold();
  await lh.pool.query("CREATE TABLE results (job_id bigint PRIMARY KEY, token integer NOT NULL, value text NOT NULL)");
  const write = (token: number, value: string) => fencedWrite(lh.pool, { table: "results", key: { job_id: "7" }, token, values: { value } });
  const row = async () => (await lh.pool.query("SELECT token, value FROM results WHERE job_id = 7")).rows[0];
  return { lh, write, row };
}

test("a newer attempt overwrites, the same attempt may write again, an older one is refused", async () => {
  const { lh, write, row } = await withTable();
  assert.equal(await write(2, "first by 2"), true);
  assert.equal(await write(2, "again by 2"), true, "the same attempt retrying its write is not stale");
  assert.equal(await write(1, "stale 1"), false);
  assert.deepEqual(await row(), { token: 2, value: "again by 2" });
  assert.equal(await write(3, "by 3"), true);
  assert.equal(await write(2, "late 2"), false);
  assert.deepEqual(await row(), { token: 3, value: "by 3" });
  await lh.dispose();
});

test("concurrent writers from many attempts leave the newest attempt's value", async () => {
  const { lh, write, row } = await withTable();
  const tokens = [5, 1, 9, 3, 8, 2, 7, 4, 6, 10].sort(() => Math.random() - 0.5);
  await Promise.all(tokens.map((t) => write(t, `by ${t}`)));
  assert.deepEqual(await row(), { token: 10, value: "by 10" });
  await lh.dispose();
});

test("bad identifiers and tokens are refused with a ValidationError before any SQL runs", async () => {
  const db = { query: async () => assert.fail("no statement should run") };
  await assert.rejects(fencedWrite(db, { table: "results; DROP TABLE x", key: { id: 1 }, token: 1, values: {} }), ValidationError);
  await assert.rejects(fencedWrite(db, { table: "results", key: { 'id"': 1 }, token: 1, values: {} }), ValidationError);
  await assert.rejects(fencedWrite(db, { table: "results", key: {}, token: 1, values: {} }), /at least one key column/);
  await assert.rejects(fencedWrite(db, { table: "results", key: { id: 1 }, token: 0, values: {} }), /positive integer/);
  assert.match(fencedWriteSql({ table: "app.results", key: { job_id: 1 }, values: { v: 1 } }), /WHERE "results"\."token" <= EXCLUDED\."token"/);
});
