/**
 * Jobs that build on jobs (docs/flows.md): graphs of no-op jobs enqueued in one call, through
 * Leasehold's `lh.enqueueFlow` and pg-boss 12's `flow()`, drained by one worker process at a
 * handler concurrency of 10 and of 50 with the default lease. Three shapes: fan-out (one
 * parent, 10,000 children), fan-in (10,000 parents, one child) and a chain (each job the
 * previous one's child). Measured: the time from the enqueue call to the last job done (the
 * database's last finish), jobs per second, and the step latency: each child's start minus
 * its last parent's end, both from the database's records (Leasehold: job_history started_at
 * and finished_at; pg-boss: job started_on and completed_on).
 *
 * pg-boss releases dependents in a background pass every `flowIntervalSeconds` (default 5 s,
 * at least 1 s), a chain advancing one step per pass: its chain is measured over fewer steps
 * (`--graph-pgboss-chain`), and its time for the full chain extrapolated from them.
 */
import pg from "pg";
import { PgBoss } from "pg-boss";
import { nowMs, percentile, sleep } from "../lib/stats.js";
import { WorkerGroup } from "../lib/workers.js";
import { connect } from "../systems/leasehold.js";
import { QUEUE, type BenchSystem } from "../systems/types.js";
import { urlOf, type BenchContext, type Metrics } from "./context.js";

export type GraphShape = "fan-out" | "fan-in" | "chain";

/** A node of a graph: its ref and the refs it depends on. */
interface Node {
  ref: string;
  dependsOn: string[];
}

/** The nodes of a shape of `n` (fan-out/fan-in: n children/parents and the one other; chain: n jobs). */
export function graphOf(shape: GraphShape, n: number): Node[] {
  const many = Array.from({ length: n }, (_, i) => `n${i}`);
  if (shape === "fan-out") return [{ ref: "root", dependsOn: [] }, ...many.map((ref) => ({ ref, dependsOn: ["root"] }))];
  if (shape === "fan-in") return [...many.map((ref) => ({ ref, dependsOn: [] })), { ref: "sink", dependsOn: many }];
  return many.map((ref, i) => ({ ref, dependsOn: i === 0 ? [] : [many[i - 1]!] }));
}

/** pg-boss's flow pass: its default, and the shortest it accepts. */
export const PGBOSS_FLOW_DEFAULT_S = 5;
export const PGBOSS_FLOW_BEST_S = 1;

/** A graph stalls when no job ends for this long (longer than pg-boss's slowest pass). */
const STALL_MS = 60_000;
const TIMEOUT_MS = 20 * 60_000;

/** Per system: enqueue a graph in one call, count unfinished jobs, read the last finish and the step latencies. */
interface GraphSystem {
  enqueue(nodes: Node[]): Promise<void>;
  unfinished(): Promise<number>;
  /** The last job's end (ms since the epoch, the database's clock) and each child's start minus its last parent's end (ms). */
  audit(): Promise<{ lastEndMs: number; stepsMs: number[] }>;
  close(): Promise<void>;
}

async function leaseholdGraph(url: string): Promise<GraphSystem> {
  const lh = await connect(url);
  return {
    async enqueue(nodes) {
      await lh.enqueueFlow(nodes.map((n) => ({ ref: n.ref, task: QUEUE, payload: {}, dependsOn: n.dependsOn })));
    },
    async unfinished() {
      const { rows } = await lh.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM jobs");
      return rows[0]!.n;
    },
    async audit() {
      const last = await lh.pool.query<{ ms: number }>("SELECT (extract(epoch FROM max(finished_at)) * 1000)::float8 AS ms FROM job_history");
      const steps = await lh.pool.query<{ ms: number }>(
        `SELECT (extract(epoch FROM c.started_at - max(p.finished_at)) * 1000)::float8 AS ms
           FROM job_dependencies AS d
           JOIN job_history AS c ON c.id = d.child_id
           JOIN job_history AS p ON p.id = d.parent_id
          GROUP BY c.id, c.started_at`,
      );
      return { lastEndMs: last.rows[0]!.ms, stepsMs: steps.rows.map((r) => r.ms) };
    },
    close: () => lh.close(),
  };
}

