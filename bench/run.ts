/**
 * `npm run bench`: one PostgreSQL, every workload through Leasehold, pg-boss, graphile-worker
 * and BullMQ's PostgreSQL backend side by side (each in a database of its own), medians of repeated runs,
 * and a report in Markdown, JSON and PNG under bench/results/.
 *
 *   npm run bench                                  # defaults: a few minutes on 2 cores
 *   npm run bench -- --only drain,latency --runs 5
 *   npm run bench -- --only crash --systems leasehold --kills 40
 *   npm run bench -- --jobs 100000 --steady-jobs 1000000 --pin-seconds 300
 *   npm run bench -- --only flow-cost --systems leasehold,pg-boss --flow-concurrency 10
 *   npm run bench -- --only graph-fan-out,graph-fan-in,graph-chain --systems leasehold,pg-boss --runs 1
 *   npm run bench -- --only durable --systems leasehold,dbos     # durable-steps, -event, -sleep
 *   npm run bench -- --only enqueue,drain,latency,recovery --systems leasehold,bullmq
 *   npm run bench -- --only drain-multi --cores shared,split       # also PostgreSQL and the workers on a core each
 */
import os from "node:os";
import path from "node:path";
import { Command, Option } from "commander";
import { recreateDatabase, dropDatabase, startServer } from "./lib/server.js";
import { assertSplit, CORE_LAYOUTS, coreSplit, type CoreLayout, type CoreSplit } from "./lib/cores.js";
import { median } from "./lib/stats.js";
import { packageVersion, REPO_ROOT } from "./lib/versions.js";
import { SYSTEMS } from "./systems/index.js";
import type { BenchSystem } from "./systems/types.js";
import type { BenchContext, BenchOptions, Metrics } from "./workloads/context.js";
import { ceilingWorkload, planCheckWorkload } from "./workloads/ceiling.js";
import { pressureWorkload, steadyWorkload } from "./workloads/endurance.js";
import { heartbeatWorkload, latencyWorkload, recoveryWorkload } from "./workloads/liveness.js";
import { crashWorkload } from "./workloads/crash.js";
import { drainWorkload, enqueueWorkload, MULTI_CONCURRENCY } from "./workloads/throughput.js";
import { RECORD_OFF } from "./workloads/record-off.js";
import { flowCostRows, rateWorkload, runningIndexRows } from "./workloads/flow.js";
import { leaseholdCancelWorkload, pgbossCancelWorkload } from "./workloads/cancel.js";
import { graphRows } from "./workloads/graph.js";
import { durableEventWorkload, durableSettings, durableSleepWorkload, durableStepsWorkload } from "./workloads/durable.js";
import { writeReport, type BenchResults, type WorkloadResult } from "./report/write.js";
import { MAX_CLAIM_BATCH } from "../packages/leasehold/src/worker/options.js";
import { BULLMQ_DEFAULT_LOCK_MS, BULLMQ_DEFAULT_STALLED_INTERVAL_MS } from "./systems/bullmq.js";
import { findNatsServer, NATS_INSTALL_HINT, NatsServer } from "../test/harness/nats-server.js";

interface Workload {
  id: string;
  title: string;
  /** Repeated `--runs` times (short ones), or once (long ones). */
  repeated: boolean;
  /** Drains whose rows run in each layout of `--cores` (shared cores, split cores). */
  coreLayouts?: true;
  /**
   * Rows of the table: one per system, or per system variant; the ceiling has its own.
   * `compareTo`: the label of the row whose throughput this one is reported as a share of.
   */
  rows(
    ctx: BenchContext,
    systems: BenchSystem[],
  ): { label: string; system: string; settings: string; compareTo?: string; measure: () => Promise<Metrics> }[];
}

const perSystem =
  (profile: "throughput" | "recovery" | "heartbeat" | "steady", measure: (ctx: BenchContext, s: BenchSystem) => Promise<Metrics>) =>
  (ctx: BenchContext, systems: BenchSystem[]) =>
    systems.map((s) => ({ label: s.name, system: s.name, settings: s.settings[profile], measure: () => measure(ctx, s) }));

