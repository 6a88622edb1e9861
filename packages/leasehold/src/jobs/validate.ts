/**
 * Validation of what users hand us, before anything is written: a bad job in a batch
 * fails the whole batch with an error that names the job and the problem.
 */
import { ValidationError } from "../errors.js";
import { ON_DUPLICATE_MODES, UNIQUE_SCOPES, type NewJob, type OnDuplicate, type UniqueScope } from "./types.js";

export const DEFAULT_QUEUE = "default";
export const DEFAULT_MAX_ATTEMPTS = 25;
export const MAX_PAYLOAD_BYTES = 1024 * 1024;
export const MIN_LEASE_MS = 1_000;
export const MAX_LEASE_MS = 24 * 3600_000;
export const MAX_UNIQUE_KEY_LENGTH = 512;
export const MAX_FLOW_KEY_LENGTH = 512;
/** How far ahead a job may be put off (`delayMs`, `runAt`): 3650 days. */
export const MAX_DELAY_MS = 3650 * 86_400_000;
/** The earliest `runAt`: a time before it is a mistake (a zero date, seconds taken for milliseconds). */
export const MIN_RUN_AT = new Date("1970-01-01T00:00:00Z");
/**
 * jsonb's parser recurses once per level; at PostgreSQL's smallest stack setting
 * (max_stack_depth 100kB) it accepted 500 levels and refused 1,000. 256 leaves room.
 */
export const MAX_JSON_DEPTH = 256;

const NAME = /^[A-Za-z0-9_.:\-/]{1,128}$/;
const JOB_KEYS = new Set([
  "task",
  "payload",
  "queue",
  "priority",
  "runAt",
  "delayMs",
  "maxAttempts",
  "uniqueKey",
  "onDuplicate",
  "uniqueScope",
  "key",
  "leaseMs",
  "progressTimeoutMs",
  "maxRunMs",
  "headers",
]);
/** Bounds for the run-time limits: at least a second, at most a week. */
export const MIN_LIMIT_MS = 1_000;
export const MAX_LIMIT_MS = 7 * 24 * 3600_000;

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
  /** What to do when an unfinished job holds the unique key; absent: "keep". */
  onDuplicate?: OnDuplicate;
  /** Which holder of the unique key is a duplicate; absent: "task". */
  uniqueScope?: UniqueScope;
  /** The flow-control key; null or absent when the job has none. */
  flowKey?: string | null;
  leaseMs: number | null;
  progressTimeoutMs: number | null;
  /** Null: not set (the task's limit applies), or no limit when `maxRunUnlimited`. */
  maxRunMs: number | null;
  maxRunUnlimited: boolean;
  /** The headers as JSON; null or absent when the job has none (scheduled jobs carry none). */
  headersJson?: string | null;
}

/** Headers stay small: they are read with every claim of the job. */
export const MAX_HEADERS = 32;
export const MAX_HEADERS_BYTES = 8 * 1024;
const HEADER_NAME = /^[A-Za-z0-9_.-]{1,64}$/;

/**
 * A job's headers, checked and serialised: a plain object of at most MAX_HEADERS string
 * values, names of letters, digits and `_ . -` (a W3C `traceparent` fits; so would an HTTP
 * header name), MAX_HEADERS_BYTES in all. An empty object is stored as none.
 */
export function serializeHeaders(headers: unknown, where = "job"): string | null {
  if (headers === undefined || headers === null) return null;
  const proto = typeof headers === "object" && !Array.isArray(headers) ? Object.getPrototypeOf(headers) : undefined;
  if (proto !== Object.prototype && proto !== null) {
    throw new ValidationError(`${where}: headers must be an object of string values (got ${describeValue(headers)})`);
  }
  const entries = Object.entries(headers as Record<string, unknown>);
  if (entries.length === 0) return null;
  if (entries.length > MAX_HEADERS) throw new ValidationError(`${where}: headers may hold at most ${MAX_HEADERS} entries (got ${entries.length})`);
  for (const [name, value] of entries) {
    if (!HEADER_NAME.test(name)) {
      throw new ValidationError(`${where}: header name ${describeValue(name)} must be 1-64 characters of letters, digits and _ . -`);
    }
    if (typeof value !== "string") throw new ValidationError(`${where}: header ${name} must be a string (got ${describeValue(value)})`);
    const problem = textProblem(value);
    if (problem) throw new ValidationError(`${where}: header ${name} ${problem}`);
  }
  const json = JSON.stringify(headers);
  if (Buffer.byteLength(json) > MAX_HEADERS_BYTES) throw new ValidationError(`${where}: headers are larger than ${MAX_HEADERS_BYTES} bytes`);
  return json;
}

