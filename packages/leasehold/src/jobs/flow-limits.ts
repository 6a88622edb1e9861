/**
 * Validation of flow-control settings (docs/flow-control.md), once, at the edge: the library,
 * the CLI and the HTTP API all pass through here, so a bad value gets one clear error naming
 * it and never reaches the database (whose CHECKs would say less).
 */
import { ValidationError } from "../errors.js";
import type { QueueHistory, QueueLimits, RateLimit } from "../store/flow.js";
import { checkText, describeValue, integerIn, MAX_FLOW_KEY_LENGTH } from "./validate.js";

export const MAX_CONCURRENCY_LIMIT = 100_000;
export const MAX_RATE_LIMIT = 1_000_000;
/**
 * The shortest rate window: a claim takes about a millisecond, and the worker asks again when a
 * window frees a start; below 10 ms the window would be finer than the claims that count it.
 */
export const MIN_RATE_WINDOW_MS = 10;
export const MAX_RATE_WINDOW_MS = 86_400_000;
export const MAX_KEY_WEIGHT = 100;
export const MAX_KEY_WEIGHTS = 1_000;

export const MIN_MAX_HOLD_MS = 1_000;

const LIMIT_KEYS = new Set(["concurrency", "keyConcurrency", "rate", "keyRate", "keyWeights", "maxHoldMs", "allowQueueHold"]);

/** Checks a partial set of limits: each given one is a valid value or null (no limit). */
export function normalizeQueueLimits(limits: unknown): Partial<QueueLimits> {
  if (limits === null || typeof limits !== "object" || Array.isArray(limits)) {
    throw new ValidationError(`queue limits must be an object (got ${describeValue(limits)})`);
  }
  const given = limits as Record<string, unknown>;
  for (const key of Object.keys(given)) {
    if (!LIMIT_KEYS.has(key)) throw new ValidationError(`unknown queue limit "${key}" (known: ${[...LIMIT_KEYS].join(", ")})`);
  }
  const out: Partial<QueueLimits> = {};
  const count = (v: unknown, what: string) => (v === null ? null : integerIn(v, 1, MAX_CONCURRENCY_LIMIT, what));
  if (given.concurrency !== undefined) out.concurrency = count(given.concurrency, "concurrency");
  if (given.keyConcurrency !== undefined) out.keyConcurrency = count(given.keyConcurrency, "keyConcurrency");
  if (given.rate !== undefined) out.rate = rate(given.rate, "rate");
  if (given.keyRate !== undefined) out.keyRate = rate(given.keyRate, "keyRate");
  if (given.keyWeights !== undefined) out.keyWeights = weights(given.keyWeights);
  if (given.maxHoldMs !== undefined) {
    out.maxHoldMs = given.maxHoldMs === null ? null : integerIn(given.maxHoldMs, MIN_MAX_HOLD_MS, MAX_RATE_WINDOW_MS, "maxHoldMs");
  }
  if (given.allowQueueHold !== undefined) {
    if (typeof given.allowQueueHold !== "boolean") {
      throw new ValidationError(`allowQueueHold must be true or false (got ${describeValue(given.allowQueueHold)})`);
    }
    out.allowQueueHold = given.allowQueueHold;
  }
  return out;
}

function rate(value: unknown, what: string): RateLimit | null {
  if (value === null) return null;
  if (typeof value !== "object" || Array.isArray(value)) {
    throw new ValidationError(`${what} must be { limit, windowMs } or null (got ${describeValue(value)})`);
  }
  const { limit, windowMs, ...rest } = value as Record<string, unknown>;
  const extra = Object.keys(rest)[0];
  if (extra !== undefined) throw new ValidationError(`${what}: unknown field "${extra}" (known: limit, windowMs)`);
  return {
    limit: integerIn(limit, 1, MAX_RATE_LIMIT, `${what}.limit`),
    windowMs: integerIn(windowMs, MIN_RATE_WINDOW_MS, MAX_RATE_WINDOW_MS, `${what}.windowMs`),
  };
}

function weights(value: unknown): Record<string, number> | null {
  if (value === null) return null;
  const proto = typeof value === "object" && !Array.isArray(value) ? Object.getPrototypeOf(value) : undefined;
  if (proto !== Object.prototype && proto !== null) {
    throw new ValidationError(`keyWeights must be an object of keys to weights, or null (got ${describeValue(value)})`);
  }
  const entries = Object.entries(value as Record<string, unknown>);
  if (entries.length > MAX_KEY_WEIGHTS) throw new ValidationError(`keyWeights may name at most ${MAX_KEY_WEIGHTS} keys (got ${entries.length})`);
  for (const [key, weight] of entries) {
    checkText(key, "keyWeights: a key", MAX_FLOW_KEY_LENGTH);
    integerIn(weight, 1, MAX_KEY_WEIGHT, `keyWeights[${JSON.stringify(key)}]`);
  }
  return entries.length === 0 ? null : (value as Record<string, number>);
}

/**
 * "Rate-limited, retry in X" from a handler: X in ms, 1 ms to a day (the hold over other jobs
 * is clamped to the queue's maxHoldMs in the database). What the hold covers: the job's key,
 * the whole queue (where the queue allows it), or the job alone.
 */
export function checkRetryIn(ms: unknown, scope: unknown): void {
  integerIn(ms, 1, MAX_RATE_WINDOW_MS, "RateLimitedError: retryInMs");
  if (scope !== "key" && scope !== "queue" && scope !== "job") {
    throw new ValidationError(`RateLimitedError: scope must be "key", "queue" or "job" (got ${describeValue(scope)})`);
  }
}

/** Checks what a queue keeps of its finished jobs (setQueueHistory): `{ keepSucceeded: boolean }`. */
export function normalizeQueueHistory(history: unknown): QueueHistory {
  if (history === null || typeof history !== "object" || Array.isArray(history)) {
    throw new ValidationError(`queue history must be an object { keepSucceeded } (got ${describeValue(history)})`);
  }
  const { keepSucceeded, ...rest } = history as Record<string, unknown>;
  const extra = Object.keys(rest)[0];
  if (extra !== undefined) throw new ValidationError(`unknown queue history setting "${extra}" (known: keepSucceeded)`);
  if (typeof keepSucceeded !== "boolean") throw new ValidationError(`keepSucceeded must be true or false (got ${describeValue(keepSucceeded)})`);
  return { keepSucceeded };
}
