/**
 * Workloads 3-5: enqueue-to-start latency at a steady low rate, recovery after kill -9 of a
 * worker mid-job, and the cost of keeping 1,000 long jobs alive (statements/s and server CPU).
 */
import { readDb } from "../lib/server.js";
import { nowMs, percentile, sleep, waitUntil } from "../lib/stats.js";
import { WorkerGroup } from "../lib/workers.js";
import type { BenchSystem, Producer, WorkerSpec } from "../systems/types.js";
import { payloads, urlOf, withClient, type BenchContext, type Metrics } from "./context.js";

/** Latencies of the first second are dropped: connections and caches warm up. */
const WARMUP_MS = 1_000;
const LONG_JOB_MS = 30 * 60_000;

/** Enqueues one job at a time at `rate` jobs/s for `seconds`, each stamped with its enqueue time. */
export async function produceAtRate(
  producer: Producer,
  rate: number,
  seconds: number,
  perCall = 1,
  onError: (err: unknown) => void = () => {},
): Promise<number> {
  const intervalMs = (1000 * perCall) / rate;
  const start = performance.now();
  const inFlight = new Set<Promise<void>>();
  let sent = 0;
  for (let i = 0; ; i++) {
    const due = start + i * intervalMs;
    if (due - start >= seconds * 1000) break;
    const wait = due - performance.now();
    if (wait > 0) await sleep(wait);
    const p = producer.enqueue(payloads(perCall, () => ({ t: nowMs() }))).catch(onError);
    inFlight.add(p);
    void p.finally(() => inFlight.delete(p));
    sent += perCall;
  }
  await Promise.all(inFlight);
  return sent;
}

export async function latencyWorkload(ctx: BenchContext, system: BenchSystem): Promise<Metrics> {
  const url = urlOf(ctx, system);
  const { latencyRate, latencySeconds } = ctx.options;
  await system.reset(url, "throughput");
  const producer = await system.producer(url, "throughput");
  const group = await WorkerGroup.start(system.name, url, { profile: "throughput" }, 1);
  try {
    const warm = await produceAtRate(producer, latencyRate, WARMUP_MS / 1000);
    await waitUntil(() => group.ended >= group.started && group.started > 0, 5_000);
    await sleep(200);
    group.takeLatencies();
    const sent = await produceAtRate(producer, latencyRate, latencySeconds);
    const target = warm + sent;
    await waitUntil(() => group.started >= target, 30_000);
    await sleep(100);
    const l = group.takeLatencies();
    return { p50Ms: percentile(l, 50), p99Ms: percentile(l, 99), maxMs: Math.max(...l), samples: l.length };
  } finally {
    await group.stop();
    await producer.close();
  }
}

/**
 * Two worker processes at the system's shortest lease or lock setting; one job that would
 * run for half an hour; kill -9 the process running it ~1 s into the job; measure until a
 * handler for that job starts in the other process.
 */
export async function recoveryWorkload(
  ctx: BenchContext,
  system: BenchSystem,
  atDefaults = false,
  timeoutSeconds = ctx.options.recoveryTimeoutSeconds,
): Promise<Metrics> {
  const url = urlOf(ctx, system);
  await system.reset(url, "recovery");
  const producer = await system.producer(url, "recovery");
  const group = await WorkerGroup.start(system.name, url, { profile: "recovery", defaults: atDefaults }, 2);
  try {
    const starts: { pid: number; at: number }[] = [];
    group.on("tracked", (m: { pid: number; at: number }) => starts.push(m));
    await producer.enqueue([{ sleepMs: LONG_JOB_MS, track: "victim" }]);
    if (!(await waitUntil(() => starts.length > 0, 30_000))) throw new Error(`${system.name}: the job never started`);
    await sleep(1_000);
    const victim = starts[0]!.pid;
    const killedAt = nowMs();
    group.kill9(victim);
    const timeoutMs = timeoutSeconds * 1000;
    const recovered = await waitUntil(() => starts.some((s) => s.pid !== victim), timeoutMs, 10);
    const again = starts.find((s) => s.pid !== victim);
    return { recoverySeconds: recovered && again ? (again.at - killedAt) / 1000 : NaN, timeoutSeconds };
  } finally {
    group.killAll();
    await producer.close();
  }
}

/**
 * `heartbeatJobs` long jobs in flight across 4 worker processes; over a window of
 * `heartbeatSeconds`: statements/s sent by the workers, the server's transactions/s, its
 * CPU (% of one core) and WAL/s. What staying alive costs while nothing finishes.
 */
export async function heartbeatWorkload(ctx: BenchContext, system: BenchSystem, leaseMs?: number): Promise<Metrics> {
  const url = urlOf(ctx, system);
  const { heartbeatJobs, heartbeatSeconds } = ctx.options;
  const processes = 4;
  await system.reset(url, "heartbeat");
  const producer = await system.producer(url, "heartbeat");
  const spec: WorkerSpec = { profile: "heartbeat", concurrency: Math.ceil(heartbeatJobs / processes), leaseMs };
  const group = await WorkerGroup.start(system.name, url, spec, processes);
  try {
    await producer.enqueue(payloads(heartbeatJobs, () => ({ sleepMs: LONG_JOB_MS })));
    if (!(await waitUntil(() => group.started >= heartbeatJobs, 60_000))) {
      throw new Error(`${system.name}: only ${group.started} of ${heartbeatJobs} long jobs started`);
    }
    await sleep(2_000);
    return await withClient(url, async (db) => {
      const c0 = await group.stats();
      const d0 = await readDb(db, ctx.server.pid);
      await sleep(heartbeatSeconds * 1000);
      const c1 = await group.stats();
      const d1 = await readDb(db, ctx.server.pid);
      const s = (d1.at - d0.at) / 1000;
      return {
        statementsPerSecond: (c1.statements - c0.statements) / s,
        serverXactsPerSecond: (d1.xacts - d0.xacts) / s,
        serverCpuPct: ((d1.cpuMs - d0.cpuMs) / (s * 1000)) * 100,
        clientCpuPct: ((c1.cpuMs - c0.cpuMs) / (s * 1000)) * 100,
        walBytesPerSecond: Number(d1.walBytes - d0.walBytes) / s,
        jobsInFlight: group.started - group.ended,
      };
    });
  } finally {
    group.killAll();
    await producer.close();
  }
}
