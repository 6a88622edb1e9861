/** Worker settings: defaults as named constants, validated at construction. */
import { ConfigError } from "../errors.js";
import { checkName, DEFAULT_MAX_RESULT_BYTES, integerIn, limitOrNone, MAX_RESULT_BYTES_LIMIT, optionalLimit, suggest } from "../jobs/validate.js";
import { DEFAULT_BACKOFF, type BackoffPolicy } from "./backoff.js";
import type { Handler, TaskDefinition, TaskHandlers } from "./context.js";
import { isDefinedTask } from "../tasks/define.js";

export const DEFAULT_CONCURRENCY = 10;
export const DEFAULT_LEASE_MS = 30_000;
export const DEFAULT_HEARTBEAT_MS = 10_000;
export const DEFAULT_POLL_INTERVAL_MS = 1_000;
export const DEFAULT_SHUTDOWN_TIMEOUT_MS = 10_000;
/**
 * How long this worker's liveness session may be gone before the watchdog recovers its jobs
 * (announced with the worker, so every watchdog waits this worker's grace). The worker gives
 * its attempts up after half of it unless the session is back: it stops first.
 */
export const DEFAULT_LIVENESS_GRACE_MS = 1_000;
/**
 * Every attempt's maximum run time unless its job, task or worker sets another (or `null`: none).
 * Long enough for the usual report, email batch or sync; short enough that a handler awaiting
 * something that never settles gives its job back within the quarter hour instead of holding
 * it (and its slot) forever. pg-boss expires jobs at 15 minutes by default too.
 */
export const DEFAULT_MAX_RUN_MS = 15 * 60_000;
/**
 * Jobs per claim at most. The bare claim + complete loop on 2 cores did ~75,000 jobs/s at
 * 2,000 per batch against ~60,000 at 500: statements are paid per batch, rows per row.
 */
export const MAX_CLAIM_BATCH = 2_000;

/** A task as the worker runs it: its handler and its policy (announced to the database). */
export interface TaskSettings {
  handler: Handler;
  backoff: BackoffPolicy;
  /** No ctx.progress/ctx.checkpoint call for this long: the attempt has stalled. */
  progressTimeoutMs: number | null;
  /** An attempt running longer than this has timed out; null: no limit. */
  maxRunMs: number | null;
}

export interface WorkerSettings {
  queues: string[];
  concurrency: number;
  leaseMs: number;
  heartbeatMs: number;
  pollIntervalMs: number;
  shutdownTimeoutMs: number;
  name?: string;
  /** With a name held by another live process: wait for it instead of failing at start. */
  waitForName: boolean;
  /**
   * Crash detection by the worker's liveness session: after this long without it, the
   * watchdog recovers the worker's jobs, and after half of it the worker aborts them itself.
   * Null: no liveness session; jobs are recovered only when their leases run out.
   */
  livenessGraceMs: number | null;
  backoff: BackoffPolicy;
  tasks: Map<string, TaskSettings>;
  /** A handler's result larger than this (serialised) fails its attempt without retries. */
  maxResultBytes: number;
  /** The `leasehold serve` URL ctx.callback makes its URLs from (null: the transport's, if any). */
  callbackBaseUrl: string | null;
}

export interface WorkerSettingsInput {
  handlers: TaskHandlers;
  queues?: string[];
  concurrency?: number;
  leaseMs?: number;
  heartbeatMs?: number;
  pollIntervalMs?: number;
  shutdownTimeoutMs?: number;
  name?: string;
  waitForName?: boolean;
  /** See WorkerSettings.livenessGraceMs; `null` turns liveness-based recovery off. */
  livenessGraceMs?: number | null;
  backoff?: Partial<BackoffPolicy>;
  /** Defaults for every task (a task's own definition, then a job's own options, override them). */
  progressTimeoutMs?: number;
  /** Default DEFAULT_MAX_RUN_MS (15 minutes); `null`: no limit for tasks that set none. */
  maxRunMs?: number | null;
  /** The largest result (a handler's return value, as JSON) kept; default 65,536 bytes. */
  maxResultBytes?: number;
  /** Where `leasehold serve` is reached by whoever completes callbacks (docs/durable-callbacks.md): ctx.callback's URLs start with it. */
  callbackBaseUrl?: string;
}

const KEYS = [
  "handlers",
  "queues",
  "concurrency",
  "leaseMs",
  "heartbeatMs",
  "pollIntervalMs",
  "shutdownTimeoutMs",
  "name",
  "waitForName",
  "livenessGraceMs",
  "backoff",
  "progressTimeoutMs",
  "maxRunMs",
  "maxResultBytes",
  "callbackBaseUrl",
];
const TASK_KEYS = new Set(["handler", "backoff", "progressTimeoutMs", "maxRunMs"]);

/** A stable worker name: no "/", which separates it from the process part of a worker id. */
export const WORKER_NAME = /^[A-Za-z0-9_.:-]{1,100}$/;

