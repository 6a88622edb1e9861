/**
 * What the flow-control tests share: worker processes (flow-child.ts) and the audit trail read
 * back on the database's clock, with the two measures every limit is checked by: the most
 * attempts holding leases at once, and the most starts in any window of a rate's length.
 */
import { spawn, type ChildProcess } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";
import type { Queryable } from "../../packages/leasehold/src/store/db.js";
import { databaseUrl, eventually } from "./db.js";

const CHILD = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "flow-child.ts");

interface After {
  after(fn: () => unknown): void;
}

export interface FlowWorker {
  child: ChildProcess;
  /** Handler starts this process printed: job id -> Date.now() in the child (same machine). */
  starts: Map<string, number>;
  output(): string;
}

/** Worker processes, started together; each killed (-9) when the test ends. */
export async function flowWorkers(t: After, schema: string, settings: { queues: string[]; concurrency?: number }[]): Promise<FlowWorker[]> {
  return Promise.all(
    settings.map(async ({ queues, concurrency }) => {
      const child = spawn(process.execPath, ["--import", "tsx", CHILD], {
        env: {
          ...process.env,
          DATABASE_URL: databaseUrl(),
          LEASEHOLD_SCHEMA: schema,
          QUEUES: queues.join(","),
          ...(concurrency !== undefined && { CONCURRENCY: String(concurrency) }),
        },
        stdio: ["ignore", "pipe", "inherit"],
      });
      t.after(() => child.kill("SIGKILL"));
      let out = "";
      const starts = new Map<string, number>();
      child.stdout!.on("data", (b: Buffer) => {
        const text = b.toString();
        out += text;
        for (const m of text.matchAll(/^started (\d+) (\d+)$/gm)) starts.set(m[1]!, Number(m[2]));
      });
      await eventually(async () => out.includes("ready "), "worker process ready", 60_000);
      return { child, starts, output: () => out };
    }),
  );
}

/** One attempt from the audit trail; times in ms since the epoch, microseconds kept. */
export interface Attempt {
  jobId: string;
  attempt: number;
  outcome: string;
  workerId: string;
  start: number;
  end: number;
}

/** Every finished attempt (the `all_attempts` view), oldest start first. */
export async function auditTrail(db: Queryable): Promise<Attempt[]> {
  const { rows } = await db.query<{ job_id: string; attempt: number; outcome: string; worker_id: string; start_ms: number; end_ms: number }>(
    `SELECT job_id::text, attempt, outcome, worker_id,
            extract(epoch FROM started_at)::float8 * 1000 AS start_ms, extract(epoch FROM ended_at)::float8 * 1000 AS end_ms
       FROM all_attempts ORDER BY started_at, job_id`,
  );
  return rows.map((r) => ({ jobId: r.job_id, attempt: r.attempt, outcome: r.outcome, workerId: r.worker_id, start: r.start_ms, end: r.end_ms }));
}

/** The database's clock now, in ms since the epoch. */
export async function dbNow(db: Queryable): Promise<number> {
  const { rows } = await db.query<{ ms: number }>("SELECT extract(epoch FROM clock_timestamp())::float8 * 1000 AS ms");
  return rows[0]!.ms;
}

/**
 * The most attempts holding leases at once, and when: intervals are [start, end), so an attempt
 * that starts the moment another ends does not overlap it.
 */
export function maxOverlap(attempts: Attempt[]): { max: number; at: number } {
  const events = attempts.flatMap((a) => [
    [a.start, 1],
    [a.end, -1],
  ]);
  events.sort((x, y) => x[0]! - y[0]! || x[1]! - y[1]!);
  let now = 0;
  let best = { max: 0, at: NaN };
  for (const [at, d] of events) {
    now += d!;
    if (now > best.max) best = { max: now, at: at! };
  }
  return best;
}

/** The attempts holding leases at `at`, described (for a failure's message). */
export function holdersAt(attempts: Attempt[], at: number): string {
  const iso = (ms: number) => new Date(ms).toISOString().slice(11, 23) + String(Math.round((ms % 1) * 1000)).padStart(3, "0");
  const holders = attempts.filter((a) => a.start <= at && at < a.end);
  const shown = holders.slice(0, 8).map((a) => `job ${a.jobId} attempt ${a.attempt} (${a.outcome}, ${a.workerId}) ${iso(a.start)}-${iso(a.end)}`);
  return shown.join("; ") + (holders.length > shown.length ? `; and ${holders.length - shown.length} more` : "");
}

/** The most starts in any window of `windowMs` (a start counts in [t, t + windowMs)), and where. */
export function maxStartsInWindow(attempts: Attempt[], windowMs: number): { max: number; at: number } {
  const starts = attempts.map((a) => a.start).sort((x, y) => x - y);
  let best = { max: 0, at: NaN };
  for (let i = 0, j = 0; i < starts.length; i++) {
    while (j < starts.length && starts[j]! < starts[i]! + windowMs) j++;
    if (j - i > best.max) best = { max: j - i, at: starts[i]! };
  }
  return best;
}

/** Groups attempts by a job's key (from what the test enqueued); jobs without one are left out. */
export function byKey(attempts: Attempt[], keyOf: Map<string, string>): Map<string, Attempt[]> {
  const out = new Map<string, Attempt[]>();
  for (const a of attempts) {
    const key = keyOf.get(a.jobId);
    if (key === undefined) continue;
    if (!out.has(key)) out.set(key, []);
    out.get(key)!.push(a);
  }
  return out;
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
