/**
 * Workloads 1 and 2: bulk enqueue through each system's batch API, and draining a full
 * queue of no-op jobs with one or several worker processes. Each drain also records where
 * the time goes: server CPU, client CPU, statements and WAL per job.
 */
import { readDb } from "../lib/server.js";
import { nowMs, sleep, waitUntil } from "../lib/stats.js";
import { WorkerGroup } from "../lib/workers.js";
import type { BenchSystem, WorkerSpec } from "../systems/types.js";
import { payloads, urlOf, withClient, type BenchContext, type Metrics } from "./context.js";

/** Jobs per enqueue call when filling a queue for a drain (not measured). */
const FILL_BATCH = 5_000;
const DRAIN_TIMEOUT_MS = 15 * 60_000;
const DRAIN_STALL_MS = 60_000;
/** The handler concurrency per process of the fleet rows (drain-multi): what users pick, not the tuned 1,000. */
export const MULTI_CONCURRENCY = 50;

export async function enqueueWorkload(ctx: BenchContext, system: BenchSystem): Promise<Metrics> {
  const url = urlOf(ctx, system);
  const { jobs, batch } = ctx.options;
  await system.reset(url, "throughput");
  const producer = await system.producer(url, "throughput");
  try {
    return await withClient(url, async (db) => {
      const before = await readDb(db, ctx.server.pid);
      const cpuBefore = process.cpuUsage();
      const started = performance.now();
      for (let i = 0; i < jobs; i += batch) {
        await producer.enqueue(payloads(Math.min(batch, jobs - i), () => ({})));
      }
      const seconds = (performance.now() - started) / 1000;
      const cpu = process.cpuUsage(cpuBefore);
      const after = await readDb(db, ctx.server.pid);
      return {
        jobsPerSecond: jobs / seconds,
        // The producer runs in this process: validation, serialisation, the driver.
        clientCpuPct: ((cpu.user + cpu.system) / 1000 / (seconds * 1000)) * 100,
        walBytesPerJob: Number(after.walBytes - before.walBytes) / jobs,
        serverCpuPct: ((after.cpuMs - before.cpuMs) / (seconds * 1000)) * 100,
      };
    });
  } finally {
    await producer.close();
  }
}

/** Fills the queue; with `keys`, job i carries key `k<i mod keys>` (keys interleaved, as tenants' jobs arrive). */
export async function fillQueue(ctx: BenchContext, system: BenchSystem, jobs: number, keys?: number): Promise<void> {
  const producer = await system.producer(urlOf(ctx, system), "throughput");
  try {
    for (let i = 0; i < jobs; i += FILL_BATCH) {
      const n = Math.min(FILL_BATCH, jobs - i);
      await producer.enqueue(
        payloads(n, () => ({})),
        keys ? Array.from({ length: n }, (_, j) => `k${(i + j) % keys}`) : undefined,
      );
    }
  } finally {
    await producer.close();
  }
}

/** What a drain starts from, beyond the default (the `--jobs` keyless jobs in a fresh schema). */
export interface DrainSetup {
  /** Jobs to fill and drain; default `--jobs`. */
  jobs?: number;
  /** Spread the jobs over this many keys (interleaved). */
  keys?: number;
  /** Runs after the reset, before the fill: queue settings, an index dropped. */
  prepare?(url: string): Promise<void>;
  /** Runs after the fill: throws if the setup is not what the row says it measures. */
  verify?(url: string): Promise<void>;
}

/**
 * Drains `jobs` queued no-op jobs with `processes` worker processes. The clock runs from the
 * first handler start to the moment the database holds no unfinished job, so process
 * start-up is not counted.
 */
