/** The embedded default survives the crashes it will meet on a developer's machine. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import { createRequire } from "node:module";
import os from "node:os";
import path from "node:path";
import pg from "pg";
import { EmbeddedPostgres, relocatedDataDir } from "../packages/cli/src/embedded/postgres.js";

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

const PASSWORD_FILE = "leasehold.password";

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

test("another live process's server is used, never stopped, and refused with its name when we cannot log in; once that process is killed (-9), the next start takes over", async (t) => {
  const servers: EmbeddedPostgres[] = [];
  const dataDir = tempDataDir(t, servers);
  // The owner: a process that starts the server, reports its port and pid, and then only lives on.
  const script = `
    import { EmbeddedPostgres } from ${JSON.stringify(path.resolve("packages/cli/src/embedded/postgres.ts"))};
    const ep = new EmbeddedPostgres({ dataDir: ${JSON.stringify(dataDir)} });
    const url = await ep.start();
    console.log(JSON.stringify({ port: new URL(url).port, pid: ep.pid }));
    setInterval(() => {}, 1e6);`;
  const parent = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], { stdio: ["ignore", "pipe", "inherit"] });
  t.after(() => void parent.kill("SIGKILL"));
  const started = JSON.parse(await new Promise<string>((resolve) => parent.stdout.once("data", (b: Buffer) => resolve(b.toString())))) as {
    port: string;
    pid: number;
  };
  const serverPid = started.pid;

  // A second process on the same directory: a client of that server.
  const second = new EmbeddedPostgres({ dataDir });
  servers.push(second);
  const url = await second.start();
  assert.equal(new URL(url).port, started.port, "the owner's server");
  assert.equal(second.owner?.pid, parent.pid);
  assert.match(second.owner!.command, /^node .*--input-type=module/);
  assert.equal(second.pid, undefined, "it started no server");
  await query(url, "CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)");
  await second.stop();
  assert.ok(alive(serverPid), "stop() leaves a server it did not start running");
  assert.deepEqual((await query(url, "SELECT v FROM kept")).rows, [{ v: 42 }], "and it still answers");

  // Cannot log in (a replaced password file): refused in one line that names the owner, the server untouched.
  const file = path.join(dataDir, PASSWORD_FILE);
  const password = fs.readFileSync(file, "utf8");
  fs.writeFileSync(file, "not-the-password\n", { mode: 0o600 });
  const refused = await new EmbeddedPostgres({ dataDir }).start().then(
    () => undefined,
    (e: Error) => e,
  );
  fs.writeFileSync(file, password, { mode: 0o600 });
  assert.ok(refused, "refused");
  assert.ok(refused.message.includes(`in use by process ${parent.pid} (node `), refused.message);
  assert.match(refused.message, /refuses the password in .*leasehold\.password; stop that process/);
  assert.ok(!refused.message.includes("\n") && !refused.message.includes(password.trim()), refused.message);
  assert.ok(alive(serverPid), "the refused start left the server alone");

  // The owner is killed without cleanup: its server is an orphan, which the next start stops and replaces.
  parent.kill("SIGKILL");
  await new Promise((r) => parent.once("exit", r));
  assert.ok(alive(serverPid), "the server outlives its killed owner");
  const next = new EmbeddedPostgres({ dataDir });
  servers.push(next);
  const url2 = await next.start();
  assert.equal(next.owner, undefined, "it owns the server it started");
  assert.deepEqual((await query(url2, "SELECT v FROM kept")).rows, [{ v: 42 }]);
  assert.equal(alive(serverPid), false, "the orphan was stopped");
});

test("two starts at once on a fresh directory: one runs initdb and the server, the other uses it", async (t) => {
  const servers: EmbeddedPostgres[] = [];
  const dataDir = tempDataDir(t, servers);
  const [a, b] = [new EmbeddedPostgres({ dataDir }), new EmbeddedPostgres({ dataDir })];
  servers.push(a, b);
  const [urlA, urlB] = await Promise.all([a.start(), b.start()]);
  assert.equal(urlA, urlB);
  assert.equal([a.pid, b.pid].filter((pid) => pid !== undefined).length, 1, "one server");
  const [owner, client] = a.pid === undefined ? [b, a] : [a, b];
  assert.equal(client.owner?.pid, process.pid);
  await client.stop();
  assert.deepEqual((await query(urlA, "SELECT 1 AS ok")).rows, [{ ok: 1 }], "the client's stop() left it running");
  await owner.stop();
  assert.equal(fs.existsSync(`${dataDir}.owner`), false, "the owner gave the directory up");
});

// --- Who can get in: a random password per data directory, no Unix socket. ---

const isRoot = process.getuid?.() === 0;
const needsRoot = isRoot ? false : "needs root (to act as other users)";

/** Logs in with `password` (TCP, 127.0.0.1); the error's SQLSTATE or message when refused. */
async function tryLogin(url: string, password: string): Promise<string> {
  const u = new URL(url);
  const c = new pg.Client({ host: "127.0.0.1", port: Number(u.port), user: "postgres", password, database: "postgres" });
  try {
    await c.connect();
    await c.end();
    return "ok";
  } catch (err) {
    await c.end().catch(() => {});
    return (err as { code?: string }).code ?? (err as Error).message;
  }
}

