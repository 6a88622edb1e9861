/**
 * `leasehold dev` as `npm start` runs it: embedded PostgreSQL in ./.leasehold, the server,
 * a worker with the bundled examples, commands from "another terminal" finding it, and a
 * graceful Ctrl-C.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { eventually } from "./helpers/db.js";
import { CLI, runCli, startCli, type CliResult } from "./helpers/cli.js";
import { collect } from "./helpers/cli.js";
import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";
import { relocatedDataDir } from "../packages/cli/src/embedded/postgres.js";

// Nothing points at the test database: dev and the commands must find their own.
const NO_DATABASE = { DATABASE_URL: undefined, LEASEHOLD_SCHEMA: undefined, LEASEHOLD_DATA_DIR: undefined, LEASEHOLD_TOKEN: undefined };

/**
 * An app in `cwd` that connects with `embedded: true` (the built library), enqueues a job of
 * `task` and closes; `owner` is the process whose server it used, from its log (none: it
 * started the server itself).
 */
async function libraryEmbedded(cwd: string, task: string, payload: unknown): Promise<CliResult & { owner?: { pid: number; command: string } }> {
  // The built library, as an app that installed it would load it (packages/leasehold/dist).
  const index = path.resolve(path.dirname(CLI), "..", "..", "..", "leasehold", "dist", "index.js");
  const script = `
    const { Leasehold } = await import(${JSON.stringify(index)});
    const { default: pino } = await import(${JSON.stringify(pathToFileURL(createRequire(import.meta.url).resolve("pino")).href)});
    const lh = await Leasehold.connect({ embedded: true, logger: pino({ level: "info" }, pino.destination({ fd: 1, sync: true })) });
    await lh.enqueue(${JSON.stringify(task)}, ${JSON.stringify(payload)});
    await lh.close();`;
  // An app on the built packages: not the TypeScript sources the tests load (NODE_OPTIONS).
  const env: NodeJS.ProcessEnv = { ...process.env, NODE_OPTIONS: "", DATABASE_URL: undefined, LEASEHOLD_SCHEMA: undefined };
  const child = spawn(process.execPath, ["--input-type=module", "-e", script], { cwd, env, stdio: ["ignore", "pipe", "pipe"] });
  const result = await collect(child, 120_000);
  const lines = result.stdout
    .split("\n")
    .filter(Boolean)
    .map((l) => JSON.parse(l) as { msg: string; owner?: { pid: number; command: string } });
  return { ...result, owner: lines.find((l) => l.msg === "using the embedded PostgreSQL another process runs")?.owner };
}

