/**
 * What flow control costs (docs/flow-control.md, docs/benchmarks.md): the same drain of no-op
 * jobs through an unlimited queue, a queue with a settings row that sets nothing, a fleet-wide
 * limit that never binds and per-key limits over many keys, side by side in one run, with
 * pg-boss's group concurrency on the same workloads; the price of the index every claim now
 * writes (jobs_running_idx), kept vs dropped; and how close a rate limit holds its rate
 * across worker processes, read from the audit trail.
 */
import { measureRateStarts, spread } from "../lib/rate-starts.js";
import { connect, withLeasehold } from "../systems/leasehold.js";
import { QUEUE as TASK, type BenchSystem } from "../systems/types.js";
import { DEFAULT_QUEUE } from "../../packages/leasehold/src/jobs/validate.js";
import { urlOf, withClient, type BenchContext, type Metrics } from "./context.js";
import { drainWorkload, fillQueue, type DrainSetup } from "./throughput.js";

/** A row of a workload's table; `compareTo`: the label of the row its throughput is a share of. */
export interface FlowRow {
  label: string;
  system: string;
  settings: string;
  compareTo?: string;
  measure: () => Promise<Metrics>;
}

/** The queue Leasehold's benchmark jobs go to (task `bench`, no queue named): the one the settings are for. */
const QUEUE = DEFAULT_QUEUE;

/** A fleet-wide limit far above anything one process can run: it never binds. */
export const NEVER_BINDING_LIMIT = 100_000;

/**
 * After the fill: the jobs are all in the queue the settings are for, and that queue is claimed
 * the way the row says (`flow`: through claim_flow(); otherwise the plain claim).
 */
function expectFlow(flow: boolean) {
  return (url: string) =>
    withLeasehold(url, async (lh) => {
      const { rows } = await lh.pool.query<{ queue: string; flow: boolean }>(
        `SELECT j.queue, coalesce(q.flow, false) AS flow FROM (SELECT DISTINCT queue FROM jobs) AS j LEFT JOIN queues AS q ON q.name = j.queue`,
      );
      if (rows.length !== 1 || rows[0]!.queue !== QUEUE || rows[0]!.flow !== flow) {
        throw new Error(`setup is not as labelled: expected every job in queue "${QUEUE}" with flow=${flow}, found ${JSON.stringify(rows)}`);
      }
    });
}

interface Variant {
  name: string;
  settings: string;
  setup: DrainSetup;
  /** pg-boss: its work option groupConcurrency. */
  groupConcurrency?: number;
}

/**
 * Leasehold's variants of the drain. The baseline has no `queues` row at all (every queue
 * before migration 13 looked like this); "row, nothing set" has one with every setting at its
 * default (not paused, no limit), which still takes the plain claim.
 */
function leaseholdVariants(keys: number): Variant[] {
  const setLimits = (limits: Parameters<Awaited<ReturnType<typeof connect>>["setQueueLimits"]>[1]) => (url: string) =>
    withLeasehold(url, (lh) => lh.setQueueLimits(QUEUE, limits, { create: true }));
  const k = keys.toLocaleString("en-US");
  return [
    { name: "unlimited (no queues row)", settings: "no queues row: the plain claim", setup: { verify: expectFlow(false) } },
    {
      name: "queues row, nothing set",
      settings: "a queues row: not paused, every limit null (still the plain claim)",
      setup: {
        prepare: setLimits({ concurrency: null, keyConcurrency: null, rate: null, keyRate: null, keyWeights: null }),
        verify: expectFlow(false),
      },
    },
    {
      name: `concurrency ${NEVER_BINDING_LIMIT.toLocaleString("en-US")}`,
      settings: `setQueueLimits({ concurrency: ${NEVER_BINDING_LIMIT} }): claim_flow(), a limit that never binds`,
      setup: { prepare: setLimits({ concurrency: NEVER_BINDING_LIMIT }), verify: expectFlow(true) },
    },
    {
      name: `${k} keys, no limit`,
      settings: `jobs keyed over ${k} keys (interleaved), no limit: claim_flow(), round-robin between keys`,
      setup: { keys, verify: expectFlow(true) },
    },
    {
      name: `keyConcurrency 1, ${k} keys`,
      settings: `setQueueLimits({ keyConcurrency: 1 }), jobs keyed over ${k} keys (interleaved)`,
      setup: { keys, prepare: setLimits({ keyConcurrency: 1 }), verify: expectFlow(true) },
    },
    {
      name: `keyConcurrency 5, ${k} keys`,
      settings: `setQueueLimits({ keyConcurrency: 5 }), jobs keyed over ${k} keys (interleaved)`,
      setup: { keys, prepare: setLimits({ keyConcurrency: 5 }), verify: expectFlow(true) },
    },
  ];
}

/**
 * pg-boss 12's counterparts: its `groupConcurrency` work option, counted in the database on
 * every fetch. It has no fleet-wide limit per queue (only per-process loops and batch sizes)
 * and no rate limit on starts, so those rows have no pg-boss counterpart.
 */
function pgbossVariants(keys: number): Variant[] {
  const k = keys.toLocaleString("en-US");
  return [
    { name: "unlimited (no groups)", settings: "no groups, no groupConcurrency", setup: {} },
    {
      name: `groupConcurrency 1, ${k} groups`,
      settings: `work option groupConcurrency 1, jobs in ${k} groups (interleaved)`,
      setup: { keys },
      groupConcurrency: 1,
    },
    {
      name: `groupConcurrency 5, ${k} groups`,
      settings: `work option groupConcurrency 5, jobs in ${k} groups (interleaved)`,
      setup: { keys },
      groupConcurrency: 5,
    },
  ];
}