export function normalizeJob(job: NewJob, where = "job"): NormalizedJob {
  if (job === null || typeof job !== "object") throw new ValidationError(`${where}: expected an object with a task`);
  for (const key of Object.keys(job)) {
    if (!JOB_KEYS.has(key)) throw new ValidationError(`${where}: unknown option "${printable(key)}"${suggest(key, JOB_KEYS)}`);
  }
  const queue = job.queue ?? DEFAULT_QUEUE;
  checkName(queue, `${where}: queue`);
  checkName(job.task, `${where}: task`);
  if (job.runAt !== undefined && job.delayMs !== undefined) {
    throw new ValidationError(`${where}: give runAt or delayMs, not both`);
  }
  if (job.runAt !== undefined) checkRunAt(job.runAt, `${where}: runAt`);
  if (job.uniqueKey !== undefined) checkText(job.uniqueKey, `${where}: uniqueKey`, MAX_UNIQUE_KEY_LENGTH);
  if (job.key !== undefined) checkText(job.key, `${where}: key`, MAX_FLOW_KEY_LENGTH);
  const onDuplicate = checkOnDuplicate(job, where);
  const uniqueScope = checkUniqueScope(job, where);
  return {
    queue,
    task: job.task,
    payloadJson: serializePayload(job.payload === undefined ? {} : job.payload, where),
    priority: integerIn(job.priority ?? 0, -32768, 32767, `${where}: priority`),
    runAt: job.runAt ?? null,
    delayMs: integerIn(job.delayMs ?? 0, 0, MAX_DELAY_MS, `${where}: delayMs`),
    maxAttempts: integerIn(job.maxAttempts ?? DEFAULT_MAX_ATTEMPTS, 1, 1000, `${where}: maxAttempts`),
    uniqueKey: job.uniqueKey ?? null,
    ...(onDuplicate !== "keep" && { onDuplicate }),
    ...(uniqueScope !== "task" && { uniqueScope }),
    flowKey: job.key ?? null,
    leaseMs: job.leaseMs === undefined ? null : integerIn(job.leaseMs, MIN_LEASE_MS, MAX_LEASE_MS, `${where}: leaseMs`),
    progressTimeoutMs: optionalLimit(job.progressTimeoutMs, `${where}: progressTimeoutMs`),
    maxRunMs: limitOrNone(job.maxRunMs, `${where}: maxRunMs`) ?? null,
    maxRunUnlimited: job.maxRunMs === null,
    headersJson: serializeHeaders(job.headers, where),
  };
}

/** The job's `onDuplicate`: one of the modes, and only with a unique key (without one, nothing can be a duplicate). */
function checkOnDuplicate(job: NewJob, where: string): OnDuplicate {
  const mode: unknown = job.onDuplicate;
  if (mode === undefined) return "keep";
  if (typeof mode !== "string" || !ON_DUPLICATE_MODES.includes(mode as OnDuplicate)) {
    const hint = typeof mode === "string" ? suggest(mode, ON_DUPLICATE_MODES) : "";
    throw new ValidationError(
      `${where}: onDuplicate must be one of ${ON_DUPLICATE_MODES.map((m) => `"${m}"`).join(", ")} (got ${describeValue(mode)})${hint}`,
    );
  }
  if (job.uniqueKey === undefined) {
    throw new ValidationError(
      `${where}: onDuplicate ${JSON.stringify(mode)} needs a uniqueKey (it says what to do when an unfinished job holds the same key)`,
    );
  }
  return mode as OnDuplicate;
}

/**
 * A run time: a valid Date from MIN_RUN_AT to MAX_DELAY_MS ahead. "Ahead" is this process's
 * clock: a bound against mistakes, not a schedule, so a skewed clock only moves the bound.
 */