/** BullMQ's recovery at its defaults: its lock (30 s) plus up to two stalled checks 30 s apart, and a margin. */
const BULLMQ_DEFAULTS_RECOVERY_TIMEOUT_S = 120;

const WORKLOADS: Workload[] = [
  { id: "enqueue", title: "1. Bulk enqueue", repeated: true, rows: perSystem("throughput", enqueueWorkload) },
  {
    id: "drain",
    title: "2a. Drain, 1 worker process",
    repeated: true,
    coreLayouts: true,
    rows: perSystem("throughput", (ctx, s) => drainWorkload(ctx, s, 1)),
  },
  {
    id: "sweep",
    title: "2d. Drain at the same handler concurrency (one worker process; graphile-worker at each local queue size tried)",
    repeated: true,
    coreLayouts: true,
    rows: (ctx, systems) =>
      ctx.options.sweep.flatMap((c) =>
        systems.flatMap((s) =>
          s.name === "graphile-worker"
            ? graphileQueueSizes(c).map((q) => ({
                label: `graphile-worker c=${c} localQueue=${q}`,
                system: s.name,
                settings: `concurrency ${c}, localQueue size ${q}, completeJobBatchDelay 0`,
                measure: () => drainWorkload(ctx, s, 1, { concurrency: c, localQueue: q }),
              }))
            : [
                {
                  label: `${s.name} c=${c}`,
                  system: s.name,
                  settings: `concurrency ${c}, otherwise its defaults`,
                  measure: () => drainWorkload(ctx, s, 1, { concurrency: c }),
                },
              ],
        ),
      ),
  },
  {
    id: "drain-multi",
    title: "2b. Drain, several worker processes (and one, side by side)",
    repeated: true,
    coreLayouts: true,
    // Each system at its best settings, then at the handler concurrency users pick (50 per
    // process; graphile-worker with its best local queue), and Leasehold's one process at that
    // concurrency in the same rounds: a fleet must drain at least as fast as one process.
    rows: (ctx, systems) => [
      ...perSystem("throughput", (c, s) => drainWorkload(c, s, ctx.options.processes))(ctx, systems),
      ...systems.map((s) => ({
        label: `${s.name} c=${MULTI_CONCURRENCY} x${ctx.options.processes}`,
        system: s.name,
        settings: `${ctx.options.processes} processes of concurrency ${MULTI_CONCURRENCY}${s.name === "graphile-worker" ? ", localQueue size 500" : ", otherwise its defaults"}`,
        measure: () => drainWorkload(ctx, s, ctx.options.processes, { concurrency: MULTI_CONCURRENCY }),
      })),
      ...systems
        .filter((s) => s.name === "leasehold")
        .map((s) => ({
          label: `${s.name} c=${MULTI_CONCURRENCY} x1`,
          system: s.name,
          settings: `1 process of concurrency ${MULTI_CONCURRENCY}, otherwise its defaults`,
          measure: () => drainWorkload(ctx, s, 1, { concurrency: MULTI_CONCURRENCY }),
        })),
      // The same three Leasehold rows with its queue keeping no record of succeeded jobs.
      ...systems
        .filter((s) => s.name === "leasehold")
        .flatMap((s) => [
          {
            label: `${s.name} (record off)`,
            system: s.name,
            settings: `${s.settings.throughput}; its queue keeps no record of succeeded jobs`,
            measure: () => drainWorkload(ctx, s, ctx.options.processes, {}, RECORD_OFF),
          },
          {
            label: `${s.name} (record off) c=${MULTI_CONCURRENCY} x${ctx.options.processes}`,
            system: s.name,
            settings: `${ctx.options.processes} processes of concurrency ${MULTI_CONCURRENCY}; no record of succeeded jobs`,
            measure: () => drainWorkload(ctx, s, ctx.options.processes, { concurrency: MULTI_CONCURRENCY }, RECORD_OFF),
          },
          {
            label: `${s.name} (record off) c=${MULTI_CONCURRENCY} x1`,
            system: s.name,
            settings: `1 process of concurrency ${MULTI_CONCURRENCY}; no record of succeeded jobs`,
            measure: () => drainWorkload(ctx, s, 1, { concurrency: MULTI_CONCURRENCY }, RECORD_OFF),
          },
        ]),
    ],
  },
  {
    id: "ceiling",
    title: "2c. Ceiling: Leasehold's claim + complete SQL in a tight loop, no runtime",
    repeated: true,
    rows: (ctx, systems) =>
      systems.some((s) => s.name === "leasehold")
        ? [
            {
              label: `bare SQL (claimJobs + completeJobs, ${MAX_CLAIM_BATCH}/batch)`,
              system: "ceiling",
              settings: "1, 2 and 4 connections; best reported",
              measure: () => ceilingWorkload(ctx),
            },
          ]
        : [],
  },
  { id: "latency", title: "3. Enqueue-to-start latency at a steady low rate", repeated: true, rows: perSystem("throughput", latencyWorkload) },
  {
    id: "recovery",
    title: "4. Recovery after kill -9 of a worker mid-job",
    repeated: true,
    rows: (ctx, systems) => [
      ...perSystem("recovery", (c, s) => recoveryWorkload(c, s))(ctx, systems),
      ...systems
        .filter((s) => s.name === "leasehold")
        .map((s) => ({
          label: "leasehold (defaults)",
          system: "leasehold-defaults",
          settings: "every setting at its default: lease 30 s, watchdog inside each worker, default backoff",
          measure: () => recoveryWorkload(ctx, s, true),
        })),
      // BullMQ at its defaults: a 30 s lock and a stalled check every 30 s, so up to a minute or
      // more; its wait is long enough to see it whatever --recovery-timeout says.
      ...systems
        .filter((s) => s.name === "bullmq")
        .map((s) => ({
          label: "bullmq (defaults)",
          system: "bullmq-defaults",
          settings: `every setting at its default: lockDuration ${BULLMQ_DEFAULT_LOCK_MS / 1000} s (renewed every ${BULLMQ_DEFAULT_LOCK_MS / 2000} s), stalledInterval ${BULLMQ_DEFAULT_STALLED_INTERVAL_MS / 1000} s, maxStalledCount 1`,
          measure: () => recoveryWorkload(ctx, s, true, Math.max(ctx.options.recoveryTimeoutSeconds, BULLMQ_DEFAULTS_RECOVERY_TIMEOUT_S)),
        })),
    ],
  },
  {
    id: "crash",
    title: "4b. Crash detection at defaults: kill -9 of a worker holding a job, many times",
    repeated: false,
    rows: (ctx, systems) =>
      systems
        .filter((s) => s.name === "leasehold")
        .map((s) => ({
          label: `leasehold (defaults, ${ctx.options.crashProcesses} processes)`,
          system: "leasehold",
          settings: `every setting at its default; ${ctx.options.kills} kills, a fresh job each, the dead process replaced each time`,
          measure: () => crashWorkload(ctx, s),
        })),
  },
  {
    id: "heartbeat",
    title: "5. Keeping long jobs alive: 4 worker processes, jobs in flight",
    repeated: false,
    rows: (ctx, systems) =>
      systems.flatMap((s) =>
        s.name === "leasehold"
          ? [
              {
                label: "leasehold (lease 30 s, beat 10 s)",
                system: s.name,
                settings: "default lease and heartbeat",
                measure: () => heartbeatWorkload(ctx, s),
              },
              { label: "leasehold (lease 3 s, beat 1 s)", system: s.name, settings: "short lease", measure: () => heartbeatWorkload(ctx, s, 3_000) },
            ]
          : [{ label: s.name, system: s.name, settings: s.settings.heartbeat, measure: () => heartbeatWorkload(ctx, s) }],
      ),
  },
  { id: "steady", title: "6. Steady state: many jobs through the queue", repeated: false, rows: perSystem("steady", steadyWorkload) },
  {
    id: "pressure",
    title: "7. Pinned snapshot: steady load while an idle transaction holds an old snapshot",
    repeated: false,
    rows: perSystem("throughput", pressureWorkload),
  },
  {
    id: "plans",
    title: "Plan check: 500-job completion and heartbeat with 20,000 running jobs, custom vs generic plan",
    repeated: false,
    rows: (ctx, systems) =>
      systems.some((s) => s.name === "leasehold")
        ? [
            {
              label: "leasehold store statements",
              system: "leasehold",
              settings: "unnamed (as the store runs them) vs named + force_generic_plan",
              measure: () => planCheckWorkload(ctx),
            },
          ]
        : [],
  },
  {
    id: "flow-cost",
    title: "8a. Flow control's cost: the same drain unlimited, with a limit that never binds, and with per-key limits",
    repeated: true,
    rows: flowCostRows,
  },
  {
    id: "flow-index",
    title: "8b. The index every claim writes for flow control (jobs_running_idx): the plain drain with it and without it",
    repeated: true,
    rows: runningIndexRows,
  },
  {
    id: "flow-rate",
    title: "8c. Rate accuracy: one queue limited to a rate, several worker processes, claims and handler starts on the database's clock",
    repeated: false,
    rows: (ctx, systems) =>
      systems
        .filter((s) => s.name === "leasehold")
        .flatMap((s) =>
          ctx.options.rateConcurrency.map((c) => ({
            label: `leasehold (${ctx.options.rateLimit}/s, ${ctx.options.rateProcesses} processes, ${ctx.options.rateSeconds} s, c=${c})`,
            system: s.name,
            settings:
              `setQueueLimits({ rate: { limit: ${ctx.options.rateLimit}, windowMs: 1000 } }); ${ctx.options.rateProcesses} processes of concurrency ${c}, ` +
              `handlers busy ${ctx.options.rateBusyMs} ms, default lease; a backlog longer than the run`,
            measure: () => rateWorkload(ctx, s, c),
          })),
        ),
  },
  {
    id: "cancel-latency",
    title: "9. Cancel-to-abort latency: a running job cancelled, time until its handler's AbortSignal fires",
    repeated: false,
    rows: (ctx, systems) =>
      systems.flatMap((s) =>
        s.name === "leasehold"
          ? [
              {
                label: "leasehold, database worker (defaults)",
                system: s.name,
                settings: "lease 30 s, heartbeat 10 s; lh.cancel, one job at a time; the cancel's NOTIFY reaches the worker's LISTEN session",
                measure: () => leaseholdCancelWorkload(ctx, s, false),
              },
              {
                label: "leasehold, remote HTTP worker (defaults)",
                system: "leasehold-remote",
                settings: "lease 30 s, heartbeat 10 s, through leasehold serve in this process; the NOTIFY answers the worker's cancel poll",
                measure: () => leaseholdCancelWorkload(ctx, s, true),
              },
            ]
          : s.name === "pg-boss"
            ? [
                {
                  label: "pg-boss (defaults)",
                  system: s.name,
                  settings: "queue without heartbeatSeconds: cancel() only sets the state; job.signal never fires (one job tried, 15 s)",
                  measure: () => pgbossCancelWorkload(ctx, s, false),
                },
                {
                  label: "pg-boss (heartbeatSeconds 10)",
                  system: s.name,
                  settings: "queue heartbeatSeconds 10 (its minimum), refreshed every 5 s: job.signal fires when a refresh finds the job gone",
                  measure: () => pgbossCancelWorkload(ctx, s, true),
                },
              ]
            : [],
      ),
  },
  {
    id: "graph-fan-out",
    title: "10a. Jobs that build on jobs: fan-out, one parent → --graph-size children (10,000), enqueued as one graph",
    repeated: true,
    rows: graphRows("fan-out"),
  },
  {
    id: "graph-fan-in",
    title: "10b. Jobs that build on jobs: fan-in, --graph-size parents (10,000) → one child, enqueued as one graph",
    repeated: true,
    rows: graphRows("fan-in"),
  },
  {
    id: "graph-chain",
    title: "10c. Jobs that build on jobs: a chain of --graph-chain jobs (1,000), each the previous one's child, enqueued as one graph",
    repeated: true,
    rows: graphRows("chain"),
  },
  {
    id: "durable-steps",
    title: "11a. Durable steps beside DBOS Transact: five-step workflows, 1 and several worker processes",
    repeated: true,
    rows: (ctx, systems) =>
      [1, ctx.options.processes].flatMap((p) =>
        durableSystems(systems).map((s) => ({
          label: `${s.name} x${p}`,
          system: s.name,
          settings: durableSettings(s, "steps", p),
          measure: () => durableStepsWorkload(ctx, s, p),
        })),
      ),
  },
  {
    id: "durable-event",
    title: "11b. Durable steps beside DBOS Transact: event-to-resume latency, one event at a time to waiting workflows",
    repeated: true,
    rows: (ctx, systems) =>
      durableSystems(systems).map((s) => ({
        label: s.name,
        system: s.name,
        settings: durableSettings(s, "event", 1),
        measure: () => durableEventWorkload(ctx, s),
      })),
  },
  {
    id: "durable-sleep",
    title: "11c. Durable steps beside DBOS Transact: sleeping workflows, the time to create them and their cost while they sleep",
    repeated: false,
    rows: (ctx, systems) =>
      durableSystems(systems).map((s) => ({
        label: s.name,
        system: s.name,
        settings: durableSettings(s, "sleep", ctx.options.processes),
        measure: () => durableSleepWorkload(ctx, s),
      })),
  },
];

