/**
 * What connect does with a schema of another release (docs/upgrading.md): one ahead by
 * compatible migrations is run beside (a rolling upgrade's older workers), one with a newer
 * release's breaking migration is refused, and with migrate: false one that lacks a migration
 * this release needs is refused, each with an error saying what to do.
 */
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { Writable } from "node:stream";
import { test } from "node:test";
import pino from "pino";
import { Registry } from "prom-client";
import { Leasehold } from "../packages/leasehold/src/client.js";
import { SchemaVersionError } from "../packages/leasehold/src/errors.js";
import { loadMigrations } from "../packages/leasehold/src/store/migrate.js";
import { databaseUrl, freshLeasehold, silent, uniqueSchema } from "./helpers/db.js";
import { TcpProxy } from "./helpers/proxy.js";

const connect = (schema: string, options: { migrate?: boolean; logger?: pino.Logger } = {}) =>
  Leasehold.connect({ databaseUrl: databaseUrl(), schema, logger: silent, metricsRegistry: new Registry(), ...options });

async function refusal(promise: Promise<unknown>): Promise<SchemaVersionError> {
  const err = await promise.then(
    () => assert.fail("connect should have refused the schema"),
    (e: unknown) => e,
  );
  assert.ok(err instanceof SchemaVersionError, `a SchemaVersionError, not ${String(err)}`);
  assert.equal(err.code, "schema_version");
  return err;
}

test("a schema ahead by a newer release's compatible migrations: connect runs beside it and says so", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.pool.query("INSERT INTO schema_migrations (version, name) VALUES (9001, '9001_future_table.sql')");
  for (const migrate of [true, false]) {
    const lines: string[] = [];
    const logger = pino({ level: "info" }, new Writable({ write: (chunk, _e, done) => (lines.push(String(chunk)), done()) }));
    const other = await connect(lh.schema, { migrate, logger });
    await other.close();
    const said = lines
      .map((l) => JSON.parse(l) as { msg: string; migrations?: string[] })
      .find((l) => l.migrations?.includes("9001_future_table.sql"));
    assert.match(said?.msg ?? "", /newer release of Leasehold, all compatible with this one/, `migrate: ${migrate}: logged ${lines.join("")}`);
  }
});

test("a schema a newer release migrated incompatibly (a breaking migration): connect refuses before applying anything", async (t) => {
  const lh = await freshLeasehold(t);
  const last = loadMigrations().at(-1)!;
  // As if this release's last migration were still pending, and a later major release had run.
  await lh.pool.query("DELETE FROM schema_migrations WHERE version = $1", [last.version]);
  await lh.pool.query("INSERT INTO schema_migrations (version, name, breaking) VALUES (9002, '9002_drop_old_columns.sql', true)");
  for (const migrate of [true, false]) {
    const err = await refusal(connect(lh.schema, { migrate }));
    assert.equal(err.reason, "schema_too_new");
    assert.match(err.message, /was migrated by a newer, incompatible release of Leasehold \(9002_drop_old_columns\.sql/);
    assert.match(err.message, new RegExp(`this release knows migrations up to ${last.name}: deploy the newer release`));
  }
  const { rows } = await lh.pool.query("SELECT 1 FROM schema_migrations WHERE version = $1", [last.version]);
  assert.equal(rows.length, 0, "the refused migrator applied nothing");
});

test("migrate: false on a schema that lacks this release's migrations, or has none: refused, saying to run leasehold migrate", async (t) => {
  const lh = await freshLeasehold(t);
  const [before, last] = loadMigrations().slice(-2);
  await lh.pool.query("DELETE FROM schema_migrations WHERE version >= $1", [before!.version]);
  const behind = await refusal(connect(lh.schema, { migrate: false }));
  assert.equal(behind.reason, "schema_behind");
  assert.equal(
    behind.message,
    `schema "${lh.schema}" lacks migrations ${before!.name}, ${last!.name} that this release of Leasehold needs: ` +
      "run `leasehold migrate` with this release (or connect one process with migrate: true) first",
  );

  const empty = uniqueSchema();
  const none = await refusal(connect(empty, { migrate: false }));
  assert.equal(none.reason, "not_migrated");
  assert.equal(none.message, `schema "${empty}" has no Leasehold tables: run \`leasehold migrate\` (or connect with migrate: true) first`);
});

test("a schema_migrations table as 0.1.0 made it (no breaking column) is read, and the column added by the next migrator", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.pool.query("ALTER TABLE schema_migrations DROP COLUMN breaking");
  await (await connect(lh.schema, { migrate: false })).close();
  await (await connect(lh.schema)).close();
  const { rows } = await lh.pool.query("SELECT count(*)::int AS n FROM schema_migrations WHERE NOT breaking");
  assert.equal(rows[0].n, loadMigrations().length);
});

test("a migration marks itself breaking with a line `-- leasehold: breaking`; none of this major version's does", () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-migrations-"));
  try {
    fs.writeFileSync(path.join(dir, "001_additive.sql"), "-- adds a table\nCREATE TABLE a (id int);\n");
    fs.writeFileSync(path.join(dir, "002_drop.sql"), "-- Drops a column older code reads.\n-- leasehold: breaking\nALTER TABLE a DROP COLUMN id;\n");
    assert.deepEqual(
      loadMigrations(dir).map((m) => [m.name, m.breaking]),
      [
        ["001_additive.sql", false],
        ["002_drop.sql", true],
      ],
    );
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
  // Within 0.x a rolling upgrade must stay possible (docs/upgrading.md): every migration additive.
  assert.deepEqual(
    loadMigrations()
      .filter((m) => m.breaking)
      .map((m) => m.name),
    [],
  );
});

test("migrate: false with connectRetry waits at connect for a database that is restarting, and fails at once for a host that does not resolve", async (t) => {
  const lh = await freshLeasehold(t);
  const { proxy, proxiedUrl } = TcpProxy.forUrl(databaseUrl());
  await proxy.start();
  t.after(() => proxy.stop());
  proxy.cut(); // every connection is dropped as it opens: a server going down and up
  let settled = false;
  const connecting = Leasehold.connect({
    databaseUrl: proxiedUrl(),
    schema: lh.schema,
    logger: silent,
    migrate: false,
    connectRetry: { timeoutMs: 30_000 },
  }).finally(() => (settled = true));
  await new Promise((r) => setTimeout(r, 1_000));
  assert.equal(settled, false, "connect gave up while the database was restarting");
  proxy.restore();
  const client = await connecting;
  await client.close();

  const started = Date.now();
  await assert.rejects(
    Leasehold.connect({
      databaseUrl: "postgres://u:p@no-such-host.invalid:5432/db",
      schema: lh.schema,
      logger: silent,
      migrate: false,
      connectRetry: { timeoutMs: 30_000 },
    }),
    (err: Error) => err.name === "DatabaseUnavailableError" && /no-such-host\.invalid:5432/.test(err.message),
  );
  assert.ok(Date.now() - started < 10_000, "a host that does not resolve is not waited for");
});
