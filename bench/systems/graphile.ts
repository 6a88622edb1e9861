/**
 * graphile-worker 0.18 at the best settings measured on this kind of machine
 * (one worker process, no-op jobs): concurrency 50, localQueue size 500, completeJobBatchDelay 0.
 * It has no lease or heartbeat: a job locked by a worker that died stays locked until a
 * hard-coded 4-hour lock timeout.
 */
import pg from "pg";
import { Logger, makeWorkerUtils, run as runGraphile, runMigrations } from "graphile-worker";
import { packageVersion } from "../lib/versions.js";
import { QUEUE, type BenchSystem, type Payload, type Producer } from "./types.js";

const SCHEMA = "graphile_worker";
const silent = new Logger(() => () => {});

const THROUGHPUT_CONCURRENCY = 50;
const LOCAL_QUEUE_SIZE = 500;

export const graphile: BenchSystem = {
  name: "graphile-worker",
  version: packageVersion("graphile-worker"),
  database: "bench_graphile",
  schema: SCHEMA,
  settings: {
    throughput: `concurrency ${THROUGHPUT_CONCURRENCY}, localQueue size ${LOCAL_QUEUE_SIZE}, completeJobBatchDelay 0`,
    recovery: "no lease or heartbeat setting exists: a dead worker's job stays locked for 4 h (hard-coded)",
    heartbeat: "concurrency 250 per process (no heartbeats: nothing to renew)",
    steady: "as throughput (completed jobs are deleted on completion)",
  },
  recoveryNote: "no recovery without manual action: the job stays locked until graphile-worker's hard-coded 4-hour lock timeout",

  async reset(url: string) {
    const c = new pg.Client({ connectionString: url });
    await c.connect();
    await c.query(`DROP SCHEMA IF EXISTS ${SCHEMA} CASCADE`).finally(() => c.end());
    await runMigrations({ connectionString: url, logger: silent });
  },

  async producer(url: string): Promise<Producer> {
    const utils = await makeWorkerUtils({ connectionString: url, logger: silent });
    const pool = new pg.Pool({ connectionString: url, max: 1 });
    return {
      async enqueue(payloads: Payload[], keys?: string[]) {
        if (keys)
          throw new Error("graphile-worker: flow-control keys are not measured (its named queues run one job at a time, a different control)");
        await utils.addJobs(payloads.map((payload) => ({ identifier: QUEUE, payload })));
      },
      async pending() {
        const { rows } = await pool.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${SCHEMA}._private_jobs`);
        return rows[0]!.n;
      },
      async close() {
        await pool.end();
        await utils.release();
      },
    };
  },

  async startWorker(url, spec, run) {
    const throughput = spec.profile === "throughput" || spec.profile === "steady";
    const concurrency = spec.concurrency ?? (throughput ? THROUGHPUT_CONCURRENCY : 10);
    const runner = await runGraphile({
      connectionString: url,
      concurrency,
      maxPoolSize: Math.max(10, Math.min(concurrency + 2, 60)),
      noHandleSignals: true,
      pollInterval: 2_000,
      logger: silent,
      taskList: { [QUEUE]: (payload, helpers) => run(payload as Payload, helpers.abortSignal) },
      ...(throughput
        ? { preset: { worker: { localQueue: { size: spec.localQueue ?? Math.max(LOCAL_QUEUE_SIZE, concurrency) }, completeJobBatchDelay: 0 } } }
        : {}),
    });
    return {
      async stop() {
        await runner.stop();
      },
    };
  },
};
