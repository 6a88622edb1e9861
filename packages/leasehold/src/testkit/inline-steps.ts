/**
 * Durable steps for runInline: the worker's own step runner (worker/steps.ts: places by call
 * order, replay, StepMismatchError, per-step retry) over a host of the test kit's own. Records
 * live in a journal in memory, carried from one inline run to the next (`queue.resumeInline`),
 * so a test can run a handler, stop it (a failure, a sleep, a wait) and run it again from its
 * recorded steps, as a worker's next attempt would. Time and events are the test database's:
 * a sleep ends on its clock (the fake clock moves it), a wait receives events sent to it.
 */
import { ConfigError } from "../index.js";
import type pg from "pg";
import { JobSuspendedError, TransactionMisuseError, type ClaimedJob, type JsonValue } from "../index.js";
import { serializeStepResult, type StepKind, type StepRecord } from "../jobs/steps.js";
import type { AttemptSteps } from "../worker/steps.js";
import type { StepWorker } from "../worker/step-host.js";
import { runGuarded } from "../worker/transaction-guard.js";

/** A wait without a timeout still has a deadline on a worker: the longest delay (3650 days). */
const NO_TIMEOUT_MS = 3650 * 86_400_000;

/** Where an inline run suspended its job: the step, and when it wakes (null: only its event wakes it). */
export interface InlineSuspension {
  step: string;
  kind: StepKind;
  until: Date | null;
  /** The event a wait is for. */
  event?: string;
}

/** One inline job's durable state, across its runs. */
export class InlineJournal {
  readonly records = new Map<number, StepRecord>();
  /** The event each received wait took, by place: a later wait of that event takes a later one. */
  readonly receivedEvents = new Map<number, { event: string; id: string }>();
  /** Events sent before the job's first run are not its to receive (a worker's: sent before it was enqueued). */
  eventsAfter?: string;
  private suspended?: InlineSuspension;

  suspend(suspension: InlineSuspension): void {
    this.suspended = suspension;
  }
  /** Where the last run suspended, if it did. */
  suspension(): InlineSuspension | undefined {
    return this.suspended && { ...this.suspended };
  }
  /** A new run begins: the suspension is over. */
  resume(): void {
    this.suspended = undefined;
  }

  list(): StepRecord[] {
    return [...this.records.values()].sort((a, b) => a.seq - b.seq).map((r) => ({ ...r }));
  }
}

/** The attempt as the step runner sees it (a worker's in-flight entry). */
export type InFlight = ConstructorParameters<typeof AttemptSteps>[0];
type StepOutcome = Parameters<StepWorker["record"]>[1];

interface PlaceRef {
  seq: number;
  name: string;
  occurrence: number;
  kind: StepKind;
}

export interface InlineStepDeps {
  /** On the Leasehold schema of the test database: its clock and its events. */
  pool: pg.Pool;
  /** ctx.step.transaction's default pool. */
  appPool(): pg.Pool;
  signal(): AbortSignal;
  /** The handler broke out of a step's transaction: the attempt fails, as on a worker. */
  misused(err: TransactionMisuseError): void;
}

/** The InFlight entry worker/steps.ts reads: the job's identity, and how the attempt stands. */
export function inlineEntry(job: { id: string; attempt: number; fence: string; task: string; queue: string }): InFlight {
  return {
    job: { ...job, payload: null } as unknown as ClaimedJob,
    renewedAt: 0,
    phase: "running",
    claimedAt: 0,
    progressTimeoutMs: null,
    maxRunMs: null,
  };
}

export class InlineStepHost implements StepWorker {
  /** The names of the steps this run replayed, in order. */
  readonly replayedSteps: string[] = [];

  constructor(
    private readonly journal: InlineJournal,
    private readonly deps: InlineStepDeps,
  ) {}

  async loadSteps(): Promise<StepRecord[]> {
    return this.journal.list();
  }

  /**
   * Children need their parent's job row (each child names it, and its end wakes it), which an
   * inline run does not write: said so, pointing at what does run them.
   */
  children(): Promise<never> {
    return Promise.reject(
      new ConfigError(
        "runInline cannot run ctx.children: the children name their parent's job row, which an inline run does not write; run the job with queue.drain() instead",
      ),
    );
  }

  /** An inline run has no server to hand a URL for: its callbacks are completed with queue.completeCallback. */
  callbackUrl(): string | null {
    return null;
  }

  async record(entry: InFlight, outcome: StepOutcome): Promise<{ result: JsonValue | undefined } | undefined> {
    const existing = this.journal.records.get(outcome.seq);
    // As the database's ON CONFLICT: a success stands, a failure gives way.
    if (existing?.state === "succeeded") return outcome.state === "succeeded" ? { result: existing.result } : undefined;
    const result = outcome.resultJson === undefined ? undefined : (JSON.parse(outcome.resultJson) as JsonValue);
    await this.put(entry, outcome, { state: outcome.state, result, error: outcome.error ?? null, durationMs: Math.round(outcome.durationMs) });
    return undefined;
  }