type Row = ReturnType<Workload["rows"]>[number] & { cores?: CoreLayout };

/**
 * A workload's rows in each layout of `--cores`. Shared only (the default): its rows as they
 * are. Otherwise each row once per layout, side by side in every run, labelled "(shared cores)"
 * or "(split cores)"; a split row pins the server and this process (and so the workers it
 * forks) before it measures, checks at the end of its drain that they stayed, and unpins after.
 */
function withCoreLayouts(w: Workload, ctx: BenchContext, systems: BenchSystem[], split: CoreSplit | undefined): Row[] {
  const layouts = w.coreLayouts ? options.cores! : ["shared" as const];
  if (layouts.length === 1 && layouts[0] === "shared") return w.rows(ctx, systems);
  const perLayout = layouts.map((cores) => {
    const suffix = ` (${cores} cores)`;
    const layoutCtx: BenchContext =
      cores === "split" ? { ...ctx, checkCores: (workerPids) => assertSplit(split!, ctx.server.pid!, workerPids) } : ctx;
    return w.rows(layoutCtx, systems).map((r): Row => ({
      ...r,
      label: r.label + suffix,
      ...(r.compareTo ? { compareTo: r.compareTo + suffix } : {}),
      cores,
      measure:
        cores === "split"
          ? async () => {
              const unpin = split!.pin();
              try {
                return await r.measure();
              } finally {
                unpin();
              }
            }
          : r.measure,
    }));
  });
  // Row by row, each layout in turn: drifts of the shared machine hit both alike.
  return perLayout[0]!.flatMap((_, i) => perLayout.map((rows) => rows[i]!));
}

