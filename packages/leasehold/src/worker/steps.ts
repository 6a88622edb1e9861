/**
 * Durable steps on the worker: ctx.step, ctx.step.transaction, ctx.sleep and ctx.waitForEvent
 * for one attempt (docs/durable.md).
 *
 * Each call takes the next place (`seq`) in the order the handler calls them, synchronously, so
 * steps started together (Promise.all) get the same places on every replay. An attempt after
 * the first reads the job's recorded steps once, at its first call; a recorded place returns its
 * result without running anything, and a place recorded for another step fails the attempt
 * (StepMismatchError). A new step's result is recorded, fenced, before the handler goes on.
 */
import type pg from "pg";
import { StepMismatchError, ValidationError } from "../errors.js";
import {
  MAX_STEPS_PER_JOB,
  checkStepName,
  durationMs,
  serializeEventData,
  serializeStepResult,
  sleepTarget,
  type Duration,
  type StepKind,
  type StepRecord,
} from "../jobs/steps.js";
import type { JsonValue } from "../jobs/types.js";
import { callbackEvent, newCallbackToken } from "../jobs/callbacks.js";
import type { InFlight } from "./heartbeat.js";
import type { StepWorker } from "./step-host.js";
import { PermanentJobError } from "./context.js";
import { eventName, isDefinedEvent, receivedData, type AnyEvent } from "../tasks/events.js";
import { prepareChildren, type ChildEnd, type ChildrenFunction } from "./children.js";

/** A step's own retries, within the attempt, before its error fails the attempt. */
export interface StepRetry {
  /** Runs of `fn` in all, at least 1 (default 1: no retry). */
  attempts: number;
  /** Delay before the first retry (default 1,000 ms); each next one `factor` (default 2) times longer. */
  delayMs?: number;
  factor?: number;
  /** The longest delay (default 60,000 ms). */
  maxDelayMs?: number;
}

export interface StepOptions {
  /** Runs `fn` again after a failure, in this attempt, before the step fails it (default: no retry). */
  retry?: StepRetry;
}

export interface WaitForEventOptions {
  /** The event to wait for (as sent by sendEvent): its name, or an event made by defineEvent (its data then goes through the schema). */
  event: string | AnyEvent;
  /** Fields the event's data must contain (JSON containment, as PostgreSQL's @>). */
  match?: Record<string, JsonValue>;
  /** How long to wait (ms, or a duration such as "3d"); the wait then returns null. Default: 3650 days. */
  timeout?: Duration;
}

export interface CallbackOptions {
  /** How long its wait waits (ms, or a duration such as "3d"), from when wait() begins; then null. Default: 3650 days. */
  timeout?: Duration;
}

/** What ctx.callback hands out: the token (and its URL on `leasehold serve`), and the wait it completes. */
export interface Callback<T = JsonValue> {
  /** The credential that completes this wait once: 43 base64url characters. */
  readonly token: string;
  /** POST here to complete it, when the worker knows the server's URL (a remote worker, or `callbackBaseUrl`); else null. */
  readonly url: string | null;
  /** The data it was completed with, or null after the timeout; suspends the job until then. Once per callback. */
  wait(): Promise<T | null>;
}

/** ctx.step: runs `fn` once per job, its JSON result recorded; ctx.step.transaction runs in a transaction. */
export interface StepFunction {
  <T>(name: string, fn: () => T | Promise<T>, options?: StepOptions): Promise<Awaited<T>>;
  /**
   * A step whose database writes and record commit together, in one transaction on the worker's
   * database: exactly once per job, even with a zombie worker. `tx` is guarded as in
   * ctx.transaction (no COMMIT/ROLLBACK of your own; savepoints work). Workers on the database
   * only.
   */
  transaction<T>(name: string, work: (tx: pg.PoolClient) => Promise<T>, options?: { pool?: pg.Pool }): Promise<Awaited<T>>;
}

