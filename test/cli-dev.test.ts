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
import { runCli, startCli } from "./helpers/cli.js";
import { relocatedDataDir } from "../src/embedded/postgres.js";

// Nothing points at the test database: dev and the commands must find their own.
const NO_DATABASE = { DATABASE_URL: undefined, LEASEHOLD_SCHEMA: undefined, LEASEHOLD_DATA_DIR: undefined, LEASEHOLD_TOKEN: undefined };

test("leasehold dev runs the examples on the embedded database; other commands reach it; Ctrl-C stops it cleanly", { timeout: 180_000 }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-dev-"));
  fs.chmodSync(dir, 0o755); // as root, the embedded server runs as `postgres` and must enter it
  const opts = { schema: "unused", env: NO_DATABASE, cwd: dir };
  try {
    const dev = await startCli(["dev", "--port", "0"], {
      ...opts,
      ready: /✔ job \d+ example\.progress succeeded/,
      timeoutMs: 120_000,
      asTerminal: true,
    });
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
