/**
 * The previous tagged release, installed from this repository's history for the rolling upgrade
 * test: `git archive` of its commit, `npm ci` of its own lockfile, and its own build of
 * packages/leasehold, so its workers run the code that release shipped. Which release:
 * test/upgrade/previous-release.json ({ tag, commit }); the tag is resolved first, the commit
 * is the fallback for a clone without tags. Kept in node_modules/.cache per commit: a second
 * run reuses it.
 */
import { execFileSync, spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const RECORD = path.join(REPO, "test", "upgrade", "previous-release.json");
const CACHE = path.join(REPO, "node_modules", ".cache", "leasehold-previous-release");

export interface PreviousRelease {
  tag: string;
  commit: string;
  /** Its packages/leasehold/dist/index.js. */
  entry: string;
  /** Its migrations, by file name. */
  migrations: string[];
}

/** The release's commit: its tag if this clone has it, else the recorded commit; fails clearly when neither is here. */
export function resolvePreviousRelease(): { tag: string; commit: string } {
  const { tag, commit } = JSON.parse(fs.readFileSync(RECORD, "utf8")) as { tag: string; commit: string };
  const resolved = gitCommit(`refs/tags/${tag}^{commit}`) ?? gitCommit(`${commit}^{commit}`);
  if (!resolved) {
    throw new Error(
      `the previous release ${tag} (commit ${commit}, recorded in test/upgrade/previous-release.json) is not in this clone: ` +
        "neither the tag nor the commit resolves (a shallow clone?); fetch it with `git fetch --tags --unshallow` (or fetch that commit)",
    );
  }
  if (resolved !== commit) {
    throw new Error(`tag ${tag} is commit ${resolved}, but test/upgrade/previous-release.json records ${commit}: update the record`);
  }
  return { tag, commit };
}

function gitCommit(rev: string): string | undefined {
  try {
    return execFileSync("git", ["rev-parse", "--verify", "--quiet", rev], {
      cwd: REPO,
      encoding: "utf8",
      stdio: ["ignore", "pipe", "ignore"],
    }).trim();
  } catch {
    return undefined;
  }
}

/** Installs and builds the previous release (or finds it installed); `log` hears what it does and how long it took. */
export async function installPreviousRelease(log: (line: string) => void = () => {}): Promise<PreviousRelease> {
  const { tag, commit } = resolvePreviousRelease();
  const dir = path.join(CACHE, commit);
  const entry = path.join(dir, "packages", "leasehold", "dist", "index.js");
  const done = () => ({ tag, commit, entry, migrations: fs.readdirSync(path.join(dir, "packages", "leasehold", "migrations")).sort() });
  if (fs.existsSync(path.join(dir, ".installed"))) return done();

  // Built beside the cache entry and renamed into place whole: a run cut short leaves no half install.
  fs.mkdirSync(CACHE, { recursive: true });
  const work = fs.mkdtempSync(path.join(CACHE, `${commit}.partial-`));
  try {
    const started = Date.now();
    execFileSync("sh", ["-c", `git -C "$1" archive --format=tar "$2" | tar -x -C "$3"`, "sh", REPO, commit, work], { stdio: "inherit" });
    // Without the test runner's options (its tsx loader, the "source" condition) or what the
    // calling npm set for its own project (npm_config_local_prefix...): that release's own
    // install and build. Where packages come from is kept.
    const keep = new Set(["npm_config_cache", "npm_config_registry", "npm_config_userconfig"]);
    const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => k !== "NODE_OPTIONS" && (!k.startsWith("npm_") || keep.has(k))));
    // --ignore-scripts: the workspace's prepare would build every package; the worker needs one.
    await run("npm", ["ci", "--prefer-offline", "--no-audit", "--no-fund", "--ignore-scripts"], work, env);
    await run("npm", ["run", "build", "--workspace", "leasehold"], work, env);
    fs.writeFileSync(path.join(work, ".installed"), `${tag} ${commit}\n`);
    try {
      fs.renameSync(work, dir);
    } catch (err) {
      // Another run installed it meanwhile: use that one.
      if (!fs.existsSync(path.join(dir, ".installed"))) throw err;
    }
    log(`installed ${tag} (${commit.slice(0, 7)}) with npm ci and built its packages/leasehold in ${((Date.now() - started) / 1000).toFixed(1)} s`);
  } finally {
    fs.rmSync(work, { recursive: true, force: true });
  }
  return done();
}

function run(cmd: string, args: string[], cwd: string, env: NodeJS.ProcessEnv): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { cwd, env, stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    child.stdout.on("data", (b: Buffer) => (out += b.toString()));
    child.stderr.on("data", (b: Buffer) => (out += b.toString()));
    child.on("error", reject);
    child.on("exit", (code) =>
      code === 0 ? resolve() : reject(new Error(`\`${cmd} ${args.join(" ")}\` in the previous release failed (exit ${code}):\n${out.slice(-4000)}`)),
    );
  });
}
