/**
 * One handler call, inline, without a worker: the handler gets a JobContext that behaves like a
 * worker's (progress and checkpoints are checked and recorded, the signal can be aborted, a
 * fenced write uses a real fence token, a transaction really commits) and the call ends the way
 * a worker would end its attempt. No job row is written: the job id and fence are fresh values
 * from the queue's own sequences, so they never collide with a real job's.
 */
import type { StepFunction } from "../worker/steps.js";
import pg from "pg";
import type { Logger } from "../logger.js";
import { serializeResult } from "../jobs/validate.js";
import { guardTransaction } from "../worker/transaction-guard.js";
import {
  fencedWrite,
  JobAbortedError,
  PermanentJobError,
  RetrySupersededError,
  TransactionMisuseError,
  ValidationError,
  DEFAULT_MAX_RESULT_BYTES,
  type AbortReason,
  type AttemptOutcome,
  type FencedWriteDb,
  type Handler,
  type JobContext,
  type JobHeaders,
  type JsonValue,
  type TaskDefinition,
  type ParentRecord,
  type DependencyCounts,
  type AnyTask,
  type TypedParentRecord,
  ConfigError,
} from "../index.js";

export interface InlineOptions {
  queue?: string;
  /** This attempt's number; default 1 (the first). */
  attempt?: number;
  /** Attempts already spent; default `attempt - 1`. */
  spentAttempts?: number;
  /** Default 25, as at enqueue. */
  maxAttempts?: number;
  /** What an earlier attempt saved (`ctx.previousCheckpoint`); default null. */
  previousCheckpoint?: JsonValue | null;
  /** How the previous attempt ended (`ctx.previousOutcome`, and so `ctx.recovered`); default null. */
  previousOutcome?: AttemptOutcome | null;
  lastError?: string | null;
  /** `ctx.headers` (a trace context, metadata); default null. */
  headers?: JobHeaders | null;
  /**
   * Aborting this aborts `ctx.signal`. Its reason becomes the JobAbortedError's reason when it
   * is one (`"cancelled"`, `"lease_expired"`, ...) or a JobAbortedError; otherwise `"cancelled"`.
   */
  signal?: AbortSignal;
  /** What `ctx.parents()` returns (and `ctx.dependencies()` counts); default none. */
  parents?: ParentRecord[];
  /** The pool `ctx.transaction` uses when the handler passes none; default: the test database's. */
  pool?: pg.Pool;
  /** The largest result a worker would store (its option of that name); default 65,536. */
  maxResultBytes?: number;
}

/**
 * How the attempt ended, as a worker would have ended it: `succeeded` (returned, or its
 * transaction committed), `superseded` (a fenced write was refused), `failed` (threw; it would be
 * retried), `dead` (threw a PermanentJobError, or failed with no attempt left).
 */
export type InlineState = "succeeded" | "superseded" | "failed" | "dead";

export interface InlineResult<R = unknown> {
  state: InlineState;
  /** What the handler returned (on success). */
  value?: R;
  /** What the handler threw. */
  error?: unknown;
  /** Every `ctx.progress` value, in order (a worker stores the latest with each heartbeat). */
  progress: JsonValue[];
  /** Every `ctx.checkpoint` value, in order; the last is what a retry would get. */
  checkpoints: JsonValue[];
  /** Set when `ctx.signal` aborted: why. */
  aborted?: JobAbortedError;
  /** The context the handler got (its jobId, attempt, fence, ...). */
  ctx: JobContext;
}

const ABORT_REASONS: ReadonlySet<string> = new Set<AbortReason>([
  "cancelled",
  "lease_expired",
  "reclaimed",
  "finished",
  "missing",
  "shutdown",
  "renewal_failed",
  "liveness_lost",
  "progress_refused",
  "stalled",
  "timed_out",
  "fence_refused",
]);
const RECOVERY_OUTCOMES: ReadonlySet<AttemptOutcome> = new Set<AttemptOutcome>(["lease_expired", "worker_lost", "stalled", "timed_out"]);

export interface InlineHost {
  /** A fresh job id and fence from the queue's sequences. */
  identity(): Promise<{ jobId: string; fence: string }>;
  /** The default pool for ctx.transaction (the test database, default search_path). */
  appPool(): pg.Pool;
  logger: Logger;
}

class InlineContext implements JobContext {
  readonly progressValues: JsonValue[] = [];
  readonly checkpointValues: JsonValue[] = [];
  readonly controller = new AbortController();
  /** The first refused fenced write decides the end: superseded. */
  superseded = false;
  committed = false;
  /** The handler broke out of its transaction: the attempt fails, even if it caught the error (as on a worker). */
  transactionMisuse: TransactionMisuseError | undefined;
  private transacting = false;

