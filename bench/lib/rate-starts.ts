/**
 * A queue's rate limit measured where it matters (docs/flow-control.md): worker processes of
 * their own drain a rate-limited backlog, and the starts are read on the database's clock both
 * as the claims recorded them (the attempts' `started_at` in the audit trail) and as each handler
 * stamped its own (bench/rate-worker.ts). Used by `bench/flow-rate.ts` (standalone) and by
 * `npm run bench`'s flow-rate workload.
 */
import { fork, type ChildProcess } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";
import pg from "pg";

// Compiled (npm run bench): plain JS. Run from source (tsx): the same through tsx.
const HERE = fileURLToPath(import.meta.url);
const ENTRY = path.join(path.dirname(HERE), "..", HERE.endsWith(".js") ? "rate-worker.js" : "rate-worker.ts");
const READY_TIMEOUT_MS = 60_000;

export interface RateStartsSetup {
  /** The database, and the Leasehold schema whose queue is limited and filled (a backlog longer than the run). */
  url: string;
  schema: string;
  queue: string;
  task: string;
  /** The rate's starts per window, and its window. */
  limit: number;
  windowMs: number;
  seconds: number;
  /** Handler concurrency of each worker process (one process each). */
  concurrency: number[];
  /** Each handler runs about this long (±50%; 0: returns at once). */
  busyMs: number;
}

export interface RateStarts {
  /** The claims' starts in the measured span (ms, sorted), from the first one. */
  claims: number[];
  /** The handlers' stamped starts in the same span. */
  handlerStarts: number[];
  /** Claims in each fixed second from the first start. */
  perSecond: number[];
  /** How long after its claim each handler started (ms, sorted): the claim's answer and the worker's dispatch. */
  claimToHandler: number[];
  /** The most claims, and the most handler starts, in any sliding window of the rate's length. */
  mostClaims: number;
  mostHandlerStarts: number;
}

/** Forks the worker processes, lets them drain for `seconds` from the first start, and reads the starts. */
export async function measureRateStarts(o: RateStartsSetup): Promise<RateStarts> {
  const db = new pg.Client({ connectionString: o.url, options: `-c search_path=${o.schema}` });
  await db.connect();
  const children: ChildProcess[] = [];
  try {
    await db.query("DROP TABLE IF EXISTS handler_starts");
    await db.query("CREATE TABLE handler_starts (job_id bigint PRIMARY KEY, at timestamptz NOT NULL)");
    for (const concurrency of o.concurrency) {
      children.push(
        fork(ENTRY, [], {
          env: {
            ...process.env,
            RATE_URL: o.url,
            RATE_SCHEMA: o.schema,
            RATE_QUEUE: o.queue,
            RATE_TASK: o.task,
            RATE_CONCURRENCY: String(concurrency),
            RATE_BUSY_MS: String(o.busyMs),
          },
        }),
      );
    }
    await Promise.all(
      children.map(
        (c) =>
          new Promise<void>((resolve, reject) => {
            const timer = setTimeout(() => reject(new Error(`a rate worker was not ready within ${READY_TIMEOUT_MS} ms`)), READY_TIMEOUT_MS);
            c.once("message", () => (clearTimeout(timer), resolve()));
            c.once("exit", (code) => (clearTimeout(timer), reject(new Error(`a rate worker exited (${code}) before it was ready`))));
          }),
      ),
    );
    const firstStart = async () =>
      (await db.query<{ ms: number | null }>("SELECT extract(epoch FROM min(started_at))::float8 * 1000 AS ms FROM all_attempts")).rows[0]!.ms;
    const deadline = Date.now() + 30_000;
    let t0: number | null = null;
    while ((t0 = await firstStart()) === null) {
      if (Date.now() > deadline) throw new Error("no job started within 30 s");
      await new Promise((r) => setTimeout(r, 50));
    }
    // The span, and a moment for its last starts' claims to be answered and stamped.
    await new Promise((r) => setTimeout(r, t0! + o.seconds * 1_000 + 2_000 - Date.now()));
    const inSpan = (ms: number) => ms < t0! + o.seconds * 1_000;
    const claims = (
      await db.query<{ ms: number }>(
        "SELECT extract(epoch FROM started_at)::float8 * 1000 AS ms FROM all_attempts WHERE started_at >= to_timestamp($1 / 1000.0) ORDER BY 1",
        [t0],
      )
    ).rows
      .map((r) => r.ms)
      .filter(inSpan);
    const handlerStarts = (
      await db.query<{ ms: number }>(
        "SELECT extract(epoch FROM at)::float8 * 1000 AS ms FROM handler_starts WHERE at >= to_timestamp($1 / 1000.0) ORDER BY 1",
        [t0],
      )
    ).rows
      .map((r) => r.ms)
      .filter(inSpan);
    const claimToHandler = (
      await db.query<{ ms: number }>(
        `SELECT extract(epoch FROM h.at - a.started_at)::float8 * 1000 AS ms
           FROM handler_starts AS h JOIN all_attempts AS a ON a.job_id = h.job_id AND a.attempt = 1
          WHERE h.at >= to_timestamp($1 / 1000.0) ORDER BY 1`,
        [t0],
      )
    ).rows.map((r) => r.ms);
    const perSecond = Array.from({ length: o.seconds }, () => 0);
    for (const ms of claims) perSecond[Math.floor((ms - t0) / 1_000)]!++;
    return {
      claims,
      handlerStarts,
      perSecond,
      claimToHandler,
      mostClaims: mostInWindow(claims, o.windowMs),
      mostHandlerStarts: mostInWindow(handlerStarts, o.windowMs),
    };
  } finally {
    for (const c of children) c.kill("SIGKILL");
    await db.end();
  }
}

/** "p50 x ms, p99 y ms, max z ms" of sorted `ms`. */
export function spread(ms: number[]): string {
  const at = (q: number) => ms[Math.min(ms.length - 1, Math.floor(q * ms.length))] ?? NaN;
  return `p50 ${at(0.5).toFixed(0)} ms, p99 ${at(0.99).toFixed(0)} ms, max ${at(1).toFixed(0)} ms`;
}

/** The most of `times` (sorted, ms) in any window [t, t + windowMs) that opens at one of them. */
export function mostInWindow(times: number[], windowMs: number): number {
  let most = 0;
  for (let i = 0, j = 0; i < times.length; i++) {
    while (j < times.length && times[j]! < times[i]! + windowMs) j++;
    most = Math.max(most, j - i);
  }
  return most;
}
