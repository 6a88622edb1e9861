/** What every workload gets: the server, its options, and a way to talk to a system's database. */
import pg from "pg";
import type { CoreLayout } from "../lib/cores.js";
import type { BenchServer } from "../lib/server.js";
import type { BenchSystem } from "../systems/types.js";

export interface BenchOptions {
  /** Jobs for the enqueue and drain workloads (and the ceiling). */
  jobs: number;
  /** Jobs per enqueue call. */
  batch: number;
  /** Repetitions of the short workloads; medians are reported. */
  runs: number;
  /** Worker processes for the multi-process drain. */
  processes: number;
  /** Enqueue rate (jobs/s) and duration (s) of the latency workload. */
  latencyRate: number;
  latencySeconds: number;
  /** Jobs in flight and measuring window (s) of the heartbeat workload. */
  heartbeatJobs: number;
  heartbeatSeconds: number;
  /** Seconds to wait for a killed worker's job to run again. */
  recoveryTimeoutSeconds: number;
  /** Kills in the crash workload, and its worker processes. */
  kills: number;
  crashProcesses: number;
  /** Jobs through the queue in the steady-state workload. */
  steadyJobs: number;
  /** Handler concurrencies of the sweep: every system drains at each. */
  sweep: number[];
  /** Pinned-snapshot workload: rate (jobs/s) and seconds before, during and after the pin. */
  pressureRate: number;
  pressureSeconds: number;
  pinSeconds: number;
  /** Flow-control cost: jobs per drain, handler concurrencies, keys the keyed drains spread over. */
  flowJobs: number;
  flowConcurrency: number[];
  flowKeys: number;
  /** Rate accuracy: starts per second allowed, seconds measured, worker processes, their handler concurrencies (a row each), handlers' run time. */
  rateLimit: number;
  rateSeconds: number;
  rateProcesses: number;
  rateConcurrency: number[];
  rateBusyMs: number;
  /** Cancel-to-abort latency: jobs cancelled one at a time while running (pg-boss with a heartbeat: at most 20). */
  cancels: number;
  /** Jobs that build on jobs: fan-out/fan-in width, chain length (pg-boss: its steps), handler concurrencies. */
  graphSize: number;
  graphChain: number;
  graphPgbossChain: number;
  /** pg-boss's flowIntervalSeconds in its graph rows, one row each (its default 5 s and its shortest 1 s). */
  graphPgbossIntervals: number[];
  graphConcurrency: number[];
  /** Durable steps beside DBOS: five-step workflows drained, waiters resumed one by one, sleepers and the idle window watched (s). */
  durableWorkflows: number;
  durableWaiters: number;
  durableSleepers: number;
  durableIdleSeconds: number;
  /** Where the drains run: every process on every core, and/or the server and the workers on a core each (bench/lib/cores.ts). */
  cores?: CoreLayout[];
}

export interface BenchContext {
  server: BenchServer;
  options: BenchOptions;
  log(message: string): void;
  /**
   * Split-core rows only: throws unless the server and these worker processes ran on their
   * own cores. A drain calls it with its workers' pids before it stops them.
   */
  checkCores?(workerPids: number[]): void;
}

/** One run's measurements: metric name to number (NaN: not measured / not recovered). */
export type Metrics = Record<string, number>;

export function urlOf(ctx: BenchContext, system: BenchSystem): string {
  return ctx.server.urlFor(system.database);
}

export async function withClient<T>(url: string, fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    return await fn(c);
  } finally {
    await c.end();
  }
}

/** `count` payloads, built by `make`. */
export function payloads<T>(count: number, make: (i: number) => T): T[] {
  return Array.from({ length: count }, (_, i) => make(i));
}