  constructor(
    readonly jobId: string,
    readonly fence: string,
    readonly task: string,
    private readonly options: InlineOptions,
    private readonly host: InlineHost,
  ) {}

  // Replaced by the test kit's durable steps (in progress).
  get step(): StepFunction {
    throw new ConfigError("runInline: durable steps are not supported yet");
  }
  sleep(): Promise<void> {
    throw new ConfigError("runInline: durable steps are not supported yet");
  }
  waitForEvent<T>(): Promise<T | null> {
    throw new ConfigError("runInline: durable steps are not supported yet");
  }

  get queue(): string {
    return this.options.queue ?? "default";
  }
  get attempt(): number {
    return this.options.attempt ?? 1;
  }
  get spentAttempts(): number {
    return this.options.spentAttempts ?? this.attempt - 1;
  }
  get maxAttempts(): number {
    return this.options.maxAttempts ?? 25;
  }
  get previousOutcome(): AttemptOutcome | null {
    return this.options.previousOutcome ?? null;
  }
  get headers(): JobHeaders | null {
    return this.options.headers ?? null;
  }
  get recovered(): boolean {
    const p = this.previousOutcome;
    return p !== null && RECOVERY_OUTCOMES.has(p);
  }
  get lastError(): string | null {
    return this.options.lastError ?? null;
  }
  parents(): Promise<ParentRecord[]>;
  parents<Task extends AnyTask>(task: Task): Promise<TypedParentRecord<Task>[]>;
  async parents(task?: AnyTask): Promise<(ParentRecord | TypedParentRecord<AnyTask>)[]> {
    const all = (this.options.parents ?? []).map((p) => ({ ...p }));
    if (task === undefined) return all;
    // As the worker's ctx.parents(task): the parents that are jobs of that task.
    if (typeof task !== "object" || task === null || typeof task.name !== "string") {
      throw new ConfigError("ctx.parents(task) takes a task made by defineTask");
    }
    return all.filter((p) => p.task === task.name);
  }
  async dependencies(): Promise<DependencyCounts> {
    const parents = this.options.parents ?? [];
    const count = (state: ParentRecord["state"]) => parents.filter((p) => p.state === state).length;
    const dead = count("dead");
    const cancelled = count("cancelled");
    return { total: parents.length, succeeded: parents.length - dead - cancelled, dead, cancelled };
  }
  get previousCheckpoint(): JsonValue | null {
    return this.options.previousCheckpoint ?? null;
  }
  get signal(): AbortSignal {
    return this.controller.signal;
  }
  get logger(): Logger {
    return this.host.logger.child({ jobId: this.jobId, attempt: this.attempt, task: this.task });
  }

  abort(reason: AbortReason | JobAbortedError): void {
    if (this.controller.signal.aborted) return;
    this.controller.abort(reason instanceof JobAbortedError ? reason : new JobAbortedError(this.jobId, this.attempt, reason));
  }

  progress(data: JsonValue): void {
    this.progressValues.push(checkJson(data, "progress"));
  }

  checkpoint(data: JsonValue): void {
    this.checkpointValues.push(checkJson(data, "checkpoint"));
  }

  async fencedWrite(
    db: FencedWriteDb,
    write: { table: string; key: Record<string, unknown>; values: Record<string, unknown>; tokenColumn?: string },
  ): Promise<boolean> {
    const accepted = await fencedWrite(db, { ...write, token: this.fence });
    if (!accepted) {
      this.superseded = true;
      this.abort("fence_refused");
    }
    return accepted;
  }

  async transaction<T>(work: (tx: pg.PoolClient) => Promise<T>, options: { pool?: pg.Pool } = {}): Promise<T> {
    if (this.committed || this.transacting) {
      throw new Error(`ctx.transaction: job ${this.jobId} attempt ${this.attempt} already used its transaction (one per attempt)`);
    }
    if (this.signal.aborted) throw this.signal.reason;
    this.transacting = true;
    const client = await (options.pool ?? this.options.pool ?? this.host.appPool()).connect();
    // The tx a worker hands out: COMMIT, ROLLBACK and release refused, dead after the callback.
    const guard = guardTransaction(client, `job ${this.jobId} attempt ${this.attempt}`);
    try {
      await client.query("BEGIN");
      let value: T;
      try {
        value = await work(guard.tx);
      } catch (err) {
        throw guard.misuse === undefined ? err : new TransactionMisuseError(guard.misuse);
      } finally {
        guard.end();
      }
      // Refused before it was sent, and caught by the handler: the attempt fails all the same.
      if (guard.misuse !== undefined) throw new TransactionMisuseError(guard.misuse);
      await client.query("COMMIT");
      // As with a worker: committed, the job is finished whatever the handler does next.
      this.committed = true;
      return value;
    } catch (err) {
      if (err instanceof TransactionMisuseError) this.transactionMisuse ??= err;
      await client.query("ROLLBACK").catch(() => {});
      throw err;
    } finally {
      this.transacting = false;
      client.release();
    }
  }
}

