/**
 * A worker in a process of its own for the flow-control tests (test/flow-*.test.ts): several of
 * them claim against the same limits, as separate processes of a fleet do, and one can be
 * killed for real. Default lease, local buffer as the worker keeps it, no watchdog (the test
 * runs one where it wants crash detection).
 *
 * Environment: DATABASE_URL, LEASEHOLD_SCHEMA, QUEUES (comma-separated; default "default"),
 * CONCURRENCY (default the worker's).
 * Tasks:
 *   sleep     {min, max}: sleeps a random time in [min, max] ms (overlaps would happen without limits)
 *   throttled {retryInMs, scope}: throws RateLimitedError on its first attempt, then succeeds
 *   hold      never ends (a job to kill the process under)
 *   quick     returns at once
 *   stamp     {min, max}: records its start on the database's clock (a row of handler_starts, on
 *             a connection of its own, one per handler slot), then sleeps as `sleep` does
 * Prints "ready <worker id>" once started and "started <job id> <Date.now()>" when a handler
 * starts (the test runs on the same machine: the same clock).
 */
import pg from "pg";
import pino from "pino";
import { Leasehold } from "../../packages/leasehold/src/client.js";
import { RateLimitedError, type JobContext } from "../../packages/leasehold/src/worker/context.js";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const lh = await Leasehold.connect({ logger: pino({ level: "silent" }) });
const concurrency = Number(process.env.CONCURRENCY ?? 10);
// A connection per handler slot, opened before the worker starts: a start is stamped at once.
const stamps = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: concurrency, options: `-c search_path=${lh.schema}` });
await Promise.all(Array.from({ length: concurrency }, () => stamps.query("SELECT pg_sleep(0.05)")));
const worker = lh.worker({
  watchdog: false,
  queues: (process.env.QUEUES ?? "default").split(","),
  ...(process.env.CONCURRENCY && { concurrency: Number(process.env.CONCURRENCY) }),
  handlers: {
    sleep: async (p: unknown) => {
      const { min, max } = p as { min: number; max: number };
      await sleep(min + Math.random() * (max - min));
    },
    throttled: (p: unknown, ctx: JobContext) => {
      const { retryInMs, scope } = p as { retryInMs: number; scope: "key" | "queue" | "job" };
      if (ctx.attempt === 1) throw new RateLimitedError(retryInMs, scope);
    },
    stamp: async (p: unknown, ctx: JobContext) => {
      await stamps.query("INSERT INTO handler_starts (job_id, at) VALUES ($1, clock_timestamp())", [ctx.jobId]);
      const { min, max } = p as { min: number; max: number };
      await sleep(min + Math.random() * (max - min));
    },
    hold: () => new Promise(() => {}),
    quick: () => undefined,
  },
});
worker.on("job:start", (job: { id: string }) => process.stdout.write(`started ${job.id} ${Date.now()}\n`));
await worker.start();
process.stdout.write(`ready ${worker.id}\n`);
process.on(
  "SIGTERM",
  () =>
    void worker
      .stop(0)
      .then(() => lh.close())
      .then(() => process.exit(0)),
);
