/**
 * A watchdog-only process: reaps expired leases and nothing else. The chaos run keeps
 * several of them at once (workers run without their own), and kills and restarts them.
 *
 * Environment: CHAOS_DATABASE_URL, CHAOS_SCHEMA, CHAOS_WATCHDOG_INTERVAL_MS.
 */
import pino from "pino";
import { Leasehold } from "../packages/leasehold/src/index.js";
import { CHAOS_BACKOFF, env, waitForDatabase } from "./process-env.js";

const logger = pino({ level: process.env.CHAOS_LOG_LEVEL ?? "error" }, pino.destination(2));
const lh = await Leasehold.connect({
  databaseUrl: env("CHAOS_DATABASE_URL"),
  schema: env("CHAOS_SCHEMA"),
  migrate: false,
  // Started while the database may be restarting (a chaos fault): wait for it, as a worker's first session does.
  connectRetry: { timeoutMs: 30_000 },
  poolSize: 2,
  logger,
});
await waitForDatabase(lh.pool);
const watchdog = lh.watchdog({ intervalMs: Number(env("CHAOS_WATCHDOG_INTERVAL_MS")), backoff: CHAOS_BACKOFF }).start();
process.send?.({ type: "ready" });
// The watchdog's timer is unref'd (it must not keep a worker's process alive); a process
// that is only a watchdog has to keep itself alive.
const keepAlive = setInterval(() => {}, 1 << 30);

process.on("SIGTERM", () => {
  void (async () => {
    clearInterval(keepAlive);
    await watchdog.stop();
    await lh.close().catch(() => {});
    process.exit(0);
  })();
});
