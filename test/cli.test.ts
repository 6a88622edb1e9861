/** The CLI as a user runs it: real processes, real output, exit codes. */
import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { databaseUrl, eventually, freshLeasehold, rawClient, uniqueSchema, waitForEvent } from "./helpers/db.js";
import { isOneLineError, runCli, startCli } from "./helpers/cli.js";
import { TcpProxy } from "./helpers/proxy.js";

test("enqueue, jobs list/show/cancel/retry and stats, in human and --json form", async () => {
  const schema = uniqueSchema("cli");
  const cli = (...args: string[]) => runCli(args, { schema });

  const migrated = await cli("migrate");
  assert.equal(migrated.code, 0, migrated.stderr);
  assert.match(migrated.stdout, new RegExp(`schema ${schema} is up to date`));

  const one = await cli("enqueue", "email.send", "--payload", '{"to":"ada@example.com"}', "--queue", "mail", "--priority", "-5", "--json");
  assert.equal(one.code, 0, one.stderr);
  const { id, created } = JSON.parse(one.stdout) as { id: string; created: boolean };
  assert.equal(created, true);

  const human = await cli("enqueue", "report.build", "--delay", "1h", "--max-attempts", "3", "--unique-key", "r-1");
  assert.equal(human.code, 0, human.stderr);
  assert.match(human.stdout, /^enqueued job \d+ \(report\.build\)\n$/);
  const again = await cli("enqueue", "report.build", "--unique-key", "r-1");
  assert.match(again.stdout, /is unfinished; not enqueued again/);

  const list = await cli("jobs", "list", "--queue", "mail", "--json", "--payload");
  const jobs = JSON.parse(list.stdout) as { id: string; task: string; priority: number; payload: unknown }[];
  assert.deepEqual(
    jobs.map((j) => [j.id, j.task, j.priority]),
    [[id, "email.send", -5]],
  );
  assert.deepEqual(jobs[0]!.payload, { to: "ada@example.com" });
  // Payloads are left out unless asked for, as through a server.
  const bare = JSON.parse((await cli("jobs", "list", "--queue", "mail", "--json")).stdout) as object[];
  assert.ok(bare.length === 1 && !("payload" in bare[0]!));
  const table = await cli("jobs", "list");
  assert.match(table.stdout, /^ID\s+STATE\s+QUEUE\s+TASK/);
  assert.match(table.stdout, /report\.build/);

  const cancelled = await cli("jobs", "cancel", id);
  assert.equal(cancelled.code, 0, cancelled.stderr);
  assert.equal(cancelled.stdout, `job ${id} cancelled\n`);
  const cancelTwice = await cli("jobs", "cancel", id);
  assert.equal(cancelTwice.code, 4);
  assert.ok(isOneLineError(cancelTwice.stderr), cancelTwice.stderr);

  const retried = await cli("jobs", "retry", id, "--json");
  assert.deepEqual(JSON.parse(retried.stdout), { id, result: "retried" });
  const shown = await cli("jobs", "show", id, "--json");
  const detail = JSON.parse(shown.stdout) as { job: { state: string }; attempts: unknown[] };
  assert.equal(detail.job.state, "waiting");
  const shownHuman = await cli("jobs", "show", id);
  assert.match(shownHuman.stdout, /attempt history:/);

  const stats = await cli("stats", "--json");
  const s = JSON.parse(stats.stdout) as { counts: { queue: string; state: string; count: number }[]; activeLeases: number };
  assert.deepEqual(s.counts.map((c) => `${c.queue}/${c.state}/${c.count}`).sort(), ["default/waiting/1", "mail/waiting/1"]);
  assert.equal(s.activeLeases, 0);
  const statsHuman = await cli("stats");
  assert.match(statsHuman.stdout, /QUEUE\s+WAITING\s+RUNNING/);
  assert.match(statsHuman.stdout, /active leases\s+0/);
});

