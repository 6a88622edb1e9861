/**
 * What the benchmark needs from each queue: reset its tables, enqueue in bulk through its
 * own batch API, count unfinished jobs, and (in a worker process) run handlers with the
 * settings of a profile. Each system lives in a database of its own on the shared server.
 */

/** A job's payload. `t`: enqueue time (ms, for latency); `sleepMs`: a long job. */
export interface Payload {
  t?: number;
  sleepMs?: number;
  /** Ask the worker process to announce this job's start (recovery workload). */
  track?: string;
  /** `sleepMs` holds for the first attempt only; a retry ends at once (Leasehold, crash workload). */
  firstAttemptOnly?: boolean;
}

/**
 * Settings profiles. "throughput": the system's best settings for draining no-op jobs
 * (also used for latency); "recovery": its shortest supported lease/lock; "heartbeat":
 * long jobs in flight with the liveness setting of "recovery" where the system has one.
 */
export type Profile = "throughput" | "recovery" | "heartbeat" | "steady";

export interface WorkerSpec {
  profile: Profile;
  /** Jobs in flight per process (heartbeat workload); otherwise the profile's own setting. */
  concurrency?: number;
  /** Leasehold only: run its worker with this lease (ms), heartbeat at a third. */
  leaseMs?: number;
  /** graphile-worker only: its local queue size (jobs fetched ahead; at least the concurrency). */
  localQueue?: number;
  /** Leasehold and BullMQ: the worker at every default (recovery at defaults). */
  defaults?: boolean;
  /**
   * pg-boss only: its `groupConcurrency` work option (at most this many active jobs per group,
   * counted in the database). Leasehold's per-key limit is a queue setting instead, set before
   * its workers start (bench/workloads/flow.ts).
   */
  groupConcurrency?: number;
  /**
   * pg-boss only: its `flowIntervalSeconds` constructor option, how often its background pass
   * releases the dependents of completed flow jobs (default 5 s, at least 1 s).
   */
  flowIntervalSeconds?: number;
  /**
   * Durable workflows instead of plain jobs (bench/workloads/durable.ts): the shape each
   * workflow has. Leasehold's side runs as the worker system "leasehold-durable".
   */
  durable?: DurableShape;
}

/**
 * The durable workloads' workflows, the same for every system. "steps": five no-op steps (the
 * first reports the workflow's start); "event": a step that reports it is ready, a wait for its
 * event, a step that reports the event's send time; "sleep": a durable sleep far in the future.
 */
export type DurableShape = "steps" | "event" | "sleep";

export interface Producer {
  /**
   * Enqueues in one batch. `keys[i]`: job i's flow-control key (Leasehold's enqueue option
   * `key`, pg-boss's `group.id`); a system without keys refuses them rather than drop them.
   */
  enqueue(payloads: Payload[], keys?: string[]): Promise<void>;
  /** Jobs not yet finished (waiting, running, or retrying). */
  pending(): Promise<number>;
  close(): Promise<void>;
}

export interface RunningWorker {
  stop(): Promise<void>;
}

export interface BenchSystem {
  name: string;
  version: string;
  /** Database this system's tables live in. */
  database: string;
  /** Schema holding its tables (for dead tuples and sizes). */
  schema: string;
  /** The settings each profile uses, for the report. */
  settings: Record<Profile, string>;
  /** Only these workloads (by id) measure this system; default all. */
  workloads?: string[];
  /**
   * At most this many jobs per drain: a system ~20x slower than the others would otherwise take
   * most of the run. Its rate is still measured over 10 s or more; its settings say so.
   */
  maxDrainJobs?: number;
  /** What happens after kill -9, if the system cannot recover by itself. */
  recoveryNote?: string;
  /** Drops and re-creates the system's tables for a fresh run. */
  reset(url: string, profile: Profile): Promise<void>;
  producer(url: string, profile: Profile): Promise<Producer>;
  /** In a worker process: run handlers; `onStart`/`onEnd` are called around each handler. */
  startWorker(url: string, spec: WorkerSpec, run: (payload: Payload, signal?: AbortSignal) => Promise<void>): Promise<RunningWorker>;
}

/** The task/queue name every system uses. */
export const QUEUE = "bench";