export async function drainWorkload(
  ctx: BenchContext,
  system: BenchSystem,
  processes: number,
  spec: Partial<WorkerSpec> = {},
  setup: DrainSetup = {},
): Promise<Metrics> {
  const url = urlOf(ctx, system);
  const jobs = Math.min(setup.jobs ?? ctx.options.jobs, system.maxDrainJobs ?? Infinity);
  await system.reset(url, "throughput");
  await setup.prepare?.(url);
  await fillQueue(ctx, system, jobs, setup.keys);
  await setup.verify?.(url);
  await withClient(url, (db) => db.query("VACUUM ANALYZE"));
  await sleep(500);
  const producer = await system.producer(url, "throughput");
  const group = await WorkerGroup.start(system.name, url, { profile: "throughput", ...spec }, processes, false);
  try {
    return await withClient(url, async (db) => {
      const clientBefore = await group.stats();
      const dbBefore = await readDb(db, ctx.server.pid);
      await group.go();
      const waits = sampleWaits(url);
      // A system that stops making progress fails its run instead of holding the benchmark.
      let last = { ended: -1, at: Date.now() };
      const handled = await waitUntil(
        () => {
          if (group.ended !== last.ended) last = { ended: group.ended, at: Date.now() };
          return group.ended >= jobs || Date.now() - last.at > DRAIN_STALL_MS;
        },
        DRAIN_TIMEOUT_MS,
        10,
      );
      if (!handled || group.ended < jobs) {
        throw new Error(
          `${system.name}: only ${group.ended} of ${jobs} jobs handled (${handled ? `none in the last ${DRAIN_STALL_MS / 1000} s` : "out of time"})`,
        );
      }
      await waitUntil(async () => (await producer.pending()) === 0, 60_000, 10);
      const doneAt = nowMs();
      const dbAfter = await readDb(db, ctx.server.pid);
      const clientAfter = await group.stats();
      const w = await waits.stop();
      ctx.checkCores?.(group.pids);
      const seconds = (doneAt - group.firstStartAt!) / 1000;
      if (group.errors.length) ctx.log(`  ${system.name} worker errors: ${group.errors.slice(0, 3).join(" | ")}`);
      return {
        jobsPerSecond: jobs / seconds,
        serverCpuMsPerKJob: ((dbAfter.cpuMs - dbBefore.cpuMs) / jobs) * 1000,
        clientCpuMsPerKJob: ((clientAfter.cpuMs - clientBefore.cpuMs) / jobs) * 1000,
        statementsPerKJob: ((clientAfter.statements - clientBefore.statements) / jobs) * 1000,
        walBytesPerJob: Number(dbAfter.walBytes - dbBefore.walBytes) / jobs,
        activeBackends: w.activeAvg,
        lockWaitPct: w.lockPct,
        lwlockWaitPct: w.lwlockPct,
        ioWaitPct: w.ioPct,
      };
    });
  } finally {
    await group.stop();
    await producer.close();
  }
}

/**
 * Samples the system's backends every 50 ms while a drain runs: how many are active, and
 * which share of those samples waits on a heavyweight lock (row locks), an LWLock (buffer
 * and WAL internals) or IO (WAL flush, data files).
 */
function sampleWaits(url: string): { stop(): Promise<{ activeAvg: number; lockPct: number; lwlockPct: number; ioPct: number }> } {
  let running = true;
  const totals = { samples: 0, active: 0, Lock: 0, LWLock: 0, IO: 0 };
  const done = withClient(url, async (db) => {
    while (running) {
      const { rows } = await db.query<{ wait: string | null }>(
        `SELECT wait_event_type AS wait FROM pg_stat_activity
          WHERE datname = current_database() AND pid <> pg_backend_pid() AND state = 'active'`,
      );
      totals.samples++;
      totals.active += rows.length;
      for (const r of rows) if (r.wait === "Lock" || r.wait === "LWLock" || r.wait === "IO") totals[r.wait]++;
      await sleep(50);
    }
  });
  return {
    async stop() {
      running = false;
      await done;
      const pct = (n: number) => (totals.active ? (n / totals.active) * 100 : 0);
      return {
        activeAvg: totals.samples ? totals.active / totals.samples : 0,
        lockPct: pct(totals.Lock),
        lwlockPct: pct(totals.LWLock),
        ioPct: pct(totals.IO),
      };
    },
  };
}
