/**
 * What the worker runtime needs from the outside world. One runtime, two transports:
 * `DatabaseTransport` (below) talks to PostgreSQL through the store; the remote transport
 * talks to `leasehold serve` over HTTP. Both give the same fencing guarantees, because
 * the fence is in the SQL.
 */
import { randomUUID } from "node:crypto";
import os from "node:os";
import pg from "pg";
import { ConfigError, TransactionMisuseError, WorkerNameInUseError } from "../errors.js";
import * as store from "../store/index.js";
import { DEFAULT_BACKOFF } from "./backoff.js";
import { Listener } from "./listener.js";
import { runGuarded } from "./transaction-guard.js";
import { childrenAnswer, eventWaitAnswer, sleepAnswer } from "./step-answers.js";
import { isConnectionError } from "../store/db.js";
import type { StepRecord } from "../jobs/steps.js";
import type { JsonValue } from "../jobs/types.js";
import type { PreparedChildren } from "./children.js";

/**
 * A ctx.children step: as the store takes it (the children prepared, null on a replay), and the
 * children as the handler gave them, which a remote worker sends for the server to check itself.
 */
export type ChildrenCall = store.ChildrenStep & { given: PreparedChildren["given"] | null };

export { isConnectionError };

/** The payload of the notification a change of queue settings sends (migration 013); no queue can be named so. */
export const QUEUE_SETTINGS_CHANGED = "!queues";

/** What a worker tells the world about itself when it starts. */
export interface AttachParams {
  workerId: string;
  name?: string;
  /** With the name held by another live process: wait for it instead of failing. */
  waitForName: boolean;
  /**
   * How long the worker's liveness lock may be gone before its jobs are recovered; null: hold
   * no liveness lock (recovery by lease expiry only). Transports without a session ignore it.
   */
  livenessGraceMs: number | null;
  /** Whether the worker holds leases now (its liveness session is then proven alive by pings). */
  holdsLeases?: () => boolean;
  queues: string[];
  concurrency: number;
  leaseMs: number;
  heartbeatMs: number;
  policies: store.TaskPolicy[];
  /** Jobs may have become ready in one of the queues (or a wake-up may have been missed). */
  wake: () => void;
  /** Queue settings (pause, limits) may have changed, or a notification of it may have been missed. */
  onQueueSettings?: () => void;
  /**
   * A user asked to cancel this attempt of the worker's (instant cancel: a notice, not the next
   * heartbeat). Undefined: notices may have been missed (a reconnect), so the worker checks its
   * attempts itself. Transports that cannot hear notices never call it (heartbeats still tell).
   */
  onCancelRequested?: (attempt: store.AttemptRef | undefined) => void;
  /** The worker's identity was taken while it ran (its name is held by another process). */
  onIdentityLost: (err: Error) => void;
  /**
   * The transport's own session went down or came back: for outage logging and, where that
   * session holds the worker's liveness lock, for the worker to give up its jobs before the
   * watchdog recovers them.
   */
  onConnection?: (state: "up" | "down", err?: unknown, lateByMs?: number) => void;
}

export interface Attachment {
  /** Ends the worker's presence; `graceful`: it stopped on purpose (its jobs were released). */
  detach(graceful: boolean): Promise<void>;
  /**
   * What the worker's database session gives it, for a transport on the database: `listen`
   * (wake-ups and instant cancel by notification), `liveness` (crash detection by its lock),
   * `nameLock` (its stable name held by a lock). `degraded` says why some are missing when it
   * is not the worker's own choice (transaction pooling without a direct URL).
   */
  session?: SessionFeatures & { degraded?: string };
}

export interface SessionFeatures {
  listen: boolean;
  liveness: boolean;
  nameLock: boolean;
}