/** The systems with durable workflows: Leasehold's durable steps and DBOS Transact. */
function durableSystems(systems: BenchSystem[]): BenchSystem[] {
  return systems.filter((s) => s.name === "leasehold" || s.name === "dbos");
}

/** graphile-worker's local queue must hold at least its concurrency; sizes tried for its best. */
function graphileQueueSizes(concurrency: number): number[] {
  return [...new Set([concurrency, Math.max(concurrency, 500), Math.max(concurrency, 2_000)])];
}

const int = (v: string) => {
  const n = Number(v);
  if (!Number.isInteger(n) || n <= 0) throw new Error(`expected a positive integer, got "${v}"`);
  return n;
};

const program = new Command("bench")
  .description("Leasehold vs pg-boss vs graphile-worker vs BullMQ's PostgreSQL backend (and DBOS Transact for durable steps) on one PostgreSQL")
  .option("--only <workloads>", `comma-separated: ${WORKLOADS.map((w) => w.id).join(", ")}; or a group: durable, graph, flow`)
  .option("--systems <names>", `comma-separated: ${Object.keys(SYSTEMS).join(", ")}`)
  .option("--jobs <n>", "jobs to enqueue and to drain", int, 100_000)
  .option("--batch <n>", "jobs per enqueue call", int, 1_000)
  .option("--runs <n>", "repetitions of the short workloads (medians reported)", int, 3)
  .option("--processes <n>", "worker processes for the multi-process drain", int, 4)
  .option("--latency-rate <n>", "jobs/s in the latency workload", int, 200)
  .option("--latency-seconds <n>", "seconds of the latency workload", int, 10)
  .option("--heartbeat-jobs <n>", "long jobs in flight in the heartbeat workload", int, 1_000)
  .option("--heartbeat-seconds <n>", "measuring window of the heartbeat workload", int, 20)
  .option("--recovery-timeout <n>", "seconds to wait for a killed worker's job to run again", int, 20)
  .option("--kills <n>", "kill -9s in the crash workload (p50/p99 over them)", int, 20)
  .option("--crash-processes <n>", "worker processes in the crash workload", int, 3)
  .option("--sweep <list>", "handler concurrencies of the sweep", "10,50,1000")
  .option("--steady-jobs <n>", "jobs through the queue in the steady-state workload", int, 1_000_000)
  .option("--pressure-rate <n>", "jobs/s during the pinned-snapshot workload", int, 500)
  .option("--pressure-seconds <n>", "seconds before and after the pinned snapshot", int, 10)
  .option("--pin-seconds <n>", "seconds the snapshot stays pinned (the issue asks for minutes: try 300)", int, 30)
  .option("--flow-jobs <n>", "jobs per drain in the flow-control cost workload", int, 50_000)
  .option("--flow-concurrency <list>", "handler concurrencies of the flow-control cost workload", "10,50")
  .option("--flow-keys <n>", "keys (pg-boss: groups) the keyed drains spread their jobs over", int, 1_000)
  .option("--rate <n>", "starts per second allowed in the rate workload", int, 50)
  .option("--rate-seconds <n>", "seconds the rate workload measures", int, 60)
  .option("--rate-processes <n>", "worker processes in the rate workload", int, 4)
  .option("--rate-concurrency <list>", "handler concurrencies of the rate workload's processes, a row each", "10,50")
  .option("--rate-busy-ms <n>", "how long each handler of the rate workload runs (±50%)", (v: string) => (v === "0" ? 0 : int(v)), 0)
  .option("--cancels <n>", "running jobs cancelled one at a time in the cancel-latency workload", int, 100)
  .option("--graph-size <n>", "children of the fan-out, parents of the fan-in", int, 10_000)
  .option("--graph-chain <n>", "jobs in the chain", int, 1_000)
  .option("--graph-pgboss-chain <n>", "steps of pg-boss's chain (one per flow pass: its time is scaled to --graph-chain)", int, 20)
  .option("--graph-pgboss-intervals <list>", "pg-boss's flowIntervalSeconds in the graph workloads, a row each (its default, its shortest)", "5,1")
  .option("--graph-concurrency <list>", "handler concurrencies of the graph workloads", "10,50")
  .option("--durable-workflows <n>", "five-step workflows per drain in the durable-steps workload", int, 5_000)
  .option("--durable-waiters <n>", "waiting workflows resumed one at a time in the durable-event workload", int, 200)
  .option("--durable-sleepers <n>", "sleeping workflows in the durable-sleep workload", int, 100_000)
  .option("--durable-idle-seconds <n>", "seconds the durable-sleep workload watches them sleep", int, 10)
  .option(
    "--cores <layouts>",
    "where the drains (drain, drain-multi, sweep) run, a row each: shared (every process on every core), split (PostgreSQL on one core, the workers and the bench on another; needs taskset)",
    "shared",
  )
  .option("--out <dir>", "where to write the report", path.join(REPO_ROOT, "bench", "results"))
  .option("--name <name>", "file name stem of the report", "latest")
  .addOption(new Option("--database-url <url>", "use this server instead of starting one (tests)").env("BENCH_DATABASE_URL"))
  .option("--database-suffix <suffix>", "appended to each system's database name (runs that share a server: the smoke tests)", (v: string) => {
    if (!/^[a-z0-9_]{1,20}$/.test(v)) throw new Error(`expected 1-20 of a-z, 0-9 and _, got "${v}"`);
    return v;
  })
  .option("--keep-databases", "leave the benchmark databases behind");

