/**
 * `lh.waitFor(id)`: waiting for jobs to finish, woken by the database, not by polling.
 *
 * One LISTEN session per client, on "leasehold:<schema>:ended", made on the first wait and
 * shared by every waiter of the client: a thousand waiters cost one connection and no query
 * until something happens. A waiter marks its job `watched` (its end then sends the job's id
 * on that channel, migration 014) and only then reads the job, so an end before the mark is
 * seen by the read and an end after it by the notification. Notifications sent while the
 * session was down are lost: after every reconnect every waiter's job is read again.
 *
 * Without a session URL (transaction pooling without a direct URL: LISTEN through the pooler
 * would hear nothing) the waited-for jobs are read again every WAIT_POLL_MS instead, in one
 * statement for all of them.
 */
import type pg from "pg";
import { LeaseholdError, ValidationError, WaitTimeoutError } from "./errors.js";
import { checkJobId } from "./jobs/ids.js";
import { missingJobError } from "./jobs/missing.js";
import type { JobRecord } from "./jobs/types.js";
import type { Logger } from "./logger.js";
import * as store from "./store/index.js";
import { Listener } from "./worker/listener.js";

export interface WaitOptions {
  /** Give up after this many ms with a WaitTimeoutError (default: wait as long as it takes). */
  timeoutMs?: number;
  /** Aborting it rejects the wait with the signal's reason. */
  signal?: AbortSignal;
}

/** A job in these states has not finished: a suspended one (asleep, waiting for an event) resumes later. */
const UNFINISHED = new Set<string>(["waiting", "running", "blocked", "suspended"]);

/** The longest timeout a timer can keep (about 24.8 days). */
const MAX_TIMEOUT_MS = 2_147_483_647;
/** A re-check that failed (the database just came back) is tried again after this. */
const RECHECK_RETRY_MS = 1_000;
/** Without a LISTEN session, how often the waited-for jobs are read. */
export const WAIT_POLL_MS = 1_000;

interface Waiter {
  id: string;
  resolve: (job: JobRecord) => void;
  reject: (err: unknown) => void;
}

export class JobWaiters {
  private readonly waiters = new Map<string, Set<Waiter>>();
  private listener?: Listener;
  private listening?: Promise<void>;
  private recheckTimer?: NodeJS.Timeout;
  private pollTimer?: NodeJS.Timeout;
  private closed = false;

  constructor(
    private readonly pool: pg.Pool,
    /** Where the LISTEN session connects; undefined: none, poll. */
    private readonly connectionString: string | undefined,
    private readonly schema: string,
    private readonly logger: Logger,
  ) {}

  /** The notification channel of finished watched jobs. */
  get channel(): string {
    return `${store.notifyChannel(this.schema)}:ended`;
  }

  async waitFor(id: string, options: WaitOptions = {}): Promise<JobRecord> {
    checkJobId(id);
    const { timeoutMs, signal } = options ?? {};
    if (timeoutMs !== undefined && (typeof timeoutMs !== "number" || !Number.isInteger(timeoutMs) || timeoutMs < 0 || timeoutMs > MAX_TIMEOUT_MS)) {
      throw new ValidationError(`timeoutMs must be an integer from 0 to ${MAX_TIMEOUT_MS} (got ${JSON.stringify(timeoutMs)})`);
    }
    if (signal !== undefined && !(signal instanceof AbortSignal)) throw new ValidationError("signal must be an AbortSignal");
    if (this.closed) throw new LeaseholdError("client_closed", "the Leasehold client is closed");
    signal?.throwIfAborted();

    let timer: NodeJS.Timeout | undefined;
    let onAbort: (() => void) | undefined;
    const waiter = { id } as Waiter;
    const done = new Promise<JobRecord>((resolve, reject) => {
      waiter.resolve = resolve;
      waiter.reject = reject;
    }).finally(() => {
      clearTimeout(timer);
      if (onAbort) signal!.removeEventListener("abort", onAbort);
      this.remove(waiter);
    });
    let set = this.waiters.get(id);
    if (!set) this.waiters.set(id, (set = new Set()));
    set.add(waiter);
    if (timeoutMs !== undefined) timer = setTimeout(() => waiter.reject(new WaitTimeoutError(id, timeoutMs)), timeoutMs);
    if (signal) {
      onAbort = () => waiter.reject(signal.reason);
      signal.addEventListener("abort", onAbort, { once: true });
    }
    // Listening first: a notification after the mark must find the session there.
    this.start()
      .then(() => store.watchJob(this.pool, id))
      .then(() => this.check(id))
      .catch((err: unknown) => waiter.reject(err));
    return done;
  }

