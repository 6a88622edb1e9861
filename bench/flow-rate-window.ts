/**
 * What a long rate window costs a claim (docs/flow-control.md): a queue limited per day, its
 * claims timed with EXPLAIN ANALYZE of claim_flow() when the window holds no start, and again
 * after `--starts` claims of one job each (each one start in the window).
 *
 *   node --conditions=source --import tsx bench/flow-rate-window.ts [--starts 8000] [--samples 21]
 *
 * Uses DATABASE_URL (a schema of its own, dropped at the end), or starts a throwaway server.
 */
import { randomBytes } from "node:crypto";
import { parseArgs } from "node:util";
import pino from "pino";
import { Leasehold } from "../packages/leasehold/src/client.js";
import { startServer } from "./lib/server.js";

const { values } = parseArgs({ options: { starts: { type: "string", default: "8000" }, samples: { type: "string", default: "21" } } });
const starts = Number(values.starts);
const samples = Number(values.samples);
const server = await startServer(process.env.DATABASE_URL);
const schema = `flow_window_${randomBytes(4).toString("hex")}`;
const lh = await Leasehold.connect({ databaseUrl: server.adminUrl, schema, logger: pino({ level: "silent" }) });
const claim = "SELECT * FROM claim_flow('daily', 1, 'bench', 30000, '{quick}')";

/** Median execution time (ms) of `samples` claims of one job, as EXPLAIN ANALYZE reports it, and of the round trip. */
async function timeClaims(): Promise<{ explained: number; roundTrip: number }> {
  const explained: number[] = [];
  const roundTrip: number[] = [];
  for (let i = 0; i < samples; i++) {
    const { rows } = await lh.pool.query<{ "QUERY PLAN": [{ "Execution Time": number }] }>(`EXPLAIN (ANALYZE, FORMAT JSON) ${claim}`);
    explained.push(rows[0]!["QUERY PLAN"][0]["Execution Time"]);
    const t0 = performance.now();
    await lh.pool.query(claim);
    roundTrip.push(performance.now() - t0);
  }
  const median = (xs: number[]) => xs.sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
  return { explained: median(explained), roundTrip: median(roundTrip) };
}

try {
  await lh.setQueueLimits("daily", { rate: { limit: 1_000_000, windowMs: 86_400_000 } }, { create: true });
  const jobs = starts + 4 * samples + 10;
  for (let i = 0; i < jobs; i += 5_000) {
    await lh.enqueueMany(Array.from({ length: Math.min(5_000, jobs - i) }, () => ({ task: "quick", queue: "daily" })));
  }
  const empty = await timeClaims();
  for (let i = 0; i < starts; i++) {
    await lh.pool.query(claim);
    // Its jobs done (they would end as it goes on): only the window's starts accumulate.
    if (i % 500 === 499) await lh.pool.query("DELETE FROM jobs WHERE state = 'running'");
  }
  await lh.pool.query("DELETE FROM jobs WHERE state = 'running'");
  await lh.pool.query("VACUUM ANALYZE jobs");
  const full = await timeClaims();
  console.log(`rate limit 1000000 per day; claims of one job; median of ${samples} (ms): EXPLAIN ANALYZE of claim_flow / round trip`);
  console.log(`0 to ${2 * samples} starts in the window: ${empty.explained.toFixed(2)} / ${empty.roundTrip.toFixed(2)}`);
  console.log(`${starts + 2 * samples} to ${starts + 4 * samples}: ${full.explained.toFixed(2)} / ${full.roundTrip.toFixed(2)}`);
} finally {
  await lh.pool.query(`DROP SCHEMA ${schema} CASCADE`).catch(() => {});
  await lh.close();
  await server.stop();
}
