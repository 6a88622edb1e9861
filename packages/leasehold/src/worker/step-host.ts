/**
 * Where a step is recorded: the worker's side of durable steps (worker/steps.ts runs them for a
 * handler). Records go through the transport, batched: while one statement is on its way, the
 * records that handlers finish meanwhile wait and go together in the next, so a busy worker
 * writes many steps per statement and an idle one sends each at once.
 *
 * A record or a suspension the fence refuses ends the attempt as a lost lease: the handler gets a
 * StaleLeaseError and its signal aborts, and nothing it does later is reported.
 */
import type pg from "pg";
import { ConfigError, JobSuspendedError, StaleLeaseError, StepMismatchError, TransactionMisuseError } from "../errors.js";
import { PermanentJobError } from "./context.js";
import { callbackUrl } from "../jobs/callbacks.js";
import { serializeStepResult, type StepRecord } from "../jobs/steps.js";
import type { JsonValue } from "../jobs/types.js";
import type { Logger } from "../logger.js";
import type { ComposedHooks } from "../hooks.js";
import type { Metrics } from "../metrics.js";
import type { LostLeaseReason } from "../errors.js";
import type { StepOutcome } from "../store/steps.js";
import type { ChildEndRecord } from "../store/children.js";
import type { PreparedChildren } from "./children.js";
import type { InFlight } from "./heartbeat.js";
import { recordRefusals, type SuspensionAnswer, type WorkerTransport } from "./transport.js";
import type { StepKind } from "../jobs/steps.js";

/** What the step host needs of its worker (@internal methods of Worker). */
export interface StepWorkerDeps {
  readonly id: string;
  readonly transport: WorkerTransport;
  readonly metrics: Metrics;
  readonly logger: Logger;
  /** The `leasehold serve` URL a callback's URL is made from; null: callbacks hand out tokens only. */
  readonly callbackBaseUrl: string | null;
  /** aroundStep: tracing's span per step (otel/tracing.ts). */
  readonly hooks: Pick<ComposedHooks, "aroundStep">;
  progressed(entry: InFlight): void;
  /** The attempt lost its job: abort the handler, report nothing. */
  stepLost(entry: InFlight, reason: LostLeaseReason): void;
  /** The attempt suspended its job (or the suspension found it cancelled): no more beats, no report. */
  attemptSuspended(entry: InFlight): void;
  /** Progress and checkpoint set but not yet sent: stored before the attempt's end. */
  sendPending(entry: InFlight): Promise<void>;
}

interface PlaceRef {
  seq: number;
  name: string;
  occurrence: number;
  kind: StepKind;
}

/** What worker/steps.ts calls. */
export interface StepWorker {
  loadSteps(entry: InFlight): Promise<StepRecord[]>;
  /** Records an outcome; returns another attempt's record of the place if it came first. */
  record(entry: InFlight, outcome: Omit<StepOutcome, "id" | "attempt">): Promise<{ result: JsonValue | undefined } | undefined>;
  replayed(entry: InFlight, place: PlaceRef): void;
  traced<T>(entry: InFlight, place: PlaceRef, fn: () => Promise<T>): Promise<T>;
  progressed(entry: InFlight): void;
  signal(entry: InFlight): AbortSignal;
  /** The URL that completes a callback, when the worker knows the server's. */
  callbackUrl(token: string): string | null;
  transaction<T>(entry: InFlight, place: PlaceRef, work: (tx: pg.PoolClient) => Promise<T>, pool?: pg.Pool): Promise<JsonValue | undefined>;
  sleep(entry: InFlight, place: PlaceRef, target: { until: Date } | { ms: number }): Promise<void>;
  waitForEvent(
    entry: InFlight,
    place: PlaceRef,
    wait: { event: string; matchJson: string | null; timeoutMs: number | null; kind?: "event" | "callback" | "children" },
  ): Promise<JsonValue | null>;
  /** ctx.children: the children's ends once all have ended; else the job suspends (JobSuspendedError). */
  children(entry: InFlight, place: PlaceRef, start: PreparedChildren | null): Promise<ChildEndRecord[]>;
}

