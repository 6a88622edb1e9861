/** Reports how an attempt ended (success, failure, a limit, superseded) and turns the answer into its outcome. */
import { StaleLeaseError, ValidationError } from "../errors.js";
import { sanitizeText, serializeResult } from "../jobs/validate.js";
import type { Failure } from "../store/index.js";
import { JobAbortedError, PermanentJobError, RateLimitedError, RetrySupersededError, type AbortReason } from "./context.js";
import { checkRetryIn } from "../jobs/flow-limits.js";
import { hasUnsentValues, type InFlight } from "./heartbeat.js";
import type { ReportOutcome } from "./reporter.js";
import { recordRefusals } from "./transport.js";
import type { Worker } from "./worker.js";

export type JobOutcome =
  | { state: "succeeded" | "superseded" | "cancelled" | "waiting" | "suspended" }
  /** `error`: why the worker ended it dead itself, when the handler threw nothing (a refused result). */
  | { state: "dead"; error?: ValidationError }
  | { state: "stale"; error: StaleLeaseError }
  | { state: "lost"; reason: AbortReason }
  | { state: "report_failed"; error: unknown };

const MAX_ERROR_LENGTH = 4_000;

export async function reportEnd(
  worker: Worker,
  entry: InFlight,
  err: unknown,
  limit?: "stalled" | "timed_out",
  limitMessage?: string,
): Promise<JobOutcome> {
  const { job } = entry;
  // A durable handler that returned without reaching a step it recorded before: its code changed.
  if (err === undefined && entry.steps) err = await entry.steps.unreached();
  // A refused ctx.fencedWrite decides the end, whatever the handler did next (returned,
  // threw because its signal aborted, hit a limit): the job finishes as superseded, with no
  // retry to overwrite the newer claim's value. Only an explicit request retries it.
  if (entry.superseded !== undefined && !(err instanceof RetrySupersededError)) {
    const outcome = await worker.reporter.supersede({ id: job.id, attempt: job.attempt, reason: entry.superseded });
    if (outcome.applied) worker.logger.info({ jobId: job.id, attempt: job.attempt }, "job superseded by a newer claim's write; not retried");
    return answered(worker, entry, outcome, "supersede");
  }
  // A handler that returns after its progress was refused still fails: the job's recorded
  // state would otherwise miss what the handler reported.
  if (entry.refusedValue !== undefined && (err === undefined || err instanceof JobAbortedError)) err = new Error(entry.refusedValue);
  // Likewise after a handler broke out of ctx.transaction (and caught the error): its writes
  // were rolled back, so a success would record a job done without them.
  if (entry.transactionMisuse !== undefined && (err === undefined || err instanceof JobAbortedError)) err = entry.transactionMisuse;
  let outcome: ReportOutcome;
  // The return value is the job's result: one that cannot be stored fails the attempt for
  // good (the same code would return the same value again), naming the problem and the cap.
  let resultJson: string | undefined;
  let badResult: string | undefined;
  if (err === undefined) {
    const checked = serializeResult(entry.returned, worker.settings.maxResultBytes);
    if (typeof checked === "object") badResult = `the handler's result was refused: ${checked.problem}`;
    else resultJson = checked;
  }
  const rateLimited = err instanceof RateLimitedError && !limit ? validRateLimit(err) : undefined;
  if (err === undefined && badResult === undefined) {
    outcome = await worker.reporter.succeed(
      resultJson === undefined ? { id: job.id, attempt: job.attempt } : { id: job.id, attempt: job.attempt, resultJson },
    );
  } else if (rateLimited) {
    outcome = await worker.reporter.rateLimit({
      id: job.id,
      attempt: job.attempt,
      delayMs: rateLimited.retryInMs,
      scope: rateLimited.scope,
      message: sanitizeText(rateLimited.message, MAX_ERROR_LENGTH),
    });
    if (outcome.applied)
      worker.logger.info(
        { jobId: job.id, attempt: job.attempt, retryInMs: rateLimited.retryInMs },
        "job rate-limited; waits without spending an attempt",
      );
    return answered(worker, entry, outcome, "fail", "rate_limited");
  } else {
    const failure: Failure = {
      id: job.id,
      attempt: job.attempt,
      // A cancelled attempt ends with what happened, not with whatever its handler threw on the
      // way out (an abort error's stack says nothing to the person who cancelled it).
      error:
        badResult ??
        limitMessage ??
        (entry.abortedWith instanceof JobAbortedError && entry.abortedWith.reason === "cancelled" ? entry.abortedWith.message : describeError(err)),
      backoff: worker.settings.tasks.get(job.task)?.backoff ?? worker.settings.backoff,
      giveUp: badResult !== undefined || err instanceof PermanentJobError || entry.permanent === true,
      outcome: limit ?? "failed",
    };
    outcome = await worker.reporter.fail(failure);
    if (!(err instanceof JobAbortedError)) worker.logger.warn({ jobId: job.id, attempt: job.attempt, err: failure.error }, "job failed");
  }
  const ended = answered(worker, entry, outcome, err === undefined && badResult === undefined ? "complete" : "fail");
  return badResult !== undefined && ended.state === "dead" ? { state: "dead", error: new ValidationError(badResult) } : ended;
}

