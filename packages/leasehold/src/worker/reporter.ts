/**
 * Reports attempts' ends in batches: the ends handed in during one turn of the event loop go
 * out together, and while one batch is being written the next fills up, so a busy worker
 * sends one completion statement for many jobs and an idle one reports at once. A report
 * resolves only after its commit is known.
 *
 * An ambiguous commit (the connection dropped while the statement ran) is retried: the
 * fenced statement is safe to repeat. If the retry matches nothing, the attempt's audit
 * row says whether the first try landed ("succeeded by my attempt" is success); anything
 * else is a stale lease: an ambiguous commit is not a stale report.
 */
import type { AttemptRef, Completion, EndState, Failure, LostLease, RateLimited, Supersession } from "../store/index.js";
import type { LostLeaseReason } from "../errors.js";
import type { Outage } from "./outage.js";
import { isConnectionError, type WorkerTransport } from "./transport.js";

/** How a reported attempt's job ended: a success or a supersession finishes it; a failure may retry it. */
export type EndedAs = "succeeded" | "superseded" | "cancelled" | EndState;

export type ReportOutcome = { applied: true; state: EndedAs } | { applied: false; reason: LostLeaseReason } | { applied: false; error: unknown };

interface Pending<T> {
  item: T;
  resolve: (o: ReportOutcome) => void;
}

const RETRY_MIN_MS = 100;
/** Retried at least once a second: reports land within a second of the database coming back. */
const RETRY_MAX_MS = 1_000;

/**
 * Report statements in flight at once. One batch at a time let completions queue behind a
 * round trip; a second batch starts only when enough have piled up to be worth a statement.
 */
export const MAX_REPORTS_IN_FLIGHT = 2;
const MIN_EXTRA_BATCH = 100;

export class Reporter {
  private successes: Pending<Completion>[] = [];
  private failures: Pending<Failure>[] = [];
  private supersessions: Pending<Supersession>[] = [];
  private rateLimits: Pending<RateLimited & { message: string }>[] = [];
  private inFlight = 0;
  /** A flush is due once this turn of the event loop has handed in what it ends. */
  private flushScheduled = false;
  private drained: (() => void)[] = [];
  /** After this moment (Date.now()), connection errors are no longer retried. */
  giveUpAfter = Infinity;

  constructor(
    private readonly transport: WorkerTransport,
    private readonly workerId: string,
    private readonly outage?: Outage,
  ) {}

  /** A success, with the handler's result (validated JSON) if it has one. */
  succeed(ref: Completion): Promise<ReportOutcome> {
    return new Promise((resolve) => this.succeedThen(ref, resolve));
  }

  /**
   * succeed() without a promise: `done` is called with the outcome once it is known (the
   * worker's plain success, where a promise and the async frames awaiting it were garbage
   * made per job).
   */
  succeedThen(ref: Completion, done: (o: ReportOutcome) => void): void {
    this.successes.push({ item: ref, resolve: done });
    this.kick();
  }

  fail(failure: Failure): Promise<ReportOutcome> {
    return new Promise((resolve) => {
      this.failures.push({ item: failure, resolve });
      this.kick();
    });
  }

  /** An attempt whose fenced write a newer claim overtook: its job finishes, not retried. */
  supersede(s: Supersession): Promise<ReportOutcome> {
    return new Promise((resolve) => {
      this.supersessions.push({ item: s, resolve });
      this.kick();
    });
  }

  /** An attempt whose handler was told to slow down: its job waits, no budget spent. */
  rateLimit(r: RateLimited & { message: string }): Promise<ReportOutcome> {
    return new Promise((resolve) => {
      this.rateLimits.push({ item: r, resolve });
      this.kick();
    });
  }

  private pending(): number {
    return this.successes.length + this.failures.length + this.supersessions.length + this.rateLimits.length;
  }

  /** Resolves when everything handed in so far has been reported. */
  drain(): Promise<void> {
    if (this.inFlight === 0 && this.pending() === 0) return Promise.resolve();
    return new Promise((resolve) => this.drained.push(resolve));
  }

  /**
   * Sends after the current turn of the event loop, not at once: the handlers of one claim's
   * jobs often end in the same turn, and the first end sent on its own made a batch of one
   * while the rest waited for the next. With 4 worker processes at concurrency 50 this halved
   * the completion statements (7 to 3 per 1,000 jobs); setImmediate adds no timer delay.
   */
  private kick(): void {
    if (this.flushScheduled) return;
    this.flushScheduled = true;
    setImmediate(() => {
      this.flushScheduled = false;
      this.flush();
    });
  }