interface Place {
  seq: number;
  name: string;
  occurrence: number;
  kind: StepKind;
}

/** The durable state of one attempt: the places taken, and the records a replay reads. */
export class AttemptSteps {
  private next = 0;
  private readonly occurrences = new Map<string, number>();
  private records?: Promise<Map<number, StepRecord>>;

  constructor(
    private readonly entry: InFlight,
    private readonly host: StepWorker,
  ) {}

  readonly step: StepFunction = Object.assign(<T>(name: string, fn: () => T | Promise<T>, options?: StepOptions) => this.runStep(name, fn, options), {
    transaction: <T>(name: string, work: (tx: pg.PoolClient) => Promise<T>, options?: { pool?: pg.Pool }) => this.runTransaction(name, work, options),
  });

  /**
   * Takes the next place, synchronously (call order, not completion order). `counter`: what its
   * occurrence counts (its name; a callback's wait counts apart from the callback it shares a name with).
   */
  private take(name: unknown, kind: StepKind, call: string, counter = String(name)): Place {
    checkStepName(name, call);
    this.usable();
    if (this.next >= MAX_STEPS_PER_JOB) {
      throw new PermanentJobError(`job ${this.entry.job.id}: more than ${MAX_STEPS_PER_JOB} steps (the most one job may record)`);
    }
    const occurrence = this.occurrences.get(counter) ?? 0;
    this.occurrences.set(counter, occurrence + 1);
    return { seq: this.next++, name, occurrence, kind };
  }

  /** Steps after the attempt ended (suspended, finished by its transaction, lost) are refused. */
  private usable(): void {
    const e = this.entry;
    if (e.abortedWith) throw e.abortedWith;
    if (e.within) throw new ValidationError(`job ${e.job.id} attempt ${e.job.attempt}: the attempt has ended (${e.within}); no more steps run in it`);
  }

  /** The record at a place, after checking it is this step's; undefined: not recorded. */
  private async recorded(place: Place): Promise<StepRecord | undefined> {
    // The first attempt cannot have records: nothing to read.
    if (this.entry.job.attempt <= 1) return undefined;
    this.records ??= this.host.loadSteps(this.entry).then((list) => new Map(list.map((r) => [r.seq, r])));
    const record = (await this.records).get(place.seq);
    if (!record) return undefined;
    if (record.name !== place.name || record.occurrence !== place.occurrence || !sameKind(record.kind, place.kind)) {
      throw new StepMismatchError(this.entry.job.id, place.seq, record, place);
    }
    return record;
  }

  /** At the handler's successful end: a recorded place the code no longer reaches is a changed handler. */
  async unreached(): Promise<StepMismatchError | undefined> {
    if (!this.records) return undefined;
    const records = await this.records;
    for (const [seq, record] of records) {
      if (seq >= this.next && record.state !== "failed") return new StepMismatchError(this.entry.job.id, seq, record, undefined);
    }
    return undefined;
  }

  private async runStep<T>(name: string, fn: () => T | Promise<T>, options: StepOptions = {}): Promise<Awaited<T>> {
    const place = this.take(name, "step", "ctx.step");
    if (typeof fn !== "function") throw new ValidationError(`ctx.step("${name}"): the second argument must be a function`);
    const retry = checkRetry(options.retry, name);
    const record = await this.recorded(place);
    if (record?.state === "succeeded") {
      this.host.replayed(this.entry, place);
      return record.result as Awaited<T>;
    }
    this.usable();
    const started = performance.now();
    let value: Awaited<T>;
    for (let run = 1; ; run++) {
      try {
        value = await this.host.traced(this.entry, place, async () => await fn());
        break;
      } catch (err) {
        if (run >= retry.attempts || this.entry.abortedWith) {
          await this.host.record(this.entry, {
            ...place,
            kind: "step",
            state: "failed",
            error: errorText(err),
            durationMs: performance.now() - started,
          });
          throw err;
        }
        await pause(retryDelay(retry, run), this.host.signal(this.entry));
        this.usable();
      }
    }
    const json = serializeStepResult(value, name);
    this.host.progressed(this.entry);
    const stored = await this.host.record(this.entry, {
      ...place,
      kind: "step",
      state: "succeeded",
      resultJson: json,
      durationMs: performance.now() - started,
    });
    // Another attempt of this job recorded the place first (it ran meanwhile): its result stands.
    if (stored !== undefined) return stored.result as Awaited<T>;
    return (json === undefined ? undefined : JSON.parse(json)) as Awaited<T>;
  }