export interface WorkerTransport {
  /**
   * Announces the worker and its task policies, holds its liveness (and, with a name, the
   * name: a second live process with that name is refused with WorkerNameInUseError), and
   * calls `wake` when jobs may be ready. Resolves when the worker may start claiming.
   */
  attach(p: AttachParams): Promise<Attachment>;
  /** Claims jobs; `retryInMs` and `paused` say when flow control (not the backlog) held it back. */
  claim(p: store.ClaimParams): Promise<store.ClaimedJobs>;
  /** Flow-control settings of every configured queue (paused, limited, keyed, held). */
  queueSettings(): Promise<store.QueueSettings[]>;
  /**
   * Attempts whose handlers threw RateLimitedError: each job waits its delay without spending
   * budget, its key or queue held back as long. Fenced like a release.
   */
  rateLimit(p: { workerId: string; jobs: store.RateLimited[]; message?: string }): Promise<Map<string, store.EndState>>;
  heartbeat(p: store.HeartbeatParams): Promise<store.BeatResult>;
  /**
   * Successes, each with its result (JSON, already validated) if it has one. A transport whose
   * far end validates results again may end a refused one as dead (giveUp) and answer "dead".
   */
  complete(p: { workerId: string; jobs: store.Completion[] }): Promise<Map<string, "succeeded" | "cancelled" | "dead">>;
  fail(p: { workerId: string; failures: store.Failure[] }): Promise<Map<string, store.EndState>>;
  /**
   * Attempts whose `ctx.fencedWrite` a newer claim overtook: each job finishes (outcome
   * superseded) without spending its retry budget. Fenced like a completion.
   */
  supersede(p: { workerId: string; jobs: store.Supersession[] }): Promise<Map<string, "superseded" | "cancelled">>;
  /** A graceful release by this live worker: no retry budget is spent. */
  release(p: { workerId: string; jobs: store.AttemptRef[]; reason: string }): Promise<Map<string, store.EndState>>;
  describeLost(attempts: store.AttemptRef[]): Promise<Map<string, store.LostLease>>;
  /**
   * Start-up reconciliation for a worker holding a stable name: the jobs an earlier process
   * of the name still holds end as worker_lost (spending budget); returns how many.
   */
  reconcile(p: { workerName: string; currentWorkerId: string; backoff: store.BackoffPolicy }): Promise<number>;
  /**
   * `ctx.transaction`: runs `work` in a transaction and completes the attempt in it, fenced;
   * commits both, or rolls both back when the attempt no longer holds its job. Only a
   * transport on the database itself can (a remote worker cannot join the server's
   * transactions). `committing` is called just before the completion runs.
   */
  completeWithin?<T>(p: CompleteWithinParams<T>): Promise<CompleteWithinResult<T>>;
  /**
   * ctx.parents(): the parents of a job this worker holds, and how each ended (results
   * included). A transport without it cannot serve dependent jobs' reads.
   */
  parents?(p: { workerId: string; job: store.AttemptRef }): Promise<store.ParentRecord[]>;
  /** ctx.dependencies(): how the parents of a job this worker holds ended, counted. */
  dependencies?(p: { workerId: string; job: store.AttemptRef }): Promise<store.DependencyCounts>;
  /** Ends a claim in progress (a remote long poll) so that stop() need not wait for it. */
  interrupt?(): void;
  /** The server a remote worker reaches: ctx.callback's URLs start with it. */
  readonly callbackBaseUrl?: string;
  /** Durable steps (worker/step-host.ts): a held job's recorded steps, in order. */
  loadSteps?(p: { workerId: string; job: store.AttemptRef }): Promise<StepRecord[]>;
  /** Records step outcomes, fenced; returns the keys ("id:seq") recorded (see store/steps.ts). */
  recordSteps?(p: { workerId: string; steps: store.StepOutcome[] }): Promise<Set<string>>;
  /** Why a record was refused: the attempt lost its job, or the place was recorded already. */
  stepFate?(p: { workerId: string; id: string; attempt: number; seq: number }): Promise<store.StepFate>;
  /** ctx.step.transaction: the handler's writes and the step's record in one transaction (a transport on the database only). */
  recordStepWithin?<T>(p: RecordStepWithinParams<T>): Promise<RecordStepWithinResult>;
  /** ctx.sleep: records the sleep and suspends the job; "due": its end had passed (recorded, not suspended). */
  sleep?(p: store.SuspendingStep & ({ until: Date } | { ms: number })): Promise<SuspensionAnswer | "due">;
  /** ctx.waitForEvent: the event (or the timeout's null) if the wait is over, else the job suspends. */
  waitForEvent?(p: store.EventWait): Promise<{ received: boolean; data: JsonValue | null } | SuspensionAnswer>;
  /** ctx.children: starts the children (or looks at them on a replay); their ends once all ended, else the job suspends. */
  children?(p: ChildrenCall): Promise<{ ends: store.ChildEndRecord[] } | SuspensionAnswer>;
  /**
   * Keeps a record of heartbeats and reports the fence refused, for operators (the
   * dashboard's Recoveries view). Only a transport on the database has it: the server keeps
   * the record of its remote workers' refusals itself.
   */
  recordRefusals?(refusals: store.StaleRefusal[]): Promise<void>;
  /** The most jobs one claim may ask for through this transport (default: the runtime's own cap). */
  readonly maxClaimBatch?: number;
  /**
   * The transport calls `onQueueSettings` on every change of queue settings (and on every new
   * session): the worker then reads them on notice, and polls only as a slow safety net.
   */
  readonly notifiesQueueSettings?: boolean;
}

