/**
 * How other commands find a running `leasehold dev`: it writes `<data dir>/dev.json` (mode
 * 0600: it holds the API token) with its database URL, schema and API address, and removes
 * it on exit. A file whose process is gone is ignored.
 */
import { randomBytes } from "node:crypto";
import fs from "node:fs";
import path from "node:path";

export interface DevState {
  pid: number;
  databaseUrl: string;
  schema: string;
  apiUrl: string;
  token: string;
  startedAt: string;
}

export function devStatePath(dataDir: string): string {
  return path.join(dataDir, "dev.json");
}

export function readDevState(dataDir: string): DevState | undefined {
  let state: DevState;
  try {
    state = JSON.parse(fs.readFileSync(devStatePath(dataDir), "utf8")) as DevState;
  } catch {
    return undefined;
  }
  return typeof state.pid === "number" && isAlive(state.pid) && typeof state.databaseUrl === "string" ? state : undefined;
}

/**
 * A new file (0600 from its first byte) renamed over the old one: writeFileSync's mode applies
 * only when it creates the file, so writing in place would keep a left-behind file's wider mode
 * (and follow a symbolic link planted at its name).
 */
export function writeDevState(dataDir: string, state: DevState): void {
  fs.mkdirSync(dataDir, { recursive: true });
  const file = devStatePath(dataDir);
  const tmp = `${file}.tmp-${process.pid}-${randomBytes(4).toString("hex")}`;
  try {
    fs.writeFileSync(tmp, JSON.stringify(state, null, 2) + "\n", { mode: 0o600, flag: "wx" });
    fs.renameSync(tmp, file);
  } finally {
    fs.rmSync(tmp, { force: true });
  }
}

export function removeDevState(dataDir: string): void {
  const current = readDevState(dataDir);
  if (!current || current.pid === process.pid) fs.rmSync(devStatePath(dataDir), { force: true });
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}
