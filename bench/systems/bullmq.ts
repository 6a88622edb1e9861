/**
 * BullMQ 6's PostgreSQL backend (`createPostgresBackend`): the same Queue, Worker and
 * FlowProducer as its Redis flavour, on tables of its own in schema `bullmq`. No Redis.
 *
 * Settings from its PostgreSQL guide (docs.bullmq.io/guide/postgresql): migrations run
 * explicitly (`runMigrations`, connections never migrate); a pool sized for the handler
 * concurrency; `removeOnComplete` so finished jobs do not pile up in the job table; its
 * indicative numbers peak at concurrency 8-32. Durability stays the server's (fsync and
 * synchronous_commit on, as for every system here; the guide's `synchronous_commit = off`
 * tip is a database-wide trade it leaves to the operator).
 *
 * Liveness: a worker holds a lock on each active job (`lockDuration`, 30 s by default,
 * renewed every half of it). Every `stalledInterval` (30 s by default) one worker's stalled
 * check moves back to waiting the active jobs whose lock expired and that the previous check
 * had already marked: a killed worker's job runs again after its lock expires plus one or two
 * checks. Neither setting has a documented minimum (any positive number is accepted).
 */
import pg from "pg";
import { createPostgresBackend, runMigrations, withBackend, type JobsOptions } from "bullmq";
import { packageVersion } from "../lib/versions.js";
import { QUEUE, type BenchSystem, type Payload, type Producer, type Profile, type WorkerSpec } from "./types.js";

export const BULLMQ_SCHEMA = "bullmq";

/** Inside the 8-32 its guide's processing numbers come from; 8 and 16 drained fastest here (docs/benchmarks.md). */
const THROUGHPUT_CONCURRENCY = 16;
const MAX_POOL = 50;
/** Recovery: a 1 s lock (renewed every 0.5 s) checked every 1 s, as short as Leasehold's shortest lease. */
const RECOVERY_LOCK_MS = 1_000;
const RECOVERY_STALLED_INTERVAL_MS = 1_000;
/** Its defaults, for the recovery row at defaults. */
export const BULLMQ_DEFAULT_LOCK_MS = 30_000;
export const BULLMQ_DEFAULT_STALLED_INTERVAL_MS = 30_000;

/** Queue, Worker and FlowProducer bound to the PostgreSQL backend (its guide's way, for typed jobs). */
export const BullPg = withBackend(createPostgresBackend);

/**
 * Its guide: "Use removeOnComplete / removeOnFail so finished jobs don't accumulate". Set on
 * the bench's jobs as the queue's default job options; the graph workloads keep their jobs
 * instead, to read each job's start and finish from the table.
 */
const JOB_OPTIONS: JobsOptions = { removeOnComplete: true, removeOnFail: 1_000 };

/** The connection every BullMQ object here gets: its pool sized as the guide says, for the concurrency. */
export function bullmqConnection(url: string, poolSize = 10) {
  return { connection: { connectionString: url, schema: BULLMQ_SCHEMA, max: poolSize } };
}

function workerOptions(url: string, spec: WorkerSpec) {
  const recovery = spec.profile === "recovery" && !spec.defaults;
  const concurrency = spec.concurrency ?? (spec.profile === "recovery" ? 10 : THROUGHPUT_CONCURRENCY);
  return {
    // One query in flight per handler at most (its completion fetches the next job), plus the
    // stalled check; capped so 4 processes stay well inside the server's max_connections.
    ...bullmqConnection(url, Math.min(concurrency + 2, MAX_POOL)),
    concurrency,
    ...(recovery ? { lockDuration: RECOVERY_LOCK_MS, stalledInterval: RECOVERY_STALLED_INTERVAL_MS } : {}),
  };
}

export const bullmq: BenchSystem = {
  name: "bullmq",
  version: packageVersion("bullmq"),
  database: "bench_bullmq",
  schema: BULLMQ_SCHEMA,
  settings: {
    throughput: `PostgreSQL backend (createPostgresBackend); drains of at most 20,000 jobs (~10 s at its rate); concurrency ${THROUGHPUT_CONCURRENCY} (its guide's numbers peak at 8-32; 8 and 16 drained fastest here, 32 and 64 slower), pool max concurrency + 2, at most ${MAX_POOL} (its guide: a pool sized for the concurrency), jobs added with removeOnComplete true (its guide: let retention work), LISTEN/NOTIFY wake-up; queue.addBulk`,
    recovery: `lockDuration ${RECOVERY_LOCK_MS} ms (renewed every ${RECOVERY_LOCK_MS / 2} ms), stalledInterval ${RECOVERY_STALLED_INTERVAL_MS} ms, maxStalledCount 1: no documented minimum, so as short as Leasehold's shortest lease; and at its defaults (lockDuration 30 s, stalledInterval 30 s)`,
    heartbeat: "250 jobs per process, lockDuration 30 s renewed every 15 s (its defaults), stalled check every 30 s",
    steady: "as throughput (removeOnComplete deletes each job as it completes)",
  },
  // Fan-out does not map onto its flows (a job has one parent: one job cannot release 10,000).
  // Flow control (its group limits are BullMQ Pro's), cancel latency and durable steps: not measured.
  // The long runs (steady state, pinned snapshot) are left out: at ~2,000 jobs/s its
  // million-job steady state alone would take 8-9 minutes of every run.
  workloads: ["enqueue", "drain", "sweep", "drain-multi", "latency", "recovery", "heartbeat", "graph-fan-in", "graph-chain"],
  // One commit per job caps it near 2,000 jobs/s here: 20,000 jobs is a 10 s drain.
  maxDrainJobs: 20_000,

  async reset(url: string) {
    const c = new pg.Client({ connectionString: url });
    await c.connect();
    try {
      await c.query(`DROP SCHEMA IF EXISTS ${BULLMQ_SCHEMA} CASCADE`);
      // Its guide: connections never migrate; one deployment step does, on a single session.
      await runMigrations(c, BULLMQ_SCHEMA);
    } finally {
      await c.end();
    }
  },

  async producer(url: string, _profile: Profile): Promise<Producer> {
    const queue = new BullPg.Queue<Payload>(QUEUE, { ...bullmqConnection(url), defaultJobOptions: JOB_OPTIONS });
    queue.on("error", () => {});
    await queue.waitUntilReady();
    const pool = new pg.Pool({ connectionString: url, max: 1 });
    return {
      async enqueue(payloads: Payload[], keys?: string[]) {
        if (keys) throw new Error("bullmq: flow-control keys are not measured (its group limits are a BullMQ Pro feature)");
        await queue.addBulk(payloads.map((data) => ({ name: QUEUE, data })));
      },
      async pending() {
        const { rows } = await pool.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM ${BULLMQ_SCHEMA}.job WHERE queue = $1 AND state NOT IN ('completed', 'failed')`,
          [QUEUE],
        );
        return rows[0]!.n;
      },
      async close() {
        await pool.end();
        await queue.close();
      },
    };
  },

  async startWorker(url, spec, run) {
    const worker = new BullPg.Worker<Payload>(QUEUE, async (job, _token, signal) => run(job.data, signal), workerOptions(url, spec));
    worker.on("error", () => {});
    await worker.waitUntilReady();
    return {
      async stop() {
        await worker.close(true);
      },
    };
  },
};
