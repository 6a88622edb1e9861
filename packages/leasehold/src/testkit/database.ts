/**
 * A fresh database per test queue, cloned from a migrated template.
 *
 * Migrating a database takes a good part of a second; cloning a migrated one
 * (`CREATE DATABASE x TEMPLATE t`) takes a fraction of that. The template is named after a hash
 * of what makes it (the migrations' text, the schema, the fake clock's SQL), so it is reused
 * while those stay the same and a changed migration builds a new one. Test files run in
 * parallel processes, so building is guarded twice: an advisory lock makes later builders wait
 * and then find the template, and the template appears only by a rename of a finished build,
 * so nobody clones half a template.
 */
import { createHash, randomBytes } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import pg from "pg";
import { newRegistry } from "../metrics.js";
import { Leasehold } from "../index.js";
import { CLOCK_SQL } from "./clock.js";

/** The package's own migrations (shipped beside dist/ and src/). */
const MIGRATIONS_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "migrations");

export const TEMPLATE_PREFIX = "leasehold_template_";
export const TEST_DATABASE_PREFIX = "leasehold_test_";
/** One key for every template build on the server: builds are rare, a queue of them is harmless. */
const BUILD_LOCK = "leasehold-testkit-template";

export interface TemplateInfo {
  name: string;
  /** The template has the fake clock (built by a superuser): `clock.advance` works. */
  clock: boolean;
}

/**
 * The name of the template for these migrations and schema, and whether it carries the fake
 * clock (it can only when we are a superuser: the clock replaces `now()`).
 */
export function templateName(schema: string, clock: boolean): string {
  const hash = createHash("sha256");
  hash.update(`schema:${schema}\nclock:${clock ? CLOCK_SQL : "none"}\n`);
  for (const file of fs
    .readdirSync(MIGRATIONS_DIR)
    .filter((f) => /^\d+_.*\.sql$/.test(f))
    .sort()) {
    hash.update(`${file}\n`);
    hash.update(fs.readFileSync(path.join(MIGRATIONS_DIR, file)));
  }
  return TEMPLATE_PREFIX + hash.digest("hex").slice(0, 16);
}

/** `url` with its database replaced. Only URL forms (postgres://, postgresql://) can be rewritten. */
export function urlForDatabase(url: string, database: string): string {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new Error("leasehold/testing needs a database URL such as postgres://user:password@host:5432/postgres (the value given is not one)");
  }
  if (!/^postgres(ql)?:$/.test(parsed.protocol)) {
    throw new Error(`leasehold/testing needs a postgres:// URL to create databases with (got a ${parsed.protocol} URL)`);
  }
  parsed.pathname = `/${encodeURIComponent(database)}`;
  return parsed.toString();
}

async function withClient<T>(url: string, work: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: url, application_name: "leasehold-testkit" });
  await client.connect();
  try {
    return await work(client);
  } finally {
    await client.end().catch(() => {});
  }
}

async function databaseExists(client: pg.Client, name: string): Promise<boolean> {
  const { rows } = await client.query("SELECT 1 FROM pg_database WHERE datname = $1", [name]);
  return rows.length > 0;
}

/**
 * The template for `schema`, built now if missing. `adminUrl` is any database on the server we
 * may connect to (the user's DATABASE_URL); the template and the test databases sit beside it.
 */
export async function ensureTemplate(adminUrl: string, schema: string): Promise<TemplateInfo> {
  return withClient(adminUrl, async (admin) => {
    const { rows } = await admin.query<{ rolsuper: boolean; rolcreatedb: boolean }>(
      "SELECT rolsuper, rolcreatedb FROM pg_roles WHERE rolname = current_user",
    );
    const role = rows[0];
    if (!role?.rolsuper && !role?.rolcreatedb) {
      throw new Error(
        "leasehold/testing creates a database per test queue: the DATABASE_URL's role needs CREATEDB " +
          "(ALTER ROLE <name> CREATEDB), or be a superuser (needed for fake time too)",
      );
    }
    const clock = role.rolsuper;
    const name = templateName(schema, clock);
    if (await databaseExists(admin, name)) return { name, clock };
    // Session lock: released if this process dies mid-build, so nobody waits forever.
    await admin.query("SELECT pg_advisory_lock(hashtext($1))", [BUILD_LOCK]);
    try {
      if (await databaseExists(admin, name)) return { name, clock };
      await dropStaleBuilds(admin, name);
      await buildTemplate(admin, adminUrl, name, schema, clock);
      return { name, clock };
    } finally {
      await admin.query("SELECT pg_advisory_unlock(hashtext($1))", [BUILD_LOCK]).catch(() => {});
    }
  });
}

