/**
 * What the worker runtime needs from the outside world. One runtime, two transports:
 * `DatabaseTransport` (below) talks to PostgreSQL through the store; the remote transport
 * talks to `leasehold serve` over HTTP. Both give the same fencing guarantees, because
 * the fence is in the SQL.
 */
import type pg from "pg";
import type { ClaimedJob } from "../jobs/types.js";
import * as store from "../store/index.js";
import { Listener } from "./listener.js";

export interface WorkerTransport {
  claim(p: store.ClaimParams): Promise<ClaimedJob[]>;
  heartbeat(p: { workerId: string; leaseMs: number; beats: store.Beat[] }): Promise<store.BeatResult>;
  complete(p: { workerId: string; jobs: store.AttemptRef[] }): Promise<Map<string, "succeeded" | "cancelled">>;
  fail(p: { workerId: string; failures: store.Failure[] }): Promise<Map<string, store.EndState>>;
  release(p: { workerId: string; jobs: store.AttemptRef[]; reason: string }): Promise<Map<string, store.EndState>>;
  describeLost(attempts: store.AttemptRef[]): Promise<Map<string, store.LostLease>>;
  /** Startup reconciliation for a worker with a stable name; returns how many jobs were released. */
  reconcile(p: { workerName: string; currentWorkerId: string }): Promise<number>;
  /**
   * Calls `wake` when jobs may have become ready in one of `queues`, and after every
   * reconnect (notifications sent while disconnected are lost). Returns a stop function.
   */
  subscribe(queues: string[], wake: () => void): Promise<() => Promise<void>>;
  /** Ends a claim in progress (a remote long poll) so that stop() need not wait for it. */
  interrupt?(): void;
}

/** Errors that mean "the request may or may not have been applied": retry the fenced call. */
export function isConnectionError(err: unknown): boolean {
  const e = err as { code?: string; message?: string };
  if (!e || typeof e !== "object") return false;
  if (typeof e.code === "string") {
    // node socket errors, and PostgreSQL's admin shutdown / connection-exception classes
    if (/^(ECONNRESET|ECONNREFUSED|EPIPE|ETIMEDOUT|ENOTFOUND|EHOSTUNREACH|ECONNABORTED|UND_ERR_\w+)$/.test(e.code)) return true;
    if (/^(57P0[1-3]|08\d{3})$/.test(e.code)) return true;
    // the remote transport: the server could not be reached, or could not reach the database
    if (e.code === "server_unavailable") return true;
  }
  return /Connection terminated|connection timeout|timeout exceeded when trying to connect|Client has encountered a connection error|socket hang up|fetch failed|Query read timeout/i.test(
    e.message ?? "",
  );
}

/**
 * PostgreSQL refused a value, not the connection: a data exception (class 22, e.g. invalid
 * text or JSON) or a program limit (class 54, e.g. nesting too deep for its stack).
 */
export function isRefusedValue(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === "string" && /^(22|54)[0-9A-Z]{3}$/.test(code);
}

/** One job's beat; if its value is refused, the lease is renewed without the value. */
async function beatAlone(
  db: store.Queryable,
  p: { workerId: string; leaseMs: number },
  beat: store.Beat,
): Promise<store.BeatResult> {
  try {
    return await store.extendLeases(db, { ...p, beats: [beat] });
  } catch (err) {
    if (!isRefusedValue(err)) throw err;
    const bare = await store.extendLeases(db, { ...p, beats: [{ id: beat.id, attempt: beat.attempt }] });
    return { ...bare, refused: new Map([[beat.id, `the database refused its progress or checkpoint: ${(err as Error).message}`]]) };
  }
}

/** Reports are fenced and retried, so a hung one can be abandoned and sent again. */
const REPORT_TIMEOUT_MS = 10_000;

/**
 * Statements that give up after `ms`. pg then drops the connection from the pool, so a
 * connection that went silent (a half-open TCP flow) cannot hang the worker: the retry
 * runs on a fresh one. The statement may still have committed: callers treat the timeout
 * as an ambiguous connection error (isConnectionError) and repeat the fenced call.
 */
function withQueryTimeout(pool: pg.Pool, ms: number): store.Queryable {
  return {
    query: (text, values) => pool.query({ text, values, query_timeout: ms } as pg.QueryConfig),
  };
}

export class DatabaseTransport implements WorkerTransport {
  constructor(
    private readonly pool: pg.Pool,
    private readonly connectionString: string,
    private readonly schema: string,
  ) {}

  claim(p: store.ClaimParams): Promise<ClaimedJob[]> {
    return store.claimJobs(withQueryTimeout(this.pool, p.leaseMs), p);
  }
  async heartbeat(p: { workerId: string; leaseMs: number; beats: store.Beat[] }): Promise<store.BeatResult> {
    // A beat that cannot answer within a third of the lease is retried on a fresh connection.
    const db = withQueryTimeout(this.pool, Math.max(1_000, Math.floor(p.leaseMs / 3)));
    try {
      return await store.extendLeases(db, p);
    } catch (err) {
      if (!isRefusedValue(err)) throw err;
      // One job's value failed the whole statement: beat each job alone so only its own
      // value is dropped (rare: values are validated before they get here).
      const result: store.BeatResult = { renewed: new Map(), lost: [], refused: new Map() };
      for (const beat of p.beats) {
        const one = await beatAlone(db, p, beat);
        for (const [id, r] of one.renewed) result.renewed.set(id, r);
        result.lost.push(...one.lost);
        for (const [id, why] of one.refused ?? []) result.refused!.set(id, why);
      }
      return result;
    }
  }
  complete(p: { workerId: string; jobs: store.AttemptRef[] }): Promise<Map<string, "succeeded" | "cancelled">> {
    return store.completeJobs(withQueryTimeout(this.pool, REPORT_TIMEOUT_MS), p);
  }
  fail(p: { workerId: string; failures: store.Failure[] }): Promise<Map<string, store.EndState>> {
    return store.failJobs(withQueryTimeout(this.pool, REPORT_TIMEOUT_MS), p);
  }
  release(p: { workerId: string; jobs: store.AttemptRef[]; reason: string }): Promise<Map<string, store.EndState>> {
    return store.releaseJobs(this.pool, p);
  }
  describeLost(attempts: store.AttemptRef[]): Promise<Map<string, store.LostLease>> {
    return store.describeLostLeases(this.pool, attempts);
  }
  async reconcile(p: { workerName: string; currentWorkerId: string }): Promise<number> {
    return (await store.releaseJobsOfEarlierProcess(this.pool, p)).size;
  }
  async subscribe(queues: string[], wake: () => void): Promise<() => Promise<void>> {
    const wanted = new Set(queues);
    const listener = new Listener(this.connectionString, store.notifyChannel(this.schema), (queue) => {
      if (queue === undefined || wanted.has(queue)) wake();
    });
    await listener.start();
    return () => listener.stop();
  }
}
