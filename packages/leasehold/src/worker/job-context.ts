/**
 * The JobContext a handler receives for one attempt. A class rather than an object of
 * closures: one is made per job, and its methods live once on the prototype.
 */
import type pg from "pg";
import type { Logger } from "../logger.js";
import { serializePayload } from "../jobs/validate.js";
import { fencedWrite, type FencedWriteDb } from "../fencing.js";
import type { AttemptOutcome, JobHeaders, JsonValue } from "../jobs/types.js";
import type { Metrics } from "../metrics.js";
import type { AbortReason, JobContext, TransactionResult } from "./context.js";
import type { InFlight } from "./heartbeat.js";
import type { DependencyCounts, ParentRecord } from "../store/dependencies.js";
import type { AnyTask } from "../tasks/define.js";
import { parentsOfTask, type TypedParentRecord } from "../tasks/parents.js";
import { AttemptSteps, type Callback, type CallbackOptions, type StepFunction, type WaitForEventOptions } from "./steps.js";
import type { StepWorker } from "./step-host.js";
import type { ChildrenFunction } from "./children.js";
import type { Duration } from "../jobs/steps.js";

export interface ContextHost {
  logger: Logger;
  metrics: Metrics;
  transaction<T>(entry: InFlight, work: (tx: pg.PoolClient) => Promise<T>, pool?: pg.Pool, result?: TransactionResult<T>): Promise<T>;
  /** The handler made progress (a progress or checkpoint call). */
  progressed(entry: InFlight): void;
  abort(entry: InFlight, reason: AbortReason): void;
  parents(entry: InFlight): Promise<ParentRecord[]>;
  dependencies(entry: InFlight): Promise<DependencyCounts>;
  /** Where durable steps are recorded (worker/step-host.ts). */
  readonly steps: StepWorker;
}

/**
 * How an attempt ends when recovery, not its handler, ends it. A list of what counts rather
 * than of what does not, so an outcome added later is not taken for a recovery by default.
 */
const RECOVERY_OUTCOMES: ReadonlySet<AttemptOutcome> = new Set<AttemptOutcome>(["lease_expired", "worker_lost", "stalled", "timed_out"]);

class AttemptContext implements JobContext {
  private childLogger?: Logger;

  constructor(
    private readonly entry: InFlight,
    private readonly host: ContextHost,
  ) {}

  get jobId(): string {
    return this.entry.job.id;
  }
  get attempt(): number {
    return this.entry.job.attempt;
  }
  get fence(): string {
    return this.entry.job.fence;
  }
  get queue(): string {
    return this.entry.job.queue;
  }
  get task(): string {
    return this.entry.job.task;
  }
  get spentAttempts(): number {
    return this.entry.job.spentAttempts;
  }
  get maxAttempts(): number {
    return this.entry.job.maxAttempts;
  }
  get previousOutcome(): AttemptOutcome | null {
    return this.entry.job.previousOutcome;
  }
  /**
   * This attempt follows one that recovery ended, not its handler: the job is back after a
   * crash, a lost lease or a limit. Not after a graceful release: that worker was alive and
   * gave the job back without running it to an end (previousOutcome says `released`).
   */
  get recovered(): boolean {
    const p = this.entry.job.previousOutcome;
    return p !== null && RECOVERY_OUTCOMES.has(p);
  }
  get lastError(): string | null {
    return this.entry.job.lastError;
  }
  get headers(): JobHeaders | null {
    return this.entry.job.headers;
  }
  get previousCheckpoint(): JsonValue | null {
    return this.entry.job.checkpoint;
  }

  /** Made on first use: most short handlers never read it. */
  get signal(): AbortSignal {
    const e = this.entry;
    if (!e.controller) {
      e.controller = new AbortController();
      if (e.abortedWith) e.controller.abort(e.abortedWith);
    }
    return e.controller.signal;
  }

  // Validated here, so a value PostgreSQL would refuse throws to this handler only.
  progress(data: JsonValue): void {
    this.entry.progressJson = serializePayload(data, "", "progress");
    this.host.progressed(this.entry);
  }

  checkpoint(data: JsonValue): void {
    this.entry.checkpointJson = serializePayload(data, "", "checkpoint");
    this.host.progressed(this.entry);
  }

  async fencedWrite(
    db: FencedWriteDb,
    write: { table: string; key: Record<string, unknown>; values: Record<string, unknown>; tokenColumn?: string },
  ): Promise<boolean> {
    const { job } = this.entry;
    const accepted = await fencedWrite(db, { ...write, token: job.fence });
    if (!accepted) {
      this.host.metrics.fencingRejections.inc({ kind: "downstream", reason: "newer_token" });
      // Marked before the abort: whatever the handler does next, its end is reported as
      // superseded (the first refused write names it).
      this.entry.superseded ??=
        `superseded: a newer claim already wrote ${write.table} (this attempt's fenced write, fence ${job.fence}, was refused); ` +
        "the job is not retried";
      this.host.abort(this.entry, "fence_refused");
    }
    return accepted;
  }

  transaction<T>(work: (tx: pg.PoolClient) => Promise<T>, options: { pool?: pg.Pool; result?: TransactionResult<T> } = {}): Promise<T> {
    return this.host.transaction(this.entry, work, options.pool, options.result);
  }

  parents(): Promise<ParentRecord[]>;
  parents<Task extends AnyTask>(task: Task): Promise<TypedParentRecord<Task>[]>;
  async parents(task?: AnyTask): Promise<(ParentRecord | TypedParentRecord<AnyTask>)[]> {
    const all = await this.host.parents(this.entry);
    return task === undefined ? all : parentsOfTask(all, task);
  }

  dependencies(): Promise<DependencyCounts> {
    return this.host.dependencies(this.entry);
  }

  // Made at the first durable call: a handler without steps pays nothing for them.
  private get durable(): AttemptSteps {
    return (this.entry.steps ??= new AttemptSteps(this.entry, this.host.steps));
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
  // A getter, not a field: a field would make a closure for every job, durable or not.
  get children(): ChildrenFunction {
    return this.durable.startChildren;
  }

  // Created on first use: most handlers never log, and a child logger per job measured ~2 µs.
  get logger(): Logger {
    const job = this.entry.job;
    return (this.childLogger ??= this.host.logger.child({ jobId: job.id, attempt: job.attempt, task: job.task }));
  }
}

export function createJobContext(entry: InFlight, host: ContextHost): JobContext {
  return new AttemptContext(entry, host);
}