  private async runTransaction<T>(name: string, work: (tx: pg.PoolClient) => Promise<T>, options: { pool?: pg.Pool } = {}): Promise<Awaited<T>> {
    const place = this.take(name, "transaction", "ctx.step.transaction");
    if (typeof work !== "function") throw new ValidationError(`ctx.step.transaction("${name}"): the second argument must be a function`);
    const record = await this.recorded(place);
    if (record?.state === "succeeded") {
      this.host.replayed(this.entry, place);
      return record.result as Awaited<T>;
    }
    this.usable();
    const result = await this.host.transaction(this.entry, place, work, options.pool);
    this.host.progressed(this.entry);
    return result as Awaited<T>;
  }

  async sleep(name: string, until: Duration | Date): Promise<void> {
    const place = this.take(name, "sleep", "ctx.sleep");
    const target = sleepTarget(until, `ctx.sleep("${name}")`);
    if (await this.recorded(place)) return this.host.replayed(this.entry, place);
    this.usable();
    await this.host.sleep(this.entry, place, target);
  }

  async waitForEvent<T = JsonValue>(name: string, options: WaitForEventOptions): Promise<T | null> {
    const place = this.take(name, "event", "ctx.waitForEvent");
    const call = `ctx.waitForEvent("${name}")`;
    if (options === null || typeof options !== "object") throw new ValidationError(`${call}: options { event, match?, timeout? } are required`);
    const event = eventName(options.event, call);
    const matchJson = options.match === undefined ? null : serializeEventData(options.match, `${call}: match`);
    const timeoutMs = options.timeout === undefined ? null : durationMs(options.timeout, `${call}: timeout`);
    const record = await this.recorded(place);
    let data: JsonValue | null;
    if (record?.state === "succeeded") {
      this.host.replayed(this.entry, place);
      data = record.result ?? null;
    } else {
      this.usable();
      data = await this.host.waitForEvent(this.entry, place, { event, matchJson, timeoutMs });
    }
    // A defined event's data goes through its schema (defaults, transforms), on every replay too.
    if (data === null || !isDefinedEvent(options.event)) return data as T | null;
    return (await receivedData(options.event, data, call)) as T;
  }

