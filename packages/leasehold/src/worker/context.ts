/**
 * What a handler is given. Read this before writing one:
 *
 *   DELIVERY IS AT-LEAST-ONCE. A handler can run more than once for the same job: when its
 *   worker crashes, hangs or is cut off, the lease expires and another worker runs the job
 *   again, possibly while the first is still running. Make handlers idempotent, and use
 *   (ctx.jobId, ctx.attempt) as the dedup key, and ctx.fence as the fencing token for writes
 *   elsewhere (see `ctx.fencedWrite`). Stop work when `ctx.signal` aborts: the lease is gone.
 */
import type pg from "pg";
import type { Logger } from "../logger.js";
import type { AttemptOutcome, JobHeaders, JsonValue } from "../jobs/types.js";
import type { LostLeaseReason } from "../errors.js";
import { LeaseholdError } from "../errors.js";
import type { BackoffPolicy } from "./backoff.js";
import type { FencedWriteDb } from "../fencing.js";
import type { DependencyCounts, ParentRecord } from "../store/dependencies.js";
import type { AnyTask } from "../tasks/define.js";
import type { TypedParentRecord } from "../tasks/parents.js";
import type { Callback, CallbackOptions, StepFunction, WaitForEventOptions } from "./steps.js";
import type { ChildrenFunction } from "./children.js";
import type { Duration } from "../jobs/steps.js";
import type { AnyEvent, EventData } from "../tasks/events.js";

