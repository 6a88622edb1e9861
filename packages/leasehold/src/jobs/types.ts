/** Shapes of jobs as the store returns them. Ids are strings: PostgreSQL bigints, exact past 2^53. */

export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };

/**
 * Unfinished jobs live in `jobs`; finished ones in `job_history`, dead ones in `dead_jobs`.
 * A blocked job waits for its parents (docs/flows.md): no claim takes it until they have ended.
 */
export type JobState = "blocked" | "waiting" | "suspended" | "running" | "succeeded" | "dead" | "cancelled";
export const JOB_STATES: readonly JobState[] = ["blocked", "waiting", "suspended", "running", "succeeded", "dead", "cancelled"];

/**
 * How an attempt ended: its handler returned (succeeded) or threw (failed); its lease ran out
 * (lease_expired); its worker's process was found gone (worker_lost: crashed, killed, or
 * restarted and reconciled); it made no progress for its progress timeout (stalled) or ran
 * past its maximum run time (timed_out); it was given back by a live worker (released); the
 * job was cancelled; or its `ctx.fencedWrite` was refused because a newer claim of another
 * job wrote first (superseded: the job finished as succeeded, not retried, no budget spent).
 */
export type AttemptOutcome =
  "succeeded" | "failed" | "lease_expired" | "worker_lost" | "stalled" | "timed_out" | "released" | "cancelled" | "superseded" | "rate_limited";

export interface EnqueueOptions {
  /** Queue name; default "default". */
  queue?: string;
  /** Lower runs first; default 0; -32768..32767. */
  priority?: number;
  /** Run no earlier than this moment. */
  runAt?: Date;
  /** Run no earlier than this many ms after the database's now(). */
  delayMs?: number;
  /** Attempts that may fail (or lose their lease) before the job is dead; default 25. */
  maxAttempts?: number;
  /** While a job with this key is unfinished, enqueueing the key again returns that job (or see `onDuplicate`). */
  uniqueKey?: string;
  /**
   * What an enqueue does when an unfinished job already holds its `uniqueKey` (needs one;
   * docs/flows.md#debounce-and-replace). Default "keep".
   */
  onDuplicate?: OnDuplicate;
  /**
   * Which unfinished job holding `uniqueKey` is this job's duplicate (needs a `uniqueKey`):
   * "task" (the default) one of the same task, "queue" one in the same queue, "global" any. A
   * key is held by one unfinished job at a time: an enqueue meeting a holder outside its scope
   * is refused (`UniqueKeyConflictError`), and that job is left untouched.
   */
  uniqueScope?: UniqueScope;
  /**
   * The job's flow-control key (a tenant, a customer, an entity id): the queue's per-key limits
   * and rates count it, and keys take turns (docs/flow-control.md). 1-512 characters.
   */
  key?: string;
  /** Lease length for this job; default: the claiming worker's lease. */
  leaseMs?: number;
  /** Fail an attempt that reports no progress (ctx.progress/ctx.checkpoint) for this long; default: the task's. */
  progressTimeoutMs?: number;
  /**
   * Fail an attempt that runs longer than this; default: the task's (15 minutes unless the task
   * or its worker sets another). `null`: this job runs without a time limit, whatever its task says.
   */
  maxRunMs?: number | null;
  /**
   * Small string values carried with the job to every attempt (`ctx.headers`), beside the
   * payload: a W3C trace context (`traceparent`, `tracestate`: docs/tracing.md), a correlation
   * id. At most 32 of them, names of letters, digits and `_ . -`, 8 KiB in all.
   */
  headers?: JobHeaders;
}

/**
 * What an enqueue does when an unfinished job holds its unique key:
 * - "keep": nothing; the answer is that job (the default).
 * - "replace": a waiting (or blocked) holder takes the new payload and run time (debounce: each
 *   enqueue pushes the time); a running holder loses the key and finishes untouched, and the
 *   new job is enqueued.
 * - "replace_payload": as "replace", but a waiting holder keeps its run time.
 * - "cancel_running": as "replace", and a running holder's cancel is requested (its handler's
 *   signal aborts) as it loses the key.
 */
export type OnDuplicate = "keep" | "replace" | "replace_payload" | "cancel_running";
export const ON_DUPLICATE_MODES: readonly OnDuplicate[] = ["keep", "replace", "replace_payload", "cancel_running"];

