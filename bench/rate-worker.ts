/**
 * A worker process of the rate measure (bench/lib/rate-starts.ts), until killed: Leasehold's
 * worker on one queue, each handler stamping its start on the database's clock
 * (clock_timestamp(), on a connection per handler slot) and then running busyMs (±50%).
 */
import pg from "pg";
import pino from "pino";
import { Leasehold } from "../packages/leasehold/src/client.js";
import type { JobContext } from "../packages/leasehold/src/worker/context.js";

const env = (name: string) => {
  const v = process.env[name];
  if (v === undefined) throw new Error(`rate-worker: ${name} is not set`);
  return v;
};
const url = env("RATE_URL");
const concurrency = Number(env("RATE_CONCURRENCY"));
const busyMs = Number(env("RATE_BUSY_MS"));
const lh = await Leasehold.connect({ databaseUrl: url, schema: env("RATE_SCHEMA"), logger: pino({ level: "silent" }), migrate: false });
const stamps = new pg.Pool({ connectionString: url, max: concurrency, options: `-c search_path=${lh.schema}` });
// Connected before the first job: a stamp measures the handler's start, not a connection's.
await Promise.all(Array.from({ length: concurrency }, () => stamps.query("SELECT 1")));
const worker = lh.worker({
  queues: [env("RATE_QUEUE")],
  concurrency,
  handlers: {
    [env("RATE_TASK")]: async (_p: unknown, ctx: JobContext) => {
      await stamps.query("INSERT INTO handler_starts (job_id, at) VALUES ($1, clock_timestamp())", [ctx.jobId]);
      if (busyMs > 0) await new Promise((r) => setTimeout(r, busyMs * (0.5 + Math.random())));
    },
  },
});
await worker.start();
process.send!("ready");
