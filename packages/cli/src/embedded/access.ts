/**
 * Who runs the server, and where its data may go. PostgreSQL refuses to run as root, so as
 * root we run it as the `postgres` user, which must then reach the data directory: a clone
 * under /root or in `mktemp -d` is closed to it.
 *
 * We change the owner only of a directory we created in this call (the data directory,
 * handed to the server user). An existing directory the server user cannot use is refused,
 * never taken over: it may hold anything. Parents are never chowned.
 */
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { EmbeddedPostgresError } from "leasehold/internal/errors";

export interface RunAs {
  uid?: number;
  gid?: number;
}

export const SERVER_USER = "postgres";
/** Root's own place (root-owned, 0755) for what the server user must reach: binaries, relocated data. */
export const SHARED_ROOT = "/var/lib/leasehold";

/** As root, the `postgres` user (created if missing); otherwise ourselves. */
export function ensureRunAsUser(): RunAs {
  if (process.getuid?.() !== 0) return {};
  let ids = lookupUser(SERVER_USER);
  if (!ids) {
    spawnSync("groupadd", ["--system", SERVER_USER]);
    const r = spawnSync("useradd", ["--system", "-g", SERVER_USER, "--no-create-home", SERVER_USER], { encoding: "utf8" });
    ids = lookupUser(SERVER_USER);
    if (!ids)
      throw new EmbeddedPostgresError(
        `embedded PostgreSQL: running as root, and could not create the '${SERVER_USER}' user to run the server as: ${oneLine(r.error?.message ?? r.stderr)}`,
      );
  }
  return ids;
}

function lookupUser(name: string): RunAs | undefined {
  const uid = spawnSync("id", ["-u", name], { encoding: "utf8" });
  const gid = spawnSync("id", ["-g", name], { encoding: "utf8" });
  if (uid.status !== 0 || gid.status !== 0) return undefined;
  return { uid: Number(uid.stdout.trim()), gid: Number(gid.stdout.trim()) };
}

/** Spawn options for running as the server user; from "/" because our own cwd may be closed to it. */
export function asServerUser(runAs: RunAs): { uid?: number; gid?: number; cwd?: string } {
  return runAs.uid === undefined ? {} : { uid: runAs.uid, gid: runAs.gid, cwd: "/" };
}

/** Whether the server user can reach `dir` (search permission on it and every parent). */
export function canEnter(dir: string, runAs: RunAs): boolean {
  return spawnSync("test", ["-x", dir], asServerUser(runAs)).status === 0;
}

/** A short stable name for a path, for per-directory resources. */
export function pathTag(p: string): string {
  return createHash("sha1").update(path.resolve(p)).digest("hex").slice(0, 8);
}

/** Where the cluster goes when the requested place is out of the server user's reach. */
export function relocatedDataDir(requested: string): string {
  return path.join(SHARED_ROOT, `data-${pathTag(requested)}`);
}

export interface PlacedDataDir {
  dataDir: string;
  /** Directories this call created, parents first: removed again if the start fails. */
  created: string[];
}

/**
 * Decides where the cluster lives and makes sure the server user owns it. As root, a
 * requested place out of the server user's reach is refused, or (with `onRelocate`) swapped
 * for one under SHARED_ROOT.
 */
export function placeDataDir(
  requested: string,
  runAs: RunAs,
  onRelocate?: (to: string, from: string) => void,
  /** Appended to the refusal: what else the caller can do about it. */
  refusalHint = "",
): PlacedDataDir {
  let dataDir = requested;
  if (runAs.uid !== undefined) {
    if (fs.existsSync(requested)) assertServerOwned(requested, runAs);
    const existing = nearestExisting(requested);
    if (!canEnter(existing, runAs)) {
      const closed = firstClosed(existing, runAs);
      if (!onRelocate) {
        throw new EmbeddedPostgresError(
          `embedded PostgreSQL: the server runs as the ${SERVER_USER} user (we run as root), which cannot reach ${requested} because ${closed} is closed to other users; choose a data directory it can reach (e.g. under /srv or /var/lib)${refusalHint}`,
        );
      }
      ensureSharedRoot();
      dataDir = relocatedDataDir(requested);
      if (fs.existsSync(dataDir)) assertServerOwned(dataDir, runAs);
      onRelocate(dataDir, requested);
    }
  }
  const created = makeDataDir(dataDir);
  if (runAs.uid !== undefined && created.at(-1) === dataDir) fs.chownSync(dataDir, runAs.uid, runAs.gid!);
  return { dataDir, created };
}