program.parse();
const o = program.opts();
const options: BenchOptions = {
  jobs: o.jobs,
  batch: o.batch,
  runs: o.runs,
  processes: o.processes,
  latencyRate: o.latencyRate,
  latencySeconds: o.latencySeconds,
  heartbeatJobs: o.heartbeatJobs,
  heartbeatSeconds: o.heartbeatSeconds,
  recoveryTimeoutSeconds: o.recoveryTimeout,
  kills: o.kills,
  crashProcesses: o.crashProcesses,
  steadyJobs: o.steadyJobs,
  sweep: String(o.sweep)
    .split(",")
    .map((v) => int(v.trim())),
  pressureRate: o.pressureRate,
  pressureSeconds: o.pressureSeconds,
  pinSeconds: o.pinSeconds,
  flowJobs: o.flowJobs,
  flowConcurrency: String(o.flowConcurrency)
    .split(",")
    .map((v) => int(v.trim())),
  flowKeys: o.flowKeys,
  rateLimit: o.rate,
  rateSeconds: o.rateSeconds,
  rateProcesses: o.rateProcesses,
  rateConcurrency: String(o.rateConcurrency)
    .split(",")
    .map((v) => int(v.trim())),
  rateBusyMs: o.rateBusyMs,
  cancels: o.cancels,
  graphSize: o.graphSize,
  graphChain: o.graphChain,
  graphPgbossChain: o.graphPgbossChain,
  graphPgbossIntervals: String(o.graphPgbossIntervals)
    .split(",")
    .map((v) => int(v.trim())),
  graphConcurrency: String(o.graphConcurrency)
    .split(",")
    .map((v) => int(v.trim())),
  durableWorkflows: o.durableWorkflows,
  durableWaiters: o.durableWaiters,
  durableSleepers: o.durableSleepers,
  durableIdleSeconds: o.durableIdleSeconds,
  cores: [
    ...new Set(
      String(o.cores)
        .split(",")
        .map((v) => v.trim()),
    ),
  ].map((v) => {
    if (!(CORE_LAYOUTS as readonly string[]).includes(v)) {
      console.error(`--cores: unknown layout "${v}"; choose from ${CORE_LAYOUTS.join(", ")} (or both: shared,split)`);
      process.exit(2);
    }
    return v as CoreLayout;
  }),
};