/** The handler of a task's registration (a function, or a definition with `handler`). */
export function handlerOf(registration: Handler | TaskDefinition): Handler {
  return typeof registration === "function" ? registration : registration.handler;
}

export async function runInline<R>(
  host: InlineHost,
  task: string,
  handler: Handler,
  payload: unknown,
  options: InlineOptions = {},
): Promise<InlineResult<R>> {
  // As a worker would get it: through JSON (undefined is stored as null).
  const body: unknown = payload === undefined ? null : JSON.parse(JSON.stringify(checkJson(payload, "payload")));
  const { jobId, fence } = await host.identity();
  const ctx = new InlineContext(jobId, fence, task, options, host);
  const external = options.signal;
  const onAbort = () => ctx.abort(abortReasonOf(external!.reason));
  if (external?.aborted) onAbort();
  else external?.addEventListener("abort", onAbort, { once: true });
  let value: R | undefined;
  let error: unknown;
  let threw = false;
  try {
    value = (await handler(body, ctx)) as R;
  } catch (err) {
    threw = true;
    error = err;
  } finally {
    external?.removeEventListener("abort", onAbort);
  }
  if (ctx.transactionMisuse !== undefined && (!threw || error instanceof JobAbortedError)) {
    threw = true;
    error = ctx.transactionMisuse;
  }
  // A result a worker could not store ends its attempt dead: checked by the worker's own rule.
  const stored = threw || ctx.committed ? undefined : serializeResult(value, options.maxResultBytes ?? DEFAULT_MAX_RESULT_BYTES);
  if (typeof stored === "object") {
    threw = true;
    error = new PermanentJobError(`the handler's result was refused: ${stored.problem}`);
  }
  const aborted = ctx.signal.aborted ? (ctx.signal.reason as JobAbortedError) : undefined;
  const state: InlineState = ctx.committed
    ? "succeeded"
    : ctx.superseded && !(error instanceof RetrySupersededError)
      ? "superseded"
      : !threw
        ? "succeeded"
        : error instanceof PermanentJobError || ctx.spentAttempts + 1 >= ctx.maxAttempts
          ? "dead"
          : "failed";
  return { state, ...(threw ? { error } : { value }), progress: ctx.progressValues, checkpoints: ctx.checkpointValues, aborted, ctx };
}

function abortReasonOf(reason: unknown): AbortReason | JobAbortedError {
  if (reason instanceof JobAbortedError) return reason;
  return typeof reason === "string" && ABORT_REASONS.has(reason) ? (reason as AbortReason) : "cancelled";
}

/**
 * What a worker would refuse to store: anything JSON cannot carry as it is (undefined, a
 * function, a bigint, NaN or Infinity, a cycle) or PostgreSQL's jsonb cannot (a NUL character).
 */
function checkJson<T>(value: T, what: string, seen = new Set<unknown>(), at = ""): T {
  const where = at === "" ? what : `${what}${at}`;
  if (value === null || typeof value === "boolean" || typeof value === "string") {
    if (typeof value === "string" && value.includes("\u0000"))
      throw new ValidationError(`${where} contains a NUL character, which PostgreSQL cannot store`);
    return value;
  }
  if (typeof value === "number") {
    if (!Number.isFinite(value)) throw new ValidationError(`${where} is ${value}, which JSON cannot carry`);
    return value;
  }
  if (typeof value !== "object")
    throw new ValidationError(`${where} is ${value === undefined ? "undefined" : `a ${typeof value}`}, which JSON cannot carry`);
  if (seen.has(value)) throw new ValidationError(`${where} refers back to itself (a cycle), which JSON cannot carry`);
  seen.add(value);
  if (Array.isArray(value)) value.forEach((v, i) => checkJson(v, what, seen, `${at}[${i}]`));
  else if (typeof (value as { toJSON?: unknown }).toJSON !== "function") {
    for (const [k, v] of Object.entries(value)) if (v !== undefined) checkJson(v, what, seen, `${at}.${k}`);
  }
  seen.delete(value);
  return value;
}