/** Removes what placeDataDir created (the data directory whole, parents only if empty). */
export function removeCreated(created: string[]): void {
  for (const dir of [...created].reverse()) {
    try {
      if (dir === created.at(-1)) fs.rmSync(dir, { recursive: true, force: true });
      else fs.rmdirSync(dir);
    } catch {
      return; // a parent that now holds something else (e.g. the server log) stays
    }
  }
}

function makeDataDir(dataDir: string): string[] {
  const created: string[] = [];
  try {
    const first = fs.mkdirSync(path.dirname(dataDir), { recursive: true });
    if (first) {
      for (let d = path.dirname(dataDir); d.length >= first.length; d = path.dirname(d)) created.unshift(d);
      // The server user passes through them; a umask of 077 would have closed them.
      for (const d of created) fs.chmodSync(d, 0o755);
    }
    try {
      fs.mkdirSync(dataDir, { mode: 0o700 });
      created.push(dataDir);
    } catch (err) {
      // Already there (maybe made this instant by another process starting on it): not ours to remove.
      if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
    }
    return created;
  } catch (err) {
    removeCreated(created);
    throw new EmbeddedPostgresError(`embedded PostgreSQL: cannot create the data directory ${dataDir}: ${oneLine((err as Error).message)}`);
  }
}

function assertServerOwned(dir: string, runAs: RunAs): void {
  const st = fs.statSync(dir);
  if (!st.isDirectory()) throw new EmbeddedPostgresError(`embedded PostgreSQL: the data directory ${dir} exists but is not a directory`);
  if (st.uid === runAs.uid) return;
  const owner = st.uid === 0 ? "root" : `uid ${st.uid}`;
  throw new EmbeddedPostgresError(
    `embedded PostgreSQL: the data directory ${dir} already exists and belongs to ${owner}, but the server runs as the ${SERVER_USER} user (we run as root) and Leasehold does not take over existing directories; use a new data directory (it is created for ${SERVER_USER}) or hand this one over yourself (chown -R ${SERVER_USER}: ${dir})`,
  );
}

function nearestExisting(p: string): string {
  let dir = p;
  while (!fs.existsSync(dir) && path.dirname(dir) !== dir) dir = path.dirname(dir);
  return dir;
}

/** The outermost directory on the way to `dir` that the server user cannot pass. */
function firstClosed(dir: string, runAs: RunAs): string {
  const chain: string[] = [];
  for (let d = dir; ; d = path.dirname(d)) {
    chain.unshift(d);
    if (path.dirname(d) === d) break;
  }
  return chain.find((d) => !canEnter(d, runAs)) ?? dir;
}

/**
 * SHARED_ROOT, created if missing. Root runs what it keeps there (the binaries' version
 * probe) and the server user trusts it, so every directory on the way must be root's and
 * closed to writes by others.
 */
export function ensureSharedRoot(): string {
  const first = fs.mkdirSync(SHARED_ROOT, { recursive: true, mode: 0o755 });
  if (first) fs.chmodSync(SHARED_ROOT, 0o755);
  for (let dir = SHARED_ROOT; ; dir = path.dirname(dir)) {
    const st = fs.statSync(dir);
    if (st.uid !== 0 || (st.mode & 0o022) !== 0) {
      const why = st.uid !== 0 ? `belongs to uid ${st.uid}` : "is writable by other users";
      throw new EmbeddedPostgresError(
        `embedded PostgreSQL: will not keep files in ${SHARED_ROOT}: ${dir} ${why}, so they could be replaced; make it root's and closed to others (chown root: ${dir}; chmod go-w ${dir})`,
      );
    }
    if (path.dirname(dir) === dir) return SHARED_ROOT;
  }
}

export function oneLine(text: string): string {
  return text
    .split("\n")
    .map((l) => l.trim())
    .filter(Boolean)
    .join(" ");
}
