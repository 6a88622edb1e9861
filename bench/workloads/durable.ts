/**
 * Durable steps beside DBOS Transact (issue 27): the same workflows through Leasehold's
 * `ctx.step` / `ctx.waitForEvent` / `ctx.sleep` and DBOS's `DBOS.runStep` / `DBOS.recv` /
 * `DBOS.sleep`, on the same server, each system in its own database.
 *
 * - "steps": `--durable-workflows` workflows of five no-op steps, started before the workers
 *   go, drained by 1 and by `--processes` worker processes of concurrency 50. Workflows per
 *   second from the first step to the database holding no unfinished workflow; server CPU,
 *   worker CPU, statements (counted in the worker processes' `pg` clients), transactions
 *   (pg_stat_database) and WAL, all per step.
 * - "event": `--durable-waiters` workflows wait for an event each (one worker process); one
 *   event is sent at a time, and the latency runs from the send call's start to the step
 *   after the wait running (both on the nowMs clock).
 * - "sleep": `--durable-sleepers` workflows sleep a week, with `--processes` worker processes
 *   running: the time from the first start call to the last sleep recorded, then server CPU,
 *   worker statements and transactions per second over `--durable-idle-seconds` of sleep,
 *   and the bytes the system's tables hold per sleeping workflow.
 */
import { readDb, readTables } from "../lib/server.js";
import { nowMs, percentile, sleep, waitUntil } from "../lib/stats.js";
import { WorkerGroup } from "../lib/workers.js";
import { dbosDriver, DBOS_POLLING_MS } from "../systems/dbos.js";
import { STEPS_PER_WORKFLOW, type DurableArgs, type DurableDriver } from "../systems/durable.js";
import { leaseholdDurableDriver } from "../systems/leasehold-durable.js";
import type { BenchSystem, DurableShape, WorkerSpec } from "../systems/types.js";
import { urlOf, withClient, type BenchContext, type Metrics } from "./context.js";

/** Handler concurrency per worker process: the fleet rows' (bench/run.ts), what users pick. */
export const DURABLE_CONCURRENCY = 50;
const STALL_MS = 60_000;
const TIMEOUT_MS = 20 * 60_000;
/** Longer than a run: nobody wakes during the idle window. */
const SLEEP_MS = 7 * 24 * 3_600_000;
const SLEEPERS_POLL_MS = 250;
/** pg_stat_database is flushed by each backend at most once a second. */
const STATS_FLUSH_MS = 1_500;

const DRIVERS: Record<string, DurableDriver> = { leasehold: leaseholdDurableDriver, dbos: dbosDriver };

export const DURABLE_WORKLOAD_IDS = ["durable-steps", "durable-event", "durable-sleep"];

function driverOf(system: BenchSystem): DurableDriver {
  const d = DRIVERS[system.name];
  if (!d) throw new Error(`${system.name} has no durable workflows`);
  return d;
}

/**
 * The worker spec of a shape. DBOS's waiting and sleeping workflows keep running in their
 * process and hold a slot each, so its "event" and "sleep" queues have no limit (every waiter
 * must run to wait); Leasehold's end their attempt, and run at the fleet concurrency.
 */
function specOf(system: BenchSystem, shape: DurableShape): WorkerSpec {
  const unlimited = system.name === "dbos" && shape !== "steps";
  return { profile: "throughput", durable: shape, ...(unlimited ? {} : { concurrency: DURABLE_CONCURRENCY }) };
}

