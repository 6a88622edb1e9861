/**
 * Hooks: the small extension API that tracing (src/otel/) is built on, and that users can use
 * for their own metadata, logging or instrumentation (docs/tracing.md#hooks).
 *
 *   - beforeEnqueue: read or change the jobs about to be enqueued (add headers, say);
 *   - aroundEnqueue: middleware around an enqueue call's write;
 *   - aroundHandler: middleware around each attempt's handler call, `(job, ctx, next)`;
 *   - afterAttempt: an attempt's end is known, with its outcome;
 *   - aroundClaim, aroundSettle: middleware around a worker's claim and report batches;
 *   - aroundStep: middleware around each durable step a handler runs or replays.
 *
 * Registered on the client (`Leasehold.connect({ hooks })`, `lh.use(hooks)`: its enqueues and
 * the workers it makes afterwards) or on one worker (`worker({ hooks })`). Several sets
 * compose in registration order: the first registered is the outermost middleware and sees
 * jobs first. Nothing here runs, and nothing is allocated per job, when no hook is registered.
 */
import type { ClaimedJob, EnqueuedJob, NewJob } from "./jobs/types.js";
import type { JobContext } from "./worker/context.js";
import type { JobOutcome } from "./worker/report-end.js";
import type { Queryable } from "./store/db.js";

/** What an enqueue call is: its caller's transaction (`{ db }`) or Leasehold's own connection. */
export interface EnqueueInfo {
  /** The caller's client when the jobs are enqueued in its transaction (`{ db }`). */
  db?: Queryable;
}

/** The end of an attempt, as `afterAttempt` sees it. */
export interface AttemptEnd {
  /** How the attempt ended, as the worker's `job:end` event reports it. */
  outcome: JobOutcome;
  /** What the handler threw (undefined if it returned, or never settled before a limit ended it). */
  error?: unknown;
  /** Milliseconds from the handler's start to this moment. */
  durationMs: number;
}

/** A claim batch: what the worker asks for. */
export interface ClaimBatch {
  queues: string[];
  limit: number;
}

/** A report batch: attempts' ends written in one statement. */
export interface SettleBatch {
  /**
   * complete: successes; fail: failures (retried or dead); supersede: superseded attempts;
   * rate_limit: attempts whose handlers were rate-limited (waiting again, no budget spent).
   */
  kind: "complete" | "fail" | "supersede" | "rate_limit";
  jobs: { id: string; attempt: number }[];
}

/** A durable step as `aroundStep` sees it (docs/durable.md). */
export interface StepInfo {
  name: string;
  /** The how-many-th call of this name in the handler (from 0). */
  occurrence: number;
  /** Its place in the order the handler called its steps (from 0). */
  seq: number;
  kind: "step" | "transaction" | "sleep" | "event" | "children" | "callback";
  /** True: its recorded result was returned and nothing ran (`next()` does nothing). */
  replayed: boolean;
}

export type StepMiddleware = (job: ClaimedJob, step: StepInfo, next: () => Promise<unknown>) => Promise<unknown>;
export type HandlerMiddleware = (job: ClaimedJob, ctx: JobContext, next: () => Promise<unknown>) => Promise<unknown>;
export type EnqueueMiddleware = (jobs: readonly NewJob[], info: EnqueueInfo, next: () => Promise<EnqueuedJob[]>) => Promise<EnqueuedJob[]>;
export type BatchMiddleware<B, R> = (batch: B, next: () => Promise<R>) => Promise<R>;

export interface LeaseholdHooks {
  /**
   * Before an enqueue call validates and writes its jobs: read them, change them in place
   * (`job.headers = { ...job.headers, tenant }`), but not the array. The objects are copies of
   * the caller's. A hook that throws fails the call; nothing is written.
   */
  beforeEnqueue?(jobs: NewJob[], info: EnqueueInfo): void | Promise<void>;
  /** Around an enqueue call's validation and write; call `next()` once and return its result. */
  aroundEnqueue?: EnqueueMiddleware;
  /**
   * Around each attempt's handler: call `next()` to run the handler (or the next middleware)
   * and return (or throw) what it does. What this middleware throws is the attempt's failure.
   */
  aroundHandler?: HandlerMiddleware;
  /**
   * After an attempt's end is known (its report landed or was refused, or its lease was known
   * lost). Called once per attempt whose handler started; what it throws is logged and dropped.
   */
  afterAttempt?(job: ClaimedJob, end: AttemptEnd): void;
  /**
   * Around each claim statement (or request) of a worker's polling; `next()` resolves with the
   * jobs claimed. Must call `next()` and return its jobs: a job dropped here is lost until its
   * lease runs out. Claims by a dispatch (NATS) are not wrapped.
   */
  aroundClaim?: BatchMiddleware<ClaimBatch, ClaimedJob[]>;
  /** Around each report batch's statement (or request); must call `next()` and return its result. */
  aroundSettle?: BatchMiddleware<SettleBatch, Map<string, string>>;
  /**
   * Around each durable step of a handler: a ctx.step's run (each of its retries), a
   * ctx.step.transaction, a ctx.sleep or ctx.waitForEvent (a suspension throws
   * JobSuspendedError through it), and a replayed step (`replayed`, `next()` a no-op). Must call
   * `next()` and return (or throw) what it does.
   */
  aroundStep?: StepMiddleware;
}