/** Builds that a killed process left behind: nobody else builds while we hold the lock. */
async function dropStaleBuilds(admin: pg.Client, name: string): Promise<void> {
  const { rows } = await admin.query<{ datname: string }>("SELECT datname FROM pg_database WHERE left(datname, $2) = $1", [
    `${name}_b`,
    name.length + 2,
  ]);
  for (const { datname } of rows) await admin.query(`DROP DATABASE IF EXISTS ${pg.escapeIdentifier(datname)} WITH (FORCE)`);
}

async function buildTemplate(admin: pg.Client, adminUrl: string, name: string, schema: string, clock: boolean): Promise<void> {
  const building = `${name}_b${randomBytes(4).toString("hex")}`;
  await admin.query(`CREATE DATABASE ${pg.escapeIdentifier(building)} TEMPLATE template0`);
  try {
    const url = urlForDatabase(adminUrl, building);
    // The library's own migrate-on-connect: the template is exactly what a user's app gets.
    const lh = await Leasehold.connect({ databaseUrl: url, schema, metricsRegistry: newRegistry(), poolSize: 1 });
    await lh.close();
    // The clock goes in last and before any test connects: sessions cache plans that call
    // the original now() directly, so it must be in place before the first statement runs.
    if (clock) await withClient(url, (c) => c.query(CLOCK_SQL));
    // The rename publishes it whole; another server-wide builder may have won meanwhile.
    try {
      await admin.query(`ALTER DATABASE ${pg.escapeIdentifier(building)} RENAME TO ${pg.escapeIdentifier(name)}`);
    } catch (err) {
      if ((err as { code?: string }).code !== "42P04") throw err; // duplicate_database: use theirs
      await admin.query(`DROP DATABASE IF EXISTS ${pg.escapeIdentifier(building)} WITH (FORCE)`);
      return;
    }
    // A template any role with CREATEDB may clone, and nobody connects to by mistake.
    await admin.query(`ALTER DATABASE ${pg.escapeIdentifier(name)} WITH IS_TEMPLATE true ALLOW_CONNECTIONS false`);
  } catch (err) {
    await admin.query(`DROP DATABASE IF EXISTS ${pg.escapeIdentifier(building)} WITH (FORCE)`).catch(() => {});
    throw err;
  }
}

/** A new, empty-of-jobs database cloned from the template; returns its name. */
export async function createTestDatabase(adminUrl: string, template: string): Promise<string> {
  const name = TEST_DATABASE_PREFIX + randomBytes(6).toString("hex");
  await withClient(adminUrl, (admin) => admin.query(`CREATE DATABASE ${pg.escapeIdentifier(name)} TEMPLATE ${pg.escapeIdentifier(template)}`));
  return name;
}

/** Drops a test database, ending any session still on it (a worker the test left running). */
export async function dropTestDatabase(adminUrl: string, name: string): Promise<void> {
  await withClient(adminUrl, (admin) => admin.query(`DROP DATABASE IF EXISTS ${pg.escapeIdentifier(name)} WITH (FORCE)`));
}

/**
 * Drops every template this testkit made on the server (old migrations leave theirs behind).
 * Only when no test runs: a clone in progress would fail.
 */
export async function dropTemplates(adminUrl = process.env.DATABASE_URL): Promise<string[]> {
  if (!adminUrl) throw new Error("dropTemplates needs a database URL (or DATABASE_URL)");
  return withClient(adminUrl, async (admin) => {
    const { rows } = await admin.query<{ datname: string }>("SELECT datname FROM pg_database WHERE left(datname, $2) = $1", [
      TEMPLATE_PREFIX,
      TEMPLATE_PREFIX.length,
    ]);
    for (const { datname } of rows) {
      await admin.query(`ALTER DATABASE ${pg.escapeIdentifier(datname)} WITH IS_TEMPLATE false`);
      await admin.query(`DROP DATABASE IF EXISTS ${pg.escapeIdentifier(datname)} WITH (FORCE)`);
    }
    return rows.map((r) => r.datname);
  });
}
