/**
 * DBOS Transact (@dbos-inc/dbos-sdk) beside Leasehold's durable steps, PostgreSQL only: no
 * DBOS Cloud, no Conductor. Its system tables live in a database of their own (bench_dbos),
 * schema "dbos". The benchmark process starts workflows with a `DBOSClient` (enqueue onto a
 * queue, `send` for events), as an application outside the workers would; each worker process
 * runs `DBOS.launch()` with the workflows registered (`DBOS.registerWorkflow`, steps through
 * `DBOS.runStep`, `DBOS.recv`, `DBOS.sleep`) and dequeues from a `WorkflowQueue`, DBOS's way of
 * spreading work over processes.
 *
 * Settings (docs/benchmarks.md): a distinct executor ID per process (otherwise each launch
 * recovers the others' "local" workflows), one application version for all, LISTEN/NOTIFY on
 * (its default: `recv` wakes on a notification), and a queue per shape. The "steps" queue
 * polls every DBOS_POLLING_MS (its default is 1 s, which caps a process at its concurrency per
 * second) with the fleet rows' concurrency per process. A waiting or sleeping DBOS workflow
 * keeps running in its process and holds its slot, so the "event" and "sleep" queues have no
 * concurrency limit (every waiter must be running to wait) and poll at DBOS's default.
 */
import pg from "pg";
import { DBOS, DBOSClient, type DLogger } from "@dbos-inc/dbos-sdk";
import { packageVersion } from "../lib/versions.js";
import { withClient } from "../workloads/context.js";
import { STEPS_PER_WORKFLOW, type DurableArgs, type DurableDriver, type DurableStarter, type ResumeEvent } from "./durable.js";
import type { BenchSystem, DurableShape, Payload } from "./types.js";

const SCHEMA = "dbos";
const APP = "leasehold_bench";
const VERSION = "bench";
const TOPIC = "resume";
/** The "steps" queue's polling interval (ms); BENCH_DBOS_POLLING_MS overrides it for experiments. */
export const DBOS_POLLING_MS = Number(process.env.BENCH_DBOS_POLLING_MS ?? 10);
/** Client enqueues in flight at once (DBOS has no batch enqueue). */
const ENQUEUES_IN_FLIGHT = 20;

const queueOf = (shape: DurableShape) => `bench_${shape}`;

const quiet: DLogger = { info() {}, debug() {}, warn() {}, error() {} };

export const dbosDriver: DurableDriver = {
  workerSystem: "dbos",

  async reset(url) {
    await withClient(url, (db) => db.query(`DROP SCHEMA IF EXISTS ${SCHEMA} CASCADE`));
    await DBOS.migrate(url, { schemaName: SCHEMA });
  },

  async open(url, shape): Promise<DurableStarter> {
    const client = await DBOSClient.create({ systemDatabaseUrl: url, systemDatabaseSchemaName: SCHEMA, applicationName: APP, logger: quiet });
    const pool = new pg.Pool({ connectionString: url, max: 1 });
    return {
      async start(workflows: DurableArgs[]) {
        // One enqueue per workflow, a few in flight: DBOS has no batch enqueue.
        let next = 0;
        const lane = async () => {
          while (next < workflows.length) {
            const w = workflows[next++]!;
            await client.enqueue({ queueName: queueOf(shape), workflowName: shape, workflowID: w.id }, w);
          }
        };
        await Promise.all(Array.from({ length: ENQUEUES_IN_FLIGHT }, lane));
      },
      async sendEvent(event: ResumeEvent) {
        await client.send(event.id, event, TOPIC);
      },
      async unfinished() {
        const { rows } = await pool.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM ${SCHEMA}.workflow_status WHERE status IN ('ENQUEUED', 'PENDING', 'DELAYED')`,
        );
        return rows[0]!.n;
      },
      async sleeping() {
        const { rows } = await pool.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM ${SCHEMA}.operation_outputs WHERE function_name = 'DBOS.sleep'`,
        );
        return rows[0]!.n;
      },
      async close() {
        await pool.end();
        await client.destroy();
      },
    };
  },
};

export const dbos: BenchSystem = {
  name: "dbos",
  version: packageVersion("@dbos-inc/dbos-sdk"),
  database: "bench_dbos",
  schema: SCHEMA,
  settings: {
    throughput: `durable workflows only: queue per shape, executor ID per process, application version "${VERSION}", LISTEN/NOTIFY on, "steps" queue polled every ${DBOS_POLLING_MS} ms`,
    recovery: "not measured",
    heartbeat: "not measured",
    steady: "not measured",
  },
  workloads: ["durable-steps", "durable-event", "durable-sleep"],

  reset: (url) => dbosDriver.reset(url),

  producer() {
    return Promise.reject(new Error("dbos runs durable workflows only (bench/workloads/durable.ts)"));
  },

  async startWorker(url, spec, run) {
    const shape = spec.durable;
    if (!shape) throw new Error("dbos runs durable workflows only: WorkerSpec.durable is required");
    DBOS.setConfig({
      name: APP,
      systemDatabaseUrl: url,
      systemDatabaseSchemaName: SCHEMA,
      // Distinct per process: a launch recovers the PENDING workflows of its own executor ID.
      executorID: `bench-${process.pid}`,
      applicationVersion: VERSION,
      logLevel: "error",
      runMigrations: false,
    });
    registerWorkflows(run);
    await DBOS.launch();
    await DBOS.registerQueue(queueOf(shape), {
      onConflict: "always_update",
      ...(shape === "steps" ? { workerConcurrency: spec.concurrency, minPollingIntervalMs: DBOS_POLLING_MS } : {}), // "event" and "sleep": DBOS's default polling (1 s), the cheapest while they wait
    });
    return {
      async stop() {
        await DBOS.shutdown();
      },
    };
  },
};

/** The three shapes as DBOS workflows, by name; `run` reports to the benchmark as a job handler would. */
function registerWorkflows(run: (payload: Payload) => Promise<void>): void {
  DBOS.registerWorkflow(
    async (_args: DurableArgs) => {
      for (let i = 1; i <= STEPS_PER_WORKFLOW; i++) {
        // The first step reports the workflow's start (the clock starts at the first).
        await DBOS.runStep(async () => (i === 1 ? run({}).then(() => ({ ok: true })) : { ok: true }), { name: `s${i}` });
      }
    },
    { name: "steps" },
  );
  DBOS.registerWorkflow(
    async (_args: DurableArgs) => {
      await DBOS.runStep(() => run({}).then(() => true), { name: "ready" });
      const event = await DBOS.recv<ResumeEvent>(TOPIC, { timeoutSeconds: 3_600 });
      if (!event) throw new Error("no event within an hour");
      await DBOS.runStep(() => run({ t: event.t }).then(() => true), { name: "after" });
    },
    { name: "event" },
  );
  DBOS.registerWorkflow(
    async (args: DurableArgs) => {
      await DBOS.sleep(args.wakeAt! - Date.now());
    },
    { name: "sleep" },
  );
}