export function resolveWorkerSettings(input: WorkerSettingsInput, extraKeys: string[] = []): WorkerSettings {
  const known = new Set([...KEYS, ...extraKeys]);
  for (const key of Object.keys(input)) {
    if (!known.has(key)) throw new ConfigError(`unknown worker option "${key}"${suggest(key, known)}`);
  }
  const wrap = <T>(fn: () => T): T => {
    try {
      return fn();
    } catch (err) {
      throw new ConfigError((err as Error).message);
    }
  };
  return wrap(() => {
    const queues = input.queues ?? ["default"];
    if (!Array.isArray(queues) || queues.length === 0) throw new ConfigError("queues must be a non-empty list");
    queues.forEach((q) => checkName(q, "queue"));
    const leaseMs = integerIn(input.leaseMs ?? DEFAULT_LEASE_MS, 1_000, 24 * 3600_000, "leaseMs");
    const heartbeatMs = integerIn(input.heartbeatMs ?? Math.min(DEFAULT_HEARTBEAT_MS, Math.floor(leaseMs / 3)), 100, leaseMs, "heartbeatMs");
    if (heartbeatMs * 3 > leaseMs) {
      throw new ConfigError(`heartbeatMs (${heartbeatMs}) must be at most a third of leaseMs (${leaseMs}): a lease must survive two missed beats`);
    }
    if (input.name !== undefined && (typeof input.name !== "string" || !WORKER_NAME.test(input.name))) {
      throw new ConfigError(`name must be 1-100 characters of letters, digits and _ . : - (got ${JSON.stringify(input.name)})`);
    }
    if (input.waitForName !== undefined && typeof input.waitForName !== "boolean") throw new ConfigError("waitForName must be true or false");
    const backoff = resolveBackoff(DEFAULT_BACKOFF, input.backoff);
    // A grace longer than the lease would make the lease the faster path anyway.
    const livenessGraceMs =
      input.livenessGraceMs === null ? null : integerIn(input.livenessGraceMs ?? DEFAULT_LIVENESS_GRACE_MS, 200, leaseMs, "livenessGraceMs");
    const progressTimeoutMs = optionalLimit(input.progressTimeoutMs, "progressTimeoutMs");
    const maxRunMs = taskLimit(input.maxRunMs, "maxRunMs", DEFAULT_MAX_RUN_MS);
    const tasks = new Map<string, TaskSettings>();
    if (!input.handlers || typeof input.handlers !== "object") throw new ConfigError("handlers must map task names to functions");
    for (const [task, def] of Object.entries(input.handlers)) {
      checkName(task, "task name");
      if (isDefinedTask(def)) {
        throw new ConfigError(`handlers.${task} is a task made by defineTask: run defined tasks with lh.typed([...]).worker()`);
      }
      const d: TaskDefinition = typeof def === "function" ? { handler: def } : def;
      if (!d || typeof d.handler !== "function") throw new ConfigError(`handler for task "${task}" is not a function`);
      for (const key of Object.keys(d)) {
        if (!TASK_KEYS.has(key)) throw new ConfigError(`task "${task}": unknown option "${key}"${suggest(key, TASK_KEYS)}`);
      }
      tasks.set(task, {
        handler: d.handler,
        backoff: resolveBackoff(backoff, d.backoff),
        progressTimeoutMs: optionalLimit(d.progressTimeoutMs, `task "${task}": progressTimeoutMs`) ?? progressTimeoutMs,
        maxRunMs: taskLimit(d.maxRunMs, `task "${task}": maxRunMs`, maxRunMs),
      });
    }
    if (tasks.size === 0) throw new ConfigError("a worker needs at least one task handler");
    return {
      queues,
      concurrency: integerIn(input.concurrency ?? DEFAULT_CONCURRENCY, 1, 10_000, "concurrency"),
      leaseMs,
      heartbeatMs,
      pollIntervalMs: integerIn(input.pollIntervalMs ?? DEFAULT_POLL_INTERVAL_MS, 10, 3600_000, "pollIntervalMs"),
      shutdownTimeoutMs: integerIn(input.shutdownTimeoutMs ?? DEFAULT_SHUTDOWN_TIMEOUT_MS, 0, 24 * 3600_000, "shutdownTimeoutMs"),
      name: input.name,
      waitForName: input.waitForName ?? false,
      livenessGraceMs,
      backoff,
      tasks,
      maxResultBytes: integerIn(input.maxResultBytes ?? DEFAULT_MAX_RESULT_BYTES, 1, MAX_RESULT_BYTES_LIMIT, "maxResultBytes"),
      callbackBaseUrl: checkBaseUrl(input.callbackBaseUrl),
    };
  });
}

function checkBaseUrl(value: unknown): string | null {
  if (value === undefined) return null;
  if (typeof value !== "string" || !/^https?:\/\//.test(value) || !URL.canParse(value)) {
    throw new ConfigError(`callbackBaseUrl must be an http(s) URL, got ${JSON.stringify(value)}`);
  }
  return value;
}

/** A limit set here (a number, or null for none) over the one it overrides. */
function taskLimit(value: unknown, what: string, otherwise: number | null): number | null {
  const own = limitOrNone(value, what);
  return own === undefined ? otherwise : own;
}

export function resolveBackoff(base: BackoffPolicy, over: Partial<BackoffPolicy> | undefined): BackoffPolicy {
  if (over !== undefined && (over === null || typeof over !== "object")) throw new ConfigError("backoff must be an object");
  const b = { ...base, ...over };
  integerIn(b.baseMs, 0, 24 * 3600_000, "backoff.baseMs");
  integerIn(b.maxMs, 0, 30 * 24 * 3600_000, "backoff.maxMs");
  if (typeof b.factor !== "number" || b.factor < 1 || b.factor > 100) throw new ConfigError("backoff.factor must be from 1 to 100");
  if (typeof b.jitter !== "number" || b.jitter < 0 || b.jitter > 1) throw new ConfigError("backoff.jitter must be from 0 to 1");
  return b;
}