/**
 * The common end, reported without reportEnd's promises: a handler that returned a result
 * that can be stored (or none), with nothing else to settle first (no unsent progress, no
 * durable steps, no refused write or progress, no transaction misuse). `done` gets the
 * outcome. False (nothing reported): the attempt needs reportEnd.
 */
export function reportPlainSuccess(worker: Worker, entry: InFlight, done: (outcome: JobOutcome) => void): boolean {
  if (
    hasUnsentValues(entry) ||
    entry.steps !== undefined ||
    entry.superseded !== undefined ||
    entry.refusedValue !== undefined ||
    entry.transactionMisuse !== undefined
  ) {
    return false;
  }
  const resultJson = serializeResult(entry.returned, worker.settings.maxResultBytes);
  if (typeof resultJson === "object") return false; // reportEnd fails it, naming the problem
  const { job } = entry;
  worker.reporter.succeedThen(
    resultJson === undefined ? { id: job.id, attempt: job.attempt } : { id: job.id, attempt: job.attempt, resultJson },
    (o) => done(answered(worker, entry, o, "complete")),
  );
  return true;
}

/** Turns the reporter's answer into the attempt's outcome: counted, and a refusal recorded. */
function answered(worker: Worker, entry: InFlight, outcome: ReportOutcome, kind: "complete" | "fail" | "supersede", countAs?: string): JobOutcome {
  const { job } = entry;
  if (outcome.applied) {
    worker.countEnded(job.queue, countAs ?? (outcome.state === "waiting" ? "retry" : outcome.state));
    return { state: outcome.state };
  }
  if ("reason" in outcome) {
    const stale = new StaleLeaseError(job.id, job.attempt, outcome.reason);
    worker.metrics.fencingRejections.inc({ kind, reason: outcome.reason });
    recordRefusals(worker.transport, [{ jobId: job.id, attempt: job.attempt, workerId: worker.id, kind, reason: outcome.reason }]);
    worker.logger.warn({ jobId: job.id, attempt: job.attempt, reason: outcome.reason }, "report refused: stale lease");
    worker.emit("job:stale", job, stale);
    return { state: "stale", error: stale };
  }
  // Not a fence refusal: the report could not be written. The lease will expire and the
  // watchdog will put the job through the retry path.
  worker.logger.error({ jobId: job.id, err: String(outcome.error) }, "could not report job end");
  return { state: "report_failed", error: outcome.error };
}

/** A RateLimitedError with a usable delay and scope; a bad one is an ordinary failure that says why. */
function validRateLimit(err: RateLimitedError): RateLimitedError | undefined {
  try {
    checkRetryIn(err.retryInMs, err.scope);
    return err;
  } catch (bad) {
    err.message = `${err.message} (ignored as a rate limit: ${(bad as Error).message})`;
    return undefined;
  }
}

function describeError(err: unknown): string {
  let text: string;
  try {
    // Our own abort: its message says it all; its stack is the worker's internals.
    if (err instanceof JobAbortedError) text = err.message;
    else if (err instanceof Error) text = err.stack ?? `${err.name}: ${err.message}`;
    else text = typeof err === "string" ? err : (JSON.stringify(err) ?? String(err));
  } catch {
    text = Object.prototype.toString.call(err);
  }
  // A NUL or a lone surrogate in the message would make PostgreSQL refuse the failure report.
  return sanitizeText(text, MAX_ERROR_LENGTH);
}