/** See `EnqueueOptions.uniqueScope`. */
export type UniqueScope = "task" | "queue" | "global";
export const UNIQUE_SCOPES: readonly UniqueScope[] = ["task", "queue", "global"];

/** A job's headers: names to string values (see `EnqueueOptions.headers`). */
export type JobHeaders = Record<string, string>;

export interface NewJob extends EnqueueOptions {
  task: string;
  payload?: unknown;
}

export interface EnqueuedJob {
  id: string;
  /** False when a unique key matched an unfinished job, whose id this is. */
  created: boolean;
  /** The unfinished job holding the unique key took this enqueue's payload (and run time): `onDuplicate` replace modes. */
  replaced?: true;
  /** `onDuplicate: "cancel_running"`: the running job that held the key, whose cancel was requested. */
  cancelled?: string;
  /** Present when no worker is known to run this job's task in its queue (see EnqueueWarning). */
  warnings?: EnqueueWarning[];
}

/**
 * Why a job may wait forever: no worker seen in the last 24 h announced its task
 * (`unknown_task`), or the workers that did take other queues (`task_not_in_queue`).
 */
export interface EnqueueWarning {
  code: "unknown_task" | "task_not_in_queue";
  queue: string;
  task: string;
  message: string;
  /** The closest known task (unknown_task) or queue of that task (task_not_in_queue), if one is close. */
  didYouMean?: string;
}

/** A job as a worker receives it from a claim. */
export interface ClaimedJob {
  id: string;
  queue: string;
  task: string;
  payload: JsonValue;
  /** The fencing token of this claim within its job. */
  attempt: number;
  /** The fencing token of this claim across all jobs (a bigint, as a decimal string). */
  fence: string;
  spentAttempts: number;
  maxAttempts: number;
  leaseMs: number;
  checkpoint: JsonValue | null;
  /** How the previous attempt ended (null on the first). */
  previousOutcome: AttemptOutcome | null;
  /** The last error recorded for the job (a failure, or why a recovery ended an attempt). */
  lastError: string | null;
  /** The job's own limits, if it was enqueued with any. */
  progressTimeoutMs: number | null;
  maxRunMs: number | null;
  /** Enqueued with `maxRunMs: null`: no time limit, whatever its task's. */
  maxRunUnlimited: boolean;
  /** The headers it was enqueued with (a trace context, metadata); null when none. */
  headers: JobHeaders | null;
  /** Its flow-control key, if it was enqueued with one. */
  key: string | null;
}

/** The whole record of a job, unfinished or finished, with its attempt history. */
export interface JobRecord {
  id: string;
  queue: string;
  task: string;
  payload: JsonValue;
  priority: number;
  state: JobState;
  attempt: number;
  spentAttempts: number;
  maxAttempts: number;
  runAt: Date | null;
  leaseUntil: Date | null;
  lockedBy: string | null;
  heartbeatAt: Date | null;
  cancelRequestedAt: Date | null;
  progress: JsonValue | null;
  checkpoint: JsonValue | null;
  lastError: string | null;
  uniqueKey: string | null;
  /** Its flow-control key while it is unfinished (finished jobs do not keep it). */
  key: string | null;
  createdAt: Date;
  startedAt: Date | null;
  finishedAt: Date | null;
  /**
   * What its handler returned, stored with the attempt that succeeded (null: none, not
   * finished, or not succeeded). Forgotten with the job by retention.
   */
  result: JsonValue | null;
}

/** A job as lists return it: like JobRecord, but the payload and result only when asked for. */
export type ListedJob = Omit<JobRecord, "payload" | "result"> & { payload?: JsonValue; result?: JsonValue | null };

/** A job's parent or child in a flow (see `Leasehold.getJob`). */
export interface JobLink {
  id: string;
  /** The child's name for the parent (the ref in its graph); null for a parent named by id. */
  ref: string | null;
  /** Null when retention has forgotten the job. */
  task: string | null;
  /** "unknown": forgotten by retention. */
  state: JobState | "blocked" | "unknown";
}

export interface AttemptRecord {
  jobId: string;
  attempt: number;
  workerId: string;
  startedAt: Date;
  endedAt: Date;
  outcome: AttemptOutcome;
  error: string | null;
}