/** How a suspension ended the attempt; "stale": the attempt no longer held its job. */
export type SuspensionAnswer = "suspended" | "cancelled" | "stale";

export interface RecordStepWithinParams<T> {
  workerId: string;
  job: store.AttemptRef;
  place: { seq: number; name: string; occurrence: number };
  work: (tx: pg.PoolClient) => Promise<T>;
  /** The step's result as JSON (null: undefined) from what `work` returned; may throw to roll back. */
  result: (value: T) => string | null;
  durationMs: () => number;
  pool?: pg.Pool;
}

export type RecordStepWithinResult =
  | { recorded: true; resultJson: string | null }
  /** Not recorded, everything rolled back: the attempt lost its job (`held` false), or `other` recorded the place first. */
  | { recorded: false; held: boolean; other?: { name: string; occurrence: number; result: JsonValue | undefined } };

export interface CompleteWithinParams<T> {
  workerId: string;
  job: store.AttemptRef;
  work: (tx: pg.PoolClient) => Promise<T>;
  /** The result to store with the completion (JSON), made from what `work` returned; may throw to roll back. */
  result?: (value: T) => string | undefined;
  /** Connections for the transaction: the user's own pool, or (default) one with the server's default search_path. */
  pool?: pg.Pool;
  committing: () => void;
}

export type CompleteWithinResult<T> = { completed: true; value: T } | { completed: false; lost: store.LostLease | undefined };

/**
 * PostgreSQL refused a value, not the connection: a data exception (class 22, e.g. invalid
 * text or JSON) or a program limit (class 54, e.g. nesting too deep for its stack).
 */
export function isRefusedValue(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === "string" && /^(22|54)[0-9A-Z]{3}$/.test(code);
}

/** One job's beat; if its value is refused, the lease is renewed without the value. */
async function beatAlone(db: store.Queryable, p: store.HeartbeatParams, beat: store.Beat): Promise<store.BeatResult> {
  try {
    return await store.extendLeases(db, { ...p, beats: [beat] });
  } catch (err) {
    if (!isRefusedValue(err)) throw err;
    const bare = await store.extendLeases(db, { ...p, beats: [{ id: beat.id, attempt: beat.attempt }] });
    return { ...bare, refused: new Map([[beat.id, `the database refused its progress or checkpoint: ${(err as Error).message}`]]) };
  }
}

/**
 * Records refusals through the transport, if it keeps them, without waiting: the refusal path
 * goes on whether or not the record lands (the metric has already counted it).
 */
