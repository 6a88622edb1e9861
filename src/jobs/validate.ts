/**
 * Validation of what users hand us, before anything is written: a bad job in a batch
 * fails the whole batch with an error that names the job and the problem.
 */
import { ValidationError } from "../errors.js";
import type { NewJob } from "./types.js";

export const DEFAULT_QUEUE = "default";
export const DEFAULT_MAX_ATTEMPTS = 25;
export const MAX_PAYLOAD_BYTES = 1024 * 1024;
export const MIN_LEASE_MS = 1_000;
export const MAX_LEASE_MS = 24 * 3600_000;

const NAME = /^[A-Za-z0-9_.:\-/]{1,128}$/;
const JOB_KEYS = new Set(["task", "payload", "queue", "priority", "runAt", "delayMs", "maxAttempts", "uniqueKey", "leaseMs"]);

/** A job ready for the INSERT: payload already serialised, every option checked. */
export interface NormalizedJob {
  queue: string;
  task: string;
  payloadJson: string;
  priority: number;
  runAt: Date | null;
  delayMs: number;
  maxAttempts: number;
  uniqueKey: string | null;
  leaseMs: number | null;
}

export function normalizeJob(job: NewJob, where = "job"): NormalizedJob {
  if (job === null || typeof job !== "object") throw new ValidationError(`${where}: expected an object with a task`);
  for (const key of Object.keys(job)) {
    if (!JOB_KEYS.has(key)) throw new ValidationError(`${where}: unknown option "${key}"${suggest(key, JOB_KEYS)}`);
  }
  const queue = job.queue ?? DEFAULT_QUEUE;
  checkName(queue, `${where}: queue`);
  checkName(job.task, `${where}: task`);
  if (job.runAt !== undefined && job.delayMs !== undefined) {
    throw new ValidationError(`${where}: give runAt or delayMs, not both`);
  }
  if (job.runAt !== undefined && (!(job.runAt instanceof Date) || Number.isNaN(job.runAt.getTime()))) {
    throw new ValidationError(`${where}: runAt must be a valid Date`);
  }
  if (job.uniqueKey !== undefined && (typeof job.uniqueKey !== "string" || job.uniqueKey.length === 0 || job.uniqueKey.length > 512)) {
    throw new ValidationError(`${where}: uniqueKey must be a non-empty string of at most 512 characters`);
  }
  return {
    queue,
    task: job.task,
    payloadJson: serializePayload(job.payload === undefined ? {} : job.payload, where),
    priority: integerIn(job.priority ?? 0, -32768, 32767, `${where}: priority`),
    runAt: job.runAt ?? null,
    delayMs: integerIn(job.delayMs ?? 0, 0, 10 * 365 * 86_400_000, `${where}: delayMs`),
    maxAttempts: integerIn(job.maxAttempts ?? DEFAULT_MAX_ATTEMPTS, 1, 1000, `${where}: maxAttempts`),
    uniqueKey: job.uniqueKey ?? null,
    leaseMs: job.leaseMs === undefined ? null : integerIn(job.leaseMs, MIN_LEASE_MS, MAX_LEASE_MS, `${where}: leaseMs`),
  };
}

export function checkName(value: unknown, what: string): asserts value is string {
  if (typeof value !== "string" || !NAME.test(value)) {
    throw new ValidationError(`${what} must be 1-128 characters of letters, digits and _ . : - / (got ${JSON.stringify(value)})`);
  }
}

export function integerIn(value: unknown, min: number, max: number, what: string): number {
  if (typeof value !== "number" || !Number.isInteger(value) || value < min || value > max) {
    throw new ValidationError(`${what} must be an integer from ${min} to ${max} (got ${JSON.stringify(value)})`);
  }
  return value;
}

/**
 * JSON.stringify silently turns NaN into null and drops undefined and functions; a job queue
 * must not change a payload on the way in, so anything that would not round-trip is refused.
 */
export function serializePayload(payload: unknown, where = "payload"): string {
  const problem = findNonJson(payload, "payload", new Set());
  if (problem) throw new ValidationError(`${where}: ${problem}`);
  const json = JSON.stringify(payload);
  if (Buffer.byteLength(json) > MAX_PAYLOAD_BYTES) {
    throw new ValidationError(`${where}: payload is larger than ${MAX_PAYLOAD_BYTES} bytes`);
  }
  return json;
}

function findNonJson(value: unknown, path: string, seen: Set<object>): string | undefined {
  switch (typeof value) {
    case "string":
      // PostgreSQL's jsonb cannot store the NUL character.
      return value.includes("\u0000") ? `${path} contains a NUL character, which PostgreSQL's jsonb cannot store` : undefined;
    case "boolean":
      return undefined;
    case "number":
      return Number.isFinite(value) ? undefined : `${path} is ${value}, which JSON cannot represent`;
    case "object": {
      if (value === null) return undefined;
      if (seen.has(value)) return `${path} is circular`;
      seen.add(value);
      try {
        if (Array.isArray(value)) {
          for (let i = 0; i < value.length; i++) {
            const p = findNonJson(value[i], `${path}[${i}]`, seen);
            if (p) return p;
          }
          return undefined;
        }
        const proto = Object.getPrototypeOf(value);
        if (proto !== Object.prototype && proto !== null) {
          return `${path} is a ${proto?.constructor?.name ?? "non-plain"} object; only plain objects, arrays and primitives are JSON`;
        }
        for (const [k, v] of Object.entries(value)) {
          const p = findNonJson(v, `${path}.${k}`, seen);
          if (p) return p;
        }
        return undefined;
      } finally {
        seen.delete(value);
      }
    }
    default:
      return `${path} is ${typeof value === "undefined" ? "undefined" : `a ${typeof value}`}, which is not JSON`;
  }
}

/** "did you mean" for option names, as Oban does. */
export function suggest(key: string, known: Iterable<string>): string {
  let best: string | undefined;
  let bestDistance = 3;
  for (const k of known) {
    const d = editDistance(key.toLowerCase(), k.toLowerCase());
    if (d < bestDistance) {
      best = k;
      bestDistance = d;
    }
  }
  return best ? ` (did you mean "${best}"?)` : "";
}

function editDistance(a: string, b: string): number {
  const row = Array.from({ length: b.length + 1 }, (_, i) => i);
  for (let i = 1; i <= a.length; i++) {
    let prev = row[0]!;
    row[0] = i;
    for (let j = 1; j <= b.length; j++) {
      const cur = row[j]!;
      row[j] = Math.min(row[j]! + 1, row[j - 1]! + 1, prev + (a[i - 1] === b[j - 1] ? 0 : 1));
      prev = cur;
    }
  }
  return row[b.length]!;
}