interface Pending {
  outcome: StepOutcome;
  entry: InFlight;
  resolve: (stored: { result: JsonValue | undefined } | undefined) => void;
  reject: (err: unknown) => void;
}

export class StepHost implements StepWorker {
  private queued: Pending[] = [];
  private sending = false;

  constructor(private readonly w: StepWorkerDeps) {}

  loadSteps(entry: InFlight): Promise<StepRecord[]> {
    const t = this.w.transport;
    if (!t.loadSteps) return Promise.reject(unsupported("durable steps"));
    return t.loadSteps({ workerId: this.w.id, job: ref(entry) });
  }

  record(entry: InFlight, outcome: Omit<StepOutcome, "id" | "attempt">): Promise<{ result: JsonValue | undefined } | undefined> {
    if (!this.w.transport.recordSteps) return Promise.reject(unsupported("ctx.step"));
    const full: StepOutcome = { ...outcome, id: entry.job.id, attempt: entry.job.attempt, durationMs: Math.round(outcome.durationMs) };
    return new Promise((resolve, reject) => {
      this.queued.push({ outcome: full, entry, resolve, reject });
      if (!this.sending) void this.send();
    });
  }

  /** Sends what is queued, then what came meanwhile, until nothing is left. */
  private async send(): Promise<void> {
    this.sending = true;
    try {
      while (this.queued.length > 0) {
        const batch = this.queued;
        this.queued = [];
        let recorded: Set<string>;
        try {
          recorded = await this.w.transport.recordSteps!({ workerId: this.w.id, steps: batch.map((p) => p.outcome) });
        } catch (err) {
          for (const p of batch) p.reject(err);
          continue;
        }
        for (const p of batch) {
          const o = p.outcome;
          if (recorded.has(`${o.id}:${o.seq}`)) {
            if (o.state === "succeeded") this.w.metrics.stepsRecorded.inc({ kind: o.kind });
            p.resolve(undefined);
          } else this.refused(p).then(p.resolve, p.reject);
        }
      }
    } finally {
      this.sending = false;
    }
  }

  /** A record the statement refused: the attempt lost its job, or another attempt recorded the place. */
  private async refused(p: Pending): Promise<{ result: JsonValue | undefined } | undefined> {
    const o = p.outcome;
    const fate = await this.w.transport.stepFate!({ workerId: this.w.id, id: o.id, attempt: o.attempt, seq: o.seq });
    if (!fate.held) throw await this.lost(p.entry);
    const r = fate.recorded;
    if (r && (r.name !== o.name || r.occurrence !== o.occurrence)) {
      throw new StepMismatchError(o.id, o.seq, { ...r, kind: "step" }, { name: o.name, occurrence: o.occurrence, kind: o.kind });
    }
    // A failure that lost to a success: the success stands, and the failure still fails this attempt.
    return r?.state === "succeeded" && o.state === "succeeded" ? { result: r.result } : undefined;
  }

  /** Turns a refusal into the attempt's end as lost, and the error its handler gets. */
  private async lost(entry: InFlight): Promise<StaleLeaseError> {
    const job = ref(entry);
    const lost = (await this.w.transport.describeLost([job]).catch(() => new Map())).get(job.id);
    const reason: LostLeaseReason = lost?.reason ?? "missing";
    this.w.metrics.fencingRejections.inc({ kind: "step", reason });
    recordRefusals(this.w.transport, [{ jobId: job.id, attempt: job.attempt, workerId: this.w.id, kind: "step", reason }]);
    this.w.logger.warn({ jobId: job.id, attempt: job.attempt, reason }, "step refused: the attempt no longer holds its job");
    this.w.stepLost(entry, reason);
    return new StaleLeaseError(job.id, job.attempt, reason);
  }

