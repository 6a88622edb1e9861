/**
 * Leasehold through its public API (Leasehold.connect, enqueueMany, worker), with
 * heartbeats, fencing and the audit trail on, as in production.
 */
import pino from "pino";
import { Registry } from "prom-client";
import { Leasehold } from "../../packages/leasehold/src/client.js";
import { packageVersion } from "../lib/versions.js";
import { withClient } from "../workloads/context.js";
import { QUEUE, type BenchSystem, type Payload, type Producer, type Profile } from "./types.js";

const silent = pino({ level: "silent" });
const SCHEMA = "leasehold";

/**
 * Jobs in flight per worker process when draining. Twice the claim batch (500) lets the
 * next claim be in flight while the previous batch's handlers end and report
 * (docs/benchmarks.md); BENCH_LEASEHOLD_CONCURRENCY overrides it for experiments.
 */
export const THROUGHPUT_CONCURRENCY = Number(process.env.BENCH_LEASEHOLD_CONCURRENCY ?? 1_000);
/** The shortest lease the worker accepts (1 s), heartbeat at a third, watchdog 5 times a second. */
export const RECOVERY_LEASE_MS = 1_000;
const RECOVERY_WATCHDOG_MS = 200;
/** Reaped jobs retry at once in the recovery workload (the default backoff starts at 1 s). */
const NO_BACKOFF = { baseMs: 0, factor: 1, maxMs: 0, jitter: 0 };

/** A client on the benchmark's schema, for a workload's own setup (queue limits, an index dropped). */
export function connect(url: string, poolSize?: number): Promise<Leasehold> {
  return Leasehold.connect({ databaseUrl: url, schema: SCHEMA, logger: silent, metricsRegistry: new Registry(), migrate: false, poolSize });
}

/** Runs `fn` with a client on the Leasehold benchmark schema, closed afterwards (the workloads' set-up and checks). */
export async function withLeasehold(url: string, fn: (lh: Leasehold) => Promise<unknown>): Promise<void> {
  const lh = await connect(url);
  try {
    await fn(lh);
  } finally {
    await lh.close();
  }
}

/** Drops the schema and migrates it again: every run starts from empty tables. */
export async function recreateSchema(url: string): Promise<void> {
  // A plain connection: a client (even with migrate: false) refuses a schema with no tables.
  await withClient(url, (db) => db.query(`DROP SCHEMA IF EXISTS ${SCHEMA} CASCADE`));
  const migrated = await Leasehold.connect({ databaseUrl: url, schema: SCHEMA, logger: silent, metricsRegistry: new Registry() });
  await migrated.close();
}

/** Enqueues through `lh.enqueueMany`, as a user's producer would. */
export function producerOf(lh: Leasehold, beforeClose?: () => Promise<void> | void): Producer {
  return {
    async enqueue(payloads: Payload[], keys?: string[]) {
      await lh.enqueueMany(payloads.map((payload, i) => (keys ? { task: QUEUE, payload, key: keys[i] } : { task: QUEUE, payload })));
    },
    async pending() {
      const { rows } = await lh.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM jobs");
      return rows[0]!.n;
    },
    async close() {
      await beforeClose?.();
      await lh.close();
    },
  };
}

export const leasehold: BenchSystem = {
  name: "leasehold",
  version: packageVersion(),
  database: "bench_leasehold",
  schema: SCHEMA,
  settings: {
    throughput: `concurrency ${THROUGHPUT_CONCURRENCY}, otherwise its defaults (claims of up to 2,000 jobs ahead of free slots, one claim in flight, lease 30 s, heartbeat 10 s, batched completions, NOTIFY wake-up)`,
    recovery: `lease ${RECOVERY_LEASE_MS} ms (the minimum), heartbeat ${Math.floor(RECOVERY_LEASE_MS / 3)} ms, watchdog every ${RECOVERY_WATCHDOG_MS} ms, no retry backoff; and every setting at its default (lease 30 s, watchdog liveness check every 250 ms, 1 s grace, the default backoff)`,
    heartbeat: "250 jobs per process, lease 30 s / heartbeat 10 s (default) and lease 3 s / heartbeat 1 s",
    steady: `as throughput; retention keeps finished jobs 5 s (generations of 834 ms, emptied with TRUNCATE)`,
  },

  reset: recreateSchema,

  async producer(url: string, profile: Profile): Promise<Producer> {
    const lh = await connect(url);
    const retention = profile === "steady" ? lh.retention({ retainMs: 5_000, retainDeadMs: 5_000 }).start() : undefined;
    return producerOf(lh, () => retention?.stop());
  },

  async startWorker(url, spec, run) {
    const lh = await connect(url, 10);
    if (spec.defaults) {
      const handler = (payload: unknown, ctx: { attempt: number; signal: AbortSignal }) => {
        const p = payload as Payload;
        const sleepMs = p.firstAttemptOnly && ctx.attempt > 1 ? 0 : p.sleepMs;
        return run({ ...p, sleepMs }, sleepMs ? ctx.signal : undefined);
      };
      const worker = lh.worker({ handlers: { [QUEUE]: handler } });
      await worker.start();
      return {
        async stop() {
          await worker.stop();
          await lh.close();
        },
      };
    }
    const leaseMs = spec.leaseMs ?? (spec.profile === "recovery" ? RECOVERY_LEASE_MS : undefined);
    const worker = lh.worker({
      // A handler that waits passes its signal on; a no-op one never reads it, so (as in an app)
      // its attempt makes no AbortController: ctx.signal is made on first read.
      handlers: { [QUEUE]: (payload, ctx) => run(payload as Payload, (payload as Payload).sleepMs ? ctx.signal : undefined) },
      concurrency: spec.concurrency ?? (spec.profile === "recovery" ? 10 : THROUGHPUT_CONCURRENCY),
      ...(leaseMs ? { leaseMs, heartbeatMs: Math.floor(leaseMs / 3) } : {}),
      watchdog: spec.profile === "recovery" ? { intervalMs: RECOVERY_WATCHDOG_MS, backoff: NO_BACKOFF } : true,
      shutdownTimeoutMs: 1_000,
    });
    await worker.start();
    return {
      async stop() {
        await worker.stop();
        await lh.close();
      },
    };
  },
};