test("leasehold dev runs the examples on the embedded database; other commands reach it; Ctrl-C stops it cleanly", { timeout: 180_000 }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-dev-"));
  fs.chmodSync(dir, 0o755); // as root, the embedded server runs as `postgres` and must enter it
  // A dev.json left behind, readable by all: dev's write must close it, not keep its mode.
  fs.mkdirSync(path.join(dir, ".leasehold"));
  fs.writeFileSync(path.join(dir, ".leasehold", "dev.json"), "{}\n", { mode: 0o644 });
  fs.chmodSync(path.join(dir, ".leasehold", "dev.json"), 0o644);
  const opts = { schema: "unused", env: NO_DATABASE, cwd: dir };
  let running: Awaited<ReturnType<typeof startCli>> | undefined;
  try {
    const dev = (running = await startCli(["dev", "--port", "0"], {
      ...opts,
      ready: /✔ job \d+ example\.progress succeeded/,
      timeoutMs: 120_000,
      asTerminal: true,
    }));
    const out = dev.output();
    assert.match(out, /Leasehold dev is running/);
    assert.match(out, /enqueued 3 example jobs so you can watch them run/);
    const apiUrl = /API\s+(http:\/\/127\.0\.0\.1:\d+)/.exec(out)?.[1];
    assert.ok(apiUrl, out);

    const state = JSON.parse(fs.readFileSync(path.join(dir, ".leasehold", "dev.json"), "utf8")) as { token: string; apiUrl: string };
    assert.equal(state.apiUrl, apiUrl);
    assert.equal(fs.statSync(path.join(dir, ".leasehold", "dev.json")).mode & 0o077, 0, "dev.json holds the token: owner-only");
    const stats = await fetch(`${apiUrl}/v1/stats`, { headers: { authorization: `Bearer ${state.token}` } });
    assert.equal(stats.status, 200);

    const listed = await runCli(["jobs", "list", "--json"], opts);
    assert.equal(listed.code, 0, listed.stderr);
    const tasks = (JSON.parse(listed.stdout) as { task: string }[]).map((j) => j.task).sort();
    assert.deepEqual(tasks, ["example.flaky", "example.long", "example.progress"]);

    // An app on the same data directory uses dev's database (it has no dev.json rule) and leaves it running.
    const app = await libraryEmbedded(dir, "example.progress", { steps: 1 });
    assert.equal(app.code, 0, app.stderr);
    const devStats = await fetch(`${apiUrl}/v1/stats`, { headers: { authorization: `Bearer ${state.token}` } });
    assert.equal(devStats.status, 200, "dev still has its database after the app closed");
    assert.equal(app.owner?.pid, dev.child.pid, "the app used dev's server");
    assert.match(app.owner!.command, / dev --port 0$/);

    const enq = await runCli(["enqueue", "example.progress", "--payload", '{"steps":1}', "--json"], opts);
    assert.equal(enq.code, 0, enq.stderr);
    const { id } = JSON.parse(enq.stdout) as { id: string };
    await eventually(
      async () => new RegExp(`✔ job ${id} example\\.progress succeeded`).test(dev.output()),
      "dev ran the job enqueued from another terminal",
      30_000,
    );

    // A long job runs when Ctrl-C reaches the terminal's whole process group: the embedded
    // server must outlive dev's graceful shutdown, which gives that job back.
    const long = await runCli(["enqueue", "example.long", "--payload", '{"seconds":60}', "--json"], opts);
    assert.equal(long.code, 0, long.stderr);
    const { id: longId } = JSON.parse(long.stdout) as { id: string };
    await eventually(async () => new RegExp(`▶ job ${longId} example\\.long started`).test(dev.output()), "the long job started", 30_000);

    const stopped = await dev.stop("SIGINT");
    assert.equal(stopped.code, 0, stopped.stderr);
    assert.match(stopped.stdout, /Leasehold dev stopped\./);
    assert.doesNotMatch(stopped.stdout + stopped.stderr, /database unreachable/, "the database stayed up until dev was done with it");
    assert.equal(fs.existsSync(path.join(dir, ".leasehold", "dev.json")), false);
    const released = await runCli(["jobs", "show", longId, "--json"], opts);
    assert.equal(released.code, 0, released.stderr);
    const shown = JSON.parse(released.stdout) as { job: { state: string }; attempts: { outcome: string | null }[] };
    assert.equal(shown.job.state, "waiting", released.stdout);
    assert.deepEqual(
      shown.attempts.map((a) => a.outcome),
      ["released"],
      released.stdout,
    );

    // With dev stopped, a command starts the embedded server on the same data itself.
    const after = await runCli(["jobs", "show", id, "--json"], opts);
    assert.equal(after.code, 0, after.stderr);
    assert.equal((JSON.parse(after.stdout) as { job: { state: string } }).job.state, "succeeded");
  } finally {
    await running?.stop(); // after a failure: not left running
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test(
  "as root, run from a private (0700) folder: the default data dir moves out with one notice; an explicit --data-dir there is refused in one line",
  { skip: process.getuid?.() === 0 ? false : "needs root", timeout: 120_000 },
  async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-private-cli-")); // 0700, root's: closed to `postgres`
    const relocated = relocatedDataDir(path.join(dir, ".leasehold", "pgdata"));
    const opts = { schema: "unused", env: NO_DATABASE, cwd: dir };
    try {
      const refused = await runCli(["stats", "--data-dir", path.join(dir, "state")], opts);
      assert.equal(refused.code, 1, refused.stderr);
      const lastLine = refused.stderr.trimEnd().split("\n").at(-1)!;
      assert.match(
        lastLine,
        /^leasehold: embedded PostgreSQL: .*cannot reach .*state\/pgdata because .* is closed to other users; choose a data directory/,
      );
      assert.doesNotMatch(refused.stderr, /^\s+at /m, "no stack trace");
      assert.doesNotMatch(lastLine, /relocateIfUnreachable/, "no library option in the CLI's advice");
      assert.equal(fs.existsSync(path.join(dir, "state")), false, "nothing left behind");

      const moved = await runCli(["stats", "--json"], opts);
      assert.equal(moved.code, 0, moved.stderr);
      assert.equal(moved.stderr.split("\n").filter((l) => l.includes(`so its data is in ${relocated}`)).length, 1, moved.stderr);
      assert.ok(fs.existsSync(path.join(relocated, "PG_VERSION")));
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
      fs.rmSync(relocated, { recursive: true, force: true });
      fs.rmSync(`${relocated}.log`, { force: true });
    }
  },
);

test(
  "serve on the embedded database: jobs list and an app on the same folder use its server and leave it running; after serve is killed (-9), the next command takes over",
  { timeout: 180_000 },
  async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-serve-"));
    // As root the folder stays private (0700): the library must move the cluster out as the CLI does.
    if (process.getuid?.() !== 0) fs.chmodSync(dir, 0o755);
    const pgdata = path.join(dir, ".leasehold", "pgdata");
    const dataDir = process.getuid?.() === 0 ? relocatedDataDir(pgdata) : pgdata;
    const token = "serve-token-0123456789";
    const opts = { schema: "unused", env: { ...NO_DATABASE, LEASEHOLD_TOKEN: token }, cwd: dir };
    const stats = (url: string) => fetch(`${url}/v1/stats`, { headers: { authorization: `Bearer ${token}` } });
    let running: Awaited<ReturnType<typeof startCli>> | undefined;
    try {
      const serve = (running = await startCli(["serve", "--port", "0"], {
        ...opts,
        ready: /listening on (http:\/\/127\.0\.0\.1:\d+)/,
        timeoutMs: 120_000,
      }));
      const apiUrl = serve.match[1]!;
      const owner = JSON.parse(fs.readFileSync(`${dataDir}.owner`, "utf8")) as { pid: number; postmasterPid: number };
      assert.equal(owner.pid, serve.child.pid, "serve holds the data directory");

      const listed = await runCli(["jobs", "list", "--json"], opts);
      assert.equal(listed.code, 0, listed.stderr);
      assert.equal((await stats(apiUrl)).status, 200, "serve still has its database after jobs list");

      const app = await libraryEmbedded(dir, "app.task", { n: 1 });
      assert.equal(app.code, 0, app.stderr);
      const after = await stats(apiUrl);
      assert.equal(after.status, 200, "serve still has its database after the app closed");
      assert.match(await after.text(), /"state":"waiting","count":1/, "and sees the app's job");
      assert.equal(app.owner?.pid, serve.child.pid, "the app used serve's server");

      // serve dies without cleaning up; its server lives on, an orphan the next command takes over.
      serve.child.kill("SIGKILL");
      await serve.stop();
      assert.ok(isAlive(owner.postmasterPid), "the orphaned server still runs");
      const recovered = await runCli(["jobs", "list", "--json"], opts);
      assert.equal(recovered.code, 0, recovered.stderr);
      assert.deepEqual(
        (JSON.parse(recovered.stdout) as { task: string }[]).map((j) => j.task),
        ["app.task"],
      );
      assert.equal(isAlive(owner.postmasterPid), false, "the orphan was stopped");
      assert.equal(fs.existsSync(`${dataDir}.owner`), false, "and the command gave the directory up when done");
    } finally {
      await running?.stop(); // after a failure: not left running
      fs.rmSync(dir, { recursive: true, force: true });
      if (dataDir !== pgdata) {
        fs.rmSync(dataDir, { recursive: true, force: true });
        for (const f of [".log", ".owner"]) fs.rmSync(dataDir + f, { force: true });
      }
    }
  },
);

