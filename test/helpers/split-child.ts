/**
 * A worker in a process of its own for the split-execution tests: real processes frozen with
 * SIGSTOP and cut off by a real proxy. It prints one line per event, with this machine's wall
 * clock (the test compares it with its own):
 *   ready <worker id>
 *   started <job id> <attempt> <ms>
 *   aborted <job id> <attempt> <reason> <ms>
 *   ended <job id> <attempt> <ms>
 *   identity-lost <ms>   (its stable name was taken: the worker stops)
 * Tasks:
 *   quick                 returns at once
 *   long                  runs LONG_MS (default 8000), or until its signal fires
 *   committing            runs ctx.transaction inserting into <schema>.slow_commit, whose deferred
 *                         trigger (the test's) makes the COMMIT wait: the attempt sits in its commit
 *   freezer {victim}      waits until job `victim` is claimed by this worker (buffered behind
 *                         it), then stops its own process (SIGSTOP) and returns once continued:
 *                         the handler ends before any timer of the woken process runs
 * Environment: DATABASE_URL, LEASEHOLD_SCHEMA, CONCURRENCY, LEASE_MS, HEARTBEAT_MS,
 * LIVENESS_GRACE_MS ("off": no liveness session), LONG_MS, WORKER_NAME (a stable name).
 */
import pino from "pino";
import { Leasehold } from "../../packages/leasehold/src/client.js";
import type { JobContext } from "../../packages/leasehold/src/index.js";

const env = process.env;
const lh = await Leasehold.connect({ logger: pino({ level: "silent" }) });
const say = (line: string) => process.stdout.write(`${line}\n`);
const grace = env.LIVENESS_GRACE_MS;

const worker = lh.worker({
  watchdog: false,
  concurrency: Number(env.CONCURRENCY ?? 10),
  ...(env.WORKER_NAME && { name: env.WORKER_NAME }),
  ...(env.LEASE_MS && { leaseMs: Number(env.LEASE_MS) }),
  ...(env.HEARTBEAT_MS && { heartbeatMs: Number(env.HEARTBEAT_MS) }),
  ...(grace && { livenessGraceMs: grace === "off" ? null : Number(grace) }),
  backoff: { baseMs: 0, factor: 1, maxMs: 0, jitter: 0 },
  handlers: {
    quick: () => undefined,
    long: (_payload: unknown, ctx: JobContext) =>
      new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, Number(env.LONG_MS ?? 8_000));
        ctx.signal.addEventListener("abort", () => {
          say(`aborted ${ctx.jobId} ${ctx.attempt} ${(ctx.signal.reason as { reason: string }).reason} ${Date.now()}`);
          clearTimeout(timer);
          resolve();
        });
      }),
    committing: (_payload: unknown, ctx: JobContext) => {
      ctx.signal.addEventListener("abort", () =>
        say(`aborted ${ctx.jobId} ${ctx.attempt} ${(ctx.signal.reason as { reason: string }).reason} ${Date.now()}`),
      );
      return ctx.transaction(async (tx) => {
        await tx.query(`INSERT INTO "${env.LEASEHOLD_SCHEMA}".slow_commit VALUES (1)`);
      });
    },
    freezer: async (payload: { victim: string }) => {
      for (let i = 0; ; i++) {
        const { rows } = await lh.pool.query("SELECT locked_by FROM jobs WHERE id = $1", [payload.victim]);
        if (rows[0]?.locked_by === worker.id) break;
        if (i > 500) throw new Error("the victim job was never claimed behind the freezer");
        await new Promise((r) => setTimeout(r, 10));
      }
      say(`freezing ${Date.now()}`);
      process.kill(process.pid, "SIGSTOP");
      say(`woke ${Date.now()}`);
    },
  },
});
worker.on("job:start", (job: { id: string; attempt: number }) => say(`started ${job.id} ${job.attempt} ${Date.now()}`));
worker.on("job:end", (job: { id: string; attempt: number }) => say(`ended ${job.id} ${job.attempt} ${Date.now()}`));
worker.on("identity:lost", () => say(`identity-lost ${Date.now()}`));
await worker.start();
say(`ready ${worker.id}`);
process.on(
  "SIGTERM",
  () =>
    void worker
      .stop(0)
      .then(() => lh.close())
      .then(() => process.exit(0)),
);