export function durableSettings(system: BenchSystem, shape: DurableShape, processes: number): string {
  const procs = `${processes} worker process${processes === 1 ? "" : "es"}`;
  if (system.name === "dbos") {
    const queue =
      shape === "steps"
        ? `WorkflowQueue workerConcurrency ${DURABLE_CONCURRENCY}, minPollingIntervalMs ${DBOS_POLLING_MS}`
        : "WorkflowQueue without a concurrency limit (a waiter holds its slot), polled at its default (1 s)";
    const calls = shape === "steps" ? "DBOS.runStep x5" : shape === "event" ? "DBOS.runStep, DBOS.recv (LISTEN/NOTIFY), DBOS.runStep" : "DBOS.sleep";
    return `${procs}; ${queue}; DBOSClient.enqueue${shape === "event" ? " and DBOSClient.send" : ""}; ${calls}`;
  }
  const calls = shape === "steps" ? "ctx.step x5" : shape === "event" ? "ctx.step, ctx.waitForEvent, ctx.step" : "ctx.sleep";
  return `${procs} of concurrency ${DURABLE_CONCURRENCY}, otherwise the worker's defaults; lh.enqueueMany${shape === "event" ? " and lh.sendEvent" : ""}; ${calls}`;
}

const idsOf = (n: number, make: (id: string) => DurableArgs = (id) => ({ id })) => Array.from({ length: n }, (_, i) => make(`wf-${i}`));

/**
 * Waits until `done()`, checked every `everyMs`; fails when `progress()` stalls for a minute or
 * the run takes 20.
 */
async function waitFor(what: string, done: () => Promise<boolean> | boolean, progress: () => Promise<number> | number, everyMs = 10): Promise<void> {
  let last = { value: -1, at: Date.now() };
  const deadline = Date.now() + TIMEOUT_MS;
  for (;;) {
    if (await done()) return;
    const value = await progress();
    if (value !== last.value) last = { value, at: Date.now() };
    if (Date.now() - last.at > STALL_MS || Date.now() > deadline) throw new Error(`${what}: stuck at ${value}`);
    await sleep(everyMs);
  }
}

/** Five-step workflows drained by `processes` worker processes. */
export async function durableStepsWorkload(ctx: BenchContext, system: BenchSystem, processes: number): Promise<Metrics> {
  const driver = driverOf(system);
  const url = urlOf(ctx, system);
  const n = ctx.options.durableWorkflows;
  const steps = n * STEPS_PER_WORKFLOW;
  await driver.reset(url);
  const starter = await driver.open(url, "steps");
  const group = await WorkerGroup.start(driver.workerSystem, url, specOf(system, "steps"), processes, false);
  try {
    await starter.start(idsOf(n));
    await withClient(url, (db) => db.query("VACUUM ANALYZE"));
    await sleep(500);
    return await withClient(url, async (db) => {
      const clientBefore = await group.stats();
      const dbBefore = await readDb(db, ctx.server.pid);
      await group.go();
      await waitFor(
        `${system.name}: workflows started`,
        () => group.ended >= n,
        () => group.ended,
      );
      await waitFor(
        `${system.name}: workflows unfinished`,
        async () => (await starter.unfinished()) === 0,
        () => starter.unfinished(),
      );
      const doneAt = nowMs();
      const cpuAfter = await readDb(db, ctx.server.pid);
      const clientAfter = await group.stats();
      await sleep(STATS_FLUSH_MS);
      const xactsAfter = (await readDb(db, ctx.server.pid)).xacts;
      if (group.errors.length) ctx.log(`  ${system.name} worker errors: ${group.errors.slice(0, 3).join(" | ")}`);
      const seconds = (doneAt - group.firstStartAt!) / 1000;
      return {
        workflowsPerSecond: n / seconds,
        serverCpuMsPerKStep: ((cpuAfter.cpuMs - dbBefore.cpuMs) / steps) * 1000,
        workerCpuMsPerKStep: ((clientAfter.cpuMs - clientBefore.cpuMs) / steps) * 1000,
        statementsPerStep: (clientAfter.statements - clientBefore.statements) / steps,
        xactsPerStep: (xactsAfter - dbBefore.xacts) / steps,
        walBytesPerStep: Number(cpuAfter.walBytes - dbBefore.walBytes) / steps,
      };
    });
  } finally {
    await group.stop();
    await starter.close();
  }
}

