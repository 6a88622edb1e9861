/**
 * How other commands find a running `leasehold dev`: it writes `<data dir>/dev.json` (mode
 * 0600: it holds the API token) with its database URL, schema and API address, and removes
 * it on exit. A file whose process is gone is ignored.
 */
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

export function writeDevState(dataDir: string, state: DevState): void {
  fs.mkdirSync(dataDir, { recursive: true });
  const file = devStatePath(dataDir);
  fs.writeFileSync(file, JSON.stringify(state, null, 2) + "\n", { mode: 0o600 });
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