export function recordRefusals(transport: WorkerTransport, refusals: store.StaleRefusal[]): void {
  if (refusals.length === 0 || !transport.recordRefusals) return;
  transport.recordRefusals(refusals).catch(() => {});
}

/**
 * How a worker with leases proves its liveness session alive: a session that went silent is
 * found within two fifths of the grace (a ping every fifth, answered within another), leaving
 * the worker time to stop its attempts before the watchdog recovers them (see Worker).
 */
export function livenessPing(graceMs: number, when: () => boolean): { everyMs: number; timeoutMs: number; when: () => boolean } {
  const fifth = Math.max(40, Math.floor(graceMs / 5));
  return { everyMs: fifth, timeoutMs: fifth, when };
}

/**
 * A statement of the handler failed, the handler caught the error and returned: the
 * transaction is aborted (25P02), so the completion cannot run. Said so, as a misuse: the
 * attempt fails even if the handler catches this too.
 */
function explainAbortedTransaction(err: unknown, label: string): unknown {
  if ((err as { code?: unknown } | null)?.code !== "25P02") return err;
  return new TransactionMisuseError(
    `ctx.transaction (${label}): a statement on tx failed and the callback went on and returned, so the transaction was ` +
      "aborted and rolled back. Let the error end the callback, or run the statement under a SAVEPOINT and ROLLBACK TO it",
  );
}

