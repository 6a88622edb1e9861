/**
 * Workloads 6 and 7: a long run through the queue (throughput at the end against the start,
 * table size bounded by retention), and a steady load while another session pins an old
 * snapshot (throughput, enqueue-to-start p99 and dead tuples before, during and after).
 */
import pg from "pg";
import { readTables } from "../lib/server.js";
import { percentile, sleep, waitUntil } from "../lib/stats.js";
import { WorkerGroup } from "../lib/workers.js";
import type { BenchSystem } from "../systems/types.js";
import { produceAtRate } from "./liveness.js";
import { payloads, urlOf, withClient, type BenchContext, type Metrics } from "./context.js";

const STEADY_BATCH = 2_000;
/** The producer keeps about this many jobs waiting, so workers never starve nor the queue balloon. */
const STEADY_BACKLOG = 20_000;
const SAMPLE_MS = 200;

/**
 * `steadyJobs` jobs through one worker process while a producer keeps a backlog. Throughput
 * over a tenth of the run near its start (2-12%, after warm-up) and near its end (78-88%,
 * while the producer still runs), and the size of the system's tables along the way.
 */
export async function steadyWorkload(ctx: BenchContext, system: BenchSystem): Promise<Metrics> {
  const url = urlOf(ctx, system);
  const total = ctx.options.steadyJobs;
  await system.reset(url, "steady");
  const producer = await system.producer(url, "steady");
  const group = await WorkerGroup.start(system.name, url, { profile: "steady" }, 1);
  const samples: { t: number; ended: number; bytes: number; dead: number }[] = [];
  let enqueued = 0;
  try {
    await withClient(url, async (db) => {
      let sampling = true;
      const sampler = (async () => {
        while (sampling) {
          const tables = await readTables(db, system.schema);
          samples.push({ t: performance.now(), ended: group.ended, bytes: tables.bytes, dead: tables.deadTuples });
          await sleep(SAMPLE_MS);
        }
      })();
      while (enqueued < total) {
        if (enqueued - group.ended > STEADY_BACKLOG) {
          await sleep(10);
          continue;
        }
        const n = Math.min(STEADY_BATCH, total - enqueued);
        await producer.enqueue(payloads(n, () => ({})));
        enqueued += n;
      }
      await waitUntil(() => group.ended >= total, 15 * 60_000, 50);
      sampling = false;
      await sampler;
      const last = await readTables(db, system.schema);
      samples.push({ t: performance.now(), ended: group.ended, bytes: last.bytes, dead: last.deadTuples });
    });
    const rateBetween = (from: number, to: number) => {
      const a = samples.find((s) => s.ended >= from * total);
      const b = samples.find((s) => s.ended >= to * total);
      return a && b && b.t > a.t ? ((b.ended - a.ended) / (b.t - a.t)) * 1000 : NaN;
    };
    const at = (fraction: number) => samples.find((s) => s.ended >= fraction * total) ?? samples[samples.length - 1]!;
    const startRate = rateBetween(0.02, 0.12);
    // The producer stops once everything is enqueued (~20,000 before the end), so the end
    // window closes before that: both windows measure enqueue and drain together.
    const endRate = rateBetween(0.78, 0.88);
    return {
      jobs: total,
      startJobsPerSecond: startRate,
      endJobsPerSecond: endRate,
      endToStart: endRate / startRate,
      // A dip in the middle (a vacuum, a retention run) that the two windows would miss.
      slowestTenthJobsPerSecond: Math.min(...[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7].map((f) => rateBetween(f, f + 0.1))),
      tableMBAt10pct: at(0.1).bytes / 2 ** 20,
      tableMBAtHalf: at(0.5).bytes / 2 ** 20,
      tableMBAtEnd: at(1).bytes / 2 ** 20,
      tableMBMax: Math.max(...samples.map((s) => s.bytes)) / 2 ** 20,
      deadTuplesMax: Math.max(...samples.map((s) => s.dead)),
    };
  } finally {
    await group.stop();
    await producer.close();
  }
}

/**
 * A steady `pressureRate` jobs/s with one worker process; after `pressureSeconds`, another
 * session opens a REPEATABLE READ transaction (with an xid) and sits idle in it for
 * `pinSeconds`, pinning the xmin horizon so vacuum can remove nothing newer; then it ends
 * and the load goes on for `pressureSeconds`.
 */
export async function pressureWorkload(ctx: BenchContext, system: BenchSystem): Promise<Metrics> {
  const url = urlOf(ctx, system);
  const { pressureRate, pressureSeconds, pinSeconds } = ctx.options;
  await system.reset(url, "throughput");
  const producer = await system.producer(url, "throughput");
  const group = await WorkerGroup.start(system.name, url, { profile: "throughput" }, 1);
  const pin = new pg.Client({ connectionString: url });
  await pin.connect();
  const out: Metrics = {};
  try {
    await withClient(url, async (db) => {
      const phase = async (name: string, seconds: number) => {
        const endedBefore = group.ended;
        group.takeLatencies();
        const t0 = performance.now();
        let maxDead = 0;
        let sampling = true;
        const sampler = (async () => {
          while (sampling) {
            maxDead = Math.max(maxDead, (await readTables(db, system.schema)).deadTuples);
            await sleep(1_000);
          }
        })();
        // 10 jobs per call: a steady stream that any of the systems can keep up with.
        await produceAtRate(producer, pressureRate, seconds, 10);
        sampling = false;
        await sampler;
        const elapsed = (performance.now() - t0) / 1000;
        const latencies = group.takeLatencies();
        const tables = await readTables(db, system.schema);
        out[`${name}JobsPerSecond`] = (group.ended - endedBefore) / elapsed;
        out[`${name}P99Ms`] = percentile(latencies, 99);
        out[`${name}DeadTuplesMax`] = Math.max(maxDead, tables.deadTuples);
        out[`${name}TableMB`] = tables.bytes / 2 ** 20;
      };
      await produceAtRate(producer, pressureRate, 2, 10); // warm-up
      await phase("before", pressureSeconds);
      await pin.query("BEGIN ISOLATION LEVEL REPEATABLE READ");
      await pin.query("SELECT pg_current_xact_id(), count(*) FROM pg_class");
      await phase("pinned", pinSeconds);
      await pin.query("COMMIT");
      await phase("after", pressureSeconds);
    });
    return out;
  } finally {
    await pin.end().catch(() => {});
    await group.stop();
    await producer.close();
  }
}
