/**
 * A rolling upgrade from the previous tagged release (docs/upgrading.md): that release, installed
 * from this repository's history (test/helpers/previous-release.ts), migrates a fresh schema
 * and runs a fleet of worker processes; while they are mid-job this tree migrates the same
 * schema and starts its own workers beside them, and more of the previous release's workers
 * connect after the upgrade. The audit trail (job_history, job_attempts) and every process's
 * own record of the handlers it ran must show that nothing was lost, run twice unexplained or
 * crashed, and that the old workers kept claiming, beating and completing throughout.
 *
 * Not part of `npm test`: it installs the previous release with `npm ci`, which may need the
 * registry. Run it with `npm run test:upgrade` (CI runs it after `npm test`).
 */
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import path from "node:path";
import readline from "node:readline";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import pg from "pg";
import { Registry } from "prom-client";
import { createServer } from "../packages/cli/src/server/app.js";
import { Leasehold } from "../packages/leasehold/src/client.js";
import { loadMigrations } from "../packages/leasehold/src/store/migrate.js";
import { databaseUrl, rawClient, silent, uniqueSchema } from "./helpers/db.js";
import { TOKEN } from "./helpers/server.js";
import { installPreviousRelease, type PreviousRelease } from "./helpers/previous-release.js";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const WORKER = path.join(HERE, "upgrade", "worker.mjs");
const REMOTE_WORKER = path.join(HERE, "upgrade", "remote-worker.mjs");
const NEW_ENTRY = path.join(HERE, "..", "packages", "leasehold", "src", "index.ts");
/** As in worker.mjs: longer than its workers' 3 s lease, so only heartbeats carry such a job through. */
const LONG_JOB_MS = 4_500;
/** What each worker must have claimed and completed after the migration. */
const JOBS_EACH_AFTER = 3;

interface Line {
  worker: string;
  at: number;
  ready?: string;
  start?: string;
  attempt?: number;
  ms?: number;
  end?: string;
  enqueued?: string;
  stoppedProducing?: number;
  log?: string;
  msg?: string;
  detail?: string;
  stats?: { queue: string; state: string; count: number }[];
  listed?: { id: string; state: string }[];
  raw?: string;
}

interface WorkerProcess {
  name: string;
  release: "previous" | "this";
  child: ChildProcess;
  lines: Line[];
  stderr: () => string;
  exited: Promise<number | null>;
  send(command: string): void;
}

async function startWorker(
  t: { after(fn: () => unknown): void },
  p: { release: "previous" | "this"; name: string; schema: string; entry: string; env?: Record<string, string>; script?: string },
): Promise<WorkerProcess> {
  // The previous release runs as it shipped: built JavaScript on plain node, without the test
  // runner's options. This tree's workers run its source through tsx.
  const script = p.script ?? WORKER;
  const args = p.release === "previous" ? [script] : ["--import", "tsx", script];
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    DATABASE_URL: databaseUrl(),
    LEASEHOLD_SCHEMA: p.schema,
    LEASEHOLD_ENTRY: p.entry,
    WORKER_NAME: p.name,
    ...p.env,
  };
  if (p.release === "previous") delete env.NODE_OPTIONS;
  const child = spawn(process.execPath, args, { env, stdio: ["pipe", "pipe", "pipe"] });
  t.after(() => child.kill("SIGKILL"));
  const lines: Line[] = [];
  readline.createInterface({ input: child.stdout! }).on("line", (line) => {
    try {
      lines.push(JSON.parse(line) as Line);
    } catch {
      lines.push({ worker: p.name, at: Date.now(), raw: line });
    }
  });
  let stderr = "";
  child.stderr!.on("data", (b: Buffer) => (stderr += b.toString()));
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
  const proc: WorkerProcess = {
    name: p.name,
    release: p.release,
    child,
    lines,
    stderr: () => stderr,
    exited,
    send: (command) => child.stdin!.write(command + "\n"),
  };
  const ready = await Promise.race([until(() => lines.some((l) => l.ready), 60_000).then(() => true), exited.then(() => false)]);
  assert.ok(ready, `worker ${p.name} (${p.release} release) exited before it was ready:\n${stderr}\n${JSON.stringify(lines)}`);
  return proc;
}