export interface JobContext {
  jobId: string;
  /** This claim's token within its job: strictly greater than every earlier attempt's. */
  attempt: number;
  /**
   * This claim's token across all jobs (a bigint as a decimal string): greater than that of
   * every claim before it, of any job. Fence a resource several jobs write with it.
   */
  fence: string;
  queue: string;
  task: string;
  /** Failed or expired attempts so far, and the budget: the job is dead when they meet. */
  spentAttempts: number;
  maxAttempts: number;
  /**
   * How the previous attempt ended (null on the first): a recovery run sees `lease_expired`,
   * `worker_lost`, `stalled` or `timed_out`; a plain retry `failed`; a job a live worker gave
   * back (at a graceful shutdown, or claimed ahead and not started in time) `released`.
   */
  previousOutcome: AttemptOutcome | null;
  /**
   * The previous attempt was ended by recovery (a crash, a lost lease, a stall or time limit),
   * not by its handler; false after a failure and after a graceful release (`released`).
   */
  readonly recovered: boolean;
  /** The last error recorded for the job: the previous failure, or why a recovery ended it. */
  lastError: string | null;
  /** Fires when this attempt must stop: lease lost, job cancelled, stalled, timed out, or shutdown. */
  signal: AbortSignal;
  /** The headers the job was enqueued with (a trace context, metadata a hook added); null when none. */
  headers: JobHeaders | null;
  /** What an earlier attempt saved with `checkpoint()`, to resume from; null the first time. */
  previousCheckpoint: JsonValue | null;
  /** Report progress; stored with the next heartbeat or before the attempt's end (the latest value wins). Each call counts as progress. */
  progress(data: JsonValue): void;
  /** Save a checkpoint a retry can resume from; stored with the next heartbeat or before the attempt's end. Counts as progress. */
  checkpoint(data: JsonValue): void;
  /**
   * Writes a row of your own table unless a later claim (of any job) already wrote it, using
   * `ctx.fence` as the token (see docs/fencing.md). False means the write was refused: a
   * newer claim owns the row, so this attempt is superseded. Its signal is aborted (reason
   * `fence_refused`), the refusal is counted, and however the handler then ends (returns or
   * throws) the attempt ends as superseded: the job finishes without spending its retry
   * budget and is not retried, since a retry would overwrite the newer value. To be retried
   * anyway, throw a `RetrySupersededError`.
   */
  fencedWrite(
    db: FencedWriteDb,
    write: { table: string; key: Record<string, unknown>; values: Record<string, unknown>; tokenColumn?: string },
  ): Promise<boolean>;
  /**
   * Runs `work` in a transaction and completes this attempt in the same transaction: your
   * writes and the job's success commit together, or not at all. The completion is fenced:
   * if this attempt no longer holds its job (its lease was reaped, another attempt claimed
   * it, it was cancelled), everything rolls back and a StaleLeaseError is thrown, so your
   * writes in this database happen exactly once per job even with a zombie worker. Once it
   * returns, the job is finished, whatever the handler does next. Once per attempt.
   *
   * `tx` is a connection with the server's default search_path (your tables, not
   * Leasehold's schema), from a small pool of the worker's own; pass `{ pool }` to use yours
   * (same database). Workers connected through `leasehold serve` cannot use it. The
   * transaction is not the handler's to end: COMMIT, ROLLBACK, BEGIN (and the like) and
   * `release()` on `tx` throw a TransactionMisuseError and fail the attempt (savepoints
   * work), and `tx` is dead once `work` returns.
   *
   * The job finishes at this commit, so what the handler returns afterwards is not stored:
   * pass `{ result }` (a value, or a function of what `work` returned) to store the job's
   * result in the same transaction.
   */
  transaction<T>(work: (tx: pg.PoolClient) => Promise<T>, options?: { pool?: pg.Pool; result?: TransactionResult<T> }): Promise<T>;
  /**
   * This job's parents (enqueued with `dependsOn`, or a batch's members for its callback) and
   * how each ended: state, result (its handler's return value) and error. A parent forgotten
   * by retention reads as state "unknown". A job without parents: [].
   *
   * With a task made by defineTask, only the parents that are jobs of that task, each `result`
   * typed as that task's result (docs/typescript.md#flows-results-and-parents).
   */
  parents(): Promise<ParentRecord[]>;
  parents<Task extends AnyTask>(task: Task): Promise<TypedParentRecord<Task>[]>;
  /**
   * How this job's parents ended, counted: `{ total, succeeded, dead, cancelled }` (a batch
   * callback's counts). A job without parents: all 0.
   */
  dependencies(): Promise<DependencyCounts>;
  /**
   * A durable step (docs/durable.md): runs `fn` and records its JSON result, fenced by this
   * attempt, before the handler goes on. Any later attempt of the job (a retry, a recovery, a
   * resume after a sleep or a wait) runs the handler from the top, and a recorded step returns
   * its recorded result without running `fn` again. Steps are told apart by name, and by the
   * how-many-th call of that name (a step in a loop). At least once per job for a plain step
   * (its worker may die between `fn` and its record); `ctx.step.transaction` is exactly once.
   */
  step: StepFunction;
  /**
   * Ends this attempt and suspends the job until `until` (a Date, ms, or a duration such as
   * "3d"), on the database's clock, holding no lease and no worker slot; it then resumes from
   * the top, replaying its recorded steps. Spends no retry. Throws JobSuspendedError: let it end
   * the handler.
   */
  sleep(name: string, until: Duration | Date): Promise<void>;
  /**
   * Waits for an event sent with `sendEvent` (or HTTP, the CLI, SQL's send_event()) whose data
   * contains `match`: the event's data, or null after `timeout`. If it was sent since the job was
   * enqueued, it returns at once; otherwise the job suspends (as ctx.sleep) until it comes.
   */
  waitForEvent<E extends AnyEvent>(name: string, options: WaitForEventOptions & { event: E }): Promise<EventData<E> | null>;
  waitForEvent<T = JsonValue>(name: string, options: WaitForEventOptions): Promise<T | null>;
  /**
   * A callback (docs/durable-callbacks.md): a token that completes this job's wait once, with
   * data, through `lh.completeCallback`, `POST /v1/callbacks/:token` on `leasehold serve` (its
   * `url`) or the CLI. Hand it out in a step (an email, a webhook's registration), then
   * `await cb.wait()`: the data, or null after `timeout`; the job suspends until then. Recorded
   * as a step: a replay hands out the same token.
   */
  callback<T = JsonValue>(name: string, options?: CallbackOptions): Promise<Callback<T>>;
  /**
   * Starts child jobs (an array, as lh.enqueueMany takes them) or a child flow (`{ flow: nodes }`,
   * as lh.enqueueFlow) as a step, exactly once per job, and suspends this job, holding no lease
   * and no worker slot, until every child has ended (succeeded, dead or cancelled). The job then
   * resumes from the top and this returns each child's end, `{ id, ref, task, state, result,
   * error }`, in the order given; children given as defineTask tasks have their results typed.
   * Throws JobSuspendedError while the children run: let it end the handler. A remote worker's
   * children are checked again and started by `leasehold serve` (docs/durable-children.md).
   */
  children: ChildrenFunction;
  logger: Logger;
}