  replayed(entry: InFlight, place: PlaceRef): void {
    this.w.metrics.stepsReplayed.inc({ kind: place.kind });
    const around = this.w.hooks.aroundStep;
    // Nothing runs on a replay: the hook sees it (a span marked replayed), and cannot fail it.
    if (around) {
      around(entry.job, { ...place, replayed: true }, () => Promise.resolve(undefined)).catch((err: unknown) =>
        this.w.logger.warn({ hook: "aroundStep", err: String(err) }, "a hook threw; ignored"),
      );
    }
  }

  traced<T>(entry: InFlight, place: PlaceRef, fn: () => Promise<T>): Promise<T> {
    const around = this.w.hooks.aroundStep;
    return around ? (around(entry.job, { ...place, replayed: false }, fn) as Promise<T>) : fn();
  }

  progressed(entry: InFlight): void {
    this.w.progressed(entry);
  }

  callbackUrl(token: string): string | null {
    return this.w.callbackBaseUrl === null ? null : callbackUrl(this.w.callbackBaseUrl, token);
  }

  signal(entry: InFlight): AbortSignal {
    if (!entry.controller) {
      entry.controller = new AbortController();
      if (entry.abortedWith) entry.controller.abort(entry.abortedWith);
    }
    return entry.controller.signal;
  }

  // A transaction, a sleep and a wait each run in one span of the aroundStep hooks (when any).
  transaction<T>(entry: InFlight, place: PlaceRef, work: (tx: pg.PoolClient) => Promise<T>, pool?: pg.Pool): Promise<JsonValue | undefined> {
    return this.traced(entry, place, () => this.runTransaction(entry, place, work, pool));
  }

  sleep(entry: InFlight, place: PlaceRef, target: { until: Date } | { ms: number }): Promise<void> {
    return this.traced(entry, place, () => this.runSleep(entry, place, target));
  }

  waitForEvent(
    entry: InFlight,
    place: PlaceRef,
    wait: { event: string; matchJson: string | null; timeoutMs: number | null; kind?: "event" | "callback" | "children" },
  ): Promise<JsonValue | null> {
    return this.traced(entry, place, () => this.runWaitForEvent(entry, place, wait));
  }

  private async runTransaction<T>(
    entry: InFlight,
    place: PlaceRef,
    work: (tx: pg.PoolClient) => Promise<T>,
    pool?: pg.Pool,
  ): Promise<JsonValue | undefined> {
    const t = this.w.transport;
    if (!t.recordStepWithin) {
      entry.permanent = true;
      throw new PermanentJobError(
        "ctx.step.transaction needs a worker on the database: a remote worker (through leasehold serve) cannot join the " +
          "server's transactions, so the job is dead without retries. Run this task on a worker connected to the database, " +
          "or use ctx.step and make its writes idempotent",
      );
    }
    const started = performance.now();
    let answer;
    try {
      answer = await t.recordStepWithin({
        workerId: this.w.id,
        job: ref(entry),
        place,
        work,
        pool,
        result: (value: T) => serializeStepResult(value, place.name) ?? null,
        durationMs: () => Math.round(performance.now() - started),
      });
    } catch (err) {
      if (err instanceof TransactionMisuseError) entry.transactionMisuse ??= err;
      throw err;
    }
    if (answer.recorded) {
      this.w.metrics.stepsRecorded.inc({ kind: "transaction" });
      return answer.resultJson === null ? undefined : (JSON.parse(answer.resultJson) as JsonValue);
    }
    if (!answer.held) throw await this.lost(entry);
    const r = answer.other!;
    if (r.name !== place.name || r.occurrence !== place.occurrence) {
      throw new StepMismatchError(entry.job.id, place.seq, { ...r, kind: "transaction" }, place);
    }
    // Another attempt's transaction committed this step first: this one's writes were rolled back.
    return r.result;
  }

  private async runSleep(entry: InFlight, place: PlaceRef, target: { until: Date } | { ms: number }): Promise<void> {
    const t = this.w.transport;
    if (!t.sleep) throw unsupported("ctx.sleep");
    await this.suspending(entry, place, "until" in target ? target.until : null, async () => {
      const answer = await t.sleep!({ workerId: this.w.id, id: entry.job.id, attempt: entry.job.attempt, ...place, ...target });
      // "due": its end had passed; recorded, and the handler goes on.
      return answer === "due" ? { over: undefined } : answer;
    });
  }

