/**
 * Assertions and waits over the queue's jobs. Failures are node:assert AssertionErrors with a
 * message that says what was looked for and what is there: node:test, vitest and jest all
 * report them as test failures and print the message.
 */
import { AssertionError } from "node:assert";
import type { JobRecord, JobState, Leasehold, ListedJob } from "../index.js";

/**
 * What a payload must look like: a function that says yes or no, or a value the payload must
 * contain (objects match when every key given matches, recursively; arrays element by element;
 * anything else by equality). vitest's and jest's asymmetric matchers (`expect.any(String)`)
 * work inside it.
 */
export type PayloadMatcher = ((payload: any) => boolean) | { [key: string]: unknown } | unknown[] | RegExp | string | number | boolean | null;

export interface ExpectEnqueuedOptions {
  /** Exactly this many matching jobs (0: none); default at least one. */
  count?: number;
  /** Only jobs in this state; default any (a job that already ran was still enqueued). */
  state?: JobState;
}

export interface WaitForOptions {
  /** Default 10,000 ms. */
  timeoutMs?: number;
  /** For an id: wait for this state instead of any finished one (succeeded, dead, cancelled). */
  state?: JobState;
}

const FINISHED: ReadonlySet<JobState> = new Set<JobState>(["succeeded", "dead", "cancelled"]);
const POLL_MS = 20;
const LIST_LIMIT = 10_000;
const SHOWN = 10;

export async function expectEnqueued(
  lh: Leasehold,
  task: string,
  matcher?: PayloadMatcher,
  options: ExpectEnqueuedOptions = {},
): Promise<ListedJob[]> {
  if (typeof task !== "string" || task === "") throw new TypeError("expectEnqueued(task, payload?) takes a task name");
  const jobs = (await lh.listJobs({ task, state: options.state, limit: LIST_LIMIT })).reverse(); // oldest first
  const matching = matcher === undefined ? jobs : jobs.filter((j) => payloadMatches(j.payload, matcher));
  const wanted = options.count;
  if (wanted === undefined ? matching.length > 0 : matching.length === wanted) return matching;

  const what =
    `${wanted === undefined ? "a" : wanted} "${task}" job${wanted === undefined || wanted === 1 ? "" : "s"}` +
    (options.state ? ` in state ${options.state}` : "") +
    (matcher === undefined ? "" : ` with payload matching ${describeMatcher(matcher)}`);
  let message: string;
  if (jobs.length === 0) {
    message = `expected ${what} to be enqueued, but there is no "${task}" job${options.state ? ` in state ${options.state}` : ""}`;
    const others = await otherTasks(lh);
    message += others.length > 0 ? `. Enqueued tasks: ${others.join(", ")}` : ". No job was enqueued at all";
  } else {
    message =
      `expected ${what}, found ${matching.length === 0 ? "none" : matching.length}` +
      (matcher === undefined ? "" : ` among the ${jobs.length} "${task}" job${jobs.length === 1 ? "" : "s"}`) +
      ":\n" +
      describeJobs(matcher === undefined || matching.length > 0 ? matching : jobs);
  }
  throw new AssertionError({
    message,
    actual: jobs.map((j) => j.payload),
    expected: typeof matcher === "function" ? undefined : matcher,
    operator: "expectEnqueued",
  });
}

/** Waits until the job finishes (or reaches `state`); returns it. */
export async function waitForJob(lh: Leasehold, id: string, options: WaitForOptions = {}): Promise<JobRecord> {
  const deadline = Date.now() + (options.timeoutMs ?? 10_000);
  for (;;) {
    const { job } = await lh.getJob(id);
    if (options.state ? job.state === options.state : FINISHED.has(job.state)) return job;
    if (Date.now() >= deadline) {
      throw new AssertionError({
        message:
          `job ${id} (${job.task}) did not ${options.state ? `reach state ${options.state}` : "finish"} within ${options.timeoutMs ?? 10_000} ms: ` +
          `it is ${job.state}, attempt ${job.attempt}, ${job.spentAttempts} of ${job.maxAttempts} attempts spent` +
          (job.runAt && job.state === "waiting" ? `, runs at ${job.runAt.toISOString()}` : "") +
          (job.lastError ? `; last error: ${firstLine(job.lastError)}` : "") +
          ". Is a worker running its task? (drain() runs the queue without one)",
        actual: job.state,
        expected: options.state ?? "a finished state",
        operator: "waitFor",
      });
    }
    await sleep(POLL_MS);
  }
}

