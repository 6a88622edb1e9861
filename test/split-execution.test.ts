/**
 * Split executions a worker can prevent, with real processes: one frozen with SIGSTOP past its
 * lease, one cut off from PostgreSQL by a real proxy. Fencing keeps the job's state right in
 * both cases; these tests pin that the *handler* never runs twice at once when the worker could
 * have known better.
 */
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import path from "node:path";
import { test, type TestContext } from "node:test";
import { fileURLToPath } from "node:url";
import { databaseUrl, eventually, freshLeasehold, NO_BACKOFF, waitForEvent, recordEvents } from "./helpers/db.js";
import { TcpProxy } from "./helpers/proxy.js";

const CHILD = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "helpers", "split-child.ts");

interface ChildLine {
  event: string;
  jobId?: string;
  attempt?: number;
  reason?: string;
  at: number;
}

/** A worker process of its own (test/helpers/split-child.ts); resolves once it runs. */
async function workerProcess(schema: string, env: Record<string, string>, url = databaseUrl()) {
  const child: ChildProcess = spawn(process.execPath, ["--import", "tsx", CHILD], {
    env: { ...process.env, DATABASE_URL: url, LEASEHOLD_SCHEMA: schema, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  let err = "";
  child.stdout!.on("data", (b: Buffer) => (out += b.toString()));
  child.stderr!.on("data", (b: Buffer) => (err += b.toString()));
  await eventually(async () => out.includes("ready ") || child.exitCode !== null, "worker process ready", 30_000);
  assert.ok(out.includes("ready "), `the worker process did not start: ${err}`);
  const lines = (): ChildLine[] =>
    out
      .trim()
      .split("\n")
      .map((l) => l.split(" "))
      .map(([event, ...rest]) => {
        if (event === "started" || event === "ended") return { event, jobId: rest[0], attempt: Number(rest[1]), at: Number(rest[2]) };
        if (event === "aborted") return { event, jobId: rest[0], attempt: Number(rest[1]), reason: rest[2], at: Number(rest[3]) };
        return { event: event!, at: Number(rest[0]) };
      });
  return { child, lines, stderr: () => err };
}

test("a frozen worker that wakes past its lease does not start the job it had buffered: another worker runs it", async (t) => {
  const lh = await freshLeasehold(t);
  // Ahead of the freezer, quick jobs make the worker claim ahead (its buffer fills at the rate
  // jobs finish), so the victim is claimed into its buffer behind the freezer.
  await lh.enqueueMany(Array.from({ length: 300 }, () => ({ task: "quick", priority: 0 })));
  const victim = await lh.enqueue("long", {}, { priority: 2, maxAttempts: 5 });
  await lh.enqueue("freezer", { victim: victim.id }, { priority: 1, maxAttempts: 5 });
  const frozen = await workerProcess(lh.schema, { CONCURRENCY: "1", LEASE_MS: "3000", HEARTBEAT_MS: "1000" });
  t.after(() => frozen.child.kill("SIGKILL"));
  await eventually(async () => frozen.lines().some((l) => l.event === "freezing"), "the freezer stopped its process", 20_000);
  const held = await lh.pool.query("SELECT attempt FROM jobs WHERE id = $1 AND state = 'running'", [victim.id]);
  assert.equal(held.rowCount, 1, "the victim is claimed (buffered) by the frozen worker");
  const frozenAttempt = held.rows[0].attempt as number;

  // The frozen process cannot beat: its leases run out, the watchdog reaps them, and another
  // worker takes the victim while the frozen one still has it in its buffer.
  const watchdog = lh.watchdog({ intervalMs: 200 }).start();
  t.after(() => watchdog.stop());
  let releaseRescuer!: () => void;
  const rescuerDone = new Promise<void>((r) => (releaseRescuer = r));
  const rescuer = lh.worker({
    watchdog: false,
    backoff: NO_BACKOFF,
    handlers: { long: () => rescuerDone, freezer: () => undefined, quick: () => undefined },
  });
  await rescuer.start();
  t.after(async () => {
    releaseRescuer();
    await rescuer.stop(0);
  });
  const [rescued] = await waitForEvent<[{ id: string; attempt: number }]>(rescuer, "job:start", (j: { id: string }) => j.id === victim.id, 20_000);
  assert.ok(rescued.attempt > frozenAttempt);

  // Wake it. Its freezer handler ends at once, before any of its timers (the renewal check
  // included) can run: the next thing it would do is start the buffered victim.
  frozen.child.kill("SIGCONT");
  await eventually(async () => frozen.lines().some((l) => l.event === "woke"), "the frozen worker woke");
  // Let it run a while: its beats learn the leases are gone, its give-back is refused.
  await new Promise((r) => setTimeout(r, 1_500));
  const starts = frozen.lines().filter((l) => l.event === "started" && l.jobId === victim.id);
  assert.deepEqual(starts, [], `the woken worker started attempt ${starts[0]?.attempt} of the victim while attempt ${rescued.attempt} ran elsewhere`);
  const { job } = await lh.getJob(victim.id);
  assert.equal(job.state, "running");
  assert.equal(job.attempt, rescued.attempt, "the rescuer's attempt still holds the job");
});

/** The job's attempts as the audit trail has them, with start and end on the database's clock. */
async function attemptsOf(lh: Awaited<ReturnType<typeof freshLeasehold>>, id: string) {
  return (await lh.getJob(id)).attempts;
}

/**
 * One worker process behind a real proxy, running a long job; a watchdog and a second worker on
 * a direct connection at the default settings beside it (what a deployment runs), and the
 * second worker's starts of that job, with their times.
 */
async function behindProxy(t: TestContext, env: Record<string, string>) {
  const lh = await freshLeasehold(t);
  const { proxy, proxiedUrl } = TcpProxy.forUrl(databaseUrl());
  await proxy.start();
  t.after(() => proxy.stop());
  const worker = await workerProcess(lh.schema, env, proxiedUrl());
  t.after(() => worker.child.kill("SIGKILL"));
  const { id } = await lh.enqueue("long", {}, { maxAttempts: 5 });
  await eventually(async () => worker.lines().some((l) => l.event === "started" && l.jobId === id), "the job started behind the proxy");
  const watchdog = lh.watchdog().start();
  t.after(() => watchdog.stop());
  const secondStarts: { attempt: number; at: number }[] = [];
  const second = lh.worker({ watchdog: false, handlers: { long: () => new Promise((r) => setTimeout(r, 200)) } });
  second.on("job:start", (j: { id: string; attempt: number }) => {
    if (j.id === id) secondStarts.push({ attempt: j.attempt, at: Date.now() });
  });
  await second.start();
  t.after(() => second.stop(0));
  // Past the watchdog's start-up grace: it judges liveness from here on.
  await new Promise((r) => setTimeout(r, 300));
  return { lh, proxy, worker, id, secondStarts };
}

/**
 * One worker process behind a proxy runs an 8-second job; the test cuts every connection of
 * the proxy (refusing new ones) for `cutMs`, with a watchdog and a second worker on a direct
 * connection. Returns the worker process's lines and the times of the cut.
 */
async function blip(t: TestContext, cutMs: number, env: Record<string, string> = {}) {
  const { lh, proxy, worker: cutOff, id, secondStarts } = await behindProxy(t, { LONG_MS: "8000", ...env });
  const cutAt = Date.now();
  proxy.cut();
  await new Promise((r) => setTimeout(r, cutMs));
  proxy.restore();
  const restoredAt = Date.now();
  return { lh, id, cutOff, secondStarts, cutAt, restoredAt };
}

test("a connection blip longer than half the grace: the worker aborts its handler before the watchdog hands the job to another worker", async (t) => {
  const { lh, id, cutOff, secondStarts, cutAt } = await blip(t, 3_000);
  await eventually(async () => secondStarts.length > 0, "the job ran again on the other worker", 20_000);
  const aborted = cutOff.lines().find((l) => l.event === "aborted" && l.jobId === id);
  assert.ok(aborted, "the cut-off worker's handler was aborted");
  assert.equal(aborted.reason, "liveness_lost");
  assert.ok(
    aborted.at < secondStarts[0]!.at,
    `attempt ${secondStarts[0]!.attempt} started ${secondStarts[0]!.at - aborted.at} ms before attempt 1's signal fired`,
  );
  // Well before the grace (1 s) from the cut: the signal fired at half of it.
  assert.ok(aborted.at - cutAt < 1_000, `aborted ${aborted.at - cutAt} ms after the cut`);
  await eventually(async () => (await lh.getJob(id)).job.state === "succeeded", "the job finished", 20_000);
  const attempts = await attemptsOf(lh, id);
  assert.equal(attempts[0]!.outcome, "worker_lost");
  assert.equal(attempts.at(-1)!.outcome, "succeeded");
});

test("a partition while an attempt commits its ctx.transaction: the worker aborts that handler too before the job is handed on", async (t) => {
  const lh = await freshLeasehold(t);
  // The handler's transaction inserts here; the deferred trigger makes its COMMIT wait.
  await lh.pool.query(`CREATE TABLE slow_commit (id int);
    CREATE FUNCTION slow_commit_sleep() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(60); RETURN NULL; END $$;
    CREATE CONSTRAINT TRIGGER slow_commit_sleep AFTER INSERT ON slow_commit DEFERRABLE INITIALLY DEFERRED
      FOR EACH ROW EXECUTE FUNCTION slow_commit_sleep();`);
  const { proxy, proxiedUrl } = TcpProxy.forUrl(databaseUrl());
  await proxy.start();
  t.after(() => proxy.stop());
  const cutOff = await workerProcess(lh.schema, {}, proxiedUrl());
  t.after(() => cutOff.child.kill("SIGKILL"));
  const { id } = await lh.enqueue("committing", {}, { maxAttempts: 5 });
  let committing: number | undefined;
  await eventually(async () => {
    const { rows } = await lh.pool.query<{ pid: number }>("SELECT pid FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND query = 'COMMIT'");
    committing = rows[0]?.pid;
    return committing !== undefined;
  }, "the attempt waits in its COMMIT");
  assert.ok(cutOff.lines().some((l) => l.event === "started" && l.jobId === id));
  // A watchdog and a second worker on a direct connection, as a deployment runs them.
  const watchdog = lh.watchdog().start();
  t.after(() => watchdog.stop());
  const secondStarts: number[] = [];
  const second = lh.worker({ watchdog: false, handlers: { committing: () => undefined } });
  second.on("job:start", (j: { id: string }) => j.id === id && secondStarts.push(Date.now()));
  await second.start();
  t.after(() => second.stop(0));
  // Past the watchdog's start-up grace: it judges liveness from here on.
  await new Promise((r) => setTimeout(r, 300));
  const liveness = (
    await lh.pool.query<{ pid: number }>(
      `SELECT l.pid FROM pg_locks AS l JOIN workers AS w ON w.liveness_key = ((l.classid::bigint << 32) | l.objid::bigint)
        WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND w.pid = $1`,
      [cutOff.child.pid],
    )
  ).rows[0]?.pid;
  assert.ok(liveness, "the worker holds its liveness lock");
  // A partition: the worker hears nothing more, its COMMIT waits for an answer that never comes.
  // The server ends both sessions (a TCP timeout): the transaction rolls back, the liveness
  // lock is free, and the job is the watchdog's to recover after the worker's grace.
  proxy.isolate();
  await lh.pool.query("SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS p(pid)", [[committing, liveness]]);
  await eventually(async () => secondStarts.length > 0, "the job ran again on the other worker", 20_000);
  proxy.restore();
  const aborted = cutOff.lines().find((l) => l.event === "aborted" && l.jobId === id);
  assert.ok(aborted, "the cut-off worker's committing handler was aborted");
  assert.equal(aborted.reason, "liveness_lost");
  assert.ok(aborted.at < secondStarts[0]!, `attempt 2 started ${secondStarts[0]! - aborted.at} ms before attempt 1's signal fired`);
  await eventually(async () => (await lh.getJob(id)).job.state === "succeeded", "the job finished", 20_000);
});

test("a blip shorter than half the grace changes nothing: no abort, no recovery, the attempt finishes", async (t) => {
  const { lh, id, cutOff, secondStarts } = await blip(t, 150);
  await eventually(async () => (await lh.getJob(id)).job.state === "succeeded", "the job finished", 20_000);
  assert.deepEqual(
    cutOff.lines().filter((l) => l.event === "aborted"),
    [],
  );
  assert.deepEqual(secondStarts, []);
  const attempts = await attemptsOf(lh, id);
  assert.deepEqual(
    attempts.map((a) => a.outcome),
    ["succeeded"],
  );
});

test("the watchdog waits the grace a worker announced, and the worker rides out a blip within half of it", async (t) => {
  // 1.5 s: past the watchdog's own 1 s grace, within half of this worker's 4 s.
  const { lh, id, cutOff, secondStarts } = await blip(t, 1_500, { LIVENESS_GRACE_MS: "4000" });
  await eventually(async () => (await lh.getJob(id)).job.state === "succeeded", "the job finished", 20_000);
  assert.deepEqual(
    cutOff.lines().filter((l) => l.event === "aborted"),
    [],
  );
  assert.deepEqual(secondStarts, []);
  assert.deepEqual(
    (await attemptsOf(lh, id)).map((a) => a.outcome),
    ["succeeded"],
  );
});

test("with liveness recovery off, a blip neither aborts the handler nor lets the watchdog recover the job", async (t) => {
  const { lh, id, cutOff, secondStarts } = await blip(t, 3_000, { LIVENESS_GRACE_MS: "off" });
  await eventually(async () => (await lh.getJob(id)).job.state === "succeeded", "the job finished", 20_000);
  assert.deepEqual(
    cutOff.lines().filter((l) => l.event === "aborted"),
    [],
  );
  assert.deepEqual(secondStarts, []);
  const { rows } = await lh.pool.query("SELECT liveness_key, liveness_grace_ms FROM workers WHERE kind = 'worker' AND pid = $1", [cutOff.child.pid]);
  assert.deepEqual(rows, [{ liveness_key: null, liveness_grace_ms: null }], "a worker without liveness announces no lock");
});

test("bad liveness settings are refused at construction with a clear error", async (t) => {
  const lh = await freshLeasehold(t);
  const handlers = { t: () => undefined };
  assert.throws(() => lh.worker({ handlers, livenessGraceMs: 50 }), {
    name: "ConfigError",
    message: /livenessGraceMs must be an integer from 200 to 30000 \(got 50\)/,
  });
  assert.throws(() => lh.worker({ handlers, leaseMs: 5_000, livenessGraceMs: 6_000 }), /livenessGraceMs must be an integer from 200 to 5000/);
  assert.throws(() => lh.worker({ handlers, livenessGraceMs: "1s" } as never), /livenessGraceMs must be an integer/);
});

test("a liveness session that goes silent while its backend lives on: the worker proves it dead, takes its lock back, and nothing runs twice", async (t) => {
  const { lh, proxy, worker, id, secondStarts } = await behindProxy(t, { LONG_MS: "6000" });
  // The backend that holds the worker's liveness lock now: its session is about to go silent.
  const holder = async () =>
    (
      await lh.pool.query<{ pid: number }>(
        `SELECT l.pid FROM pg_locks AS l JOIN workers AS w ON w.liveness_key = ((l.classid::bigint << 32) | l.objid::bigint)
          WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND w.pid = $1`,
        [worker.child.pid],
      )
    ).rows[0]?.pid;
  const before = await holder();
  assert.ok(before, "the worker holds its liveness lock");
  proxy.silence();
  // Later, the server ends that backend (a terminate, a TCP timeout): its lock goes with it. A
  // worker that still counted on that session would be recovered while its handler runs on.
  await new Promise((r) => setTimeout(r, 1_500));
  await lh.pool.query("SELECT pg_terminate_backend($1)", [before]);
  await eventually(async () => (await lh.getJob(id)).job.state === "succeeded", "the job finished", 20_000);
  const after = await holder();
  assert.ok(after && after !== before, "the worker holds its lock on a new session");
  const aborted = worker.lines().filter((l) => l.event === "aborted" && l.jobId === id);
  for (const s of secondStarts) {
    assert.ok(
      aborted.some((a) => a.at < s.at),
      `attempt ${s.attempt} started while attempt 1 ran with its signal not fired`,
    );
  }
});

test("a named worker whose session goes silent while its backend lives on takes its name back with its liveness lock, and keeps running under it", async (t) => {
  const { lh, proxy, worker, id } = await behindProxy(t, { LONG_MS: "4000", WORKER_NAME: "steady" });
  // The backend holding the name's lock: the silent session's, alive until someone ends it.
  const nameHolder = async () =>
    (
      await lh.pool.query<{ pid: number }>(
        `SELECT l.pid FROM pg_locks AS l
          WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
            AND ((l.classid::bigint << 32) | l.objid::bigint) = hashtextextended('leasehold:' || $1 || ':name:' || $2, 0)`,
        [lh.schema, "steady"],
      )
    ).rows[0]?.pid;
  const before = await nameHolder();
  assert.ok(before, "the worker holds its name's lock");
  proxy.silence();
  // Nobody else ends the old backend: the worker's new session must, or it finds its own name taken.
  await eventually(
    async () => {
      const now = await nameHolder();
      return now !== undefined && now !== before;
    },
    "the worker holds its name on a new session",
    15_000,
  );
  await eventually(async () => (await lh.getJob(id)).job.state === "succeeded", "the job finished", 20_000);
  assert.deepEqual(
    worker.lines().filter((l) => l.event === "identity-lost"),
    [],
    `the worker stopped, its name taken by its own earlier session: ${worker.stderr()}`,
  );
  const { rows } = await lh.pool.query("SELECT count(*)::int AS n FROM workers WHERE name = 'steady' AND stopped_at IS NULL", []);
  assert.equal(rows[0].n, 1, "the named worker is still announced as running");
  assert.equal(worker.child.exitCode, null);
});

test("a worker frozen while its liveness session is ended wakes to abort its handler at once: the watchdog may already have handed the job on", async (t) => {
  const lh = await freshLeasehold(t);
  const frozen = await workerProcess(lh.schema, { LONG_MS: "20000" });
  t.after(() => frozen.child.kill("SIGKILL"));
  const { id } = await lh.enqueue("long", {}, { maxAttempts: 5 });
  await eventually(async () => frozen.lines().some((l) => l.event === "started" && l.jobId === id), "the job started");
  frozen.child.kill("SIGSTOP");
  // While it is stopped, its liveness session ends (a restart of a pooler, a terminate storm):
  // its lease (30 s) still holds, but the watchdog recovers its job after the grace.
  // Only this test's worker: another test file running beside this one has LISTEN sessions too.
  const { rows } = await lh.pool.query<{ n: number }>(
    `SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity
      WHERE application_name = 'leasehold-worker' AND starts_with(query, 'LISTEN "leasehold:' || $1 || '"')`,
    [lh.schema],
  );
  assert.equal(rows[0]!.n, 1, "ended the stopped worker's liveness session");
  const watchdog = lh.watchdog({ livenessIntervalMs: 100 }).start();
  t.after(() => watchdog.stop());
  const rescuer = lh.worker({ watchdog: false, handlers: { long: () => new Promise((r) => setTimeout(r, 200)) } });
  const starts = recordEvents<[{ id: string; attempt: number }]>(rescuer, "job:start");
  await rescuer.start();
  t.after(() => rescuer.stop(0));
  await starts.waitFor((j) => j.id === id, 20_000);

  const wokeAt = Date.now();
  frozen.child.kill("SIGCONT");
  await eventually(async () => frozen.lines().some((l) => l.event === "aborted" && l.jobId === id), "the woken worker aborted its handler");
  const aborted = frozen.lines().find((l) => l.event === "aborted" && l.jobId === id)!;
  assert.equal(aborted.reason, "liveness_lost");
  // At once on waking, not half a grace (500 ms) later: its session may have ended long before.
  assert.ok(aborted.at - wokeAt < 250, `aborted ${aborted.at - wokeAt} ms after waking`);
});
