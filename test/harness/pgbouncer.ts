/**
 * A throwaway PgBouncer in transaction pooling, in front of the test PostgreSQL, for the
 * pooler tests: on a free port, its config in a temp directory, one database alias per entry
 * of `aliases` (each with its own connect_query, pool size and, if given, pool mode). PgBouncer refuses to run as
 * root, so as root it runs as the `postgres` user, with its files owned by it. Found on the
 * PATH or in /usr/sbin (Debian's `pgbouncer`).
 */
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import pg from "pg";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { findProgram, freePort } from "./programs.js";

export const PGBOUNCER_INSTALL_HINT = "install it with `apt-get install pgbouncer` (Debian/Ubuntu)";

/** The pgbouncer binary, or undefined when there is none. LEASEHOLD_PGBOUNCER names one (or "none"). */
export function findPgBouncer(): string | undefined {
  return findProgram("pgbouncer", "LEASEHOLD_PGBOUNCER");
}

export interface PgBouncerAlias {
  /** Run on every new server connection: how a transaction pooler sets search_path. */
  connectQuery?: string;
  /** Server connections of this alias at most (default 4). */
  poolSize?: number;
  /** This alias's pool_mode (default: the pooler's, transaction). */
  poolMode?: "session" | "transaction";
  /** The role its server connections log in as (default: the database URL's user and password). */
  serverUser?: { user: string; password: string };
}

export interface PgBouncerSettings {
  /**
   * Start-up parameters it accepts and drops instead of refusing (ignore_startup_parameters):
   * with "options", a client's `options` (its search_path, say) silently never arrive.
   */
  ignoreStartupParameters?: string[];
}

/** A value for pgbouncer.ini's connection strings: single-quoted, quotes doubled. */
function quoted(value: string): string {
  return `'${value.replace(/'/g, "''")}'`;
}

export class PgBouncer {
  private child?: ChildProcess;

  private constructor(
    readonly dir: string,
    readonly port: number,
    private readonly user: string,
  ) {}

  /** Starts one in front of `databaseUrl`; throws if there is no pgbouncer binary. */
  static async start(
    databaseUrl: string,
    aliases: Record<string, PgBouncerAlias>,
    binary = findPgBouncer(),
    settings: PgBouncerSettings = {},
  ): Promise<PgBouncer> {
    if (!binary) throw new Error(`pgbouncer not found: ${PGBOUNCER_INSTALL_HINT}`);
    const target = new URL(databaseUrl);
    const user = decodeURIComponent(target.username) || os.userInfo().username;
    const server = {
      host: target.hostname || "127.0.0.1",
      port: target.port || "5432",
      dbname: decodeURIComponent(target.pathname.slice(1)) || user,
      user,
      password: decodeURIComponent(target.password),
    };
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-pgbouncer-"));
    const port = await freePort();
    const databases = Object.entries(aliases).map(([alias, a]) => {
      const parts = [
        `host=${server.host}`,
        `port=${server.port}`,
        `dbname=${quoted(server.dbname)}`,
        `user=${quoted(a.serverUser?.user ?? server.user)}`,
        ...((a.serverUser?.password ?? server.password) ? [`password=${quoted(a.serverUser?.password ?? server.password)}`] : []),
        `pool_size=${a.poolSize ?? 4}`,
        ...(a.connectQuery ? [`connect_query=${quoted(a.connectQuery)}`] : []),
        ...(a.poolMode ? [`pool_mode=${a.poolMode}`] : []),
      ];
      return `${alias} = ${parts.join(" ")}`;
    });
    fs.writeFileSync(
      path.join(dir, "pgbouncer.ini"),
      [
        "[databases]",
        ...databases,
        "[pgbouncer]",
        "listen_addr = 127.0.0.1",
        `listen_port = ${port}`,
        // Clients are the tests themselves; the server side authenticates with the password above.
        "auth_type = trust",
        // The admin console (SHOW SERVERS): which backends the pooler's connections are.
        `admin_users = ${user}`,
        `auth_file = ${path.join(dir, "users.txt")}`,
        "pool_mode = transaction",
        ...(settings.ignoreStartupParameters ? [`ignore_startup_parameters = ${settings.ignoreStartupParameters.join(",")}`] : []),
        "max_client_conn = 200",
        "unix_socket_dir =",
        "",
      ].join("\n"),
    );
    fs.writeFileSync(path.join(dir, "users.txt"), `"${user.replace(/"/g, '""')}" ""\n`);
    const bouncer = new PgBouncer(dir, port, user);
    await bouncer.resume(binary);
    return bouncer;
  }

  /** A client URL for one of the aliases (the pooler trusts its clients: no password). */
  url(alias: string): string {
    return `postgres://${encodeURIComponent(this.user)}@127.0.0.1:${this.port}/${alias}`;
  }

  /** The PostgreSQL backend pids of the pooler's server connections now (SHOW SERVERS). */
  async serverPids(): Promise<number[]> {
    const admin = new pg.Client({ connectionString: this.url("pgbouncer") });
    await admin.connect();
    try {
      const { rows } = await admin.query<{ remote_pid: string }>("SHOW SERVERS");
      return rows.map((r) => Number(r.remote_pid)).filter((pid) => pid > 0);
    } finally {
      await admin.end();
    }
  }

  private async resume(binary: string): Promise<void> {
    // PgBouncer will not run as root: then as postgres, owning its files.
    let ids: { uid: number; gid: number } | undefined;
    if (process.getuid?.() === 0) {
      const uid = Number(execFileSync("id", ["-u", "postgres"], { encoding: "utf8" }).trim());
      const gid = Number(execFileSync("id", ["-g", "postgres"], { encoding: "utf8" }).trim());
      ids = { uid, gid };
      for (const f of [this.dir, ...fs.readdirSync(this.dir).map((n) => path.join(this.dir, n))]) fs.chownSync(f, uid, gid);
    }
    const child = spawn(binary, [path.join(this.dir, "pgbouncer.ini")], { stdio: ["ignore", "ignore", "pipe"], ...ids });
    let stderr = "";
    child.stderr!.on("data", (d: Buffer) => (stderr = (stderr + d.toString()).slice(-4_000)));
    this.child = child;
    child.on("exit", () => {
      if (this.child === child) this.child = undefined;
    });
    const deadline = Date.now() + 15_000;
    while (!/listening on 127\.0\.0\.1:\d+/.test(stderr)) {
      if (!this.child) throw new Error(`pgbouncer exited at start: ${stderr.trim()}`);
      if (Date.now() > deadline) throw new Error(`pgbouncer did not listen on ${this.port}: ${stderr.trim()}`);
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  /** Stops it and removes its files. */
  async dispose(): Promise<void> {
    const child = this.child;
    if (child) {
      const exited = new Promise((r) => child.once("exit", r));
      child.kill("SIGKILL");
      await exited;
    }
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}
