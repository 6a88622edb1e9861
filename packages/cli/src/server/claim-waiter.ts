/**
 * Long polls: a claim that finds nothing waits until a job may be ready for it, the wait
 * ends or the client goes away. Two things wake a waiting claim:
 *   - a NOTIFY on the schema's channel naming one of its queues (one LISTEN connection per
 *     server process serves every waiting claim);
 *   - the shared re-check: once a second, one statement asks which of the waiting claims'
 *     (queue, tasks) pairs has a due job (a delayed job's run_at passing sends no
 *     notification), and only the claims with such a pair are woken.
 * So idle waiting costs one statement per second per server process, not one per claim.
 * At most `maxLongPolls` claims wait at once; beyond that a claim answers at once.
 * The server keeps no job state, so any number of replicas can serve the same database.
 */
import type { Logger } from "leasehold/internal/logger";
import * as store from "leasehold/internal/store/index";
import { Listener } from "leasehold/internal/worker/listener";
import type { ServerMetrics } from "./http-metrics.js";

/** The payload the `queues` table's trigger sends on the workers' channel when flow-control settings change. */
const QUEUE_SETTINGS_CHANGED = "!queues";

/** The shared re-check's period: how late a delayed job may be noticed by a waiting claim. */
export const LONG_POLL_RECHECK_MS = 1_000;

export type WaitResult = "woken" | "timeout" | "aborted" | "closed";

interface Waiter {
  queues: Set<string>;
  /** Keys of this claim's (queue, tasks) pairs for the re-check. */
  pairs: string[];
  wake: () => void;
}

interface Options {
  pool: store.Queryable;
  /**
   * Where the LISTEN session connects. Undefined (transaction pooling without a direct URL):
   * no LISTEN; waiting claims are woken by the shared re-check alone (within a second), and
   * remote workers hear cancels at their next heartbeat.
   */
  connectionString: string | undefined;
  channel: string;
  /** More channels heard on the same LISTEN session (the cancel notices for remote workers' cancel polls). */
  also?: Record<string, (payload: string | undefined) => void>;
  maxLongPolls: number;
  metrics: ServerMetrics;
  logger: Logger;
}

export class ClaimWaiter {
  private readonly waiters = new Set<Waiter>();
  /** Pair key → the pair, for the waiting claims. */
  private readonly pairs = new Map<string, store.QueueTasks>();
  private admitted = 0;
  private listener?: Listener;
  private starting?: Promise<void>;
  private recheckTimer?: NodeJS.Timeout;
  /** Set when the server stops: long polls answer at once with what they have. */
  closed = false;

  constructor(private readonly options: Options) {}

  /** Resolves once the server's LISTEN session is up (started on first use). */
  listen(): Promise<void> {
    return this.ensureListening();
  }

  /**
   * Takes a long-poll slot for one claim request (or cancel poll); false at the cap (counted), when the
   * claim should answer with what it found instead of waiting. Pair with leave().
   */
  enter(): boolean {
    if (this.admitted >= this.options.maxLongPolls) {
      this.options.metrics.longPollsRefused.inc();
      return false;
    }
    this.admitted++;
    this.options.metrics.longPollsWaiting.inc();
    return true;
  }

  leave(): void {
    this.admitted--;
    this.options.metrics.longPollsWaiting.dec();
  }

  /** Resolves after `ms`, when a job may be ready for this claim, or when `signal` aborts. */
  async wait(want: { queues: string[]; tasks: string[] }, ms: number, signal: AbortSignal): Promise<WaitResult> {
    await this.ensureListening();
    if (signal.aborted) return "aborted";
    if (this.closed) return "closed";
    if (ms <= 0) return "timeout";
    const tasks = [...new Set(want.tasks)].sort();
    const pairs = want.queues.map((queue) => {
      const key = `${queue}\n${tasks.join(",")}`;
      if (!this.pairs.has(key)) this.pairs.set(key, { queue, tasks });
      return key;
    });
    const result = await new Promise<WaitResult>((resolve) => {
      const waiter: Waiter = { queues: new Set(want.queues), pairs, wake: () => done("woken") };
      const timer = setTimeout(() => done("timeout"), ms);
      const onAbort = () => done("aborted");
      const done = (why: WaitResult) => {
        clearTimeout(timer);
        signal.removeEventListener("abort", onAbort);
        this.waiters.delete(waiter);
        resolve(this.closed ? "closed" : why);
      };
      signal.addEventListener("abort", onAbort);
      this.waiters.add(waiter);
      this.scheduleRecheck();
    });
    if (this.waiters.size === 0) this.pairs.clear();
    return result;
  }

  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.recheckTimer);
    for (const w of [...this.waiters]) w.wake();
    await this.listener?.stop();
  }

  private scheduleRecheck(): void {
    if (this.recheckTimer || this.closed) return;
    this.recheckTimer = setTimeout(() => {
      void this.recheck().finally(() => {
        this.recheckTimer = undefined;
        if (this.waiters.size > 0) this.scheduleRecheck();
      });
    }, LONG_POLL_RECHECK_MS);
    this.recheckTimer.unref();
  }

  /** One statement for every waiting claim: wake those with a due job in one of their pairs. */
  private async recheck(): Promise<void> {
    if (this.waiters.size === 0) return;
    const live = new Set([...this.waiters].flatMap((w) => w.pairs));
    for (const key of this.pairs.keys()) if (!live.has(key)) this.pairs.delete(key);
    const keys = [...this.pairs.keys()];
    let ready: Set<string>;
    try {
      ready = new Set(
        (
          await store.readyPairs(
            this.options.pool,
            keys.map((k) => this.pairs.get(k)!),
          )
        ).map((i) => keys[i]!),
      );
    } catch (err) {
      // The waiting claims answer at their deadline; their clients poll again.
      this.options.logger.warn({ err: String(err) }, "long-poll re-check failed");
      return;
    }
    for (const w of [...this.waiters]) if (w.pairs.some((k) => ready.has(k))) w.wake();
  }

  private ensureListening(): Promise<void> {
    const connectionString = this.options.connectionString;
    if (connectionString === undefined) return Promise.resolve();
    this.starting ??= (async () => {
      this.listener = new Listener({
        connectionString,
        channel: this.options.channel,
        applicationName: "leasehold-serve-listen",
        also: this.options.also,
        onNotify: (queue) => {
          // QUEUE_SETTINGS_CHANGED: a queue was resumed or its limits changed; any waiting claim may now find jobs.
          for (const w of [...this.waiters]) if (queue === undefined || queue === QUEUE_SETTINGS_CHANGED || w.queues.has(queue)) w.wake();
        },
      });
      await this.listener.start();
    })();
    return this.starting;
  }
}
