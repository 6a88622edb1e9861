/** Settings of a chaos run: the short CI run's defaults, and what the CLI can change. */

export const FAULT_KINDS = [
  "kill", // kill -9 of a worker mid-job, restarted by the supervisor
  "zombie", // SIGSTOP of a worker for longer than the lease, then SIGCONT
  "partition", // a worker's connections cut or stalled at its proxy, then restored
  "reset", // a connection blip: every connection of a worker reset, none accepted for 2-5 s, then healed
  "pg_restart", // fast shutdown and start of PostgreSQL
  "terminate_storm", // pg_terminate_backend against the workers' connections
  "watchdog_kill", // kill -9 of a watchdog-only process, restarted
  "idle_txn", // a session holds an idle transaction (pins the xmin horizon)
  "burst", // enqueue at 1.5x the measured drain rate
  "hang", // a handler stops making progress (never settles) while its process keeps beating
  "pause", // the main queue paused for 3-6 s, then resumed (flow control: it must start nothing meanwhile)
  "flow_kill", // kill -9 of the worker holding the probe queue's only slot while another job waits for it
  "nats_restart", // --dispatch nats: nats-server stopped (SIGKILL or SIGTERM) and started again
  "nats_partition", // --dispatch nats: one worker's NATS connection cut or stalled at its proxy (its database stays reachable)
] as const;
export type Dispatch = "polling" | "nats";

/** The fault kinds a run injects: the NATS ones only with --dispatch nats. */
export function faultKindsFor(dispatch: Dispatch): FaultKind[] {
  return FAULT_KINDS.filter((k) => dispatch === "nats" || !k.startsWith("nats_"));
}
export type FaultKind = (typeof FAULT_KINDS)[number];

export interface ChaosOptions {
  /** How workers learn of jobs: LISTEN/NOTIFY polling, or NATS JetStream (docs/nats.md) with NATS faults. */
  dispatch: Dispatch;
  /** "off": the run's queues keep no record of succeeded jobs (chaos/record-off.ts). */
  record: "on" | "off";
  jobs: number;
  workers: number;
  watchdogs: number;
  concurrency: number;
  leaseMs: number;
  heartbeatMs: number;
  watchdogIntervalMs: number;
  /** The chaos task's progress timeout: a hung handler ends as stalled this long after its last progress. */
  progressTimeoutMs: number;
  /** Faults are injected for this long while the producer enqueues; then the queue drains. */
  faultWindowMs: number;
  /** Mean pause between two faults. */
  faultEveryMs: number;
  /** How long the idle transaction is held. */
  idleTxnMs: number;
  /** Give up waiting for the queue to drain after this long (the run then fails). */
  drainTimeoutMs: number;
  /** Retry budget of each job; a few "poison" jobs always fail and end dead. */
  maxAttempts: number;
  seed: number;
  /** Where reports and process logs go. */
  outDir: string;
  /** Print progress lines. */
  verbose: boolean;
}

export const SHORT_RUN: Omit<ChaosOptions, "outDir" | "seed"> = {
  dispatch: "polling",
  record: "on",
  jobs: 2_000,
  workers: 4,
  watchdogs: 2,
  concurrency: 8,
  leaseMs: 2_500,
  heartbeatMs: 600,
  watchdogIntervalMs: 500,
  progressTimeoutMs: 1_500,
  faultWindowMs: 50_000,
  faultEveryMs: 1_800,
  idleTxnMs: 20_000,
  drainTimeoutMs: 90_000,
  maxAttempts: 20,
  verbose: false,
};

/** Long runs scale the fault window with the job count (~80 jobs/s drain on 2 cores). */
export function optionsFor(partial: Partial<ChaosOptions> & { outDir: string }): ChaosOptions {
  const jobs = partial.jobs ?? SHORT_RUN.jobs;
  const scale = Math.max(1, jobs / SHORT_RUN.jobs);
  return {
    ...SHORT_RUN,
    faultWindowMs: Math.round(SHORT_RUN.faultWindowMs * scale),
    idleTxnMs: scale > 1 ? 120_000 : SHORT_RUN.idleTxnMs,
    // A ceiling only: the drain also stops after a minute without progress (harness.ts).
    drainTimeoutMs: Math.round(SHORT_RUN.drainTimeoutMs * scale),
    seed: Date.now() % 1_000_000,
    ...partial,
  };
}

/** A small seeded generator (mulberry32), so a run's choices can be replayed from its seed. */
export function seededRandom(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** How often an idle worker asks for jobs besides being woken (worker-process.ts). */
export const WORKER_POLL_MS = 500;

/** The schema the chaos run uses in its own database, and the downstream table. */
export const CHAOS_SCHEMA = "chaos";
export const RESULTS_TABLE = "downstream_results";
/** Rows handlers write through ctx.transaction: exactly one per succeeded job, none for the others. */
export const TX_EFFECTS_TABLE = "tx_effects";
/** Durable jobs' step executions (one row each time a plain step's body begins) and their transactional step's rows. */
export const STEP_RUNS_TABLE = "step_runs";
export const STEP_EFFECTS_TABLE = "step_effects";
