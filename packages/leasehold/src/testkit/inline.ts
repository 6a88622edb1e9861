/**
 * One handler call, inline, without a worker: the handler gets a JobContext that behaves like a
 * worker's (progress and checkpoints are checked and recorded, the signal can be aborted, a
 * fenced write uses a real fence token, a transaction really commits, durable steps run and are
 * recorded: ./inline-steps.ts) and the call ends the way a worker would end its attempt. No job
 * row is written: the job id and fence are fresh values from the queue's own sequences, so they
 * never collide with a real job's.
 */
import { AttemptSteps, type Callback, type CallbackOptions, type StepFunction, type WaitForEventOptions } from "../worker/steps.js";
import type { ChildrenFunction } from "../index.js";
import pg from "pg";
import type { Duration, StepRecord } from "../jobs/steps.js";
import { inlineEntry, InlineJournal, InlineStepHost, type InFlight, type InlineSuspension } from "./inline-steps.js";
import type { Logger } from "../logger.js";
import { serializeResult } from "../jobs/validate.js";
import { runGuarded } from "../worker/transaction-guard.js";
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
  /** The pool `ctx.transaction` (and `ctx.step.transaction`) uses when the handler passes none; default: the test database's. */
  pool?: pg.Pool;
  /** The largest result a worker would store (its option of that name); default 65,536. */
  maxResultBytes?: number;
}

/**
 * How the attempt ended, as a worker would have ended it: `succeeded` (returned, or its
 * transaction committed), `superseded` (a fenced write was refused), `failed` (threw; it would be
 * retried), `dead` (threw a PermanentJobError, or failed with no attempt left), `suspended` (a
 * sleep or a wait: `suspended` says until when; `queue.resumeInline` runs it again).
 */
export type InlineState = "succeeded" | "superseded" | "failed" | "dead" | "suspended";

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
  /** The job's recorded durable steps after this run (this run's and its earlier runs'), in order. */
  steps: StepRecord[];
  /** The names of the steps this run replayed from earlier runs (their functions did not run), in order. */
  replayed: string[];
  /** Set when the state is `suspended`: the sleep or wait, and when it wakes (null: only its event wakes it). */
  suspended?: InlineSuspension;
}

/** What an inline run leaves for the next (`queue.resumeInline`): the same job, its steps, its budget. */
export interface InlineJob {
  task: string;
  handler: Handler;
  payload: unknown;
  jobId: string;
  journal: InlineJournal;
}
const inlineJobs = new WeakMap<InlineResult<unknown>, InlineJob>();