/** Waiting workflows resumed one at a time: send-to-resume latency. */
export async function durableEventWorkload(ctx: BenchContext, system: BenchSystem): Promise<Metrics> {
  const driver = driverOf(system);
  const url = urlOf(ctx, system);
  const m = ctx.options.durableWaiters;
  await driver.reset(url);
  const starter = await driver.open(url, "event");
  const group = await WorkerGroup.start(driver.workerSystem, url, specOf(system, "event"), 1, true);
  try {
    const workflows = idsOf(m);
    await starter.start(workflows);
    // Each reports "ready" in a step just before its wait: give the last ones time to wait.
    await waitFor(
      `${system.name}: waiters ready`,
      () => group.ended >= m,
      () => group.ended,
    );
    await sleep(1_000);
    group.takeLatencies();
    let missed = 0;
    for (const [i, w] of workflows.entries()) {
      await starter.sendEvent({ id: w.id, t: nowMs() });
      if (!(await waitUntil(() => group.ended >= m + i + 1, 10_000, 1))) {
        missed++;
        break; // the rest would be counted against this one's resume
      }
    }
    await waitUntil(async () => (await starter.unfinished()) === 0, 10_000, 10);
    const latencies = group.takeLatencies();
    if (group.errors.length) ctx.log(`  ${system.name} worker errors: ${group.errors.slice(0, 3).join(" | ")}`);
    if (missed) throw new Error(`${system.name}: an event resumed nothing within 10 s (${latencies.length} of ${m} resumed)`);
    return {
      resumed: latencies.length,
      p50Ms: percentile(latencies, 50),
      p95Ms: percentile(latencies, 95),
      p99Ms: percentile(latencies, 99),
      maxMs: percentile(latencies, 100),
    };
  } finally {
    await group.stop();
    await starter.close();
  }
}

/** Many workflows asleep: the time to put them to sleep, then what they cost while they sleep. */
export async function durableSleepWorkload(ctx: BenchContext, system: BenchSystem): Promise<Metrics> {
  const driver = driverOf(system);
  const url = urlOf(ctx, system);
  const n = ctx.options.durableSleepers;
  const idleSeconds = ctx.options.durableIdleSeconds;
  await driver.reset(url);
  const starter = await driver.open(url, "sleep");
  const group = await WorkerGroup.start(driver.workerSystem, url, specOf(system, "sleep"), ctx.options.processes, true);
  try {
    const wakeAt = Date.now() + SLEEP_MS;
    const t0 = nowMs();
    await starter.start(idsOf(n, (id) => ({ id, wakeAt })));
    const startSeconds = (nowMs() - t0) / 1000;
    // Counting 100,000 rows takes the server a while: not so often that it slows the sleepers.
    await waitFor(
      `${system.name}: workflows asleep`,
      async () => (await starter.sleeping()) >= n,
      () => starter.sleeping(),
      SLEEPERS_POLL_MS,
    );
    const createSeconds = (nowMs() - t0) / 1000;
    await sleep(STATS_FLUSH_MS);
    return await withClient(url, async (db) => {
      await db.query("VACUUM ANALYZE"); // the tables as autovacuum would leave them, for their size
      await sleep(STATS_FLUSH_MS);
      const dbBefore = await readDb(db, ctx.server.pid);
      const clientBefore = await group.stats();
      await sleep(idleSeconds * 1_000);
      const dbAfter = await readDb(db, ctx.server.pid);
      const clientAfter = await group.stats();
      const tables = await readTables(db, system.schema);
      if (group.errors.length) ctx.log(`  ${system.name} worker errors: ${group.errors.slice(0, 3).join(" | ")}`);
      const window = (dbAfter.at - dbBefore.at) / 1000;
      return {
        sleepers: n,
        startCallsSeconds: startSeconds,
        createSeconds,
        idleServerCpuPct: ((dbAfter.cpuMs - dbBefore.cpuMs) / (window * 1000)) * 100,
        idleWorkerCpuPct: ((clientAfter.cpuMs - clientBefore.cpuMs) / (window * 1000)) * 100,
        idleStatementsPerSecond: (clientAfter.statements - clientBefore.statements) / window,
        idleXactsPerSecond: (dbAfter.xacts - dbBefore.xacts) / window,
        bytesPerSleeper: tables.bytes / n,
      };
    });
  } finally {
    await group.stop();
    await starter.close();
  }
}
