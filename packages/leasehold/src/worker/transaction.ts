/**
 * ctx.transaction: the handler's writes and the attempt's completion in one transaction.
 * Committed, the job is finished (nothing is reported when the handler returns); refused,
 * everything is rolled back and the handler gets a StaleLeaseError. The `tx` it hands the
 * handler is guarded (./transaction-guard.ts).
 */
import type pg from "pg";
import { ConfigError, StaleLeaseError, TransactionMisuseError, type LostLeaseReason } from "../errors.js";
import type { ClaimedJob } from "../jobs/types.js";
import { serializeResult } from "../jobs/validate.js";
import type { Logger } from "../logger.js";
import type { Metrics } from "../metrics.js";
import { PermanentJobError, type AbortReason, type TransactionResult } from "./context.js";
import { hasUnsentValues, type Heartbeater, type InFlight } from "./heartbeat.js";
import { recordRefusals, type CompleteWithinResult, type WorkerTransport } from "./transport.js";
import { disarmLimits } from "./limits.js";

/** What a transaction's end does to the worker's attempt. */
export interface TransactionHost {
  /** The "job:stale" event. */
  stale(job: ClaimedJob, error: StaleLeaseError): void;
  abort(entry: InFlight, reason: AbortReason): void;
  leaseLost(entry: InFlight, reason: LostLeaseReason): void;
  /** The attempt is finished: no more beats, and a late beat's miss is not a loss. */
  forget(entry: InFlight): void;
}

export class TransactionRunner {
  constructor(
    private readonly host: TransactionHost,
    private readonly heartbeater: Heartbeater,
    private readonly transport: WorkerTransport,
    private readonly workerId: string,
    private readonly maxResultBytes: number,
    private readonly metrics: Metrics,
    private readonly logger: Logger,
  ) {}

  async run<T>(entry: InFlight, work: (tx: pg.PoolClient) => Promise<T>, pool?: pg.Pool, resultOption?: TransactionResult<T>): Promise<T> {
    const { job } = entry;
    if (!this.transport.completeWithin) {
      // Retrying cannot help (every attempt runs on this same kind of worker): the attempt
      // ends the job now, whatever the handler does with this error.
      entry.permanent = true;
      throw new PermanentJobError(
        "ctx.transaction needs a worker on the database: a remote worker (RemoteTransport, through leasehold serve) " +
          "cannot join the server's transactions, so the job is dead without retries. Run this task on a worker " +
          "connected to the database (a Worker with a database URL, or leasehold worker without --server), or write without " +
          "ctx.transaction and fence the writes with ctx.fencedWrite",
      );
    }
    if (entry.within)
      throw new ConfigError(`ctx.transaction: job ${job.id} attempt ${job.attempt} already committed its transaction (one per attempt)`);
    // The job finishes in this transaction: what the handler set before it is stored first
    // (that beat may find the attempt cancelled or its lease gone: checked next).
    if (hasUnsentValues(entry)) await this.heartbeater.sendPending(entry);
    if (entry.abortedWith) throw entry.abortedWith;
    let result: CompleteWithinResult<T>;
    try {
      result = await this.transport.completeWithin({
        workerId: this.workerId,
        job: { id: job.id, attempt: job.attempt },
        work,
        pool,
        ...(resultOption !== undefined && { result: (value: T) => this.storedResult(entry, resultOption, value) }),
        committing: () => (entry.within = "committing"),
      });
    } catch (err) {
      entry.within = undefined;
      // The handler broke out of its transaction: the attempt fails, even if it catches this.
      if (err instanceof TransactionMisuseError) entry.transactionMisuse ??= err;
      throw err;
    }
    if (!result.completed) {
      entry.within = undefined;
      const reason = result.lost?.reason ?? "missing";
      const stale = new StaleLeaseError(job.id, job.attempt, reason);
      this.metrics.fencingRejections.inc({ kind: "complete", reason });
      recordRefusals(this.transport, [{ jobId: job.id, attempt: job.attempt, workerId: this.workerId, kind: "complete", reason }]);
      this.logger.warn({ jobId: job.id, attempt: job.attempt, reason }, "transaction rolled back: the attempt no longer holds its job");
      this.host.stale(job, stale);
      // A cancelled job is still this attempt's to end: the handler's end is reported as usual
      // and ends it as cancelled. Any other reason: the lease is gone, nothing is reported.
      if (reason === "cancelled") this.host.abort(entry, "cancelled");
      else this.host.leaseLost(entry, reason);
      throw stale;
    }
    entry.within = "committed";
    disarmLimits(entry);
    this.host.forget(entry);
    return result.value;
  }

  /**
   * The result ctx.transaction stores with its completion (`{ result }`: a value, or a function
   * of what `work` returned), as JSON. A bad one rolls the transaction back and ends the
   * attempt without retries, as a bad return value does.
   */
  private storedResult<T>(entry: InFlight, result: TransactionResult<T>, value: T): string | undefined {
    const json = serializeResult(typeof result === "function" ? (result as (v: T) => unknown)(value) : result, this.maxResultBytes);
    if (typeof json === "object") {
      entry.permanent = true;
      throw new PermanentJobError(`ctx.transaction's result was refused: ${json.problem}`);
    }
    return json;
  }
}