/**
 * The items named in `names`. With `groups`, a name that is no item's key names every item
 * whose key starts with it and a dash: `--only durable` runs durable-steps, -event and -sleep.
 */
const pick = <T>(all: T[], names: string | undefined, key: (t: T) => string, what: string, groups = false): T[] => {
  if (!names) return all;
  const wanted = String(names)
    .split(",")
    .map((n) => n.trim())
    .filter(Boolean);
  const named = (n: string) => {
    const exact = all.filter((t) => key(t) === n);
    return exact.length || !groups ? exact : all.filter((t) => key(t).startsWith(`${n}-`));
  };
  for (const n of wanted) {
    if (named(n).length === 0) {
      console.error(`unknown ${what} "${n}"; choose from ${all.map(key).join(", ")}`);
      process.exit(2);
    }
  }
  const chosen = new Set(wanted.flatMap(named));
  return all.filter((t) => chosen.has(t));
};
const workloads = pick(WORKLOADS, o.only, (w) => w.id, "workload", true);
let systems = pick(Object.values(SYSTEMS), o.systems, (s) => s.name, "system");

const log = (m: string) => console.log(`[${new Date().toISOString().slice(11, 19)}] ${m}`);
// NATS dispatch rows (leasehold-nats) need a nats-server: one of our own, or the rows are left out.
let nats: NatsServer | undefined;
if (systems.some((s) => s.name === "leasehold-nats") && workloads.some((w) => SYSTEMS["leasehold-nats"]!.workloads!.includes(w.id))) {
  if (findNatsServer()) {
    nats = await NatsServer.start();
    process.env.BENCH_NATS_URL = nats.url;
    log(`nats-server at ${nats.url} (leasehold-nats rows)`);
  } else {
    log(`leasehold-nats rows left out: no nats-server; ${NATS_INSTALL_HINT}`);
    systems = systems.filter((s) => s.name !== "leasehold-nats");
  }
}
const coresWanted = options.cores!.includes("split") && workloads.some((w) => w.coreLayouts);
if (coresWanted && o.databaseUrl) {
  console.error("--cores split pins PostgreSQL's processes: it needs the server the bench starts itself, not --database-url");
  process.exit(2);
}
const server = await startServer(o.databaseUrl, o.databaseSuffix);
log(`PostgreSQL ${server.version} (${o.databaseUrl ? "given" : "embedded, started for this run"})`);
let split: CoreSplit | undefined;
if (coresWanted) {
  try {
    split = coreSplit(server.pid);
  } catch (err) {
    console.error((err as Error).message);
    await server.stop();
    await nats?.dispose();
    process.exit(2);
  }
  log(`split cores: PostgreSQL on cpu ${split.serverCpu}; the workers and this process (producer, samplers) on cpu ${split.clientCpu}`);
}
// Ctrl-C: stop the server we started instead of leaving it running.
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.once(signal, () => {
    log(`${signal}: stopping PostgreSQL`);
    void server
      .stop()
      .then(() => nats?.dispose())
      .finally(() => process.exit(130));
  });
}
const ctx: BenchContext = { server, options, log };
const startedAt = new Date();
const results: BenchResults = {
  command: `npm run bench${process.argv.length > 2 ? " -- " + process.argv.slice(2).join(" ") : ""}`,
  startedAt: startedAt.toISOString(),
  finishedAt: "",
  machine: {
    cpus: `${os.cpus().length} x ${os.cpus()[0]?.model ?? "?"}`,
    memoryGB: Math.round(os.totalmem() / 2 ** 30),
    os: `${os.type()} ${os.release()}`,
    node: process.version,
    postgres: server.version,
    postgresSettings: server.settings,
  },
  versions: Object.fromEntries(systems.map((s) => [s.name, s.version])),
  settings: Object.fromEntries(systems.map((s) => [s.name, s.settings])),
  options,
  workloads: [],
};
let failed = false;
try {
  for (const s of systems) await recreateDatabase(server.adminUrl, server.database(s.database));
  for (const w of workloads) {
    const rows = withCoreLayouts(
      w,
      ctx,
      systems.filter((s) => !s.workloads || s.workloads.includes(w.id)),
      split,
    );
    const runs = w.repeated ? options.runs : 1;
    const result: WorkloadResult = {
      id: w.id,
      title: w.title,
      runs,
      rows: rows.map((r) => ({
        label: r.label,
        system: r.system,
        settings: r.settings,
        ...(r.compareTo ? { compareTo: r.compareTo } : {}),
        ...(r.cores ? { cores: r.cores } : {}),
        runs: [],
        median: {},
        errors: [],
      })),
    };
    // Systems take turns within each run, so slow drifts of the shared machine hit all alike.
    for (let run = 0; run < runs; run++) {
      for (const [i, row] of rows.entries()) {
        log(`${w.id} run ${run + 1}/${runs}: ${row.label}`);
        try {
          const m = await row.measure();
          result.rows[i]!.runs.push(m);
          log(
            `  ${Object.entries(m)
              .map(([k, v]) => `${k}=${Number.isFinite(v) ? +v.toFixed(2) : v}`)
              .join(" ")}`,
          );
        } catch (err) {
          failed = true;
          result.rows[i]!.errors.push(String((err as Error)?.message ?? err));
          log(`  FAILED: ${String((err as Error)?.stack ?? err)}`);
        }
      }
    }
    for (const row of result.rows) {
      const keys = [...new Set(row.runs.flatMap((m) => Object.keys(m)))];
      row.median = Object.fromEntries(
        keys.map((k) => {
          const values = row.runs.map((m) => m[k]).filter((v): v is number => v !== undefined);
          const finite = values.filter(Number.isFinite);
          // NaN (say, not recovered) in most runs stays NaN.
          return [k, finite.length * 2 > values.length ? median(finite) : NaN];
        }),
      );
    }
    results.workloads.push(result);
  }
} finally {
  results.finishedAt = new Date().toISOString();
  if (!o.keepDatabases) for (const s of systems) await dropDatabase(server.adminUrl, server.database(s.database)).catch(() => {});
  await server.stop();
  await nats?.dispose();
}
const files = await writeReport(results, o.out, o.name);
log(`report: ${files.join(", ")}`);
log(`leasehold ${packageVersion()}; took ${Math.round((Date.parse(results.finishedAt) - startedAt.getTime()) / 1000)} s`);
process.exit(failed ? 1 : 0);
