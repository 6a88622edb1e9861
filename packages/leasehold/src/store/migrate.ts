/**
 * Versioned migrations from the numbered `.sql` files in `migrations/`. Safe to run from
 * many processes at once: a transaction-scoped advisory lock serialises them.
 */
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import type pg from "pg";
import { assertSchemaName, quoteIdent, withTransaction } from "./db.js";

const MIGRATIONS_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "migrations");

export interface Migration {
  version: number;
  name: string;
  sql: string;
}

export function loadMigrations(dir = MIGRATIONS_DIR): Migration[] {
  return fs
    .readdirSync(dir)
    .filter((f) => /^\d+_.*\.sql$/.test(f))
    .sort()
    .map((file) => ({
      version: Number(file.split("_")[0]),
      name: file,
      sql: fs.readFileSync(path.join(dir, file), "utf8"),
    }));
}

/** Applies the migrations not yet applied to `schema`; returns the names applied now. */
export async function migrate(pool: pg.Pool, schema: string): Promise<string[]> {
  assertSchemaName(schema);
  const migrations = loadMigrations();
  return withTransaction(pool, async (client) => {
    // One lock per schema: concurrent migrators wait here, then find nothing left to do.
    await client.query("SELECT pg_advisory_xact_lock(hashtext('leasehold-migrate:' || $1))", [schema]);
    await client.query(`CREATE SCHEMA IF NOT EXISTS ${quoteIdent(schema)}`);
    await client.query(`SET LOCAL search_path = ${quoteIdent(schema)}`);
    await client.query(
      `CREATE TABLE IF NOT EXISTS schema_migrations (
         version integer PRIMARY KEY,
         name text NOT NULL,
         applied_at timestamptz NOT NULL DEFAULT now())`,
    );
    const done = await client.query<{ version: number }>("SELECT version FROM schema_migrations");
    const applied = new Set(done.rows.map((r) => r.version));
    const now: string[] = [];
    for (const m of migrations) {
      if (applied.has(m.version)) continue;
      await client.query(m.sql);
      await client.query("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", [m.version, m.name]);
      now.push(m.name);
    }
    return now;
  });
}