test("each data directory gets its own random password, kept in a 0600 file and reused; the old fixed one is refused", async (t) => {
  const servers: EmbeddedPostgres[] = [];
  const [dirA, dirB] = [tempDataDir(t, servers), tempDataDir(t, servers)];
  const a = new EmbeddedPostgres({ dataDir: dirA });
  const b = new EmbeddedPostgres({ dataDir: dirB });
  servers.push(a, b);
  const [urlA, urlB] = await Promise.all([a.start(), b.start()]);

  const file = path.join(dirA, PASSWORD_FILE);
  const st = fs.statSync(file);
  assert.equal(st.mode & 0o777, 0o600);
  assert.equal(st.uid, process.getuid!());
  const passwordA = fs.readFileSync(file, "utf8").trim();
  const passwordB = fs.readFileSync(path.join(dirB, PASSWORD_FILE), "utf8").trim();
  assert.ok(passwordA.length >= 40, "32 random bytes, base64url");
  assert.notEqual(passwordA, passwordB);
  assert.equal(decodeURIComponent(new URL(urlA).password), passwordA);
  assert.equal(await tryLogin(urlA, passwordA), "ok");
  assert.equal(await tryLogin(urlA, "leasehold"), "28P01");
  assert.equal(await tryLogin(urlB, passwordA), "28P01");

  await a.stop();
  const again = new EmbeddedPostgres({ dataDir: dirA });
  servers.push(again);
  const urlAgain = await again.start();
  assert.equal(decodeURIComponent(new URL(urlAgain).password), passwordA, "a restart reuses the stored password");
  assert.deepEqual((await query(urlAgain, "SELECT 1 AS ok")).rows, [{ ok: 1 }]);
});

test("a data directory from the old code (password 'leasehold', no password file) gets a new random password, never logged", async (t) => {
  const servers: EmbeddedPostgres[] = [];
  const dataDir = tempDataDir(t, servers);
  // Make an old-style cluster: the fixed password, no file.
  const old = new EmbeddedPostgres({ dataDir });
  servers.push(old);
  const oldUrl = await old.start();
  await query(oldUrl, "ALTER ROLE postgres PASSWORD 'leasehold'");
  await old.stop();
  fs.rmSync(path.join(dataDir, PASSWORD_FILE));

  const logged: string[] = [];
  const upgraded = new EmbeddedPostgres({ dataDir, settings: { log_statement: "all" }, onLog: (l) => logged.push(l) });
  servers.push(upgraded);
  const url = await upgraded.start();
  const password = fs.readFileSync(path.join(dataDir, PASSWORD_FILE), "utf8").trim();
  assert.equal(fs.statSync(path.join(dataDir, PASSWORD_FILE)).mode & 0o777, 0o600);
  assert.notEqual(password, "leasehold");
  assert.equal(await tryLogin(url, password), "ok");
  assert.equal(await tryLogin(url, "leasehold"), "28P01");
  assert.deepEqual(
    fs.readdirSync(dataDir).filter((f) => f.startsWith(PASSWORD_FILE)),
    [PASSWORD_FILE],
    "no pending file left",
  );
  const log = logged.join("");
  assert.match(log, /ALTER ROLE/, "the statement log is on, so a password in it would show");
  assert.ok(!log.includes(password), "the new password is not in the server log");
});

