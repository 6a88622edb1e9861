/**
 * Rate accuracy of a queue's rate limit (docs/flow-control.md), measured as the issue asks: N
 * worker processes drain a backlog against `limit` starts per second for `seconds`, and the
 * starts are counted on the database's clock from the audit trail (the claims), and as each
 * handler stamps its own start (clock_timestamp(), on a connection per handler slot). Prints the
 * total against the configured rate, every 1-second bucket, and the most claims and the most
 * handler starts in any 1-second window.
 *
 *   node --conditions=source --import tsx bench/flow-rate.ts [--seconds 60] [--limit 50] [--processes 4]
 *        [--concurrency 10] [--busy-ms 2000]
 *
 * --concurrency: every process's (default: 10 and 50, alternating). --busy-ms: each handler
 * runs about this long (0: returns at once); handlers busy longer than the processes' slots
 * last at the rate are where a job claimed ahead would wait in a worker's buffer.
 *
 * Uses DATABASE_URL (a schema of its own, dropped at the end), or starts a throwaway server.
 */
import { fork } from "node:child_process";
import { randomBytes } from "node:crypto";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import pg from "pg";
import pino from "pino";
import { Leasehold } from "../packages/leasehold/src/client.js";
import type { JobContext } from "../packages/leasehold/src/worker/context.js";
import { startServer } from "./lib/server.js";

const logger = pino({ level: "silent" });

if (process.argv.includes("--child")) {
  // A worker process on queue "rate", until killed: each handler stamps its start, then runs busyMs (±50%).
  const lh = await Leasehold.connect({ databaseUrl: process.env.FLOW_RATE_URL!, schema: process.env.FLOW_RATE_SCHEMA!, logger });
  const concurrency = Number(process.env.FLOW_RATE_CONCURRENCY);
  const busyMs = Number(process.env.FLOW_RATE_BUSY_MS);
  const stamps = new pg.Pool({ connectionString: process.env.FLOW_RATE_URL, max: concurrency, options: `-c search_path=${lh.schema}` });
  await Promise.all(Array.from({ length: concurrency }, () => stamps.query("SELECT 1")));
  const worker = lh.worker({
    queues: ["rate"],
    concurrency,
    handlers: {
      quick: async (_p: unknown, ctx: JobContext) => {
        await stamps.query("INSERT INTO handler_starts (job_id, at) VALUES ($1, clock_timestamp())", [ctx.jobId]);
        if (busyMs > 0) await new Promise((r) => setTimeout(r, busyMs * (0.5 + Math.random())));
      },
    },
  });
  await worker.start();
  process.send!("ready");
} else {
  const { values } = parseArgs({
    options: {
      seconds: { type: "string", default: "60" },
      limit: { type: "string", default: "50" },
      processes: { type: "string", default: "4" },
      concurrency: { type: "string" },
      "busy-ms": { type: "string", default: "0" },
    },
  });
  const seconds = Number(values.seconds);
  const limit = Number(values.limit);
  const processes = Number(values.processes);
  const server = await startServer(process.env.DATABASE_URL);
  const url = server.adminUrl;
  const schema = `flow_rate_${randomBytes(4).toString("hex")}`;
  const lh = await Leasehold.connect({ databaseUrl: url, schema, logger });
  const children: ReturnType<typeof fork>[] = [];
  try {
    await lh.setQueueLimits("rate", { rate: { limit, windowMs: 1_000 } }, { create: true });
    await lh.pool.query("CREATE TABLE handler_starts (job_id bigint PRIMARY KEY, at timestamptz NOT NULL)");
    const backlog = limit * (seconds + 10);
    for (let i = 0; i < backlog; i += 5_000) {
      await lh.enqueueMany(Array.from({ length: Math.min(5_000, backlog - i) }, () => ({ task: "quick", queue: "rate" })));
    }
    for (let i = 0; i < processes; i++) {
      const child = fork(fileURLToPath(import.meta.url), ["--child"], {
        env: {
          ...process.env,
          FLOW_RATE_URL: url,
          FLOW_RATE_SCHEMA: schema,
          FLOW_RATE_CONCURRENCY: values.concurrency ?? (i % 2 === 0 ? "10" : "50"),
          FLOW_RATE_BUSY_MS: values["busy-ms"],
        },
      });
      children.push(child);
    }
    await Promise.all(children.map((c) => new Promise((r) => c.once("message", r))));
    const startMs = async () =>
      (await lh.pool.query<{ ms: number | null }>("SELECT extract(epoch FROM min(started_at))::float8 * 1000 AS ms FROM all_attempts")).rows[0]!.ms;
    let t0: number | null = null;
    while ((t0 = await startMs()) === null) await new Promise((r) => setTimeout(r, 50));
    await new Promise((r) => setTimeout(r, seconds * 1_000 + 2_000));
    const { rows } = await lh.pool.query<{ ms: number }>(
      "SELECT extract(epoch FROM started_at)::float8 * 1000 AS ms FROM all_attempts WHERE started_at >= to_timestamp($1 / 1000.0) ORDER BY 1",
      [t0],
    );
    const starts = rows.map((r) => r.ms).filter((ms) => ms < t0! + seconds * 1_000);
    const handled = await lh.pool.query<{ ms: number }>(
      "SELECT extract(epoch FROM at)::float8 * 1000 AS ms FROM handler_starts WHERE at >= to_timestamp($1 / 1000.0) ORDER BY 1",
      [t0],
    );
    const handlerStarts = handled.rows.map((r) => r.ms).filter((ms) => ms < t0! + seconds * 1_000);
    const buckets = Array.from({ length: seconds }, (_, s) => starts.filter((ms) => ms >= t0! + s * 1_000 && ms < t0! + (s + 1) * 1_000).length);
    const expected = limit * seconds;
    const off = ((starts.length - expected) / expected) * 100;
    const shape = values.concurrency ? `concurrency ${values.concurrency}` : "concurrency 10 and 50";
    console.log(`rate limit ${limit}/s, ${processes} worker processes (${shape}), handlers busy ${values["busy-ms"]} ms, ${seconds} s`);
    console.log(`starts: ${starts.length} (configured ${expected}: ${off >= 0 ? "+" : ""}${off.toFixed(2)} %)`);
    console.log(`per 1-second bucket: min ${Math.min(...buckets)}, max ${Math.max(...buckets)}`);
    console.log(`most in any 1-second window: ${mostInWindow(starts)} claims, ${mostInWindow(handlerStarts)} handler starts (limit ${limit})`);
    console.log(`buckets: ${buckets.join(" ")}`);
  } finally {
    for (const c of children) c.kill("SIGKILL");
    await lh.pool.query(`DROP SCHEMA ${schema} CASCADE`).catch(() => {});
    await lh.close();
    await server.stop();
  }
}

/** The most of `times` (sorted, ms) in any window [t, t + 1 s) that opens at one of them. */
function mostInWindow(times: number[]): number {
  let most = 0;
  for (let i = 0, j = 0; i < times.length; i++) {
    while (j < times.length && times[j]! < times[i]! + 1_000) j++;
    most = Math.max(most, j - i);
  }
  return most;
}
