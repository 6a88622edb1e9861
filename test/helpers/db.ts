/**
 * Test helpers: a migrated schema of its own for each test, on the server the test runner
 * started (DATABASE_URL). Run a file alone with `npm test -- test/x.test.ts`.
 */
import { randomBytes } from "node:crypto";
import type { EventEmitter } from "node:events";
import pg from "pg";
import pino from "pino";
import { Registry } from "prom-client";
import { Leasehold } from "../../packages/leasehold/src/client.js";
import type { JobAbortedError, JobContext } from "../../packages/leasehold/src/worker/context.js";

export const silent = pino({ level: process.env.TEST_LOG_LEVEL ?? "silent" });

/** Retries at once: tests about what a failure does, not about how long it waits. */
export const NO_BACKOFF = { baseMs: 0, factor: 1, maxMs: 0, jitter: 0 };

export function databaseUrl(): string {
  const url = process.env.DATABASE_URL;
  if (!url) throw new Error("DATABASE_URL is not set: run tests with `npm test` (it starts PostgreSQL)");
  return url;
}

export function uniqueSchema(prefix = "t"): string {
  return `${prefix}_${randomBytes(5).toString("hex")}`;
}

/**
 * A Leasehold client on a fresh schema, closed (and its schema dropped) when the test ends,
 * pass or fail: an open pool would keep the test file's process alive.
 */
export async function freshLeasehold(t?: { after(fn: () => Promise<void>): void }): Promise<Leasehold & { dispose(): Promise<void> }> {
  const schema = uniqueSchema();
  const lh = await Leasehold.connect({ databaseUrl: databaseUrl(), schema, logger: silent, metricsRegistry: new Registry(), poolSize: 20 });
  let disposed = false;
  const handle = Object.assign(lh, {
    async dispose() {
      if (disposed) return;
      disposed = true;
      await lh.pool.query(`DROP SCHEMA ${schema} CASCADE`).catch(() => {});
      await lh.close();
    },
  });
  t?.after(() => handle.dispose());
  return handle;
}

/** A plain client with search_path on the schema, for tests that look at rows directly. */
export async function rawClient(schema: string): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: databaseUrl(), options: `-c search_path=${schema}` });
  await c.connect();
  return c;
}

/** Resolves with the event's arguments the first time `match` accepts them. */
export function waitForEvent<A extends unknown[]>(
  emitter: EventEmitter,
  event: string,
  match: (...args: A) => boolean = () => true,
  timeoutMs = 15_000,
): Promise<A> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      emitter.off(event, listener);
      reject(new Error(`timed out after ${timeoutMs} ms waiting for "${event}"`));
    }, timeoutMs);
    const listener = (...args: unknown[]) => {
      if (!match(...(args as A))) return;
      clearTimeout(timer);
      emitter.off(event, listener);
      resolve(args as A);
    };
    emitter.on(event, listener);
  });
}

/**
 * Records every `event` from now on, so a test can wait for one about a job it has yet to enqueue:
 * a running worker woken by NOTIFY may start (or even end) the job before the enqueue's own answer
 * is read, and a listener attached after the enqueue would miss it.
 */
export function recordEvents<A extends unknown[] = unknown[]>(emitter: EventEmitter, event: string) {
  const seen: unknown[][] = [];
  emitter.on(event, (...args: unknown[]) => void seen.push(args));
  return {
    async waitFor<B extends unknown[] = A>(match: (...args: B) => boolean, timeoutMs = 15_000): Promise<B> {
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        const found = seen.find((args) => match(...(args as B)));
        if (found) return found as B;
        const left = deadline - Date.now();
        if (left <= 0) throw new Error(`timed out after ${timeoutMs} ms waiting for "${event}"`);
        await waitForEvent<B>(emitter, event, match, left).catch(() => undefined);
      }
    },
  };
}

/** Polls `check` until it returns a truthy value (for conditions only the database knows). */
export async function eventually<T>(check: () => Promise<T>, what: string, timeoutMs = 15_000): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value as NonNullable<T>;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** A handler that runs until its signal aborts, and records the abort's reason (JobAbortedError.reason). */
export function untilAborted(reasons: unknown[]) {
  return (_: unknown, ctx: JobContext) =>
    new Promise<never>((_, reject) =>
      ctx.signal.addEventListener("abort", () => {
        reasons.push((ctx.signal.reason as JobAbortedError).reason);
        reject(ctx.signal.reason as Error);
      }),
    );
}

/** Polls until the job is in `state`, and returns its getJob record (a durable job's steps and wait with it). */
export async function settled<R extends { job: { state: string } }>(
  lh: { getJob(id: string): Promise<R> },
  id: string,
  state: string,
  timeoutMs = 15_000,
): Promise<R> {
  return eventually(
    async () => {
      const record = await lh.getJob(id);
      return record.job.state === state ? record : undefined;
    },
    `job ${id} ${state}`,
    timeoutMs,
  );
}