/** The job an inline result ran, for resumeInline; undefined for a result that is not runInline's. */
export function inlineJobOf(result: InlineResult<unknown>): InlineJob | undefined {
  return inlineJobs.get(result);
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
  /** On the Leasehold schema of the test database: its clock and its events, for durable steps. */
  pool: pg.Pool;
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
  readonly entry: InFlight;
  readonly stepHost: InlineStepHost;
  /** Made at the first durable call, as on a worker. */
  steps?: AttemptSteps;

  constructor(
    readonly jobId: string,
    readonly fence: string,
    readonly task: string,
    private readonly options: InlineOptions,
    private readonly host: InlineHost,
    journal: InlineJournal,
  ) {
    this.entry = inlineEntry({ id: jobId, attempt: this.attempt, fence, task, queue: this.queue });
    this.stepHost = new InlineStepHost(journal, {
      pool: host.pool,
      appPool: () => options.pool ?? host.appPool(),
      signal: () => this.signal,
      misused: (err) => (this.transactionMisuse ??= err),
    });
  }

  private get durable(): AttemptSteps {
    return (this.steps ??= new AttemptSteps(this.entry, this.stepHost));
  }
  get step(): StepFunction {
    return this.durable.step;
  }
  sleep(name: string, until: Duration | Date): Promise<void> {
    return this.durable.sleep(name, until);
  }
  waitForEvent<T = JsonValue>(name: string, options: WaitForEventOptions): Promise<T | null> {
    return this.durable.waitForEvent<T>(name, options);
  }
  callback<T = JsonValue>(name: string, options?: CallbackOptions): Promise<Callback<T>> {
    return this.durable.callback<T>(name, options);
  }
  get children(): ChildrenFunction {
    return this.durable.startChildren;
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
    // The step runner refuses steps after an abort, as on a worker.
    this.entry.abortedWith = reason instanceof JobAbortedError ? reason : new JobAbortedError(this.jobId, this.attempt, reason);
    this.controller.abort(this.entry.abortedWith);
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
    try {
      await client.query("BEGIN");
      // The tx a worker hands out: COMMIT, ROLLBACK and release refused, dead after the callback.
      const value = await runGuarded(client, `job ${this.jobId} attempt ${this.attempt}`, work);
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
  /** The job an earlier run left (resumeInline): its id and recorded steps. */
  resumed?: InlineJob,
): Promise<InlineResult<R>> {
  // As a worker would get it: through JSON (undefined is stored as null).
  const body: unknown = payload === undefined ? null : JSON.parse(JSON.stringify(checkJson(payload, "payload")));
  const identity = await host.identity();
  const jobId = resumed?.jobId ?? identity.jobId;
  const journal = resumed?.journal ?? new InlineJournal();
  journal.resume();
  if (journal.eventsAfter === undefined) {
    const { rows } = await host.pool.query<{ last: string }>("SELECT coalesce(max(id), 0)::text AS last FROM events");
    journal.eventsAfter = rows[0]!.last;
  }
  const ctx = new InlineContext(jobId, identity.fence, task, options, host, journal);
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
  const suspended = ctx.entry.within === "suspended" ? journal.suspension() : undefined;
  // A handler that returned without reaching a step it recorded before: its code changed (as on a worker).
  if (!threw && !suspended && ctx.steps) {
    const unreached = await ctx.steps.unreached();
    if (unreached) {
      threw = true;
      error = unreached;
    }
  }
  if (ctx.transactionMisuse !== undefined && (!threw || error instanceof JobAbortedError)) {
    threw = true;
    error = ctx.transactionMisuse;
  }
  // A result a worker could not store ends its attempt dead: checked by the worker's own rule.
  const stored = threw || ctx.committed || suspended ? undefined : serializeResult(value, options.maxResultBytes ?? DEFAULT_MAX_RESULT_BYTES);
  if (typeof stored === "object") {
    threw = true;
    error = new PermanentJobError(`the handler's result was refused: ${stored.problem}`);
  }
  const aborted = ctx.signal.aborted ? (ctx.signal.reason as JobAbortedError) : undefined;
  const state: InlineState = suspended
    ? "suspended"
    : ctx.committed
      ? "succeeded"
      : ctx.superseded && !(error instanceof RetrySupersededError)
        ? "superseded"
        : !threw
          ? "succeeded"
          : error instanceof PermanentJobError || ctx.spentAttempts + 1 >= ctx.maxAttempts
            ? "dead"
            : "failed";
  const result: InlineResult<R> = {
    state,
    // The suspension is the state, not an error: what the handler threw on its way out is not reported.
    ...(suspended ? {} : threw ? { error } : { value }),
    progress: ctx.progressValues,
    checkpoints: ctx.checkpointValues,
    aborted,
    ctx,
    steps: journal.list(),
    replayed: ctx.stepHost.replayedSteps,
    ...(suspended ? { suspended } : {}),
  };
  inlineJobs.set(result, { task, handler, payload, jobId, journal });
  return result;
}

/**
 * The options of the run that resumes `previous`: the next attempt of the same job, with the
 * budget the previous one left (a suspension spends none), its checkpoint and its outcome.
 * Throws for a run that ended for good, or a sleep whose end the clock has not reached.
 */
export function resumeOptions(previous: InlineResult<unknown>, now: Date, options: InlineOptions = {}): InlineOptions {
  const ctx = previous.ctx;
  if (previous.state !== "failed" && previous.state !== "suspended") {
    throw new ConfigError(`resumeInline: job ${ctx.jobId} ended ${previous.state}; only a failed or suspended run has a next attempt`);
  }
  const s = previous.suspended;
  if (s?.kind === "sleep" && s.until !== null && s.until.getTime() > now.getTime()) {
    throw new ConfigError(
      `resumeInline: job ${ctx.jobId} sleeps at "${s.step}" until ${s.until.toISOString()}, and the queue's clock is at ${now.toISOString()}: ` +
        "advance it first (queue.clock.advanceTo(result.suspended.until))",
    );
  }
  const failed = previous.state === "failed";
  const checkpoint = previous.checkpoints.at(-1) ?? ctx.previousCheckpoint;
  return {
    queue: ctx.queue,
    maxAttempts: ctx.maxAttempts,
    headers: ctx.headers,
    previousCheckpoint: checkpoint,
    previousOutcome: failed ? "failed" : ctx.previousOutcome,
    lastError: failed ? errorMessage(previous.error) : ctx.lastError,
    ...options,
    attempt: ctx.attempt + 1,
    spentAttempts: ctx.spentAttempts + (failed ? 1 : 0),
  };
}

function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
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
