/**
 * The ceiling: Leasehold's own claim and completion statements (store.claimJobs and
 * store.completeJobs) in a tight loop straight from `pg` clients, no runtime around them:
 * what the SQL alone can do on this machine. Leasehold's drain is reported as a fraction of it.
 *
 * And the generic-plan check: the completion and heartbeat statements
 * timed as the store runs them (unnamed: planned with the real arrays every time) and as a
 * named prepared statement forced onto a generic plan, which is what `pg` would give them
 * after 5 runs if anyone ever named them. A large gap means the trap is armed.
 */
import pg from "pg";
import { claimJobs, completeJobs, extendLeases, type Queryable } from "../../packages/leasehold/src/store/index.js";
import { MAX_CLAIM_BATCH } from "../../packages/leasehold/src/worker/options.js";
import { median } from "../lib/stats.js";
import { leasehold } from "../systems/leasehold.js";
import { QUEUE } from "../systems/types.js";
import { fillQueue } from "./throughput.js";
import { urlOf, withClient, type BenchContext, type Metrics } from "./context.js";

const CONNECTIONS = [1, 2, 4];

function connect(url: string): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: url, options: `-c search_path=${leasehold.schema} -c jit=off` });
  return c.connect().then(() => c);
}

async function drainLoop(db: pg.Client, workerId: string): Promise<number> {
  let done = 0;
  for (;;) {
    const jobs = await claimJobs(db, { queues: ["default"], limit: MAX_CLAIM_BATCH, workerId, leaseMs: 30_000, tasks: [QUEUE] });
    if (jobs.length === 0) return done;
    await completeJobs(db, { workerId, jobs: jobs.map((j) => ({ id: j.id, attempt: j.attempt })) });
    done += jobs.length;
  }
}

/** Jobs/s of the bare claim+complete loop, for each number of connections, and the best. */
export async function ceilingWorkload(ctx: BenchContext): Promise<Metrics> {
  const url = urlOf(ctx, leasehold);
  const out: Metrics = {};
  for (const n of CONNECTIONS) {
    await leasehold.reset(url, "throughput");
    await fillQueue(ctx, leasehold, ctx.options.jobs);
    await withClient(url, (db) => db.query("VACUUM ANALYZE"));
    const clients = await Promise.all(Array.from({ length: n }, () => connect(url)));
    try {
      const started = performance.now();
      const counts = await Promise.all(clients.map((c, i) => drainLoop(c, `ceiling-${i}`)));
      const seconds = (performance.now() - started) / 1000;
      const total = counts.reduce((a, b) => a + b, 0);
      if (total !== ctx.options.jobs) throw new Error(`ceiling drained ${total} of ${ctx.options.jobs} jobs`);
      out[`jobsPerSecond_${n}conn`] = total / seconds;
    } finally {
      await Promise.all(clients.map((c) => c.end()));
    }
  }
  out.jobsPerSecond = Math.max(...CONNECTIONS.map((n) => out[`jobsPerSecond_${n}conn`]!));
  return out;
}

/** Runs every statement as a named prepared statement (what `pg` caches per connection). */
function prepared(db: pg.Client, name: string): Queryable {
  return { query: (text: string, values?: unknown[]) => db.query({ name, text, values }) } as Queryable;
}

const BATCH = 500;
const RUNNING = 20_000;
const REPEATS = 7;

/**
 * ms per 500-job completion and heartbeat with 20,000 running jobs and statistics from
 * before they were claimed: custom vs generic plans.
 */
export async function planCheckWorkload(ctx: BenchContext): Promise<Metrics> {
  const url = urlOf(ctx, leasehold);
  await leasehold.reset(url, "throughput");
  await fillQueue(ctx, leasehold, RUNNING);
  const db = await connect(url);
  try {
    // Statistics taken while every job waits, as after a bulk enqueue: `locked_by` looks
    // always null, which is what tempted the planner into a quadratic join for the fences.
    await db.query("VACUUM ANALYZE");
    const running: { id: string; attempt: number }[] = [];
    for (;;) {
      const jobs = await claimJobs(db, { queues: ["default"], limit: MAX_CLAIM_BATCH, workerId: "plan-check", leaseMs: 600_000, tasks: [QUEUE] });
      if (jobs.length === 0) break;
      running.push(...jobs.map((j) => ({ id: j.id, attempt: j.attempt })));
    }
    const batch = running.slice(RUNNING / 2, RUNNING / 2 + BATCH);
    const time = async (mode: "unnamed" | "generic", statement: "complete" | "heartbeat"): Promise<number> => {
      const runner: Queryable = mode === "unnamed" ? db : prepared(db, `plan_check_${statement}`);
      await db.query(`SET plan_cache_mode = ${mode === "generic" ? "force_generic_plan" : "auto"}`);
      const samples: number[] = [];
      for (let i = 0; i < REPEATS; i++) {
        await db.query("BEGIN");
        const t = performance.now();
        if (statement === "complete") await completeJobs(runner, { workerId: "plan-check", jobs: batch });
        else await extendLeases(runner, { workerId: "plan-check", leaseMs: 600_000, beats: batch });
        samples.push(performance.now() - t);
        await db.query("ROLLBACK"); // the same jobs again next time
      }
      await db.query("RESET plan_cache_mode");
      return median(samples.slice(1));
    };
    return {
      completeMsCustom: await time("unnamed", "complete"),
      completeMsGeneric: await time("generic", "complete"),
      heartbeatMsCustom: await time("unnamed", "heartbeat"),
      heartbeatMsGeneric: await time("generic", "heartbeat"),
    };
  } finally {
    await db.end();
  }
}
