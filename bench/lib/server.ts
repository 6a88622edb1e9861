/**
 * The one PostgreSQL every system runs against, and the readings taken from it: server CPU
 * (from /proc, all of the postmaster's processes), WAL position, transactions, dead tuples
 * and table sizes. Each system gets a database of its own on the same server.
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import pg from "pg";
import { EmbeddedPostgres } from "../../packages/cli/src/embedded/postgres.js";

export interface BenchServer {
  /** Connection URL of the maintenance database (postgres). */
  adminUrl: string;
  /** The postmaster's pid, when we started it (for CPU readings). */
  pid?: number;
  version: string;
  settings: Record<string, string>;
  /** A system's database on this server: its name, with the run's suffix if it has one. */
  database(name: string): string;
  urlFor(database: string): string;
  stop(): Promise<void>;
}

/**
 * Starts a throwaway embedded PostgreSQL in a temp dir (fsync and synchronous_commit on, the
 * defaults), or uses `url`. `databaseSuffix`: appended to every system's database name, so
 * that runs sharing a server (the smoke tests, two test files at once) never drop each other's.
 */
export async function startServer(url?: string, databaseSuffix?: string): Promise<BenchServer> {
  let server: EmbeddedPostgres | undefined;
  let dataRoot: string | undefined;
  if (!url) {
    dataRoot = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-bench-"));
    fs.chmodSync(dataRoot, 0o755);
    server = new EmbeddedPostgres({
      dataDir: path.join(dataRoot, "pgdata"),
      // Room for 4 worker processes per system plus producers; WAL sized so a 100k-job
      // run does not checkpoint every few seconds (the same for every system).
      settings: { max_connections: 400, shared_buffers: "256MB", max_wal_size: "2GB" },
    });
    try {
      url = await server.start();
    } catch (err) {
      fs.rmSync(dataRoot, { recursive: true, force: true }); // leave no temp dir behind
      throw err;
    }
  }
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  const { rows } = await admin.query<{ name: string; setting: string }>(
    `SELECT name, setting FROM pg_settings
      WHERE name IN ('server_version', 'fsync', 'synchronous_commit', 'shared_buffers', 'max_wal_size', 'autovacuum', 'wal_level')`,
  );
  await admin.end();
  const settings = Object.fromEntries(rows.map((r) => [r.name, r.setting]));
  const base = new URL(url);
  const databaseOf = (name: string) => (databaseSuffix ? `${name}_${databaseSuffix}` : name);
  return {
    adminUrl: url,
    pid: server?.pid,
    version: settings.server_version ?? "?",
    settings,
    database: databaseOf,
    urlFor(database: string) {
      const u = new URL(base);
      u.pathname = `/${databaseOf(database)}`;
      return u.toString();
    },
    async stop() {
      await server?.stop();
      if (dataRoot) fs.rmSync(dataRoot, { recursive: true, force: true });
    },
  };
}

/** (Re)creates an empty database. */
export async function recreateDatabase(adminUrl: string, database: string): Promise<void> {
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  try {
    await admin.query(`DROP DATABASE IF EXISTS ${pg.escapeIdentifier(database)} WITH (FORCE)`);
    await admin.query(`CREATE DATABASE ${pg.escapeIdentifier(database)}`);
  } finally {
    await admin.end();
  }
}

export async function dropDatabase(adminUrl: string, database: string): Promise<void> {
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  await admin.query(`DROP DATABASE IF EXISTS ${pg.escapeIdentifier(database)} WITH (FORCE)`).finally(() => admin.end());
}

const CLOCK_TICKS = 100; // USER_HZ on Linux

/** CPU milliseconds used so far by the server (postmaster and all its children), or NaN off Linux. */
export function serverCpuMs(postmasterPid: number | undefined): number {
  if (!postmasterPid || !fs.existsSync("/proc")) return NaN;
  let ticks = 0;
  for (const entry of fs.readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    let stat: string;
    try {
      stat = fs.readFileSync(`/proc/${entry}/stat`, "utf8");
    } catch {
      continue; // exited meanwhile
    }
    // Fields after the command name (which may contain spaces) start at ") ".
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    const pid = Number(entry);
    const ppid = Number(fields[1]);
    if (pid !== postmasterPid && ppid !== postmasterPid) continue;
    ticks += Number(fields[11]) + Number(fields[12]); // utime, stime
    // Backends that exited were reaped by the postmaster: their time is in its cutime, cstime.
    if (pid === postmasterPid) ticks += Number(fields[13]) + Number(fields[14]);
  }
  return (ticks * 1000) / CLOCK_TICKS;
}

/** A reading of one database's counters, to diff before and after a measurement. */
export interface DbReading {
  at: number;
  walBytes: bigint;
  xacts: number;
  cpuMs: number;
}

export async function readDb(db: pg.ClientBase, postmasterPid: number | undefined): Promise<DbReading> {
  // Pending statistics of this session would hide; pg_stat_database is flushed by each
  // backend at most once a second, so readings are taken over windows of many seconds.
  const { rows } = await db.query<{ lsn: string; xacts: string }>(
    `SELECT pg_current_wal_lsn() - '0/0'::pg_lsn AS lsn,
            (SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()) AS xacts`,
  );
  return {
    at: performance.now(),
    walBytes: BigInt(Math.round(Number(rows[0]!.lsn))),
    xacts: Number(rows[0]!.xacts),
    cpuMs: serverCpuMs(postmasterPid),
  };
}

export interface TableReading {
  deadTuples: number;
  liveTuples: number;
  bytes: number;
}

/** Dead and live tuples and total size (heap + indexes + toast) of a schema's tables. */
export async function readTables(db: pg.ClientBase, schema: string): Promise<TableReading> {
  const { rows } = await db.query<{ dead: string; live: string; bytes: string }>(
    `SELECT coalesce(sum(s.n_dead_tup), 0) AS dead, coalesce(sum(s.n_live_tup), 0) AS live,
            coalesce(sum(pg_total_relation_size(s.relid)), 0) AS bytes
       FROM pg_stat_user_tables AS s WHERE s.schemaname = $1`,
    [schema],
  );
  return { deadTuples: Number(rows[0]!.dead), liveTuples: Number(rows[0]!.live), bytes: Number(rows[0]!.bytes) };
}
