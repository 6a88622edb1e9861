/** The embedded default survives the crashes it will meet on a developer's machine. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import pg from "pg";
import { EmbeddedPostgres } from "../src/embedded/postgres.js";

/** A data directory in a temp folder, removed after `server` (if given) has stopped. */
function tempDataDir(t: { after(fn: () => Promise<void>): void }, servers: EmbeddedPostgres[]): string {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-embedded-"));
  fs.chmodSync(root, 0o755);
  t.after(async () => {
    for (const s of servers) await s.stop();
    fs.rmSync(root, { recursive: true, force: true });
  });
  return path.join(root, "pgdata");
}

async function query(url: string, sql: string): Promise<pg.QueryResult> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    return await c.query(sql);
  } finally {
    await c.end();
  }
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

test("after the server is killed (-9), its stale pid file does not stop the next start, and the data is kept", async (t) => {
  const servers: EmbeddedPostgres[] = [];
  const dataDir = tempDataDir(t, servers);
  const first = new EmbeddedPostgres({ dataDir });
  const url = await first.start();
  await query(url, "CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)");
  const pid = first.pid!;
  process.kill(pid, "SIGKILL");
  while (alive(pid)) await new Promise((r) => setTimeout(r, 20));
  assert.ok(fs.existsSync(path.join(dataDir, "postmaster.pid")), "the crash leaves its pid file behind");

  const second = new EmbeddedPostgres({ dataDir });
  servers.push(second);
  const url2 = await second.start();
  assert.deepEqual((await query(url2, "SELECT v FROM kept")).rows, [{ v: 42 }]);
});

test("a server orphaned by a parent killed with -9 is stopped and replaced by the next start", async (t) => {
  const servers: EmbeddedPostgres[] = [];
  const dataDir = tempDataDir(t, servers);
  // A parent process starts the server, reports its pid, and is then killed without cleanup.
  const script = `
    import { EmbeddedPostgres } from ${JSON.stringify(path.resolve("src/embedded/postgres.ts"))};
    const ep = new EmbeddedPostgres({ dataDir: ${JSON.stringify(dataDir)} });
    await ep.start();
    console.log(ep.pid);
    setInterval(() => {}, 1e6);`;
  const parent = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], { stdio: ["ignore", "pipe", "inherit"] });
  const orphanPid = Number(await new Promise<string>((resolve) => parent.stdout.once("data", (b: Buffer) => resolve(b.toString()))));
  parent.kill("SIGKILL");
  await new Promise((r) => parent.once("exit", r));
  assert.ok(alive(orphanPid), "the server outlives its killed parent");

  const next = new EmbeddedPostgres({ dataDir });
  servers.push(next);
  const url = await next.start();
  assert.deepEqual((await query(url, "SELECT 1 AS ok")).rows, [{ ok: 1 }]);
  assert.equal(alive(orphanPid), false, "the orphan was stopped");
});