/** The handler ended the transaction it was given (a COMMIT or ROLLBACK past tx.query): said so, as a misuse. */
function bypassed(label: string, consequence: string): TransactionMisuseError {
  return new TransactionMisuseError(
    `ctx.transaction (${label}): the handler ended the transaction ctx.transaction began (a COMMIT or ROLLBACK that ` +
      `bypassed tx.query); ${consequence} and whatever now runs on the connection was rolled back`,
  );
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
  /** Connections for ctx.transaction, made on first use (see completeWithin). */
  private appPool?: pg.Pool;

  /**
   * `sessionUrl`: where the worker's own session connects (LISTEN, liveness and name locks),
   * default `connectionString`; null when there is none to be had (transaction pooling without
   * a direct URL): the worker then polls and is recovered by lease expiry only.
   */
  constructor(
    private readonly pool: pg.Pool,
    private readonly connectionString: string,
    private readonly schema: string,
    private readonly sessionUrl: string | null = connectionString,
  ) {}

  /** Queue settings come by notification only with a LISTEN session; without one, the worker polls them. */
  get notifiesQueueSettings(): boolean {
    return this.sessionUrl !== null;
  }

  /**
   * The handler's transaction runs on a connection like the application's own: the server's
   * default search_path (where its tables are), not Leasehold's schema, whose statement here
   * names it. Its own small pool, so a handler holding a transaction open never takes a
   * connection the worker's claims, beats and reports need.
   */
  async completeWithin<T>(p: CompleteWithinParams<T>): Promise<CompleteWithinResult<T>> {
    const label = `job ${p.job.id} attempt ${p.job.attempt}`;
    return this.guardedTransaction<T, CompleteWithinResult<T>>(p.pool, label, p.work, async (client, marker, value) => {
      const resultJson = p.result?.(value);
      p.committing();
      const done = await store.completeWithin(client, this.schema, { workerId: p.workerId, job: { ...p.job, resultJson }, marker }).catch((err) => {
        throw explainAbortedTransaction(err, label);
      });
      if (done === "not_ours") throw bypassed(label, "the job was not completed");
      if (done === "stale")
        return {
          commit: false,
          answer: async () => ({ completed: false, lost: (await store.describeLostLeases(this.pool, [p.job])).get(p.job.id) }),
        };
      return {
        commit: true,
        answer: { completed: true, value },
        // The connection dropped during COMMIT: it may have landed. The audit trail knows.
        landed: async () => (await store.describeLostLeases(this.pool, [p.job])).get(p.job.id)?.endedAs === "succeeded",
      };
    });
  }

  /** ctx.step.transaction: as completeWithin, with the step's record in place of the completion. */
  async recordStepWithin<T>(p: RecordStepWithinParams<T>): Promise<RecordStepWithinResult> {
    const label = `job ${p.job.id} attempt ${p.job.attempt} step "${p.place.name}"`;
    const fate = async (): Promise<RecordStepWithinResult> => {
      const f = await store.stepFate(this.pool, { workerId: p.workerId, id: p.job.id, attempt: p.job.attempt, seq: p.place.seq });
      return { recorded: false, held: f.held, ...(f.recorded?.state === "succeeded" && { other: f.recorded }) };
    };
    return this.guardedTransaction<T, RecordStepWithinResult>(p.pool, label, p.work, async (client, marker, value) => {
      const resultJson = p.result(value);
      const step = { workerId: p.workerId, id: p.job.id, attempt: p.job.attempt, ...p.place, resultJson, durationMs: p.durationMs(), marker };
      const done = await store.recordStepWithin(client, this.schema, step).catch((err) => {
        throw explainAbortedTransaction(err, label);
      });
      if (done === "not_ours") throw bypassed(label, "the step was not recorded");
      if (done === "refused") return { commit: false, answer: fate };
      return {
        commit: true,
        answer: { recorded: true, resultJson },
        landed: async () => {
          const f = await fate();
          return !f.recorded && f.other !== undefined;
        },
      };
    });
  }

  /**
   * Runs `work` in a transaction begun here, on a guarded connection (transaction-guard.ts), then
   * `finish` in the same transaction: it commits both, or rolls both back and answers later (its
   * `answer` a function, run after the ROLLBACK). The handler's transaction runs on a connection
   * like the application's own: the server's default search_path (where its tables are), not
   * Leasehold's schema, whose statements name it. Its own small pool, so a handler holding a
   * transaction open never takes a connection the worker's claims, beats and reports need.
   */
  private async guardedTransaction<T, R>(
    userPool: pg.Pool | undefined,
    label: string,
    work: (tx: pg.PoolClient) => Promise<T>,
    finish: (
      client: pg.PoolClient,
      marker: string,
      value: T,
    ) => Promise<{ commit: true; answer: R; landed: () => Promise<boolean> } | { commit: false; answer: () => Promise<R> }>,
  ): Promise<R> {
    const pool = userPool ?? (this.appPool ??= store.createAppPool(this.connectionString));
    const { client, release } = await store.checkOut(pool);
    // The handler gets a guarded tx; the marker lets the closing statement prove it runs in the
    // transaction begun here (see transaction-guard.ts).
    const marker = randomUUID();
    let broken: unknown;
    try {
      await client.query(store.beginWithin(marker));
      let done;
      try {
        const value = await runGuarded(client, label, work);
        done = await finish(client, marker, value);
        if (!done.commit) {
          await client.query("ROLLBACK");
          return await done.answer();
        }
      } catch (err) {
        await client.query("ROLLBACK").catch((e: unknown) => (broken = e));
        // A connection the handler took out of our transaction may carry its state: not pooled again.
        if (err instanceof TransactionMisuseError) broken ??= err;
        throw err;
      }
      try {
        await client.query("COMMIT");
      } catch (err) {
        if (!isConnectionError(err)) throw err;
        broken = err;
        if (!(await done.landed())) throw err;
      }
      return done.answer;
    } finally {
      release(broken);
    }
  }

  async attach(p: AttachParams): Promise<Attachment> {
    const wanted = new Set(p.queues);
    const announce = (key: string | null) => ({
      workerId: p.workerId,
      name: p.name,
      kind: "worker" as const,
      host: os.hostname(),
      pid: process.pid,
      queues: p.queues,
      concurrency: p.concurrency,
      leaseMs: p.leaseMs,
      heartbeatMs: p.heartbeatMs,
      livenessKey: key,
      livenessGraceMs: key === null ? null : p.livenessGraceMs,
      policies: p.policies,
    });
    if (this.sessionUrl === null) return this.attachWithoutSession(p, announce);
    // One session per worker: it LISTENs, and holds the worker's liveness lock (and its name)
    // for as long as it lives; a new session after a reconnect takes them again.
    const sessionUrl = this.sessionUrl;
    const sessionOptions = `-c search_path=${store.quoteIdent(this.schema)}`;
    const listener = new Listener({
      connectionString: sessionUrl,
      channel: store.notifyChannel(this.schema),
      applicationName: "leasehold-worker",
      sessionOptions,
      onNotify: (queue) => {
        if (queue === QUEUE_SETTINGS_CHANGED || queue === undefined) p.onQueueSettings?.();
        if (queue === undefined || wanted.has(queue)) p.wake();
      },
      // Cancel requests of this worker's attempts, on the same session (no connection of their own).
      also: {
        [store.cancelChannel(this.schema)]: (payload) => {
          if (payload === undefined) return p.onCancelRequested?.(undefined);
          const notice = store.parseCancelNotice(payload);
          if (notice?.workerId === p.workerId) p.onCancelRequested?.({ id: notice.id, attempt: notice.attempt });
        },
      },
      onConnect: async (client) => {
        // Before any lock: a session a transaction pooler shares would leave them behind.
        await store.checkOwnBackend(
          client,
          async () => {
            const other = new pg.Client({ connectionString: sessionUrl, application_name: "leasehold-worker-check", options: sessionOptions });
            other.on("error", () => {}); // a backend ended under it fails its query instead
            await other.connect();
            return other;
          },
          sessionUrl === this.connectionString ? "databaseUrl" : "directDatabaseUrl",
        );
        const held = await store.lockLiveness(client, {
          workerId: p.workerId,
          name: p.name,
          liveness: p.livenessGraceMs !== null,
          waitForName: p.waitForName,
        });
        if ("nameTaken" in held) throw new WorkerNameInUseError(p.name!);
        await store.announceWorker(client, announce(held.key));
      },
      onFatal: p.onIdentityLost,
      ...(p.livenessGraceMs !== null && { ping: livenessPing(p.livenessGraceMs, p.holdsLeases ?? (() => true)) }),
      onState: p.onConnection,
    });
    try {
      await listener.start();
    } catch (err) {
      throw store.explainStartupRefusal(err, "directDatabaseUrl");
    }
    return {
      detach: async (graceful) => {
        if (graceful) await store.markWorkerStopped(this.pool, p.workerId).catch(() => {});
        await listener.stop();
        await this.endAppPool();
      },
      session: { listen: true, liveness: p.livenessGraceMs !== null, nameLock: p.name !== undefined },
    };
  }

  /**
   * No session of its own (transaction pooling without a direct URL): a lock or LISTEN
   * through the pooler would stay on a server connection other clients get next, so the
   * worker takes none. It announces itself without a liveness key (recovered by lease
   * expiry, like livenessGraceMs null) and polls. A stable name cannot be held: refused.
   */
  private async attachWithoutSession(p: AttachParams, announce: (key: string | null) => store.WorkerAnnouncement): Promise<Attachment> {
    if (p.name !== undefined) {
      throw new ConfigError(
        `worker name "${p.name}" needs a lock held by a session of its own, which transaction pooling cannot give: ` +
          "set directDatabaseUrl (LEASEHOLD_DIRECT_DATABASE_URL, --direct-database-url) to a URL straight to PostgreSQL, or run without a name",
      );
    }
    await store.announceWorker(this.pool, announce(null));
    // Jobs enqueued before the worker started: look now, as after a LISTEN session's start.
    p.wake();
    return {
      detach: async (graceful) => {
        if (graceful) await store.markWorkerStopped(this.pool, p.workerId).catch(() => {});
        await this.endAppPool();
      },
      session: {
        listen: false,
        liveness: false,
        nameLock: false,
        degraded: 'pooling "transaction" without directDatabaseUrl',
      },
    };
  }

  private async endAppPool(): Promise<void> {
    const appPool = this.appPool;
    this.appPool = undefined;
    await appPool?.end();
  }

  claim(p: store.ClaimParams): Promise<store.ClaimedJobs> {
    return store.claimJobs(withQueryTimeout(this.pool, p.leaseMs), p);
  }
  queueSettings(): Promise<store.QueueSettings[]> {
    return store.queueSettings(this.pool);
  }
  rateLimit(p: { workerId: string; jobs: store.RateLimited[]; message?: string }): Promise<Map<string, store.EndState>> {
    return store.rateLimitJobs(withQueryTimeout(this.pool, REPORT_TIMEOUT_MS), p);
  }
  async heartbeat(p: store.HeartbeatParams): Promise<store.BeatResult> {
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
  complete(p: { workerId: string; jobs: store.Completion[] }): Promise<Map<string, "succeeded" | "cancelled">> {
    return store.completeJobs(withQueryTimeout(this.pool, REPORT_TIMEOUT_MS), p);
  }
  fail(p: { workerId: string; failures: store.Failure[] }): Promise<Map<string, store.EndState>> {
    return store.failJobs(withQueryTimeout(this.pool, REPORT_TIMEOUT_MS), p);
  }
  supersede(p: { workerId: string; jobs: store.Supersession[] }): Promise<Map<string, "superseded" | "cancelled">> {
    return store.supersedeJobs(withQueryTimeout(this.pool, REPORT_TIMEOUT_MS), p);
  }
  release(p: { workerId: string; jobs: store.AttemptRef[]; reason: string }): Promise<Map<string, store.EndState>> {
    return store.releaseJobs(this.pool, { ...p, spend: false, backoff: DEFAULT_BACKOFF });
  }
  describeLost(attempts: store.AttemptRef[]): Promise<Map<string, store.LostLease>> {
    return store.describeLostLeases(this.pool, attempts);
  }
  async reconcile(p: { workerName: string; currentWorkerId: string; backoff: store.BackoffPolicy }): Promise<number> {
    return (await store.recoverJobsOfEarlierProcess(this.pool, p)).size;
  }
  recordRefusals(refusals: store.StaleRefusal[]): Promise<void> {
    return store.recordStaleRefusals(this.pool, refusals, "database");
  }
  parents(p: { workerId: string; job: store.AttemptRef }): Promise<store.ParentRecord[]> {
    return store.parentsOf(this.pool, p.job.id);
  }
  dependencies(p: { workerId: string; job: store.AttemptRef }): Promise<store.DependencyCounts> {
    return store.dependencyCounts(this.pool, p.job.id);
  }
  loadSteps(p: { workerId: string; job: store.AttemptRef }): Promise<StepRecord[]> {
    return store.loadSteps(this.pool, p.job.id);
  }
  recordSteps(p: { workerId: string; steps: store.StepOutcome[] }): Promise<Set<string>> {
    return store.recordSteps(withQueryTimeout(this.pool, REPORT_TIMEOUT_MS), p);
  }
  stepFate(p: { workerId: string; id: string; attempt: number; seq: number }): Promise<store.StepFate> {
    return store.stepFate(this.pool, p);
  }
  sleep(p: store.SuspendingStep & ({ until: Date } | { ms: number })): Promise<SuspensionAnswer | "due"> {
    return sleepAnswer(withQueryTimeout(this.pool, REPORT_TIMEOUT_MS), p);
  }
  waitForEvent(p: store.EventWait): Promise<{ received: boolean; data: JsonValue | null } | SuspensionAnswer> {
    return eventWaitAnswer(this.pool, p);
  }
  children(p: ChildrenCall): Promise<{ ends: store.ChildEndRecord[] } | SuspensionAnswer> {
    return childrenAnswer(this.pool, p);
  }
}