/** Waits until some job satisfies `predicate`; returns the first (oldest) that does. */
export async function waitForMatch(lh: Leasehold, predicate: (job: JobRecord) => boolean, options: WaitForOptions = {}): Promise<JobRecord> {
  const deadline = Date.now() + (options.timeoutMs ?? 10_000);
  for (;;) {
    const jobs = (await lh.listJobs({ limit: LIST_LIMIT })).reverse() as JobRecord[];
    const found = jobs.find((j) => predicate(j));
    if (found) return found;
    if (Date.now() >= deadline) {
      throw new AssertionError({
        message: `no job matched the waitFor predicate within ${options.timeoutMs ?? 10_000} ms; the jobs are:\n${describeJobs(jobs) || "  (none)"}`,
        operator: "waitFor",
      });
    }
    await sleep(POLL_MS);
  }
}

/** Partial deep match: every key the expected object gives must match; arrays element by element. */
export function payloadMatches(actual: unknown, expected: unknown): boolean {
  if (typeof expected === "function") return Boolean((expected as (p: unknown) => unknown)(actual));
  if (isAsymmetricMatcher(expected)) return expected.asymmetricMatch(actual);
  if (expected instanceof RegExp) return typeof actual === "string" && expected.test(actual);
  if (Array.isArray(expected)) {
    return Array.isArray(actual) && actual.length === expected.length && expected.every((e, i) => payloadMatches(actual[i], e));
  }
  if (expected !== null && typeof expected === "object") {
    if (actual === null || typeof actual !== "object" || Array.isArray(actual)) return false;
    return Object.entries(expected).every(([k, e]) => Object.hasOwn(actual, k) && payloadMatches((actual as Record<string, unknown>)[k], e));
  }
  return Object.is(actual, expected);
}

function isAsymmetricMatcher(value: unknown): value is { asymmetricMatch(other: unknown): boolean } {
  return value !== null && typeof value === "object" && typeof (value as { asymmetricMatch?: unknown }).asymmetricMatch === "function";
}

function describeMatcher(matcher: unknown): string {
  if (typeof matcher === "function") return matcher.name ? `${matcher.name}()` : "the given function";
  if (matcher instanceof RegExp) return String(matcher);
  try {
    return JSON.stringify(matcher, (_k, v: unknown) => (isAsymmetricMatcher(v) ? `<${String(v)}>` : v)) ?? String(matcher);
  } catch {
    return String(matcher);
  }
}

function describeJobs(jobs: (ListedJob | JobRecord)[]): string {
  const lines = jobs.slice(0, SHOWN).map((j) => `  job ${j.id} ${j.task} (${j.state}) payload ${truncate(JSON.stringify(j.payload ?? null), 200)}`);
  if (jobs.length > SHOWN) lines.push(`  … and ${jobs.length - SHOWN} more`);
  return lines.join("\n");
}

/** "send-email (2), resize (1)": what was enqueued instead, for a misspelt task name. */
async function otherTasks(lh: Leasehold): Promise<string[]> {
  const counts = new Map<string, number>();
  for (const j of await lh.listJobs({ limit: LIST_LIMIT, includePayload: false })) counts.set(j.task, (counts.get(j.task) ?? 0) + 1);
  return [...counts].sort(([a], [b]) => (a < b ? -1 : 1)).map(([task, n]) => `${task} (${n})`);
}

function truncate(text: string, max: number): string {
  return text.length > max ? `${text.slice(0, max)}…` : text;
}

function firstLine(text: string): string {
  return text.split("\n", 1)[0]!;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
