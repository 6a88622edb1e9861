/**
 * pg-boss 12 at the best settings measured on this kind of machine: one work loop taking
 * batches as large as the handler concurrency (1,000 when draining), burstWhenBatchFull,
 * LISTEN/NOTIFY with a notify queue. More loops with smaller batches measured slower
 * (10,000 jobs: 1 x 50 in 0.9 s, 5 x 10 in 1.5 s, 10 x 5 in 2.2 s); loops of batchSize 1
 * fetch one job per polling interval each (10 loops: ~20 jobs/s).
 */
import pg from "pg";
import { PgBoss } from "pg-boss";
import { packageVersion } from "../lib/versions.js";
import { QUEUE, type BenchSystem, type Payload, type Producer, type Profile } from "./types.js";

const SCHEMA = "pgboss";

const THROUGHPUT = { localConcurrency: 1, batchSize: 1_000, burstWhenBatchFull: true, pollingIntervalSeconds: 0.5 } as const;
/** heartbeatSeconds must be >= 10 in pg-boss; supervise at least every 1 s. */
const HEARTBEAT_SECONDS = 10;
const SUPERVISE_SECONDS = 1;

function queueOptions(profile: Profile) {
  return {
    notify: true,
    ...(profile === "recovery" || profile === "heartbeat" ? { heartbeatSeconds: HEARTBEAT_SECONDS, retryDelay: 0 } : {}),
    ...(profile === "steady" ? { deleteAfterSeconds: 5 } : {}),
  };
}

function boss(url: string, profile: Profile, worker: boolean, flowIntervalSeconds?: number): PgBoss {
  const b = new PgBoss({
    connectionString: url,
    schema: SCHEMA,
    max: 10,
    useListenNotify: worker,
    migrate: false,
    // Supervision (expiry, heartbeat checks, deletion) runs in worker processes only, and
    // as often as pg-boss allows where the workload depends on it.
    supervise: worker,
    schedule: false,
    // The monitor (which fails jobs whose heartbeat lapsed) runs at most every monitorIntervalSeconds.
    ...(profile === "recovery" || profile === "heartbeat"
      ? { superviseIntervalSeconds: SUPERVISE_SECONDS, monitorIntervalSeconds: SUPERVISE_SECONDS }
      : {}),
    ...(profile === "steady" ? { superviseIntervalSeconds: 2, monitorIntervalSeconds: 2, maintenanceIntervalSeconds: 2 } : {}),
    // Flows (graph workloads): its background pass releases dependents this often; unset, its default (5 s).
    ...(flowIntervalSeconds !== undefined ? { flowIntervalSeconds } : {}),
  });
  b.on("error", () => {});
  return b;
}

export const pgboss: BenchSystem = {
  name: "pg-boss",
  version: packageVersion("pg-boss"),
  database: "bench_pgboss",
  schema: SCHEMA,
  settings: {
    throughput:
      "1 work loop (localConcurrency 1), batchSize 1000 (the handler concurrency in the sweep), burstWhenBatchFull, useListenNotify + queue notify, pollingIntervalSeconds 0.5",
    recovery: `queue heartbeatSeconds ${HEARTBEAT_SECONDS} (the minimum), superviseIntervalSeconds and monitorIntervalSeconds ${SUPERVISE_SECONDS}, retryDelay 0, polling every 0.5 s`,
    heartbeat: `25 loops x batchSize 10 per process, heartbeatSeconds ${HEARTBEAT_SECONDS} (refresh every 5 s)`,
    steady: "as throughput; queue deleteAfterSeconds 5, supervise and maintenance every 2 s",
  },

  async reset(url: string, profile: Profile) {
    const c = new pg.Client({ connectionString: url });
    await c.connect();
    await c.query(`DROP SCHEMA IF EXISTS ${SCHEMA} CASCADE`).finally(() => c.end());
    const b = new PgBoss({ connectionString: url, schema: SCHEMA, supervise: false, schedule: false, max: 2 });
    b.on("error", () => {});
    await b.start();
    await b.createQueue(QUEUE, queueOptions(profile));
    await b.stop({ graceful: false, timeout: 1000 });
  },

  async producer(url: string, profile: Profile): Promise<Producer> {
    const b = boss(url, profile, false);
    await b.start();
    const pool = new pg.Pool({ connectionString: url, max: 1 });
    return {
      async enqueue(payloads: Payload[], keys?: string[]) {
        await b.insert(
          QUEUE,
          payloads.map((data, i) => (keys ? { data, group: { id: keys[i]! } } : { data })),
        );
      },
      async pending() {
        const { rows } = await pool.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM ${SCHEMA}.job WHERE name = $1 AND state IN ('created', 'retry', 'active')`,
          [QUEUE],
        );
        return rows[0]!.n;
      },
      async close() {
        await pool.end();
        await b.stop({ graceful: false, timeout: 1000 });
      },
    };
  },

  async startWorker(url, spec, run) {
    const b = boss(url, spec.profile, true, spec.flowIntervalSeconds);
    await b.start();
    const base =
      spec.profile === "recovery"
        ? // A retried job sends no NOTIFY: poll as often as pg-boss allows.
          { localConcurrency: 1, batchSize: 1, pollingIntervalSeconds: 0.5, notifyPollingIntervalSeconds: 0.5 }
        : spec.profile === "heartbeat"
          ? { localConcurrency: Math.max(1, Math.round((spec.concurrency ?? 250) / 10)), batchSize: 10, pollingIntervalSeconds: 0.5 }
          : spec.concurrency !== undefined
            ? // The same handler concurrency as the others: one loop, a batch of that many at a time.
              { ...THROUGHPUT, batchSize: spec.concurrency }
            : THROUGHPUT;
    // Per-group limits (flow workloads): counted in the database by every fetch, across processes.
    const grouped = spec.groupConcurrency === undefined ? base : { ...base, groupConcurrency: spec.groupConcurrency };
    // Flows: a dependent released by the flow pass sends no NOTIFY, so a worker finds it by its
    // fallback poll (30 s by default with LISTEN/NOTIFY on): poll as often as pg-boss allows.
    const options = spec.flowIntervalSeconds === undefined ? grouped : { ...grouped, notifyPollingIntervalSeconds: 0.5 };
    await b.work<Payload>(QUEUE, options, async (jobs) => {
      await Promise.all(jobs.map((job) => run(job.data, job.signal)));
    });
    return {
      async stop() {
        await b.stop({ graceful: true, timeout: 2000 });
      },
    };
  },
};