/** This repository's root, where `npm start` runs `leasehold dev`. */
const ROOT = path.resolve(path.dirname(CLI), "..", "..", "..", "..");

/**
 * `npm start` (with `extra` after it in the shell, e.g. `| tee log`) run as from a terminal: in
 * a process group of its own, so a Ctrl-C is SIGINT to the whole group. Its dev state in `dir`.
 */
function npmStart(dir: string, extra = "") {
  // As a newcomer's shell runs it: the built packages, not the test runner's TypeScript sources.
  const env = { ...process.env, ...NO_DATABASE, NODE_OPTIONS: "", LEASEHOLD_DATA_DIR: path.join(dir, ".leasehold") };
  const child = spawn("sh", ["-c", `exec npm start --silent -- --port 0 ${extra}`], {
    cwd: ROOT,
    env,
    detached: true,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  child.stdout.on("data", (b: Buffer) => (out += b.toString()));
  child.stderr.on("data", (b: Buffer) => (out += b.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.on("exit", (code, signal) => resolve({ code, signal })),
  );
  const cli = (...args: string[]) =>
    runCli(args, { schema: "unused", env: { ...NO_DATABASE, LEASEHOLD_DATA_DIR: path.join(dir, ".leasehold") }, cwd: dir });
  return {
    child,
    output: () => out,
    exited,
    cli,
    ctrlC: () => process.kill(-child.pid!, "SIGINT"),
    kill: () => {
      try {
        process.kill(-child.pid!, "SIGKILL");
      } catch {
        // gone already
      }
    },
  };
}

/** dev's worker has started an example job, then a long job runs: what a Ctrl-C must give back. */
async function longJobRunning(dev: ReturnType<typeof npmStart>, outputOf: () => string): Promise<string> {
  // A start is enough (example.progress takes 3 s to succeed): the first test watches them end.
  await eventually(async () => /▶ job \d+ example\.\w+ started/.test(outputOf()), "dev is up and runs the examples", 120_000);
  const long = await dev.cli("enqueue", "example.long", "--payload", '{"seconds":60}', "--json");
  assert.equal(long.code, 0, long.stderr);
  const { id } = JSON.parse(long.stdout) as { id: string };
  await eventually(async () => new RegExp(`job ${id} example\\.long started`).test(outputOf()), "the long job started", 30_000);
  return id;
}

async function assertReleased(dev: ReturnType<typeof npmStart>, id: string): Promise<void> {
  const shown = await dev.cli("jobs", "show", id, "--json");
  assert.equal(shown.code, 0, shown.stderr);
  const { job, attempts } = JSON.parse(shown.stdout) as { job: { state: string }; attempts: { outcome: string }[] };
  assert.equal(job.state, "waiting", shown.stdout);
  assert.deepEqual(
    attempts.map((a) => a.outcome),
    ["released"],
  );
}

test(
  "npm start | tee log, then Ctrl-C: tee dies with it, and dev still stops gracefully (job released, dev.json removed)",
  { timeout: 240_000 },
  async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-tee-"));
    fs.chmodSync(dir, 0o755);
    const log = path.join(dir, "log");
    const dev = npmStart(dir, `| tee ${log}`);
    try {
      const id = await longJobRunning(dev, () => (fs.existsSync(log) ? fs.readFileSync(log, "utf8") : ""));
      const stateFile = path.join(dir, ".leasehold", "dev.json");
      const { pid } = JSON.parse(fs.readFileSync(stateFile, "utf8")) as { pid: number };
      dev.ctrlC();
      await dev.exited;
      // dev outlives the pipeline it was in (tee and the shell die at once): wait for it.
      await eventually(async () => !isAlive(pid), "dev exited", 60_000);
      assert.doesNotMatch(dev.output(), /EPIPE|Unhandled 'error'/, "no crash on the closed pipe");
      assert.match(dev.output(), /SIGINT: stopping/);
      assert.equal(fs.existsSync(stateFile), false, "dev.json removed");
      await assertReleased(dev, id);
    } finally {
      dev.kill();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  },
);

test("npm start, then Ctrl-C (SIGINT to the whole process group): dev stops gracefully, and npm exits 0", { timeout: 240_000 }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-npm-"));
  fs.chmodSync(dir, 0o755);
  const dev = npmStart(dir);
  try {
    const id = await longJobRunning(dev, dev.output);
    dev.ctrlC();
    // npm forwards the SIGINT to dev, which the terminal's group signal reached too: one Ctrl-C, not two.
    assert.deepEqual(await dev.exited, { code: 0, signal: null }, dev.output());
    assert.match(dev.output(), /Leasehold dev stopped\./);
    assert.equal(fs.existsSync(path.join(dir, ".leasehold", "dev.json")), false);
    await assertReleased(dev, id);
  } finally {
    dev.kill();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}