export function checkRunAt(value: unknown, what: string): asserts value is Date {
  if (!(value instanceof Date) || Number.isNaN(value.getTime())) throw new ValidationError(`${what} must be a valid Date`);
  if (value.getTime() < MIN_RUN_AT.getTime() || value.getTime() > Date.now() + MAX_DELAY_MS) {
    throw new ValidationError(`${what} must be from ${MIN_RUN_AT.toISOString()} to 3650 days from now (got ${value.toISOString()})`);
  }
}

/** The job's `uniqueScope`: one of the scopes, and only with a unique key. */
function checkUniqueScope(job: NewJob, where: string): UniqueScope {
  const scope: unknown = job.uniqueScope;
  if (scope === undefined) return "task";
  if (typeof scope !== "string" || !UNIQUE_SCOPES.includes(scope as UniqueScope)) {
    const hint = typeof scope === "string" ? suggest(scope, UNIQUE_SCOPES) : "";
    throw new ValidationError(
      `${where}: uniqueScope must be one of ${UNIQUE_SCOPES.map((m) => `"${m}"`).join(", ")} (got ${describeValue(scope)})${hint}`,
    );
  }
  if (job.uniqueKey === undefined) {
    throw new ValidationError(`${where}: uniqueScope ${JSON.stringify(scope)} needs a uniqueKey (it says which job holding the key is a duplicate)`);
  }
  return scope as UniqueScope;
}

/**
 * Jobs of one batch sharing a unique key are enqueued as if one after the other: each must
 * take every earlier one as its duplicate (within its scope), or the batch is refused: the
 * later one would be refused on its own, and a batch is written whole or not at all.
 */
export function checkBatchKeyScopes(jobs: readonly NormalizedJob[], where: (i: number) => string): void {
  const first = new Map<string, { index: number; tasks: Set<string>; queues: Set<string> }>();
  jobs.forEach((job, i) => {
    if (job.uniqueKey === null) return;
    const seen = first.get(job.uniqueKey);
    if (!seen) {
      first.set(job.uniqueKey, { index: i, tasks: new Set([job.task]), queues: new Set([job.queue]) });
      return;
    }
    const scope = job.uniqueScope ?? "task";
    const other =
      scope === "task" ? [...seen.tasks].find((t) => t !== job.task) : scope === "queue" ? [...seen.queues].find((q) => q !== job.queue) : undefined;
    if (other !== undefined) {
      throw new ValidationError(
        `${where(i)}: uniqueKey ${JSON.stringify(job.uniqueKey)} is shared with ${where(seen.index)} of ${scope} ${JSON.stringify(other)}, ` +
          `outside this job's uniqueScope ${JSON.stringify(scope)} (a key is held by one unfinished job at a time)`,
      );
    }
    seen.tasks.add(job.task);
    seen.queues.add(job.queue);
  });
}

/** A progress timeout or maximum run time: absent, or MIN_LIMIT_MS..MAX_LIMIT_MS. */
export function optionalLimit(value: unknown, what: string): number | null {
  return value === undefined ? null : integerIn(value, MIN_LIMIT_MS, MAX_LIMIT_MS, what);
}

/**
 * A limit that may also be switched off: absent (undefined), `null` (no limit), or
 * MIN_LIMIT_MS..MAX_LIMIT_MS.
 */
export function limitOrNone(value: unknown, what: string): number | null | undefined {
  if (value === undefined || value === null) return value;
  if (typeof value !== "number" || !Number.isInteger(value) || value < MIN_LIMIT_MS || value > MAX_LIMIT_MS) {
    throw new ValidationError(
      `${what} must be an integer from ${MIN_LIMIT_MS} to ${MAX_LIMIT_MS}, or null for no limit (got ${describeValue(value)})`,
    );
  }
  return value;
}

export function checkName(value: unknown, what: string): asserts value is string {
  if (typeof value !== "string" || !NAME.test(value)) {
    throw new ValidationError(`${what} must be 1-128 characters of letters, digits and _ . : - / (got ${describeValue(value)})`);
  }
}

/**
 * A free-text value bound for a `text` column (a unique key): PostgreSQL refuses NUL, and the
 * driver would silently turn a lone UTF-16 surrogate into U+FFFD, so the stored key would no
 * longer equal the one given (and never match it again).
 */