  /**
   * ctx.callback: a token recorded as a step (a replay hands out the same one), and a wait for it
   * under the same name. Its wait is a wait for the event named from the token (waitForEvent's
   * races and suspension), which only complete_callback() sends.
   */
  async callback<T = JsonValue>(name: string, options: CallbackOptions = {}): Promise<Callback<T>> {
    const place = this.take(name, "callback", "ctx.callback");
    const call = `ctx.callback("${name}")`;
    if (options === null || typeof options !== "object") throw new ValidationError(`${call}: options must be an object { timeout? }`);
    const timeoutMs = options.timeout === undefined ? null : durationMs(options.timeout, `${call}: timeout`);
    const record = await this.recorded(place);
    // The token's record holds no event, its wait's does: a wait met where a token is recorded is a changed handler.
    if (record && record.event !== null) throw new StepMismatchError(this.entry.job.id, place.seq, record, place);
    let token: string;
    if (record?.state === "succeeded") {
      this.host.replayed(this.entry, place);
      token = (record.result as { token: string }).token;
    } else {
      this.usable();
      token = newCallbackToken();
      const stored = await this.host.record(this.entry, {
        ...place,
        kind: "callback",
        state: "succeeded",
        resultJson: JSON.stringify({ token }),
        durationMs: 0,
      });
      // Another attempt recorded this callback first: its token is the one handed out.
      if (stored !== undefined) token = (stored.result as { token: string }).token;
    }
    let waited = false;
    return {
      token,
      url: this.host.callbackUrl(token),
      wait: async () => {
        if (waited) throw new ValidationError(`${call}: wait() was called already; a callback completes one wait`);
        waited = true;
        const wait = this.take(name, "callback", "ctx.callback", `\0wait:${name}`);
        const over = await this.recorded(wait);
        if (over && over.event === null) throw new StepMismatchError(this.entry.job.id, wait.seq, over, wait);
        if (over?.state === "succeeded") {
          this.host.replayed(this.entry, wait);
          return (over.result ?? null) as T | null;
        }
        this.usable();
        const data = await this.host.waitForEvent(this.entry, wait, { event: callbackEvent(token), matchJson: null, timeoutMs, kind: "callback" });
        return (data ?? null) as T | null;
      },
    };
  }

  /** ctx.children, bound (its overloads type the children's results). */
  readonly startChildren = ((name: string, children: unknown) => this.children(name, children)) as ChildrenFunction;

  /** ctx.children: see worker/children.ts. Checked on every replay too, so bad input fails alike. */
  async children(name: string, children: unknown): Promise<ChildEnd[]> {
    const place = this.take(name, "children", "ctx.children");
    const start = await prepareChildren(children, `ctx.children("${name}")`);
    const record = await this.recorded(place);
    if (record?.state === "succeeded") {
      this.host.replayed(this.entry, place);
      return record.result as unknown as ChildEnd[];
    }
    this.usable();
    // A waiting record: the children were started; only their ends are left to read.
    return this.host.children(this.entry, place, record ? null : start);
  }
}

/** A place recorded as a sleep may be replayed by a sleep only, and so on; step and transaction are distinct. */
function sameKind(recorded: StepKind, reached: StepKind): boolean {
  return recorded === reached;
}

function checkRetry(retry: StepRetry | undefined, step: string): Required<StepRetry> {
  if (retry === undefined) return { attempts: 1, delayMs: 0, factor: 1, maxDelayMs: 0 };
  const where = `ctx.step("${step}"): retry`;
  if (!Number.isInteger(retry.attempts) || retry.attempts < 1 || retry.attempts > 100) {
    throw new ValidationError(`${where}.attempts must be an integer from 1 to 100, got ${String(retry.attempts)}`);
  }
  const delayMs = retry.delayMs ?? 1_000;
  const factor = retry.factor ?? 2;
  const maxDelayMs = retry.maxDelayMs ?? 60_000;
  for (const [key, v, max] of [
    ["delayMs", delayMs, 3_600_000],
    ["factor", factor, 100],
    ["maxDelayMs", maxDelayMs, 3_600_000],
  ] as const) {
    if (typeof v !== "number" || !Number.isFinite(v) || v < 0 || v > max)
      throw new ValidationError(`${where}.${key} must be a number from 0 to ${max}, got ${String(v)}`);
  }
  return { attempts: retry.attempts, delayMs, factor, maxDelayMs };
}

function retryDelay(r: Required<StepRetry>, run: number): number {
  return Math.min(r.maxDelayMs, r.delayMs * r.factor ** (run - 1));
}

/** Waits `ms`, or until the attempt's signal aborts (the retry then stops with its reason). */
function pause(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason as Error);
    const timer = setTimeout(() => {
      signal.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal.reason as Error);
    };
    signal.addEventListener("abort", onAbort, { once: true });
  });
}

function errorText(err: unknown): string {
  return err instanceof Error ? `${err.name}: ${err.message}` : String(err);
}
