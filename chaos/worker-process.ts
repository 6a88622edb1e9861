/**
 * One chaos worker: a separate OS process running the library as users do
 * (Leasehold.connect + a Worker), reaching PostgreSQL through the harness's proxy.
 * Every report it sends and every downstream write is logged (process-log.ts), and so is
 * each attempt's timeline: its handler's start, its signal firing, its settling (withTimeline).
 *
 * Environment: CHAOS_DATABASE_URL, CHAOS_SCHEMA, CHAOS_NAME, CHAOS_LOG, CHAOS_LEASE_MS,
 * CHAOS_HEARTBEAT_MS, CHAOS_PROGRESS_TIMEOUT_MS, CHAOS_CONCURRENCY, CHAOS_NATS_URL (NATS dispatch, through its proxy). Sends {type: "ready", workerId} over
 * IPC once it runs; {type: "hang"} makes the next handler it starts hang.
 * SIGTERM: graceful stop.
 */
import pino from "pino";
import { Leasehold, Worker } from "../packages/leasehold/src/index.js";
import { DatabaseTransport, isConnectionError } from "../packages/leasehold/src/worker/transport.js";
import { ProcessLog, withTimeline } from "./process-log.js";
import { RecordingTransport } from "./recording-transport.js";
import { CHAOS_BACKOFF, env, waitForDatabase } from "./process-env.js";
import { QUEUE, TASK, chaosHandler, type HandlerFaults } from "./workload.js";
import { TX_EFFECTS_TABLE, WORKER_POLL_MS } from "./config.js";
import { LIMITED_QUEUES } from "./flow-queues.js";

const logger = pino({ level: process.env.CHAOS_LOG_LEVEL ?? "error" }, pino.destination(2));
const log = new ProcessLog(env("CHAOS_LOG"));
const lh = await Leasehold.connect({
  databaseUrl: env("CHAOS_DATABASE_URL"),
  schema: env("CHAOS_SCHEMA"),
  migrate: false,
  // Started while the database may be restarting (a chaos fault): wait for it, as a worker's first session does.
  connectRetry: { timeoutMs: 30_000 },
  poolSize: 6,
  logger,
  ...(process.env.CHAOS_NATS_URL && { nats: process.env.CHAOS_NATS_URL }),
});
await waitForDatabase(lh.pool);

let workerId = "";
const faults: HandlerFaults = { hangNext: 0 };
process.on("message", (m: { type?: string }) => {
  if (m.type === "hang") faults.hangNext++;
});
const transport = new RecordingTransport(new DatabaseTransport(lh.pool, lh.databaseUrl, lh.schema), log, () => workerId);
const worker = new Worker({
  transport,
  dispatch: lh.dispatchFactory(),
  logger,
  name: env("CHAOS_NAME"),
  queues: [QUEUE, ...LIMITED_QUEUES.map((q) => q.name)],
  concurrency: Number(env("CHAOS_CONCURRENCY")),
  leaseMs: Number(env("CHAOS_LEASE_MS")),
  heartbeatMs: Number(env("CHAOS_HEARTBEAT_MS")),
  pollIntervalMs: WORKER_POLL_MS,
  backoff: CHAOS_BACKOFF,
  handlers: {
    [TASK]: {
      handler: withTimeline(
        chaosHandler(lh.pool, log, () => workerId, faults, `"${lh.schema}".${TX_EFFECTS_TABLE}`, lh.schema),
        log,
        () => workerId,
      ),
      progressTimeoutMs: Number(env("CHAOS_PROGRESS_TIMEOUT_MS")),
    },
  },
});
workerId = worker.id;
log.write({ ev: "hello", t: Date.now(), w: workerId, pid: process.pid });
worker.on("job:end", (job: { id: string; attempt: number }, outcome: { state: string; reason?: string; error?: unknown }) => {
  const reason = outcome.reason ?? (outcome.error ? String((outcome.error as Error).message ?? outcome.error) : undefined);
  log.write({ ev: "end", t: Date.now(), w: workerId, job: job.id, attempt: job.attempt, outcome: outcome.state, reason });
});

// No other process of this name runs while this one lives (the supervisor restarts a process
// only after it ended): losing the name is a defect, and exiting makes the run record it.
worker.on("identity:lost", (err) => {
  process.stderr.write(`worker lost its name while running: ${err.message}\n`);
  process.exit(4);
});

try {
  await worker.start();
} catch (err) {
  // Startup needs the database once (reconciliation); a supervisor restarts us.
  process.stderr.write(`worker start failed${isConnectionError(err) ? " (database unreachable)" : ""}: ${String(err)}\n`);
  process.exit(3);
}
process.send?.({ type: "ready", workerId });

process.on("SIGTERM", () => {
  void (async () => {
    await worker.stop(3_000);
    await lh.close().catch(() => {});
    process.exit(0);
  })();
});