export function checkText(value: unknown, what: string, maxLength: number): asserts value is string {
  if (typeof value !== "string" || value.length === 0 || value.length > maxLength) {
    throw new ValidationError(`${what} must be a non-empty string of at most ${maxLength} characters (got ${describeValue(value)})`);
  }
  const problem = textProblem(value);
  if (problem) throw new ValidationError(`${what} ${problem}`);
}

export function integerIn(value: unknown, min: number, max: number, what: string): number {
  if (typeof value !== "number" || !Number.isInteger(value) || value < min || value > max) {
    throw new ValidationError(`${what} must be an integer from ${min} to ${max} (got ${describeValue(value)})`);
  }
  return value;
}

/**
 * Serialises a payload (or progress, or a checkpoint) for a jsonb column, refusing anything
 * that would not arrive unchanged or that PostgreSQL would refuse:
 *   - JSON.stringify silently turns NaN into null and drops undefined and functions;
 *   - jsonb cannot store NUL, in a string or in an object key;
 *   - a lone UTF-16 surrogate is not Unicode: jsonb refuses its escape;
 *   - jsonb's parser recurses: nesting is capped well inside its stack limit.
 * One bad value fails its own job or handler call, never a batch it would have joined.
 */
export function serializePayload(payload: unknown, where = "payload", what = "payload"): string {
  const problem = jsonProblem(payload, what);
  if (problem) throw new ValidationError(where ? `${where}: ${problem}` : problem);
  const json = JSON.stringify(payload);
  if (Buffer.byteLength(json) > MAX_PAYLOAD_BYTES) {
    throw new ValidationError(`${where ? `${where}: ` : ""}${what} is larger than ${MAX_PAYLOAD_BYTES} bytes`);
  }
  return json;
}

/** Why a value would not arrive unchanged as jsonb (see serializePayload), or undefined. */
function jsonProblem(value: unknown, what: string): string | undefined {
  const problem = findNonJson(value, what, new Set(), 0);
  // A path 200 levels deep would bury the message: keep its head and its tail.
  return problem && problem.length > 300 ? `${problem.slice(0, 100)}…${problem.slice(-150)}` : problem;
}

/** Default cap on a handler's result (worker option maxResultBytes; the server's too). */
export const DEFAULT_MAX_RESULT_BYTES = 64 * 1024;
/** The largest cap that may be set: a result is read with its job, and by every dependent's ctx.parents(). */
export const MAX_RESULT_BYTES_LIMIT = 16 * 1024 * 1024;

/**
 * A handler's return value as the job's result: undefined and null store none; a value with a
 * `toJSON` method (a Date) is replaced by what it returns and an undefined field is left out,
 * as JSON.stringify does; anything
 * else must be JSON a payload could be (serializePayload's rules) and at most `maxBytes`
 * serialised. Returns the JSON, undefined for none, or `{ problem }` naming what is wrong
 * and the cap: the attempt then ends as failed without retries (the same code would return
 * the same value again).
 */
export function serializeResult(returned: unknown, maxBytes: number): string | undefined | { problem: string } {
  if (returned === undefined || returned === null) return undefined;
  const cap = `maxResultBytes (${maxBytes.toLocaleString("en-US")})`;
  // As JSON.stringify would see it: a Date (a pg row's timestamp) is its ISO string.
  const value = withToJSON(returned, "", new Set());
  if (value === undefined || value === null) return undefined;
  const problem = jsonProblem(value, "result");
  if (problem) return { problem: `${problem}; a result must be JSON of at most ${cap} bytes` };
  const json = JSON.stringify(value);
  const bytes = Buffer.byteLength(json);
  if (bytes > maxBytes) return { problem: `result is ${bytes.toLocaleString("en-US")} bytes, over ${cap}` };
  return json;
}

/**
 * The value with every `toJSON` method applied (called with its key, as JSON.stringify calls
 * it), so a Date becomes its ISO string, and without undefined fields; the rest is left as it is for jsonProblem to judge. A
 * cycle is not followed (jsonProblem names it).
 */