test("bad input is one clear line on stderr and a meaningful exit code, never a stack trace", async () => {
  const schema = uniqueSchema("cli");
  const cases: [string[], number, RegExp][] = [
    [["jobs", "list", "--bogus"], 2, /unknown option '--bogus'/],
    [["enqueue", "t", "--payload", "{not json"], 2, /--payload is not valid JSON/],
    [["enqueue", "t", "--delay", "soon"], 2, /--delay must be a duration/],
    [["enqueue", "t", "--run-at", "tomorrow"], 2, /--run-at must be an ISO 8601/],
    [["enqueue", "t", "--payload", "{}", "--payloads", "-"], 2, /give one of --payload/],
    [["enqueue", "bad task!"], 2, /task must be 1-128 characters/],
    [["enqueue", "t", "--payload-file", "/nonexistent/p.json"], 2, /cannot read \/nonexistent\/p.json/],
    [["jobs", "list", "--limit", "0"], 2, /--limit must be from 1 to 10000/],
    [["jobs", "list", "--state", "done"], 2, /--state must be one of/],
    [["jobs", "show", "123456789"], 3, /job 123456789 does not exist/],
    [["jobs", "show", "abc"], 2, /job id must be a positive integer/],
    [["jobs", "retry", "987654321"], 3, /does not exist/],
    [["nosuchcommand"], 2, /unknown command 'nosuchcommand'/],
    [["worker", "--tasks", "/nonexistent/tasks.ts"], 2, /no such file/],
    [["serve", "--port", "0"], 2, /needs an API token/],
    [["jobs", "show", "9223372036854775808"], 3, /job 9223372036854775808 does not exist/],
    [["--database-url", "notaurl", "stats"], 2, /database URL must look like postgres:\/\//],
  ];
  for (const [args, code, message] of cases) {
    const r = await runCli(args, { schema, env: { LEASEHOLD_TOKEN: undefined } });
    assert.equal(r.code, code, `${args.join(" ")}: exit ${r.code}, stderr ${r.stderr}`);
    assert.match(r.stderr, message, args.join(" "));
    assert.ok(isOneLineError(r.stderr), `${args.join(" ")}: ${r.stderr}`);
  }
  // A database nobody listens on: one line, exit 5.
  const dead = await runCli(["--database-url", "postgres://u:secret@127.0.0.1:1/db", "stats"], { schema });
  assert.equal(dead.code, 5, dead.stderr);
  assert.match(dead.stderr, /cannot reach the database/);
  assert.doesNotMatch(dead.stderr, /secret/);
  assert.ok(isOneLineError(dead.stderr), dead.stderr);
  // A job that cannot be retried from its state.
  const enq = await runCli(["enqueue", "t", "--json"], { schema });
  const { id } = JSON.parse(enq.stdout) as { id: string };
  const retry = await runCli(["jobs", "retry", id], { schema });
  assert.equal(retry.code, 4);
  assert.match(retry.stderr, /is waiting; only dead or cancelled jobs can be retried/);
});

test("bulk enqueue reads JSON lines from stdin in batches; a bad line names its number and nothing of the file is written", async () => {
  const schema = uniqueSchema("cli");
  const good = Array.from({ length: 12_000 }, (_, i) => JSON.stringify({ n: i })).join("\n") + "\n";
  const ok = await runCli(["enqueue", "bulk.task", "--payloads", "-", "--queue", "bulk", "--json"], { schema, input: good });
  assert.equal(ok.code, 0, ok.stderr);
  assert.deepEqual({ ...JSON.parse(ok.stdout), warnings: undefined }, { enqueued: 12_000, created: 12_000, warnings: undefined });

  const bad = ['{"n":1}', '{"n":2}', "", '{"n":3', '{"n":4}'].join("\n");
  const refused = await runCli(["enqueue", "bulk.bad", "--payloads", "-"], { schema, input: bad });
  assert.equal(refused.code, 2);
  assert.match(refused.stderr, /line 4: invalid JSON/);
  assert.match(refused.stderr, /nothing was enqueued/);
  assert.ok(isOneLineError(refused.stderr), refused.stderr);

  // The import is one transaction: a bad last line after several full batches leaves nothing.
  const lateBad = Array.from({ length: 5_001 }, (_, i) => JSON.stringify({ n: i })).join("\n") + '\n{"s":"\\u0000"}\n';
  const late = await runCli(["enqueue", "bulk.late", "--payloads", "-"], { schema, input: lateBad });
  assert.equal(late.code, 2, late.stderr);
  assert.match(late.stderr, /line 5002: payload\.s contains a NUL character/);
  assert.match(late.stderr, /nothing was enqueued/);

  const db = await rawClient(schema);
  try {
    const { rows } = await db.query<{ task: string; n: number }>("SELECT task, count(*)::int AS n FROM jobs GROUP BY task");
    assert.deepEqual(rows, [{ task: "bulk.task", n: 12_000 }]);
    const payloads = await db.query<{ sum: string }>("SELECT sum((payload->>'n')::int)::text AS sum FROM jobs");
    assert.equal(payloads.rows[0]!.sum, String((11_999 * 12_000) / 2));
  } finally {
    await db.end();
  }
});

test("a schema named like an SQL keyword works; a tasks module that throws null is named in one line", async () => {
  const schema = "select";
  try {
    const migrated = await runCli(["migrate", "--json"], { schema });
    assert.equal(migrated.code, 0, migrated.stderr);
    const enq = await runCli(["enqueue", "t", "--json"], { schema });
    assert.equal(enq.code, 0, enq.stderr);
    const stats = await runCli(["stats", "--json"], { schema });
    assert.deepEqual(JSON.parse(stats.stdout).counts, [{ queue: "default", state: "waiting", count: 1 }]);
  } finally {
    const db = await rawClient("public");
    await db.query('DROP SCHEMA IF EXISTS "select" CASCADE').finally(() => db.end());
  }
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-tasks-"));
  const file = path.join(dir, "throws.mjs");
  fs.writeFileSync(file, "throw null;\n");
  const r = await runCli(["worker", "--tasks", file], { schema: uniqueSchema("cli") });
  fs.rmSync(dir, { recursive: true, force: true });
  assert.equal(r.code, 2, r.stderr);
  assert.match(r.stderr, /cannot load tasks module .*throws\.mjs: it threw null/);
  assert.ok(isOneLineError(r.stderr), r.stderr);
});

test("worker --tasks runs a TypeScript tasks module's handlers; SIGTERM stops it gracefully", async () => {
  const schema = uniqueSchema("cli");
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-tasks-"));
  const tasksFile = path.join(dir, "tasks.ts");
  fs.writeFileSync(
    tasksFile,
    `import type { JobContext } from "leasehold";
export default {
  double: async (payload: { n: number }, ctx: JobContext) => {
    ctx.progress({ doubled: payload.n * 2 });
    await new Promise((r) => setTimeout(r, 50));
  },
  broken: () => { throw new Error("broken on purpose"); },
};
`,
  );
  const enq = await runCli(["enqueue", "double", "--payload", '{"n":21}', "--json"], { schema });
  const { id } = JSON.parse(enq.stdout) as { id: string };
  const broken = JSON.parse((await runCli(["enqueue", "broken", "--max-attempts", "1", "--json"], { schema })).stdout) as { id: string };
  const worker = await startCli(["worker", "--tasks", tasksFile, "--concurrency", "2"], { schema, ready: /✖ job \d+ broken failed and is dead/ });
  await eventually(async () => new RegExp(`✔ job ${id} double succeeded`).test(worker.output()), "the double job's success line");
  const stopped = await worker.stop("SIGTERM");
  assert.equal(stopped.code, 0, stopped.stderr);

  const shown = JSON.parse((await runCli(["jobs", "show", id, "--json"], { schema })).stdout) as { job: { state: string; progress: unknown } };
  assert.equal(shown.job.state, "succeeded");
  const dead = JSON.parse((await runCli(["jobs", "show", broken.id, "--json"], { schema })).stdout) as { job: { state: string; lastError: string } };
  assert.equal(dead.job.state, "dead");
  assert.match(dead.job.lastError, /broken on purpose/);
  fs.rmSync(dir, { recursive: true, force: true });
});

test("worker --name: when another process takes the name while the worker's session is down, the command exits with that error instead of idling", async (t) => {
  const schema = uniqueSchema("cli");
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-tasks-"));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const tasksFile = path.join(dir, "tasks.mjs");
  fs.writeFileSync(tasksFile, "export default { noop: () => {} };\n");
  const worker = await startCli(["worker", "--tasks", tasksFile, "--name", "pod-a", "--no-watchdog"], { schema, ready: /running noop/ });
  t.after(() => void worker.stop("SIGKILL"));
  const thief = await rawClient(schema);
  t.after(() => thief.end());
  // End the worker's session and queue for its name's lock in the same breath: the lock is
  // handed over as the old backend exits, before the worker can connect again.
  await thief.query(
    `SELECT pg_terminate_backend(l.pid) FROM pg_locks AS l
      WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
        AND ((l.classid::bigint << 32) | l.objid::bigint) = hashtextextended('leasehold:' || $1 || ':name:pod-a', 0);
     SELECT pg_advisory_lock(hashtextextended('leasehold:' || $1 || ':name:pod-a', 0));`.replace(/\$1/g, `'${schema}'`),
  );
  const exited = await Promise.race([worker.stop("SIGCONT"), new Promise<null>((r) => setTimeout(() => r(null), 20_000))]);
  assert.ok(exited, `the worker kept running without its name; stdout: ${worker.output()}`);
  assert.equal(exited.code, 4, exited.stderr);
  assert.match(exited.stderr, /worker name "pod-a" is held by another live process/);
  assert.ok(
    isOneLineError(
      exited.stderr
        .split("\n")
        .filter((l) => !l.startsWith("{"))
        .join("\n"),
    ),
    exited.stderr,
  );
});

test("watchdog --once reaps an expired lease", async () => {
  const schema = uniqueSchema("cli");
  const enq = await runCli(["enqueue", "t", "--json"], { schema });
  const { id } = JSON.parse(enq.stdout) as { id: string };
  const db = await rawClient(schema);
  try {
    // A worker that claimed the job and vanished: its lease ran out a second ago.
    await db.query(
      `UPDATE jobs SET state = 'running', attempt = 1, locked_by = 'gone', started_at = now() - interval '1 minute',
              heartbeat_at = now() - interval '1 minute', lease_until = now() - interval '1 second' WHERE id = $1`,
      [id],
    );
    const r = await runCli(["watchdog", "--once", "--json"], { schema });
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(JSON.parse(r.stdout), { retried: 1, dead: 0, cancelled: 0, byCause: { lease_expired: 1 } });
    const { rows } = await db.query<{ state: string; outcome: string }>(
      "SELECT j.state, a.outcome FROM jobs j JOIN job_attempts a ON a.job_id = j.id WHERE j.id = $1",
      [id],
    );
    assert.deepEqual(rows, [{ state: "waiting", outcome: "lease_expired" }]);
  } finally {
    await db.end();
  }
});

test("jobs watch waits out a database outage: it keeps the last frame, says it is reconnecting, and resumes", async (t) => {
  const schema = uniqueSchema("cliwatch");
  assert.equal((await runCli(["enqueue", "watch.me", "--queue", "watched"], { schema })).code, 0);
  const { proxy, proxiedUrl } = TcpProxy.forUrl(databaseUrl());
  await proxy.start();
  t.after(() => proxy.stop());
  const watch = await startCli(["jobs", "watch", "--interval", "250"], {
    schema,
    env: { DATABASE_URL: proxiedUrl() },
    ready: /watched\s+1\s+0\s+0\s+0/,
  });
  t.after(() => watch.stop("SIGKILL"));
  proxy.cut();
  await eventually(async () => /! reconnecting since/.test(watch.output()), "watch says it is reconnecting", 20_000);
  const cutFrom = watch.output().lastIndexOf("! reconnecting since");
  assert.match(watch.output().slice(cutFrom), /the last frame, from .*\n\nLeasehold .*\n\nQUEUE[^\n]*\nwatched\s+1/s, "the last frame stays up");
  assert.equal(watch.child.exitCode, null, "still running through the outage");

  // Back: the next frames are fresh again (and count a job enqueued meanwhile).
  assert.equal((await runCli(["enqueue", "watch.me", "--queue", "watched"], { schema })).code, 0);
  proxy.restore();
  await eventually(async () => /watched\s+2\s+0\s+0\s+0/.test(watch.output()), "watch resumed with fresh counts", 20_000);
  const ended = await watch.stop("SIGINT");
  assert.equal(ended.code, 0, ended.stderr);
});

test("jobs list and jobs show count a job that succeeded first time as one attempt made, none of its budget spent", async (t) => {
  const lh = await freshLeasehold(t);
  const worker = lh.worker({ watchdog: false, handlers: { "once.ok": () => undefined, "once.fail": () => Promise.reject(new Error("no")) } });
  const { id } = await lh.enqueue("once.ok", {});
  const { id: failedId } = await lh.enqueue("once.fail", {}, { maxAttempts: 1 });
  const ended = waitForEvent<[{ id: string }]>(worker, "job:end", (job) => job.id === id);
  const failed = waitForEvent<[{ id: string }]>(worker, "job:end", (job) => job.id === failedId);
  await worker.start();
  t.after(() => worker.stop(0));
  await Promise.all([ended, failed]);

  const list = await runCli(["jobs", "list"], { schema: lh.schema });
  assert.equal(list.code, 0, list.stderr);
  const [header, ...rows] = list.stdout.trimEnd().split("\n");
  assert.match(header!, /ATTEMPTS MADE\s+BUDGET SPENT/);
  const row = (jobId: string) => rows.find((r) => r.startsWith(`${jobId} `))!.split(/\s{2,}/);
  assert.deepEqual(row(id).slice(1, 6), ["succeeded", "default", "once.ok", "1", "0/25"]);
  // A failure spends the budget: one attempt made, the whole (one-attempt) budget spent.
  assert.deepEqual(row(failedId).slice(1, 6), ["dead", "default", "once.fail", "1", "1/1"]);

  const show = await runCli(["jobs", "show", id], { schema: lh.schema });
  assert.match(show.stdout, /^attempts made\s+1 /m);
  assert.match(show.stdout, /^budget spent\s+0 of 25 /m);
});