/** The result ctx.transaction stores with its completion: a value, or one made from what `work` returned. */
export type TransactionResult<T> = ((value: T) => unknown) | JsonValue;

export type Handler<P = any> = (payload: P, ctx: JobContext) => unknown;

export interface TaskDefinition<P = any> {
  handler: Handler<P>;
  /** Retry backoff for this task; fields left out take the worker's policy. */
  backoff?: Partial<BackoffPolicy>;
  /** An attempt that calls neither ctx.progress nor ctx.checkpoint for this long has stalled. */
  progressTimeoutMs?: number;
  /** An attempt running longer than this has timed out (default: the worker's, 15 minutes); `null`: no limit. */
  maxRunMs?: number | null;
}

/** A tasks module's default export: task name to handler. */
export type TaskHandlers = Record<string, Handler | TaskDefinition>;

export type AbortReason =
  LostLeaseReason | "shutdown" | "renewal_failed" | "liveness_lost" | "progress_refused" | "stalled" | "timed_out" | "fence_refused" | "suspended";

/** The `signal.reason` of an aborted handler: says why it must stop. */
export class JobAbortedError extends LeaseholdError {
  constructor(
    readonly jobId: string,
    readonly attempt: number,
    readonly reason: AbortReason,
  ) {
    super("job_aborted", `job ${jobId} attempt ${attempt} aborted: ${describeAbort(reason)}`);
  }
}

function describeAbort(reason: AbortReason): string {
  switch (reason) {
    case "cancelled":
      return "the job was cancelled";
    case "lease_expired":
      return "the lease expired and the watchdog reaped the job";
    case "reclaimed":
      return "another attempt holds the job now";
    case "finished":
      return "the job already finished";
    case "missing":
      return "the job no longer exists";
    case "shutdown":
      return "the worker is shutting down; the job is released to run again";
    case "renewal_failed":
      return "the lease could not be renewed (database unreachable) and may run out";
    case "liveness_lost":
      return "the worker lost its liveness session (its connection to the database) and the watchdog may hand the job to another worker";
    case "progress_refused":
      return "the database refused its progress or checkpoint; the attempt fails";
    case "stalled":
      return "no progress within the progress timeout; the attempt fails as stalled";
    case "timed_out":
      return "it ran past its maximum run time; the attempt fails as timed out";
    case "fence_refused":
      return "a fenced write was refused: a newer claim wrote first, so the attempt ends as superseded";
    case "suspended":
      return "the handler suspended the job (a sleep or a wait); it resumes later from its recorded steps";
  }
}

/**
 * Throw from a handler whose `ctx.fencedWrite` was refused to have the job retried anyway: the
 * attempt then ends as an ordinary failure (it spends its retry budget, and the retry runs
 * after the task's backoff with a newer fence) instead of as superseded. Use it when this
 * job's write must land even after a newer claim's, say when it adds to the row rather than
 * replacing it. Thrown without a refused write, it is an ordinary failure too.
 */
export class RetrySupersededError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "RetrySupersededError";
  }
}

/** Throw from a handler to send the job to the dead letter now, without retries. */
export class PermanentJobError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "PermanentJobError";
  }
}

/**
 * Throw from a handler when what it called said "too many requests, try again in X" (an HTTP
 * 429 with Retry-After, say): the job waits `retryInMs` without spending an attempt, and its
 * key (`scope: "key"`, the default) or its whole queue (`"queue"`) starts nothing for that long,
 * fleet-wide. A delay longer than the queue's `maxHoldMs` (default 5 minutes) is clamped to it,
 * for the job and its hold alike. The whole queue is held (for
 * `"queue"`, or a keyless job) only if the queue's `allowQueueHold` is set; otherwise the key
 * is, and a keyless job waits alone, as with `"job"` (docs/flow-control.md).
 */
export class RateLimitedError extends Error {
  constructor(
    readonly retryInMs: number,
    readonly scope: "key" | "queue" | "job" = "key",
    message = `rate-limited: retry in ${retryInMs} ms`,
  ) {
    super(message);
    this.name = "RateLimitedError";
  }
}