const HOOK_KEYS = new Set<string>(["beforeEnqueue", "aroundEnqueue", "aroundHandler", "afterAttempt", "aroundClaim", "aroundSettle", "aroundStep"]);

/** Checks a hook set (a typo'd hook name would silently never run). */
export function checkHooks(hooks: unknown, where = "hooks"): LeaseholdHooks {
  if (hooks === null || typeof hooks !== "object" || Array.isArray(hooks)) {
    throw new TypeError(`${where} must be an object of hook functions (beforeEnqueue, aroundHandler, afterAttempt, ...)`);
  }
  for (const [key, value] of Object.entries(hooks)) {
    if (!HOOK_KEYS.has(key)) throw new TypeError(`${where}: unknown hook "${key}" (known: ${[...HOOK_KEYS].join(", ")})`);
    if (value !== undefined && typeof value !== "function") throw new TypeError(`${where}.${key} must be a function`);
  }
  return hooks as LeaseholdHooks;
}

/** Several hook sets as one, each hook point composed once; undefined where none is set. */
export interface ComposedHooks {
  beforeEnqueue?: (jobs: NewJob[], info: EnqueueInfo) => Promise<void>;
  aroundEnqueue?: EnqueueMiddleware;
  aroundHandler?: HandlerMiddleware;
  afterAttempt?: (job: ClaimedJob, end: AttemptEnd) => void;
  aroundClaim?: BatchMiddleware<ClaimBatch, ClaimedJob[]>;
  aroundSettle?: BatchMiddleware<SettleBatch, Map<string, string>>;
  aroundStep?: StepMiddleware;
}

type Middleware<A, B, R> = (a: A, b: B, next: () => Promise<R>) => Promise<R>;

/** Middlewares as one, the first outermost: `mws[0]` runs first, and its `next` runs `mws[1]`, down to the wrapped call. */
function chain<A, B, R>(mws: Middleware<A, B, R>[]): Middleware<A, B, R> | undefined {
  if (mws.length <= 1) return mws[0];
  return (a, b, inner) => {
    const call = (i: number): Promise<R> => (i === mws.length ? inner() : mws[i]!(a, b, () => call(i + 1)));
    return call(0);
  };
}

function chainBatch<B, R>(mws: BatchMiddleware<B, R>[]): BatchMiddleware<B, R> | undefined {
  if (mws.length <= 1) return mws[0];
  const all = chain<B, undefined, R>(mws.map((mw) => (batch, _, next) => mw(batch, next)))!;
  return (batch, next) => all(batch, undefined, next);
}

/** `onHookError`: where an afterAttempt hook's error goes (it cannot fail anything). */
export function composeHooks(sets: readonly LeaseholdHooks[], onHookError: (hook: string, err: unknown) => void): ComposedHooks {
  const all = <K extends keyof LeaseholdHooks>(k: K) => sets.map((s) => s[k]).filter((h): h is NonNullable<LeaseholdHooks[K]> => h !== undefined);
  const before = all("beforeEnqueue");
  const after = all("afterAttempt");
  return {
    beforeEnqueue:
      before.length === 0
        ? undefined
        : async (jobs, info) => {
            for (const hook of before) await hook(jobs, info);
          },
    aroundEnqueue: chain(all("aroundEnqueue")),
    aroundHandler: chain(all("aroundHandler")),
    afterAttempt:
      after.length === 0
        ? undefined
        : (job, end) => {
            for (const hook of after) {
              try {
                hook(job, end);
              } catch (err) {
                onHookError("afterAttempt", err);
              }
            }
          },
    aroundClaim: chainBatch(all("aroundClaim")),
    aroundSettle: chainBatch(all("aroundSettle")),
    aroundStep: chain(all("aroundStep")),
  };
}