  /** Reads a job and settles its waiters if it has finished; a missing job is refused, not awaited. */
  private async check(id: string): Promise<void> {
    if (!this.waiters.has(id)) return;
    const job = await store.getJob(this.pool, id);
    const set = this.waiters.get(id);
    if (!set) return;
    if (!job) {
      // Never waited for: an unknown id, or a job that ended before the waiter marked it and
      // kept no record (its queue keeps none of succeeded jobs, or retention forgot it). Not
      // only on the first read: a job gone at a later read has ended too.
      const error = await missingJobError(this.pool, id);
      for (const w of set) w.reject(error);
      return;
    }
    if (UNFINISHED.has(job.state)) return;
    for (const w of set) w.resolve(job);
  }

  /** After a reconnect: every waiter's job, read again (in one query), settled if it finished meanwhile. */
  private async recheckAll(): Promise<void> {
    clearTimeout(this.recheckTimer);
    const ids = [...this.waiters.keys()];
    if (ids.length === 0) return;
    try {
      const unfinished = await store.unfinishedOf(this.pool, ids);
      await Promise.all(ids.filter((id) => !unfinished.has(id)).map((id) => this.check(id)));
    } catch (err) {
      this.logger.warn({ err: String(err), waiters: ids.length }, "could not re-check waited-for jobs; trying again");
      this.recheckTimer = setTimeout(() => void this.recheckAll(), RECHECK_RETRY_MS);
      this.recheckTimer.unref();
    }
  }

  private start(): Promise<void> {
    if (this.listening) return this.listening;
    if (this.connectionString === undefined) {
      this.pollTimer = setInterval(() => void this.recheckAll(), WAIT_POLL_MS);
      return (this.listening = Promise.resolve());
    }
    const listener = new Listener({
      connectionString: this.connectionString,
      channel: this.channel,
      applicationName: "leasehold-wait",
      onNotify: (id) => {
        if (id === undefined) void this.recheckAll();
        else if (this.waiters.has(id)) this.check(id).catch((err: unknown) => this.checkFailed(err));
      },
      onState: (state, err) => {
        if (state === "down") this.logger.warn({ err: String(err) }, "lost the session that waits for jobs; reconnecting");
      },
    });
    this.listener = listener;
    this.listening = listener.start().catch((err: unknown) => {
      // A first session that could not be had: the next wait tries again.
      this.listener = undefined;
      this.listening = undefined;
      throw err;
    });
    return this.listening;
  }

  private checkFailed(err: unknown): void {
    this.logger.warn({ err: String(err) }, "could not read a waited-for job; re-checking shortly");
    clearTimeout(this.recheckTimer);
    this.recheckTimer = setTimeout(() => void this.recheckAll(), RECHECK_RETRY_MS);
    this.recheckTimer.unref();
  }

  private remove(w: Waiter): void {
    const set = this.waiters.get(w.id);
    if (!set) return;
    set.delete(w);
    if (set.size === 0) this.waiters.delete(w.id);
    // Polling stops with the last wait (a timer would keep the process alive), and starts again with the next.
    if (this.waiters.size === 0 && this.pollTimer) {
      clearInterval(this.pollTimer);
      this.pollTimer = undefined;
      this.listening = undefined;
    }
  }

  /** Ends the session; waits still open are rejected. */
  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.recheckTimer);
    clearInterval(this.pollTimer);
    for (const set of [...this.waiters.values()]) {
      for (const w of set) w.reject(new LeaseholdError("client_closed", `the Leasehold client was closed while waiting for job ${w.id}`));
    }
    await this.listener?.stop();
  }
}
