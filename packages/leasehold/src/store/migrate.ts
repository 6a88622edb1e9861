/**
 * Versioned migrations from the numbered `.sql` files in `migrations/`. Safe to run from
 * many processes at once: a transaction-scoped advisory lock serialises them.
 *
 * Releases share a schema during a rolling upgrade (docs/upgrading.md): within a major
 * version every migration is additive, so an older release's code runs against a schema a
 * newer release migrated, and each migrator leaves alone the migrations it does not know. A
 * migration that older code cannot run against (a major version's: a dropped column, a
 * changed function signature) says so with a line `-- leasehold: breaking`; it is recorded as
 * such, and code that does not know it refuses the schema at connect (SchemaVersionError)
 * instead of failing statement by statement in its workers.
 */
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import type pg from "pg";
import { SchemaVersionError } from "../errors.js";
import { assertSchemaName, quoteIdent, withTransaction, type Queryable } from "./db.js";

const MIGRATIONS_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "migrations");

/** The mark of a migration that code without it cannot run against. */
const BREAKING_MARK = /^--\s*leasehold:\s*breaking\s*$/m;

export interface Migration {
  version: number;
  name: string;
  sql: string;
  /** Code that does not know this migration must not run against a schema that has it. */
  breaking: boolean;
}

export function loadMigrations(dir = MIGRATIONS_DIR): Migration[] {
  return fs
    .readdirSync(dir)
    .filter((f) => /^\d+_.*\.sql$/.test(f))
    .sort()
    .map((file) => {
      const sql = fs.readFileSync(path.join(dir, file), "utf8");
      return { version: Number(file.split("_")[0]), name: file, sql, breaking: BREAKING_MARK.test(sql) };
    });
}

/** A row of schema_migrations. */
export interface AppliedMigration {
  version: number;
  name: string;
  breaking: boolean;
}

/** A schema compared with the migrations this code knows. */
export interface SchemaVersion {
  /** Applied, but unknown to this code: a newer release migrated the schema (compatibly, or connect refuses). */
  ahead: AppliedMigration[];
  /** Known to this code, but not applied: the schema is older than this code. */
  missing: Migration[];
}

/** Tries of a migration chosen as a deadlock's victim (it takes exclusive locks while workers run). */
const MIGRATE_TRIES = 3;

/** Applies the migrations not yet applied to `schema`; returns the names applied now. */
export async function migrate(pool: pg.Pool, schema: string): Promise<string[]> {
  assertSchemaName(schema);
  const migrations = loadMigrations();
  for (let tries = 1; ; tries++) {
    try {
      return await migrateOnce(pool, schema, migrations);
    } catch (err) {
      // Rolled back whole: nothing was applied, so trying again is safe.
      if ((err as { code?: string }).code !== "40P01" || tries >= MIGRATE_TRIES) throw err;
    }
  }
}

function migrateOnce(pool: pg.Pool, schema: string, migrations: Migration[]): Promise<string[]> {
  return withTransaction(pool, async (client) => {
    // One lock per schema: concurrent migrators wait here, then find nothing left to do.
    await client.query("SELECT pg_advisory_xact_lock(hashtext('leasehold-migrate:' || $1))", [schema]);
    await client.query(`CREATE SCHEMA IF NOT EXISTS ${quoteIdent(schema)}`);
    // pg_temp named last: functions created with `SET search_path FROM CURRENT` must never
    // resolve a caller's temporary objects first (migration 018 says why).
    await client.query(`SET LOCAL search_path = ${quoteIdent(schema)}, pg_temp`);
    await client.query(
      `CREATE TABLE IF NOT EXISTS schema_migrations (
         version integer PRIMARY KEY,
         name text NOT NULL,
         applied_at timestamptz NOT NULL DEFAULT now())`,
    );
    // Added by 0.2.0 to the table 0.1.0 made; 0.1.0's own INSERT (version, name) still fits.
    await client.query(`ALTER TABLE schema_migrations ADD COLUMN IF NOT EXISTS breaking boolean NOT NULL DEFAULT false`);
    // Refused before anything is applied: a newer release's breaking migration is here.
    refuseIncompatible(schema, compare(await appliedMigrations(client, "schema_migrations"), migrations));
    const done = await client.query<{ version: number }>("SELECT version FROM schema_migrations");
    const applied = new Set(done.rows.map((r) => r.version));
    const now: string[] = [];
    for (const m of migrations) {
      if (applied.has(m.version)) continue;
      await client.query(m.sql);
      await client.query("INSERT INTO schema_migrations (version, name, breaking) VALUES ($1, $2, $3)", [m.version, m.name, m.breaking]);
      now.push(m.name);
    }
    return now;
  });
}

/**
 * The schema as this code finds it at connect: refuses (SchemaVersionError) one it cannot run
 * against: not migrated, missing migrations this code needs (connect with `migrate: false`
 * before `leasehold migrate` ran), or migrated by a newer release with a breaking migration.
 * A schema ahead by additive migrations only is fine: it is what a rolling upgrade's older
 * workers see; the caller logs it.
 */
export async function checkSchemaVersion(db: Queryable, schema: string): Promise<SchemaVersion> {
  assertSchemaName(schema);
  const table = `${quoteIdent(schema)}.schema_migrations`;
  const { rows } = await db.query<{ exists: boolean }>("SELECT to_regclass($1) IS NOT NULL AS exists", [table]);
  if (!rows[0]!.exists) {
    throw new SchemaVersionError(
      "not_migrated",
      `schema "${schema}" has no Leasehold tables: run \`leasehold migrate\` (or connect with migrate: true) first`,
    );
  }
  const version = compare(await appliedMigrations(db, table), loadMigrations());
  refuseIncompatible(schema, version);
  if (version.missing.length > 0) {
    const names = version.missing.map((m) => m.name);
    throw new SchemaVersionError(
      "schema_behind",
      `schema "${schema}" lacks ${names.length === 1 ? "migration" : "migrations"} ${names.join(", ")} that this release of Leasehold ` +
        "needs: run `leasehold migrate` with this release (or connect one process with migrate: true) first",
    );
  }
  return version;
}

async function appliedMigrations(db: Queryable, table: string): Promise<AppliedMigration[]> {
  // `breaking` is absent while only 0.1.0 has migrated the schema (it made the table without it).
  const { rows } = await db.query<AppliedMigration>(
    `SELECT m.version, m.name, coalesce((to_jsonb(m) ->> 'breaking')::boolean, false) AS breaking
       FROM ${table} AS m ORDER BY m.version`,
  );
  return rows;
}

function compare(applied: AppliedMigration[], known: Migration[]): SchemaVersion {
  const knownVersions = new Set(known.map((m) => m.version));
  const appliedVersions = new Set(applied.map((m) => m.version));
  return {
    ahead: applied.filter((m) => !knownVersions.has(m.version)),
    missing: known.filter((m) => !appliedVersions.has(m.version)),
  };
}

function refuseIncompatible(schema: string, version: SchemaVersion): void {
  const breaking = version.ahead.filter((m) => m.breaking);
  if (breaking.length === 0) return;
  throw new SchemaVersionError(
    "schema_too_new",
    `schema "${schema}" was migrated by a newer, incompatible release of Leasehold (${breaking.map((m) => m.name).join(", ")}: ` +
      "code that does not know it cannot run against it); this release knows migrations up to " +
      `${loadMigrations().at(-1)?.name ?? "none"}: deploy the newer release (docs/upgrading.md)`,
  );
}