  private async runWaitForEvent(
    entry: InFlight,
    place: PlaceRef,
    wait: { event: string; matchJson: string | null; timeoutMs: number | null; kind?: "event" | "callback" | "children" },
  ): Promise<JsonValue | null> {
    const t = this.w.transport;
    if (!t.waitForEvent) throw unsupported("ctx.waitForEvent");
    return this.suspending(entry, place, null, async () => {
      const answer = await t.waitForEvent!({
        workerId: this.w.id,
        id: entry.job.id,
        attempt: entry.job.attempt,
        seq: place.seq,
        name: place.name,
        occurrence: place.occurrence,
        kind: wait.kind ?? "event",
        event: wait.event,
        matchJson: wait.matchJson,
        timeoutMs: wait.timeoutMs,
      });
      return typeof answer === "object" ? { over: answer.received ? answer.data : null, counted: true } : answer;
    });
  }

  async children(entry: InFlight, place: PlaceRef, start: PreparedChildren | null): Promise<ChildEndRecord[]> {
    const t = this.w.transport;
    if (!t.children) throw unsupported("ctx.children");
    return this.suspending(entry, place, null, async () => {
      const answer = await t.children!({
        workerId: this.w.id,
        id: entry.job.id,
        attempt: entry.job.attempt,
        seq: place.seq,
        name: place.name,
        occurrence: place.occurrence,
        nodes: start?.nodes ?? null,
        flow: start?.flow ?? false,
        given: start?.given ?? null,
      });
      return typeof answer === "object" ? { over: answer.ends, counted: true } : answer;
    });
  }

  /**
   * A call that may end the attempt in its own statement (a sleep, a wait, children): while it
   * runs the attempt is "suspending" (a beat that misses the job then is no lost lease). Its
   * answer: the call is over (`over`: what it returns; `counted`: record it in the metrics), the
   * job suspended (or was cancelled on the way: JobSuspendedError), or the attempt had lost it.
   */
  private async suspending<T>(
    entry: InFlight,
    place: PlaceRef,
    until: Date | null,
    run: () => Promise<{ over: T; counted?: boolean } | SuspensionAnswer>,
  ): Promise<T> {
    await this.beforeEnd(entry);
    entry.within = "suspending";
    let answer;
    try {
      answer = await run();
    } catch (err) {
      entry.within = undefined;
      throw err;
    }
    if (typeof answer === "object") {
      entry.within = undefined;
      if (answer.counted) this.w.metrics.stepsRecorded.inc({ kind: place.kind });
      return answer.over;
    }
    if (answer === "stale") {
      entry.within = undefined;
      throw await this.lost(entry);
    }
    this.ended(entry, answer, place, until);
  }

  /** What the handler set is stored before the attempt ends; a beat then may find it gone. */
  private async beforeEnd(entry: InFlight): Promise<void> {
    if (entry.progressJson !== undefined || entry.checkpointJson !== undefined) await this.w.sendPending(entry);
    if (entry.abortedWith) throw entry.abortedWith;
  }

  /** The suspension's answer: suspended (or cancelled on the way), else the attempt had lost its job. */
  private ended(entry: InFlight, answer: "suspended" | "cancelled", place: PlaceRef, until: Date | null): never {
    entry.within = answer === "suspended" ? "suspended" : "cancelled";
    this.w.attemptSuspended(entry);
    if (answer === "suspended") this.w.metrics.stepsRecorded.inc({ kind: place.kind });
    throw new JobSuspendedError(entry.job.id, place.name, until);
  }
}

function ref(entry: InFlight): { id: string; attempt: number } {
  return { id: entry.job.id, attempt: entry.job.attempt };
}

function unsupported(what: string): ConfigError {
  return new ConfigError(`${what}: this worker's transport cannot record durable steps`);
}