  private flush(): void {
    for (;;) {
      const pending = this.pending();
      if (pending === 0 || this.inFlight >= MAX_REPORTS_IN_FLIGHT) break;
      if (this.inFlight > 0 && pending < MIN_EXTRA_BATCH) break;
      const successes = takeOnePerJob(this.successes);
      const failures = takeOnePerJob(this.failures);
      const supersessions = takeOnePerJob(this.supersessions);
      const rateLimits = takeOnePerJob(this.rateLimits);
      this.inFlight++;
      void Promise.all([
        successes.length &&
          this.send(successes, (items) => this.transport.complete({ workerId: this.workerId, jobs: items }), ["succeeded", "cancelled"]),
        failures.length &&
          this.send(failures, (items) => this.transport.fail({ workerId: this.workerId, failures: items }), [
            "failed",
            "stalled",
            "timed_out",
            "cancelled",
          ]),
        supersessions.length &&
          this.send(supersessions, (items) => this.transport.supersede({ workerId: this.workerId, jobs: items }), ["superseded", "cancelled"]),
        rateLimits.length &&
          this.send(
            rateLimits,
            // One statement per batch; the message of its first attempt stands for all (each says its own delay).
            (items) => this.transport.rateLimit({ workerId: this.workerId, jobs: items, message: items[0]!.message }),
            ["rate_limited", "cancelled"],
          ),
      ]).finally(() => {
        this.inFlight--;
        this.kick();
        if (this.inFlight === 0 && this.pending() === 0) {
          for (const resolve of this.drained.splice(0)) resolve();
        }
      });
    }
  }

  private async send<T extends AttemptRef>(
    batch: Pending<T>[],
    write: (items: T[]) => Promise<Map<string, EndedAs>>,
    landedAs: string[],
  ): Promise<void> {
    const items = batch.map((p) => p.item);
    let ambiguous = false;
    let applied: Map<string, EndedAs>;
    for (let delay = RETRY_MIN_MS; ; delay = Math.min(delay * 2, RETRY_MAX_MS)) {
      try {
        applied = await write(items);
        this.outage?.ok();
        break;
      } catch (err) {
        this.outage?.failed("report", err);
        if (!isConnectionError(err) || Date.now() > this.giveUpAfter) {
          for (const p of batch) settle(p, { applied: false, error: err });
          return;
        }
        ambiguous = true;
        await new Promise((r) => setTimeout(r, delay));
      }
    }
    const refused = batch.filter((p) => !applied.has(p.item.id));
    let lost = new Map<string, LostLease>();
    if (refused.length > 0) {
      lost = await this.transport.describeLost(refused.map((p) => ({ id: p.item.id, attempt: p.item.attempt }))).catch(() => lost);
    }
    for (const p of batch) {
      const state = applied.get(p.item.id);
      if (state) {
        settle(p, { applied: true, state });
        continue;
      }
      const l = lost.get(p.item.id);
      if (ambiguous && l?.endedAs && landedAs.includes(l.endedAs)) {
        // Our first try committed before the connection dropped.
        const state =
          l.endedAs === "succeeded" || l.endedAs === "superseded" || l.endedAs === "cancelled"
            ? l.endedAs
            : ((l.finishedState as EndState | null | undefined) ?? "waiting");
        settle(p, { applied: true, state });
      } else {
        settle(p, { applied: false, reason: l?.reason ?? "missing" });
      }
    }
  }
}

/**
 * Takes the pending reports to send now, at most one per job: the fenced statements answer
 * by job id, so two attempts of one job in a batch would be indistinguishable. The rest
 * (an older attempt of a job this worker claimed again) waits for the next batch.
 */
function takeOnePerJob<T extends AttemptRef>(pending: Pending<T>[]): Pending<T>[] {
  // Most flushes have no report of some kinds, and no job twice: nothing to sort out then.
  if (pending.length === 0) return NONE;
  const seen = new Set<string>();
  let later: Pending<T>[] | undefined;
  for (const p of pending) {
    if (seen.has(p.item.id)) (later ??= []).push(p);
    else seen.add(p.item.id);
  }
  if (!later) return pending.splice(0);
  const rest = later;
  const now = pending.filter((p) => !rest.includes(p));
  pending.splice(0, pending.length, ...rest);
  return now;
}

const NONE: never[] = [];

/**
 * Hands a report its outcome. A callback (succeedThen) that throws does so on its own turn, as
 * an awaited promise's rejection would, and the rest of the batch still gets its outcomes.
 */
function settle<T>(p: Pending<T>, outcome: ReportOutcome): void {
  try {
    p.resolve(outcome);
  } catch (err) {
    queueMicrotask(() => {
      throw err;
    });
  }
}