/**
 * The cost rows: for each handler concurrency, every variant of each system, one worker
 * process, default lease. The run loop takes the rows in turn in every run, so the variants
 * alternate and drifts of the shared machine hit them alike.
 */
export function flowCostRows(ctx: BenchContext, systems: BenchSystem[]): FlowRow[] {
  const { flowConcurrency, flowJobs, flowKeys } = ctx.options;
  const rows: FlowRow[] = [];
  for (const c of flowConcurrency) {
    for (const s of systems) {
      const variants = s.name === "leasehold" ? leaseholdVariants(flowKeys) : s.name === "pg-boss" ? pgbossVariants(flowKeys) : [];
      const label = (v: Variant) => `${s.name} c=${c}: ${v.name}`;
      for (const v of variants) {
        rows.push({
          label: label(v),
          system: s.name,
          settings: `${v.settings}; 1 process, handler concurrency ${c}, default lease`,
          compareTo: v === variants[0] ? undefined : label(variants[0]!),
          measure: () =>
            drainWorkload(ctx, s, 1, { concurrency: c, groupConcurrency: v.groupConcurrency }, { ...v.setup, jobs: v.setup.jobs ?? flowJobs }),
        });
      }
    }
  }
  return rows;
}

/**
 * jobs_running_idx (queue, flow_key) WHERE state = 'running' gets an entry at every claim,
 * limited or not: the plain drain with it, and with it dropped after the migration.
 */
export function runningIndexRows(ctx: BenchContext, systems: BenchSystem[]): FlowRow[] {
  const s = systems.find((x) => x.name === "leasehold");
  if (!s) return [];
  const kept = "leasehold: jobs_running_idx kept";
  return [
    {
      label: kept,
      system: s.name,
      settings: "the schema as migrated; 1 process, the throughput settings",
      measure: () => drainWorkload(ctx, s, 1),
    },
    {
      label: "leasehold: jobs_running_idx dropped",
      system: s.name,
      settings: "DROP INDEX jobs_running_idx after the migration (the benchmark's own schema); 1 process, the throughput settings",
      compareTo: kept,
      measure: () =>
        drainWorkload(ctx, s, 1, {}, { prepare: (url) => withLeasehold(url, (lh) => lh.pool.query(`DROP INDEX ${lh.schema}.jobs_running_idx`)) }),
    },
  ];
}

const RATE_WINDOW_MS = 1_000;

/**
 * A rate limit across processes: `--rate` starts per second on one queue, `--rate-processes`
 * worker processes of handler concurrency `concurrency` each, a backlog that outlasts
 * `--rate-seconds`, handlers busy `--rate-busy-ms`. Measured by bench/lib/rate-starts.ts (as
 * bench/flow-rate.ts does): the claims' starts from the audit trail and the handlers' own
 * stamps, both on the database's clock; their rate over the measured span, the most of each in
 * any sliding 1-second window (every start opens one), and each fixed second's claims.
 */
export async function rateWorkload(ctx: BenchContext, system: BenchSystem, concurrency: number): Promise<Metrics> {
  const url = urlOf(ctx, system);
  const { rateLimit, rateSeconds, rateProcesses, rateBusyMs } = ctx.options;
  await system.reset(url, "throughput");
  await withLeasehold(url, (lh) => lh.setQueueLimits(QUEUE, { rate: { limit: rateLimit, windowMs: RATE_WINDOW_MS } }, { create: true }));
  await fillQueue(ctx, system, Math.ceil(rateLimit * rateSeconds * 1.25) + 1_000);
  await withClient(url, (db) => db.query("VACUUM ANALYZE"));
  const r = await measureRateStarts({
    url,
    schema: system.schema,
    queue: QUEUE,
    task: TASK,
    limit: rateLimit,
    windowMs: RATE_WINDOW_MS,
    seconds: rateSeconds,
    concurrency: Array.from({ length: rateProcesses }, () => concurrency),
    busyMs: rateBusyMs,
  });
  if (r.claims.length === 0) throw new Error("no attempt in the audit trail");
  const rate = r.claims.length / rateSeconds;
  const over = (n: number) => (n / rateLimit - 1) * 100;
  ctx.log(`  claims per second from the first (audit trail, database clock): ${r.perSecond.join(" ")}`);
  ctx.log(
    `  ${r.claims.length} starts in ${rateSeconds} s = ${rate.toFixed(2)}/s (${over(rate).toFixed(1)}% off ${rateLimit}/s); ` +
      `most in a sliding 1-s window: ${r.mostClaims} claims, ${r.mostHandlerStarts} handler starts (limit ${rateLimit})`,
  );
  ctx.log(`  handler start after its claim: ${spread(r.claimToHandler)}`);
  return {
    starts: r.claims.length,
    startsPerSecond: rate,
    rateErrorPct: over(rate),
    worstWindowStarts: r.mostClaims,
    worstWindowOverPct: over(r.mostClaims),
    // A window that opens mid-burst also holds the next burst's first handler starts: the
    // claims' window less the claim-to-handler time is what holds (docs/flow-control.md).
    worstHandlerWindowStarts: r.mostHandlerStarts,
    claimToHandlerP99Ms: r.claimToHandler[Math.min(r.claimToHandler.length - 1, Math.floor(0.99 * r.claimToHandler.length))] ?? NaN,
    claimToHandlerMaxMs: r.claimToHandler.at(-1) ?? NaN,
    worstFixedSecond: Math.max(...r.perSecond),
    quietestFixedSecond: Math.min(...r.perSecond),
  };
}