async function pgbossGraph(url: string, schema: string): Promise<GraphSystem> {
  const b = new PgBoss({ connectionString: url, schema, supervise: false, schedule: false, migrate: false, max: 2 });
  b.on("error", () => {});
  await b.start();
  const pool = new pg.Pool({ connectionString: url, max: 1 });
  return {
    async enqueue(nodes) {
      await b.flow(nodes.map((n) => ({ ref: n.ref, name: QUEUE, data: {}, dependsOn: n.dependsOn })));
    },
    async unfinished() {
      const { rows } = await pool.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${schema}.job WHERE name = $1 AND state <> 'completed'`, [
        QUEUE,
      ]);
      return rows[0]!.n;
    },
    async audit() {
      const last = await pool.query<{ ms: number }>(`SELECT (extract(epoch FROM max(completed_on)) * 1000)::float8 AS ms FROM ${schema}.job`);
      const steps = await pool.query<{ ms: number }>(
        `SELECT (extract(epoch FROM c.started_on - max(p.completed_on)) * 1000)::float8 AS ms
           FROM ${schema}.job_dependency AS d
           JOIN ${schema}.job AS c ON c.name = d.child_name AND c.id = d.child_id
           JOIN ${schema}.job AS p ON p.name = d.parent_name AND p.id = d.parent_id
          GROUP BY c.id, c.started_on`,
      );
      return { lastEndMs: last.rows[0]!.ms, stepsMs: steps.rows.map((r) => r.ms) };
    },
    async close() {
      await pool.end();
      await b.stop({ graceful: false, timeout: 1000 });
    },
  };
}

/**
 * One graph through one system: a fresh schema, one worker process running (and idle) before
 * the enqueue, the clock from the enqueue call to the database's last finish.
 */
export async function graphWorkload(
  ctx: BenchContext,
  system: BenchSystem,
  shape: GraphShape,
  n: number,
  concurrency: number,
  flowIntervalSeconds?: number,
): Promise<Metrics> {
  const url = urlOf(ctx, system);
  await system.reset(url, "throughput");
  const graph = system.name === "pg-boss" ? await pgbossGraph(url, system.schema) : await leaseholdGraph(url);
  const nodes = graphOf(shape, n);
  const group = await WorkerGroup.start(system.name, url, { profile: "throughput", concurrency, flowIntervalSeconds }, 1, true);
  try {
    await sleep(500);
    const t0 = nowMs();
    await graph.enqueue(nodes);
    const enqueueMs = nowMs() - t0;
    let last = { left: -1, at: Date.now() };
    for (const deadline = Date.now() + TIMEOUT_MS; ; await sleep(20)) {
      const left = await graph.unfinished();
      if (left === 0) break;
      if (left !== last.left) last = { left, at: Date.now() };
      if (Date.now() - last.at > STALL_MS || Date.now() > deadline) {
        throw new Error(`${system.name}: ${left} of ${nodes.length} jobs unfinished, none ended in the last ${STALL_MS / 1000} s`);
      }
    }
    const { lastEndMs, stepsMs } = await graph.audit();
    if (group.errors.length) ctx.log(`  ${system.name} worker errors: ${group.errors.slice(0, 3).join(" | ")}`);
    const seconds = (lastEndMs - t0) / 1000;
    return {
      jobs: nodes.length,
      seconds,
      jobsPerSecond: nodes.length / seconds,
      enqueueMs,
      stepP50Ms: percentile(stepsMs, 50),
      stepP99Ms: percentile(stepsMs, 99),
    };
  } finally {
    await group.stop();
    await graph.close();
  }
}

/** A row of a graph workload's table. */
export interface GraphRow {
  label: string;
  system: string;
  settings: string;
  measure: () => Promise<Metrics>;
}

/**
 * The rows of one shape: at each handler concurrency, Leasehold, and pg-boss with its flow pass
 * at each of `--graph-pgboss-intervals` (by default its default interval and its shortest).
 * pg-boss's chain runs `pgbossChain` steps; its metrics gain `fullChainSeconds`, the measured
 * time scaled to the full chain.
 */
export function graphRows(shape: GraphShape) {
  return (ctx: BenchContext, systems: BenchSystem[]): GraphRow[] => {
    const { graphSize, graphChain, graphPgbossChain, graphPgbossIntervals, graphConcurrency } = ctx.options;
    const n = shape === "chain" ? graphChain : graphSize;
    const rows: GraphRow[] = [];
    for (const c of graphConcurrency) {
      for (const s of systems) {
        const base = `1 worker process, handler concurrency ${c}, default lease`;
        if (s.name === "leasehold") {
          rows.push({
            label: `leasehold c=${c}`,
            system: s.name,
            settings: `lh.enqueueFlow, ${nodesText(shape, n)}; ${base}`,
            measure: async () => {
              const m = await graphWorkload(ctx, s, shape, n, c);
              return shape === "chain" ? { ...m, fullChainSeconds: m.seconds! } : m;
            },
          });
        } else if (s.name === "pg-boss") {
          const steps = shape === "chain" ? Math.min(n, graphPgbossChain) : n;
          for (const interval of graphPgbossIntervals) {
            const what =
              interval === PGBOSS_FLOW_DEFAULT_S ? "default" : interval === PGBOSS_FLOW_BEST_S ? "shortest allowed" : "--graph-pgboss-intervals";
            rows.push({
              label: `pg-boss c=${c} flowInterval ${interval} s`,
              system: s.name,
              settings: `boss.flow(), ${nodesText(shape, steps)}${steps < n ? ` (time scaled to ${n})` : ""}; flowIntervalSeconds ${interval} (${what}); ${base}, batchSize ${c}, polling every 0.5 s also while LISTEN/NOTIFY is on (notifyPollingIntervalSeconds 0.5: a released dependent sends no NOTIFY)`,
              measure: async () => {
                const m = await graphWorkload(ctx, s, shape, steps, c, interval);
                return shape === "chain" ? { ...m, fullChainSeconds: (m.seconds! * n) / steps } : m;
              },
            });
          }
        }
      }
    }
    return rows;
  };
}

function nodesText(shape: GraphShape, n: number): string {
  const k = n.toLocaleString("en-US");
  return shape === "fan-out" ? `1 parent → ${k} children` : shape === "fan-in" ? `${k} parents → 1 child` : `a chain of ${k}`;
}
