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
 * The measure is bench/lib/rate-starts.ts, shared with `npm run bench -- --only flow-rate`.
 * Uses DATABASE_URL (a schema of its own, dropped at the end), or starts a throwaway server.
 */
import { randomBytes } from "node:crypto";
import { parseArgs } from "node:util";
import pino from "pino";
import { Leasehold } from "../packages/leasehold/src/client.js";
import { measureRateStarts, spread } from "./lib/rate-starts.js";
import { startServer } from "./lib/server.js";

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
const lh = await Leasehold.connect({ databaseUrl: url, schema, logger: pino({ level: "silent" }) });
try {
  await lh.setQueueLimits("rate", { rate: { limit, windowMs: 1_000 } }, { create: true });
  const backlog = limit * (seconds + 10);
  for (let i = 0; i < backlog; i += 5_000) {
    await lh.enqueueMany(Array.from({ length: Math.min(5_000, backlog - i) }, () => ({ task: "quick", queue: "rate" })));
  }
  const r = await measureRateStarts({
    url,
    schema,
    queue: "rate",
    task: "quick",
    limit,
    windowMs: 1_000,
    seconds,
    concurrency: Array.from({ length: processes }, (_, i) => Number(values.concurrency ?? (i % 2 === 0 ? 10 : 50))),
    busyMs: Number(values["busy-ms"]),
  });
  const expected = limit * seconds;
  const off = ((r.claims.length - expected) / expected) * 100;
  const shape = values.concurrency ? `concurrency ${values.concurrency}` : "concurrency 10 and 50";
  console.log(`rate limit ${limit}/s, ${processes} worker processes (${shape}), handlers busy ${values["busy-ms"]} ms, ${seconds} s`);
  console.log(`starts: ${r.claims.length} (configured ${expected}: ${off >= 0 ? "+" : ""}${off.toFixed(2)} %)`);
  console.log(`per 1-second bucket: min ${Math.min(...r.perSecond)}, max ${Math.max(...r.perSecond)}`);
  console.log(`most in any 1-second window: ${r.mostClaims} claims, ${r.mostHandlerStarts} handler starts (limit ${limit})`);
  console.log(`handler start after its claim: ${spread(r.claimToHandler)}`);
  console.log(`buckets: ${r.perSecond.join(" ")}`);
} finally {
  await lh.pool.query(`DROP SCHEMA ${schema} CASCADE`).catch(() => {});
  await lh.close();
  await server.stop();
}
