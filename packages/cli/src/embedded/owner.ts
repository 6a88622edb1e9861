/**
 * Who holds an embedded data directory: `<data dir>.owner`, a small JSON record written by the
 * process that starts the server there, and removed when its server stops.
 *
 * The record is the start lock too: it is created with link(2), which fails if it exists, so of
 * two processes starting at once exactly one runs initdb and the server; the other waits for
 * it and then uses that server as a client. PostgreSQL's own postmaster.pid stays the last
 * word on "one server per directory".
 *
 * A record is stale only when its process is gone (pid dead, or reused by another process:
 * its start time differs), or when the server it recorded has died. Then another process may
 * take the directory over, and stop the orphaned server the dead owner left running.
 *
 * Beside the data directory, not in it: initdb wants an empty directory. Readable by all
 * (it holds no secret: the password stays in leasehold.password, 0600), so that a process of
 * another user can say who holds the directory.
 */
import { randomBytes } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { EmbeddedPostgresError } from "leasehold/internal/errors";
import { oneLine } from "./access.js";

export interface OwnerRecord {
  pid: number;
  /** The process's start time (Linux, /proc/<pid>/stat), so a reused pid is not taken for the owner. */
  startTime?: string;
  /** How the owner was started, for telling people which process holds the directory. */
  command: string;
  /** Tells this claim from a later one by the same process. */
  token: string;
  startedAt: string;
  /** Set once the server accepts connections. */
  postmasterPid?: number;
  port?: number;
}

export type OwnerStatus = "ready" | "starting" | "gone";

export function ownerFile(dataDir: string): string {
  return `${dataDir}.owner`;
}

/** The owner record, or undefined if there is none (or it cannot be parsed: never written half, see writeRecord). */
export function readOwner(dataDir: string): OwnerRecord | undefined {
  let text: string;
  try {
    text = fs.readFileSync(ownerFile(dataDir), "utf8");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw new EmbeddedPostgresError(`embedded PostgreSQL: cannot read ${ownerFile(dataDir)}: ${oneLine((err as Error).message)}`);
  }
  try {
    const record = JSON.parse(text) as OwnerRecord;
    return Number.isInteger(record.pid) && typeof record.token === "string" ? record : undefined;
  } catch {
    return undefined;
  }
}

/** Whether the recorded owner still runs, and whether its server is up yet. */
export function ownerStatus(owner: OwnerRecord, dataDir: string): OwnerStatus {
  if (!sameProcess(owner.pid, owner.startTime)) return "gone";
  if (owner.postmasterPid === undefined || owner.port === undefined) return "starting";
  return serverRuns(owner.postmasterPid, dataDir) ? "ready" : "gone";
}

/** "process 123 (node …/leasehold serve)": who holds the directory, for messages. */
export function describeOwner(owner: OwnerRecord): string {
  return `process ${owner.pid} (${owner.command})`;
}

/** This process's claim on a data directory; only the claim's holder starts or stops its server. */
export class OwnerClaim {
  private constructor(
    private readonly dataDir: string,
    private record: OwnerRecord,
  ) {}

  /** Claims the directory, or returns undefined if another claim (live or stale) is there. */
  static tryClaim(dataDir: string): OwnerClaim | undefined {
    const record: OwnerRecord = {
      pid: process.pid,
      startTime: processStartTime(process.pid),
      command: ownCommand(),
      token: randomBytes(8).toString("hex"),
      startedAt: new Date().toISOString(),
    };
    const tmp = tempName(ownerFile(dataDir));
    try {
      fs.writeFileSync(tmp, JSON.stringify(record) + "\n", { mode: 0o644, flag: "wx" });
      fs.linkSync(tmp, ownerFile(dataDir));
      return new OwnerClaim(dataDir, record);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "EEXIST") return undefined;
      throw new EmbeddedPostgresError(`embedded PostgreSQL: cannot write ${ownerFile(dataDir)}: ${oneLine((err as Error).message)}`);
    } finally {
      fs.rmSync(tmp, { force: true });
    }
  }

  /** Records the running server, which makes it usable by other processes. */
  ready(postmasterPid: number, port: number): void {
    if (!this.held()) return;
    this.record = { ...this.record, postmasterPid, port };
    const tmp = tempName(ownerFile(this.dataDir));
    try {
      fs.writeFileSync(tmp, JSON.stringify(this.record) + "\n", { mode: 0o644, flag: "wx" });
      fs.renameSync(tmp, ownerFile(this.dataDir));
    } finally {
      fs.rmSync(tmp, { force: true });
    }
  }

  /** Gives the directory up, if the record is still ours (it is not once another process took over). */
  release(): void {
    if (this.held()) fs.rmSync(ownerFile(this.dataDir), { force: true });
  }

  private held(): boolean {
    return readOwner(this.dataDir)?.token === this.record.token;
  }
}

/**
 * Removes a stale record. By a rename first, then a look at what was renamed: if two processes
 * take over at once, the slower one may have renamed the faster one's fresh claim, and puts it
 * back. (Should a third claim come in between, PostgreSQL's postmaster.pid still lets only one
 * server run.)
 */
export function removeStaleOwner(dataDir: string, stale: OwnerRecord): void {
  const file = ownerFile(dataDir);
  const moved = tempName(file);
  try {
    fs.renameSync(file, moved);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return; // someone else removed it
    throw new EmbeddedPostgresError(`embedded PostgreSQL: cannot remove the stale ${file}: ${oneLine((err as Error).message)}`);
  }
  try {
    const taken = JSON.parse(fs.readFileSync(moved, "utf8")) as OwnerRecord;
    if (taken.token !== stale.token) fs.linkSync(moved, file);
  } catch {
    // Unreadable: it was the stale one's. Or a third claim came in first: then the one we moved
    // loses its claim, and at worst its server start fails on postmaster.pid.
  } finally {
    fs.rmSync(moved, { force: true });
  }
}

function tempName(file: string): string {
  return `${file}.tmp-${process.pid}-${randomBytes(4).toString("hex")}`;
}

/** As `ps` would show it, on one line (node's own flags too: with `-e` they are all there is). */
function ownCommand(): string {
  const [node, ...args] = process.argv;
  return [path.basename(node ?? "node"), ...process.execArgv, ...args].join(" ").replace(/\s+/g, " ").slice(0, 300);
}

/** Alive, and (where /proc tells) the same process that wrote the record, not a later one with its pid. */
function sameProcess(pid: number, startTime: string | undefined): boolean {
  if (!isAlive(pid)) return false;
  if (startTime === undefined) return true;
  const now = processStartTime(pid);
  return now === undefined || now === startTime;
}

/** Field 22 of /proc/<pid>/stat (clock ticks since boot); undefined without /proc. */
function processStartTime(pid: number): string | undefined {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
    // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19];
  } catch {
    return undefined;
  }
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** Whether `pid` is a PostgreSQL server on `dataDir`; without /proc, whether it is alive at all. */
function serverRuns(pid: number, dataDir: string): boolean {
  if (!isAlive(pid)) return false;
  let cmdline: string;
  try {
    cmdline = fs.readFileSync(`/proc/${pid}/cmdline`, "utf8");
  } catch {
    return true;
  }
  return cmdline.includes("postgres") && cmdline.includes(dataDir);
}