/** `what` (or what it returns at the time out) names the condition that did not come. */
async function until(
  check: () => boolean | Promise<boolean>,
  timeoutMs: number,
  what: string | (() => string) = "condition",
  intervalMs = 50,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms: ${typeof what === "string" ? what : what()}`);
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

interface Finished {
  id: string;
  state: string;
  attempt: number;
  worker: string | null;
  started_after_migration: boolean;
  finished_after_migration: boolean;
  started_at: Date | null;
  finished_at: Date;
  ms: number | null;
  last_error: string | null;
}

async function finishedJobs(db: pg.Client, migratedAt: Date | null): Promise<Finished[]> {
  const { rows } = await db.query<Finished>(
    `SELECT id::text, state, attempt, split_part(worker_id, '/', 1) AS worker,
            coalesce(started_at > $1, false) AS started_after_migration, coalesce(finished_at > $1, false) AS finished_after_migration,
            started_at, finished_at, (payload ->> 'ms')::int AS ms, last_error
       FROM finished_jobs`,
    [migratedAt ?? new Date(8.64e15)],
  );
  return rows;
}

test("a rolling upgrade from the previous release: its workers keep claiming, beating and completing while this release migrates and runs beside them", async (t) => {
  const previous: PreviousRelease = await installPreviousRelease((line) => t.diagnostic(line));
  t.diagnostic(`previous release ${previous.tag} (${previous.commit.slice(0, 7)}), migrations up to ${previous.migrations.at(-1)}`);
  const newMigrations = loadMigrations()
    .map((m) => m.name)
    .filter((name) => !previous.migrations.includes(name));
  assert.ok(newMigrations.length > 0, "this tree adds migrations to the previous release's: the upgrade crosses them");

  const schema = uniqueSchema("upgrade");
  const db = await rawClient(schema);
  t.after(async () => {
    await db.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`).catch(() => {});
    await db.end();
  });
  // Old workers also serve a queue of their own, where this release's jobs can only run on them.
  const old = (name: string, env: Record<string, string> = {}) =>
    startWorker(t, { release: "previous", name, schema, entry: previous.entry, env: { QUEUES: "default,old-only", ...env } });
  const current = (name: string) => startWorker(t, { release: "this", name, schema, entry: NEW_ENTRY });

  // 1. The previous release alone: its migrator makes the schema, two workers (one of them
  //    also enqueueing, with that release's client) run a steady stream of jobs.
  const oldA = await old("old-a", { PRODUCE_EVERY_MS: "150" });
  const oldB = await old("old-b");
  const workers = [oldA, oldB];
  const versions = async () => (await db.query<{ v: number }>("SELECT version AS v FROM schema_migrations ORDER BY version")).rows.map((r) => r.v);
  assert.deepEqual(
    await versions(),
    previous.migrations.map((m) => Number(m.split("_")[0])),
    "the previous release migrated the schema to its own last migration",
  );
  // The SQL enqueue function as the previous release defined it (also called from triggers and psql).
  const sqlIds = [(await db.query<{ id: string }>(`SELECT enqueue('work', '{"ms": 100}')::text AS id`)).rows[0]!.id];

  const allLines = () => workers.flatMap((w) => w.lines);
  const ended = () => allLines().filter((l) => l.end).length;
  // Mid-job: a long job (longer than the lease) is running on an old worker when the migration starts.
  let longBefore: Line | undefined;
  await until(
    () => {
      const endedIds = new Set(allLines().flatMap((l) => (l.end ? [l.end] : [])));
      longBefore = allLines().find((l) => l.start && l.ms === LONG_JOB_MS && !endedIds.has(l.start));
      return ended() >= 10 && longBefore !== undefined;
    },
    60_000,
    "the previous release's workers completed jobs and one runs a long job",
  );

  // 2. This release migrates the same schema while the old workers are mid-job.
  const lh = await Leasehold.connect({ databaseUrl: databaseUrl(), schema, logger: silent, metricsRegistry: new Registry() });
  t.after(() => lh.close());
  const migratedAt = (await db.query<{ now: Date }>("SELECT clock_timestamp() AS now")).rows[0]!.now;
  const applied = await versions();
  for (const name of newMigrations) assert.ok(applied.includes(Number(name.split("_")[0])), `this release applied ${name}`);
  const { rows: running } = await db.query("SELECT 1 FROM jobs WHERE id = $1 AND state = 'running' AND locked_by LIKE 'old-%'", [longBefore!.start]);
  assert.equal(running.length, 1, `long job ${longBefore!.start} was still running on ${longBefore!.worker} when the migration committed`);
  t.diagnostic(`migrated with ${newMigrations.join(", ")} while ${longBefore!.worker} ran job ${longBefore!.start}`);
  // The previous release's call of the SQL function still resolves against this release's.
  sqlIds.push((await db.query<{ id: string }>(`SELECT enqueue('work', '{"ms": 100}')::text AS id`)).rows[0]!.id);
  sqlIds.push((await db.query<{ id: string }>(`SELECT enqueue('work', '{"ms": 100}', '{"priority": 1}')::text AS id`)).rows[0]!.id);

  // 3. This release's workers beside the old ones, and old workers connecting to the upgraded
  //    schema: one migrating on connect as usual (it must find nothing it can do), one with migrate: false.
  workers.push(...(await Promise.all([current("new-a"), current("new-b"), old("old-late-a"), old("old-late-b", { MIGRATE: "false" })])));
  const newIds: string[] = [];
  const newEnqueues: Promise<unknown>[] = [];
  let n = 0;
  const producer = setInterval(() => {
    const ms = n++ % 10 === 5 ? LONG_JOB_MS : 100 + ((n * 53) % 300);
    newEnqueues.push(lh.enqueue("work", { ms, from: "this release" }).then((job) => newIds.push(job.id)));
  }, 150);
  t.after(() => clearInterval(producer));

  // This release's flows while old workers poll: children are 'blocked' until their parent
  // succeeds; an old claim (state = 'waiting') must never take one. One graph's parent is due in
  // ten minutes, so its children stay blocked for the whole run.
  const flows = await Promise.all(
    [1, 2, 3].map(() =>
      lh.enqueueFlow([
        { ref: "parent", task: "work", payload: { ms: 1_500 } },
        { ref: "a", task: "work", payload: { ms: 100 }, dependsOn: ["parent"] },
        { ref: "b", task: "work", payload: { ms: 100 }, dependsOn: ["parent"] },
      ]),
    ),
  );
  const held = await lh.enqueueFlow([
    { ref: "later", task: "work", payload: { ms: 100 }, delayMs: 600_000 },
    { ref: "a", task: "work", payload: { ms: 100 }, dependsOn: ["later"] },
    { ref: "b", task: "work", payload: { ms: 100 }, dependsOn: ["later"] },
  ]);
  const heldChildren = [held.jobs.a!, held.jobs.b!];

  // The previous release's stats and job list read the new state without failing.
  oldB.send("stats");
  await until(() => oldB.lines.some((l) => l.stats || l.msg?.startsWith("stats failed")), 15_000, "old-b answered stats");
  const statsLine = oldB.lines.find((l) => l.stats);
  assert.ok(statsLine, `old-b's stats failed: ${JSON.stringify(oldB.lines.find((l) => l.msg?.startsWith("stats failed")))}`);
  assert.ok(
    statsLine.stats!.some((c) => c.state === "blocked" && c.count >= 2),
    "the previous release's stats() counts the blocked jobs (as a state it does not name)",
  );
  assert.ok(
    statsLine.listed!.some((j) => heldChildren.includes(j.id) && j.state === "blocked"),
    "and lists them",
  );

  // Old workers ending this release's parents, by each path: a success releases the child, a
  // death (the dead letter) cancels it; and this release's cancel of a job an old worker runs.
  const onOld = await lh.enqueueFlow([
    { ref: "ok", task: "work", payload: { ms: 300 }, queue: "old-only" },
    { ref: "fails", task: "work", payload: { ms: 100, fail: true }, queue: "old-only", maxAttempts: 1 },
    { ref: "afterOk", task: "work", payload: { ms: 100 }, dependsOn: ["ok"] },
    { ref: "afterFail", task: "work", payload: { ms: 100 }, dependsOn: ["fails"] },
  ]);
  const toCancel = (await lh.enqueue("work", { ms: 60_000 }, { queue: "old-only" })).id;
  await until(() => allLines().some((l) => l.start === toCancel), 15_000, "an old worker started the job to cancel");
  assert.equal(await lh.cancel(toCancel), "cancel_requested");

  // 4. Until every worker, old and new, has claimed and completed jobs after the migration, and
  //    an old worker has carried a job longer than its lease through on heartbeats.
  const names = workers.map((w) => w.name);
  let oldBeatsAfterMigration = 0;
  let missing = "";
  await until(
    async () => {
      const { rows } = await db.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM jobs
          WHERE state = 'running' AND locked_by LIKE 'old-%' AND heartbeat_at > $1 AND heartbeat_at > started_at`,
        [migratedAt],
      );
      oldBeatsAfterMigration += rows[0]!.n;
      const done = (await finishedJobs(db, migratedAt)).filter((j) => j.state === "succeeded" && j.started_after_migration);
      const perWorker = (name: string) => done.filter((j) => j.worker === name).length;
      const longOnOld = done.some((j) => j.ms === LONG_JOB_MS && j.worker!.startsWith("old-"));
      missing = [
        ...names.filter((name) => perWorker(name) < JOBS_EACH_AFTER).map((name) => `${name} completed ${perWorker(name)} jobs`),
        ...(longOnOld ? [] : ["no job longer than the lease completed on an old worker"]),
        ...(oldBeatsAfterMigration > 0 ? [] : ["no old worker's heartbeat was seen"]),
      ].join("; ");
      return missing === "";
    },
    90_000,
    () => `every worker completed jobs claimed after the migration, and an old one a job longer than its lease (${missing})`,
    500,
  );

  // 5. Stop producing; drain everything but the held graph.
  clearInterval(producer);
  await Promise.all(newEnqueues);
  oldA.send("stop-producing");
  await until(() => oldA.lines.some((l) => l.stoppedProducing !== undefined), 10_000, "old-a stopped producing");
  const flowIds = flows.flatMap((f) => Object.values(f.jobs));
  const heldIds = Object.values(held.jobs);
  await until(
    async () => (await db.query<{ n: number }>("SELECT count(*)::int AS n FROM jobs WHERE NOT id = ANY($1::bigint[])", [heldIds])).rows[0]!.n === 0,
    60_000,
    "every job but the held graph finished",
    250,
  );
  const { rows: heldRows } = await db.query<{ id: string; state: string; attempt: number }>(
    "SELECT id::text, state, attempt FROM jobs WHERE id = ANY($1::bigint[])",
    [heldChildren],
  );
  assert.deepEqual(
    heldRows.map((r) => [r.state, r.attempt]),
    [
      ["blocked", 0],
      ["blocked", 0],
    ],
    "no worker, old or new, claimed a blocked job",
  );
  // Its parent cancelled by this release: the children are cancelled with it, old workers or not.
  await lh.cancel(held.jobs.later!);

  // 6. Every worker stops cleanly on SIGTERM.
  for (const w of workers) w.child.kill("SIGTERM");
  const codes = await Promise.all(workers.map((w) => w.exited));
  assert.deepEqual(
    codes,
    workers.map(() => 0),
    `every worker exited 0 (${workers.map((w) => `${w.name}: ${w.stderr()}`).join("; ")})`,
  );

  // The audit trail.
  const enqueuedByOld = allLines().flatMap((l) => (l.enqueued ? [l.enqueued] : []));
  const onOldIds = Object.values(onOld.jobs);
  const expected = new Set([...enqueuedByOld, ...newIds, ...sqlIds, ...flowIds, ...heldIds, ...onOldIds, toCancel]);
  const finished = await finishedJobs(db, migratedAt);
  const byId = new Map(finished.map((j) => [j.id, j]));
  assert.equal(finished.length, byId.size, "each job finished once");
  const { rows: left } = await db.query("SELECT id FROM jobs");
  assert.deepEqual(left, [], "no job is left unfinished");
  const lost = [...expected].filter((id) => !byId.has(id));
  assert.deepEqual(lost, [], "no enqueued job was lost");
  const unexpected = finished.filter((j) => !expected.has(j.id)).map((j) => j.id);
  assert.deepEqual(unexpected, [], "every finished job is one the test enqueued");

  const endedOtherwise = new Set([...heldIds, onOld.jobs.fails!, onOld.jobs.afterFail!, toCancel]);
  for (const j of finished) {
    if (endedOtherwise.has(j.id)) continue;
    assert.equal(j.state, "succeeded", `job ${j.id} succeeded (${j.state}: ${j.last_error})`);
  }
  for (const id of heldChildren) {
    assert.equal(byId.get(id)!.state, "cancelled");
    assert.equal(byId.get(id)!.last_error, `parent job ${held.jobs.later} ended cancelled`);
  }

  // Old workers ended this release's parents and ran its cancel.
  const [ok, afterOk, fails, afterFail, cancelled] = [onOld.jobs.ok!, onOld.jobs.afterOk!, onOld.jobs.fails!, onOld.jobs.afterFail!, toCancel].map(
    (id) => byId.get(id)!,
  );
  assert.match(ok!.worker!, /^old-/);
  assert.ok(afterOk!.started_at! >= ok!.finished_at, "the child of a parent an old worker completed ran after it");
  assert.deepEqual([fails!.state, fails!.worker?.startsWith("old-")], ["dead", true], "the failing parent died on an old worker");
  assert.deepEqual(
    [afterFail!.state, afterFail!.last_error],
    ["cancelled", `parent job ${fails!.id} ended dead`],
    "the child of a parent that died on an old worker was cancelled",
  );
  assert.deepEqual(
    [cancelled!.state, cancelled!.worker?.startsWith("old-")],
    ["cancelled", true],
    "this release's cancel ended a job an old worker ran",
  );

  // Run twice only with a reason recorded: every attempt before the last has its audit row
  // with an outcome; and no handler ran an attempt the database did not hand out.
  const { rows: attempts } = await db.query<{ job_id: string; attempt: number; outcome: string | null }>(
    "SELECT job_id::text, attempt, outcome FROM job_attempts",
  );
  const starts = new Map<string, number[]>();
  for (const l of allLines()) if (l.start) starts.set(l.start, [...(starts.get(l.start) ?? []), l.attempt!]);
  let retried = 0;
  for (const j of finished) {
    const ran = (starts.get(j.id) ?? []).sort((a, b) => a - b);
    if (j.state !== "succeeded") continue;
    // An attempt given back before its handler started (a buffered job released when its
    // worker stopped) never ran; every other attempt ran exactly once.
    const releasedUnstarted = (a: number) => !ran.includes(a) && attempts.find((r) => r.job_id === j.id && r.attempt === a)?.outcome === "released";
    assert.deepEqual(
      ran,
      Array.from({ length: j.attempt }, (_, i) => i + 1).filter((a) => !releasedUnstarted(a)),
      `job ${j.id}: each of its ${j.attempt} attempts ran once (outcomes: ${JSON.stringify(attempts.filter((r) => r.job_id === j.id))})`,
    );
    assert.ok(ran.includes(j.attempt), `job ${j.id}: its last attempt ran`);
    for (let a = 1; a < j.attempt; a++) {
      retried++;
      const row = attempts.find((r) => r.job_id === j.id && r.attempt === a);
      assert.ok(row?.outcome, `job ${j.id} ran again: attempt ${a} has its reason recorded`);
    }
  }
  t.diagnostic(`${finished.length} jobs; ${retried} attempts retried, each with its reason`);

  // Old workers kept claiming and completing after the migration, beside the new ones.
  for (const name of names) {
    const after = finished.filter((j) => j.worker === name && j.state === "succeeded" && j.started_after_migration);
    assert.ok(after.length >= JOBS_EACH_AFTER, `${name} claimed and completed ${after.length} jobs after the migration`);
  }
  // Heartbeats: the job that was mid-run during the migration, and a long one claimed after it.
  const before = byId.get(longBefore!.start!)!;
  assert.equal(before.worker, longBefore!.worker, "the job running through the migration finished on its old worker");
  assert.equal(before.attempt, 1, "in its first attempt: its lease was renewed across the migration");
  assert.ok(before.finished_after_migration);
  const longAfter = finished.filter((j) => j.ms === LONG_JOB_MS && j.worker!.startsWith("old-") && j.started_after_migration && j.attempt === 1);
  assert.ok(longAfter.length > 0, "a job longer than the lease, claimed after the migration, completed on an old worker in its first attempt");

  // The flows: no child started before its parent ended.
  for (const f of flows) {
    const parent = byId.get(f.jobs.parent!)!;
    for (const ref of ["a", "b"]) {
      const child = byId.get(f.jobs[ref]!)!;
      assert.ok(child.started_at! >= parent.finished_at, `flow child ${child.id} (on ${child.worker}) started after its parent ${parent.id} ended`);
    }
  }

  // No worker logged a warning or an error (a schema error would be one), or wrote to stderr.
  // (but the failure asked for, which an old worker logs as "job failed").
  const complaints = allLines().filter((l) => (l.log || l.raw) && !(l.msg === "job failed" && l.detail?.includes("asked to fail")));
  assert.deepEqual(complaints, [], "no worker logged a warning or an error");
  for (const w of workers) assert.equal(w.stderr(), "", `${w.name} wrote nothing to stderr`);
});

test("the previous release's remote workers claim, beat, complete and fail through this release's server (the server upgraded first)", async (t) => {
  const previous: PreviousRelease = await installPreviousRelease((line) => t.diagnostic(line));
  const schema = uniqueSchema("upgrade_remote");
  const lh = await Leasehold.connect({ databaseUrl: databaseUrl(), schema, logger: silent, metricsRegistry: new Registry() });
  t.after(() => lh.close());
  const app = createServer({ leasehold: lh, token: TOKEN });
  await app.listen({ host: "127.0.0.1", port: 0 });
  t.after(() => app.close());
  const serverUrl = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;

  // Short jobs, one longer than the old worker's 3 s lease (only its beats through this server
  // carry it), and one that fails for good.
  const short = await lh.enqueueMany(Array.from({ length: 8 }, (_, n) => ({ task: "work", payload: { ms: 50 + n * 20 } })));
  const long = await lh.enqueue("work", { ms: LONG_JOB_MS });
  const failing = await lh.enqueue("work", { ms: 10, fail: true }, { maxAttempts: 1 });

  const worker = await startWorker(t, {
    release: "previous",
    name: "old-remote",
    schema,
    entry: previous.entry,
    script: REMOTE_WORKER,
    env: { SERVER_URL: serverUrl, LEASEHOLD_TOKEN: TOKEN },
  });
  const all = [...short.map((j) => j.id), long.id, failing.id];
  await until(
    async () => (await Promise.all(all.map((id) => lh.getJob(id)))).every((r) => ["succeeded", "dead"].includes(r.job.state)),
    60_000,
    () => `every job finished; the worker printed ${JSON.stringify(worker.lines.slice(-5))}`,
  );

  for (const id of [...short.map((j) => j.id), long.id]) {
    const { job, attempts } = await lh.getJob(id);
    assert.equal(job.state, "succeeded", `job ${id}`);
    assert.equal(job.attempt, 1, `job ${id} ran once`);
    // The previous release reports no handler results (they came later): none is stored.
    assert.equal(job.result, null);
    assert.match(attempts.at(-1)!.workerId ?? "", /^old-remote/);
  }
  const started = worker.lines.filter((l) => l.start === long.id);
  assert.equal(started.length, 1, "the long job started once: its lease was renewed through this release's server");
  const dead = await lh.getJob(failing.id);
  assert.equal(dead.job.state, "dead");
  assert.match(dead.job.lastError ?? "", /asked to fail/);

  worker.child.kill("SIGTERM");
  assert.equal(await worker.exited, 0, worker.stderr());
  const complaints = worker.lines.filter((l) => l.log === "error" || (l.log === "warn" && l.msg !== "job failed"));
  assert.deepEqual(complaints, [], "the old remote worker logged no error and no warning but its job's failure");
});