  replayed(_entry: InFlight, place: PlaceRef): void {
    this.replayedSteps.push(place.name);
  }

  traced<T>(_entry: InFlight, _place: PlaceRef, fn: () => Promise<T>): Promise<T> {
    return fn();
  }

  progressed(): void {}

  signal(): AbortSignal {
    return this.deps.signal();
  }

  /** The step's writes and its record together: the record is kept only once its transaction commits. */
  async transaction<T>(entry: InFlight, place: PlaceRef, work: (tx: pg.PoolClient) => Promise<T>, pool?: pg.Pool): Promise<JsonValue | undefined> {
    const started = performance.now();
    const client = await (pool ?? this.deps.appPool()).connect();
    try {
      await client.query("BEGIN");
      const value = await runGuarded(client, `job ${entry.job.id} attempt ${entry.job.attempt}, step "${place.name}"`, work);
      const json = serializeStepResult(value, place.name);
      await client.query("COMMIT");
      const result = json === undefined ? undefined : (JSON.parse(json) as JsonValue);
      await this.put(entry, place, { state: "succeeded", result, durationMs: Math.round(performance.now() - started) });
      return result;
    } catch (err) {
      if (err instanceof TransactionMisuseError) this.deps.misused(err);
      await client.query("ROLLBACK").catch(() => {});
      throw err;
    } finally {
      client.release();
    }
  }

  /** A sleep whose end has passed on the test database's clock goes on; otherwise the job suspends until then. */
  async sleep(entry: InFlight, place: PlaceRef, target: { until: Date } | { ms: number }): Promise<void> {
    const now = await this.now();
    const until = "until" in target ? target.until : new Date(now.getTime() + target.ms);
    await this.put(entry, place, { state: "succeeded", wakeAt: until });
    if (until.getTime() > now.getTime()) this.suspend(entry, { step: place.name, kind: place.kind, until });
  }

  /**
   * The first matching event sent to the test database since the job's first run (and after any
   * this job's earlier waits of that event took), or, past the wait's deadline, null; otherwise
   * the job suspends until the event is sent or the deadline passes.
   */
  async waitForEvent(
    entry: InFlight,
    place: PlaceRef,
    wait: { event: string; matchJson: string | null; timeoutMs: number | null },
  ): Promise<JsonValue | null> {
    const now = await this.now();
    const begun = this.journal.records.get(place.seq);
    const deadline = begun?.wakeAt ?? new Date(now.getTime() + (wait.timeoutMs ?? NO_TIMEOUT_MS));
    const taken = [...this.journal.receivedEvents.values()].filter((r) => r.event === wait.event).map((r) => BigInt(r.id));
    const after = [BigInt(this.journal.eventsAfter ?? "0"), ...taken].reduce((a, b) => (a > b ? a : b));
    const { rows } = await this.deps.pool.query<{ id: string; data: JsonValue | null }>(
      `SELECT id::text, data FROM events
        WHERE name = $1 AND id > $2::bigint AND ($3::jsonb IS NULL OR coalesce(data, 'null'::jsonb) @> $3::jsonb)
        ORDER BY id LIMIT 1`,
      [wait.event, after.toString(), wait.matchJson],
    );
    const received = rows[0];
    const base = { event: wait.event, wakeAt: deadline };
    if (received) {
      this.journal.receivedEvents.set(place.seq, { event: wait.event, id: received.id });
      await this.put(entry, place, { ...base, state: "succeeded", result: received.data ?? undefined });
      return received.data;
    }
    if (deadline.getTime() <= now.getTime()) {
      await this.put(entry, place, { ...base, state: "succeeded", result: undefined });
      return null;
    }
    await this.put(entry, place, { ...base, state: "waiting" });
    this.suspend(entry, { step: place.name, kind: place.kind, until: wait.timeoutMs === null ? null : deadline, event: wait.event });
  }

  private suspend(entry: InFlight, suspension: InlineSuspension): never {
    entry.within = "suspended";
    this.journal.suspend(suspension);
    throw new JobSuspendedError(entry.job.id, suspension.step, suspension.until);
  }

  private async now(): Promise<Date> {
    const { rows } = await this.deps.pool.query<{ now: Date }>("SELECT now() AS now");
    return rows[0]!.now;
  }

  private async put(
    entry: InFlight,
    place: { seq: number; name: string; occurrence: number; kind: StepKind },
    fields: Partial<StepRecord> & Pick<StepRecord, "state">,
  ): Promise<void> {
    this.journal.records.set(place.seq, {
      seq: place.seq,
      name: place.name,
      occurrence: place.occurrence,
      kind: place.kind,
      attempt: entry.job.attempt,
      result: undefined,
      error: null,
      durationMs: null,
      wakeAt: null,
      event: null,
      recordedAt: await this.now(),
      ...fields,
    });
  }
}