test("the password is not in the server log, redactedUrl, nor a failed start's one-line error", async (t) => {
  const servers: EmbeddedPostgres[] = [];
  const dataDir = tempDataDir(t, servers);
  const logged: string[] = [];
  const server = new EmbeddedPostgres({ dataDir, settings: { log_statement: "all", log_connections: "on" }, onLog: (l) => logged.push(l) });
  servers.push(server);
  const url = await server.start();
  const password = decodeURIComponent(new URL(url).password);
  await query(url, "SELECT current_user");
  assert.equal(server.redactedUrl, url.replace(password, "***"));
  assert.ok(!server.redactedUrl.includes(password));
  await server.stop();
  assert.match(logged.join(""), /connection authorized/, "connections were logged");
  assert.ok(!logged.join("").includes(password));

  // A server that cannot start: the error says why, in one line, without the password.
  const broken = new EmbeddedPostgres({ dataDir, settings: { shared_buffers: "lots" } });
  servers.push(broken);
  const err = await broken.start().then(
    () => undefined,
    (e: Error) => e,
  );
  assert.ok(err, "the start failed");
  assert.match(err.message, /shared_buffers/);
  assert.ok(!err.message.includes("\n"), err.message);
  assert.ok(!err.message.includes(password));

  // A password file that no longer matches: refused, naming the file, in one line, showing neither password.
  fs.writeFileSync(path.join(dataDir, PASSWORD_FILE), "not-the-password\n", { mode: 0o600 });
  const wrong = new EmbeddedPostgres({ dataDir });
  servers.push(wrong);
  const err2 = await wrong.start().then(
    () => undefined,
    (e: Error) => e,
  );
  assert.ok(err2, "the start failed");
  assert.match(err2.message, /refuses the superuser password in .*leasehold\.password/);
  assert.ok(!err2.message.includes("\n") && !err2.message.includes(password) && !err2.message.includes("not-the-password"), err2.message);
  assert.equal(wrong.pid, undefined, "the server it started was stopped");
});

test("no Unix socket, and another local user cannot log in as superuser", { skip: needsRoot }, async (t) => {
  const servers: EmbeddedPostgres[] = [];
  const server = new EmbeddedPostgres({ dataDir: tempDataDir(t, servers) });
  servers.push(server);
  const url = await server.start();
  const port = new URL(url).port;
  assert.deepEqual((await query(url, "SHOW unix_socket_directories")).rows, [{ unix_socket_directories: "" }]);
  for (const dir of new Set([os.tmpdir(), "/tmp", "/var/run/postgresql", "/run/postgresql"])) {
    assert.equal(fs.existsSync(path.join(dir, `.s.PGSQL.${port}`)), false, `no socket in ${dir}`);
  }

  // As `nobody`: the old fixed password, none, over TCP and the old socket place; the real one as a control.
  // nobody may not reach our node_modules (a clone in a private folder): it gets its own copy of pg.
  const modules = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-pg-for-nobody-"));
  fs.chmodSync(modules, 0o755);
  t.after(() => fs.rmSync(modules, { recursive: true, force: true }));
  const nodeModules = path.resolve(createRequire(import.meta.url).resolve("pg"), "..", "..", "..");
  copyPackage("pg", nodeModules, path.join(modules, "node_modules"));
  const pgPath = path.join(modules, "node_modules", "pg", "lib", "index.js");
  const script = `
    const { default: pg } = await import(${JSON.stringify(pgPath)});
    const out = {};
    for (const [name, cfg] of Object.entries(JSON.parse(process.argv[1]))) {
      const c = new pg.Client({ user: "postgres", database: "postgres", port: ${port}, ...cfg });
      try { await c.connect(); await c.end(); out[name] = "ok"; } catch (e) { out[name] = e.code ?? e.message; }
    }
    console.log(JSON.stringify(out));
    process.exit(0); // a refused client may keep its socket open until the server's authentication_timeout`;
  const attempts = {
    oldPassword: { host: "127.0.0.1", password: "leasehold" },
    noPassword: { host: "127.0.0.1", password: "" },
    oldSocket: { host: os.tmpdir(), password: "leasehold" },
    realPassword: { host: "127.0.0.1", password: decodeURIComponent(new URL(url).password) },
  };
  const nobody = spawnSync(process.execPath, ["--input-type=module", "-e", script, JSON.stringify(attempts)], {
    uid: Number(execFileSync("id", ["-u", "nobody"], { encoding: "utf8" })),
    gid: Number(execFileSync("id", ["-g", "nobody"], { encoding: "utf8" })),
    cwd: "/",
    encoding: "utf8",
  });
  assert.equal(nobody.status, 0, nobody.stderr);
  const result = JSON.parse(nobody.stdout) as Record<string, string>;
  assert.equal(result.realPassword, "ok", "control: nobody can reach the server at all");
  assert.equal(result.oldPassword, "28P01");
  assert.notEqual(result.noPassword, "ok");
  assert.notEqual(result.oldSocket, "ok");
});

