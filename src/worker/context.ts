/**
 * What a handler is given. Read this before writing one:
 *
 *   DELIVERY IS AT-LEAST-ONCE. A handler can run more than once for the same job: when its
 *   worker crashes, hangs or is cut off, the lease expires and another worker runs the job
 *   again, possibly while the first is still running. Make handlers idempotent, and use
 *   (ctx.jobId, ctx.attempt) as the dedup key and fencing token for writes elsewhere (see
 *   `fencedWrite`). Stop work when `ctx.signal` aborts: the lease is gone.
 */
import type { Logger } from "pino";
import type { JsonValue } from "../jobs/types.js";
import type { LostLeaseReason } from "../errors.js";
import { LeaseholdError } from "../errors.js";

export interface JobContext {
  jobId: string;
  /** The fencing token of this claim: strictly greater than every earlier attempt's. */
  attempt: number;
  queue: string;
  task: string;
  /** Failed or expired attempts so far, and the budget: the job is dead when they meet. */
  spentAttempts: number;
  maxAttempts: number;
  /** Fires when this attempt must stop: lease lost, job cancelled, or worker shutting down. */
  signal: AbortSignal;
  /** What an earlier attempt saved with `checkpoint()`, to resume from; null the first time. */
  previousCheckpoint: JsonValue | null;
  /** Report progress; stored with the next heartbeat (the latest value wins). */
  progress(data: JsonValue): void;
  /** Save a checkpoint a retry can resume from; stored with the next heartbeat. */
  checkpoint(data: JsonValue): void;
  logger: Logger;
}

export type Handler<P = any> = (payload: P, ctx: JobContext) => unknown;

export interface TaskDefinition<P = any> {
  handler: Handler<P>;
  /** Retry backoff for this task; fields left out take the worker's policy. */
  backoff?: Partial<import("./backoff.js").BackoffPolicy>;
}

/** A tasks module's default export: task name to handler. */
export type TaskHandlers = Record<string, Handler | TaskDefinition>;

export type AbortReason = LostLeaseReason | "shutdown" | "renewal_failed" | "progress_refused";

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
    case "progress_refused":
      return "the database refused its progress or checkpoint; the attempt fails";
  }
}

/** Throw from a handler to send the job to the dead letter now, without retries. */
export class PermanentJobError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "PermanentJobError";
  }
}