function withToJSON(value: unknown, key: string, seen: Set<object>): unknown {
  if (typeof value !== "object" || value === null) return value;
  if (typeof (value as { toJSON?: unknown }).toJSON === "function") {
    return withToJSON((value as { toJSON(key: string): unknown }).toJSON(key), key, seen);
  }
  if (seen.has(value)) return value;
  seen.add(value);
  try {
    if (Array.isArray(value)) return value.map((v, i) => withToJSON(v, String(i), seen));
    const proto = Object.getPrototypeOf(value);
    if (proto !== Object.prototype && proto !== null) return value;
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value)) {
      const json = withToJSON(v, k, seen);
      // JSON.stringify leaves out an undefined field (an optional one not set).
      if (json !== undefined) out[k] = json;
    }
    return out;
  } finally {
    seen.delete(value);
  }
}

/**
 * Text PostgreSQL would refuse or change, made safe for a `text` column: NUL and lone
 * surrogates become U+FFFD, and the result is cut to `maxLength` characters without splitting
 * a surrogate pair. For error messages, whose text we do not control: a handler's failure must
 * be recorded, whatever its message holds.
 */
export function sanitizeText(text: string, maxLength: number): string {
  let clean = text.isWellFormed() ? text : text.toWellFormed();
  if (clean.includes("\u0000")) clean = clean.replaceAll("\u0000", "\uFFFD");
  if (clean.length <= maxLength) return clean;
  let cut = clean.slice(0, maxLength);
  if (/[\uD800-\uDBFF]$/.test(cut)) cut = cut.slice(0, -1);
  return cut + "…";
}

function textProblem(value: string): string | undefined {
  if (value.includes("\u0000")) return "contains a NUL character, which PostgreSQL cannot store";
  if (!value.isWellFormed()) return "is not well-formed Unicode (it holds a lone UTF-16 surrogate, e.g. half of an emoji)";
  return undefined;
}

function findNonJson(value: unknown, path: string, seen: Set<object>, depth: number): string | undefined {
  switch (typeof value) {
    case "string": {
      const problem = textProblem(value);
      return problem && `${path} ${problem}`;
    }
    case "boolean":
      return undefined;
    case "number":
      return Number.isFinite(value) ? undefined : `${path} is ${value}, which JSON cannot represent`;
    case "object": {
      if (value === null) return undefined;
      if (depth >= MAX_JSON_DEPTH) return `${path} is nested deeper than ${MAX_JSON_DEPTH} levels`;
      if (seen.has(value)) return `${path} is circular`;
      seen.add(value);
      try {
        if (Array.isArray(value)) {
          for (let i = 0; i < value.length; i++) {
            const p = findNonJson(value[i], `${path}[${i}]`, seen, depth + 1);
            if (p) return p;
          }
          return undefined;
        }
        const proto = Object.getPrototypeOf(value);
        if (proto !== Object.prototype && proto !== null) {
          return `${path} is a ${proto?.constructor?.name ?? "non-plain"} object; only plain objects, arrays and primitives are JSON`;
        }
        for (const [k, v] of Object.entries(value)) {
          const keyProblem = textProblem(k);
          if (keyProblem) return `${path} has a key that ${keyProblem}`;
          const p = findNonJson(v, `${path}.${printable(k)}`, seen, depth + 1);
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

/** A value for an error message: JSON when it can be, cut short, never throwing. */
export function describeValue(value: unknown): string {
  let text: string;
  try {
    text = typeof value === "bigint" ? `${value}n` : (JSON.stringify(value) ?? String(value));
  } catch {
    text = Object.prototype.toString.call(value);
  }
  return printable(text.length > 80 ? text.slice(0, 79) + "…" : text);
}

/** Text for a message: lone surrogates and control characters shown, not passed on. */
function printable(text: string): string {
  // eslint-disable-next-line no-control-regex
  return text.toWellFormed().replace(/[\u0000-\u001f]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

/** "did you mean" for option names, as Oban does. */
export function suggest(key: string, known: Iterable<string>): string {
  const best = closestName(key, known);
  return best ? ` (did you mean "${best}"?)` : "";
}

/** The known name closest to `key` (case aside, fewer than 3 edits), or undefined. */
export function closestName(key: string, known: Iterable<string>): string | undefined {
  let best: string | undefined;
  let bestDistance = 3;
  for (const k of known) {
    const d = editDistance(key.toLowerCase(), k.toLowerCase());
    if (d < bestDistance) {
      best = k;
      bestDistance = d;
    }
  }
  return best;
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