/** Copies an installed package and its dependencies (npm's flat layout) from one node_modules to another. */
function copyPackage(name: string, from: string, to: string, seen = new Set<string>()): void {
  if (seen.has(name) || !fs.existsSync(path.join(from, name))) return;
  seen.add(name);
  fs.cpSync(path.join(from, name), path.join(to, name), { recursive: true });
  const manifest = JSON.parse(fs.readFileSync(path.join(from, name, "package.json"), "utf8")) as { dependencies?: Record<string, string> };
  for (const dep of Object.keys(manifest.dependencies ?? {})) copyPackage(dep, from, to, seen);
}

// --- As root: whose directories, and where the data goes. ---

/** A root-owned 0700 folder with a secret in it; removed after the test. */
function privateRootFolder(t: { after(fn: () => void): void }): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-private-"));
  fs.chmodSync(dir, 0o700);
  fs.writeFileSync(path.join(dir, "secret.txt"), "s3cret\n", { mode: 0o600 });
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  return dir;
}

test("as root, an existing data directory that is not the server user's is refused, not chowned", { skip: needsRoot }, async (t) => {
  const parent = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-embedded-"));
  fs.chmodSync(parent, 0o755);
  t.after(() => fs.rmSync(parent, { recursive: true, force: true }));
  const dataDir = path.join(parent, "pgdata");
  fs.mkdirSync(dataDir, { mode: 0o700 });
  fs.writeFileSync(path.join(dataDir, "secret.txt"), "s3cret\n", { mode: 0o600 });

  const server = new EmbeddedPostgres({ dataDir });
  const err = await server.start().then(
    () => undefined,
    (e: Error) => e,
  );
  await server.stop();
  assert.ok(err, "the start was refused");
  assert.ok(!err.message.includes("\n"), err.message);
  assert.ok(err.message.includes(dataDir), err.message);
  assert.match(err.message, /belongs to root.*chown/);
  for (const p of [dataDir, path.join(dataDir, "secret.txt")]) {
    const st = fs.statSync(p);
    assert.equal(st.uid, 0, `${p} still root's`);
  }
  assert.equal(fs.statSync(dataDir).mode & 0o777, 0o700);
  assert.deepEqual(fs.readdirSync(dataDir), ["secret.txt"]);
});

test("as root, a data directory under a private (0700) folder: refused without relocation, moved out with it", { skip: needsRoot }, async (t) => {
  const folder = privateRootFolder(t);
  const dataDir = path.join(folder, "sub", "pgdata");
  const tmpBefore = fs.readdirSync(os.tmpdir()).filter((f) => f.startsWith("leasehold-initdb-"));

  const refused = new EmbeddedPostgres({ dataDir });
  const err = await refused.start().then(
    () => undefined,
    (e: Error) => e,
  );
  assert.ok(err, "refused");
  assert.ok(!err.message.includes("\n"), err.message);
  assert.ok(err.message.includes(`${folder} is closed to other users`), err.message);
  assert.match(err.message, /choose a data directory .*, or pass relocateIfUnreachable: true to keep the cluster in \/var\/lib\/leasehold\/data-/);
  assert.deepEqual(fs.readdirSync(folder), ["secret.txt"], "nothing created in the folder");
  assert.equal(fs.statSync(folder).uid, 0);
  assert.equal(fs.statSync(folder).mode & 0o777, 0o700);
  assert.equal(fs.existsSync(relocatedDataDir(dataDir)), false, "nothing created elsewhere");
  assert.deepEqual(
    fs.readdirSync(os.tmpdir()).filter((f) => f.startsWith("leasehold-initdb-")),
    tmpBefore,
    "no temp dir left",
  );

  const notices: string[] = [];
  const moved = new EmbeddedPostgres({ dataDir, relocateIfUnreachable: true, onRelocate: (to, from) => notices.push(`${from} -> ${to}`) });
  t.after(async () => {
    await moved.stop();
    fs.rmSync(moved.dataDir, { recursive: true, force: true });
    fs.rmSync(`${moved.dataDir}.log`, { force: true });
  });
  const url = await moved.start();
  assert.deepEqual((await query(url, "SELECT 1 AS ok")).rows, [{ ok: 1 }]);
  assert.equal(moved.dataDir, relocatedDataDir(dataDir));
  assert.ok(moved.dataDir.startsWith("/var/lib/leasehold/"), moved.dataDir);
  assert.deepEqual(notices, [`${dataDir} -> ${moved.dataDir}`], "said once");
  assert.deepEqual(fs.readdirSync(folder), ["secret.txt"], "the private folder untouched");
  assert.equal(fs.statSync(moved.dataDir).uid, Number(execFileSync("id", ["-u", "postgres"], { encoding: "utf8" })));
  assert.equal(fs.statSync(path.join(moved.dataDir, PASSWORD_FILE)).mode & 0o777, 0o600);
});
