/**
 * Jobs that build on jobs (docs/flows.md): graphs of no-op jobs enqueued in one call, through
 * Leasehold's `lh.enqueueFlow`, pg-boss 12's `flow()` and BullMQ's FlowProducer (fan-in and
 * chain: its flows are trees, see bullmqFlowOf), drained by one worker process at a
 * handler concurrency of 10 and of 50 with the default lease. Three shapes: fan-out (one
 * parent, 10,000 children), fan-in (10,000 parents, one child) and a chain (each job the
 * previous one's child). Measured: the time from the enqueue call to the last job done (the
 * database's last finish), jobs per second, and the step latency: each child's start minus
 * its last parent's end, both from the database's records (Leasehold: job_history started_at
 * and finished_at; pg-boss: job started_on and completed_on; BullMQ: job processed_at_ms and
 * finished_at_ms, its workers' clocks).
 *
 * pg-boss releases dependents in a background pass every `flowIntervalSeconds` (default 5 s,
 * at least 1 s), a chain advancing one step per pass: its chain is measured over fewer steps
 * (`--graph-pgboss-chain`), and its time for the full chain extrapolated from them.
 */
import pg from "pg";
import { PgBoss } from "pg-boss";
import type { FlowJob } from "bullmq";
import { nowMs, percentile, sleep } from "../lib/stats.js";
import { WorkerGroup } from "../lib/workers.js";
import { connect } from "../systems/leasehold.js";
import { BULLMQ_SCHEMA, BullPg, bullmqConnection } from "../systems/bullmq.js";
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
 * A graph as a BullMQ flow: a tree whose parents run after all their children, so a node's
 * children are the nodes it depends on. It maps when exactly one node is no one's dependency
 * (the root) and every other node is the dependency of exactly one (a job has one parent):
 * fan-in (the child is the root, the 10,000 parents its children) and the chain (the last job
 * the root, each job the parent of the one before it). Fan-out does not: its root is the
 * dependency of 10,000 jobs.
 */
export function bullmqFlowOf(nodes: Node[]): FlowJob {
  const dependents = new Map<string, number>();
  for (const n of nodes) for (const d of n.dependsOn) dependents.set(d, (dependents.get(d) ?? 0) + 1);
  if ([...dependents.values()].some((count) => count > 1))
    throw new Error("bullmq: a flow is a tree; a job that several jobs depend on has no BullMQ shape");
  const roots = nodes.filter((n) => !dependents.has(n.ref));
  if (roots.length !== 1) throw new Error(`bullmq: a flow has one root; this graph has ${roots.length}`);
  // Built bottom-up, without recursion (the chain is 1,000 deep): graphOf lists every node after those it depends on.
  const built = new Map<string, FlowJob>();
  for (const n of nodes) {
    const children = n.dependsOn.map((d) => built.get(d));
    if (children.some((c) => c === undefined)) throw new Error(`bullmq: ${n.ref} comes before a job it depends on`);
    built.set(n.ref, { name: QUEUE, queueName: QUEUE, data: {}, ...(children.length ? { children: children as FlowJob[] } : {}) } as FlowJob);
  }
  return built.get(roots[0]!.ref)!;
}

/** BullMQ's flows keep their finished jobs (no removeOnComplete), for their start and finish times. */
async function bullmqGraph(url: string): Promise<GraphSystem> {
  const flows = new BullPg.FlowProducer(bullmqConnection(url, 2));
  flows.on("error", () => {});
  const pool = new pg.Pool({ connectionString: url, max: 1 });
  const job = `${BULLMQ_SCHEMA}.job`;
  return {
    async enqueue(nodes) {
      await flows.add(bullmqFlowOf(nodes));
    },
    async unfinished() {
      const { rows } = await pool.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${job} WHERE queue = $1 AND state <> 'completed'`, [QUEUE]);
      return rows[0]!.n;
    },
    async audit() {
      // BullMQ's times are the workers' clocks in epoch ms (processedOn, finishedOn), on this machine.
      const last = await pool.query<{ ms: number }>(`SELECT max(finished_at_ms)::float8 AS ms FROM ${job} WHERE queue = $1`, [QUEUE]);
      const steps = await pool.query<{ ms: number }>(
        `SELECT (p.processed_at_ms - max(c.finished_at_ms))::float8 AS ms
           FROM ${job} AS p
           JOIN ${job} AS c ON c.parent_queue = p.queue AND c.parent_id = p.id
          WHERE p.queue = $1
          GROUP BY p.id, p.processed_at_ms`,
        [QUEUE],
      );
      return { lastEndMs: last.rows[0]!.ms, stepsMs: steps.rows.map((r) => r.ms) };
    },
    async close() {
      await pool.end();
      await flows.close();
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
  const graph =
    system.name === "pg-boss" ? await pgbossGraph(url, system.schema) : system.name === "bullmq" ? await bullmqGraph(url) : await leaseholdGraph(url);
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
        } else if (s.name === "bullmq") {
          rows.push({
            label: `bullmq c=${c}`,
            system: s.name,
            settings: `FlowProducer.add(), ${nodesText(shape, n)} as one tree (${shape === "chain" ? "the last job the root, each job the parent of the one before it" : "the child the root, the parents its children"}: a BullMQ parent runs after all its children); ${base.replace("default lease", "default lock (30 s)")}`,
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
