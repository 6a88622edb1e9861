/**
 * The test queue: a Leasehold client on a database of its own, with the helpers a test needs.
 * Made by `createTestQueue()`; `close()` drops the database.
 */
import pg from "pg";
import { CallbackRefusedError } from "../index.js";
import { callbackEvent } from "../jobs/callbacks.js";
import { silentLogger, type Logger } from "../logger.js";
import { newRegistry } from "../metrics.js";
import { Leasehold, type AnyEvent, type EventInput, type JobRecord, type ListedJob, type TaskHandlers } from "../index.js";
import { embeddedServer, type EmbeddedPostgresOptions, type EmbeddedServer } from "../embedded-options.js";
import { DatabaseClock, type TestClock } from "./clock.js";
import { createTestDatabase, dropTestDatabase, ensureTemplate, urlForDatabase } from "./database.js";
import { drain, type DrainOptions, type DrainResult } from "./drain.js";
import { expectEnqueued, waitForJob, waitForMatch, type ExpectEnqueuedOptions, type PayloadMatcher, type WaitForOptions } from "./expect.js";
import { workerHandlers, type TestHandlers } from "./handlers.js";
import { handlerOf, inlineJobOf, resumeOptions, runInline, type InlineHost, type InlineOptions, type InlineResult } from "./inline.js";

export interface TestQueueOptions {
  /**
   * What drain() and runInline() run: task name to handler (or `{ handler, backoff, ... }`), as
   * for `lh.worker`, or to a task made by `defineTask`; or a list of such tasks. A defined task
   * runs behind its schema, as a typed worker runs it.
   */
  handlers?: TestHandlers;
  /**
   * The PostgreSQL server to make test databases on: a URL to any database there (default
   * DATABASE_URL). Its role needs CREATEDB; fake time needs a superuser.
   */
  databaseUrl?: string;
  /**
   * With no URL (and no DATABASE_URL): use Leasehold's embedded PostgreSQL (`true`, or its
   * options). Started if not running, and stopped by `close()` if this queue started it.
   */
  embedded?: boolean | EmbeddedPostgresOptions;
  /** Leasehold's schema in the test database; default "leasehold". */
  schema?: string;
  /** Default: silent. */
  logger?: Logger;
}

export class TestQueue {
  private appPoolInstance?: pg.Pool;
  private closed = false;
  readonly handlers: TaskHandlers;

  private constructor(
    /** A Leasehold client on the test database: hand it to the code under test. */
    readonly lh: Leasehold,
    /** The test database's URL, for the application's own connections and tables. */
    readonly databaseUrl: string,
    readonly databaseName: string,
    /** The queue's clock (the test database's `now()`), which tests may move forward. */
    readonly clock: TestClock,
    /** False when the server role is not a superuser: then `clock.advance` refuses. */
    readonly fakeTime: boolean,
    handlers: TestHandlers,
    private readonly adminUrl: string,
    private readonly embedded: EmbeddedServer | undefined,
  ) {
    this.handlers = workerHandlers(handlers);
  }

  /** @internal use createTestQueue() */
  static async create(options: TestQueueOptions = {}): Promise<TestQueue> {
    const schema = options.schema ?? "leasehold";
    const logger = options.logger ?? silentLogger;
    let adminUrl = options.databaseUrl ?? process.env.DATABASE_URL;
    let embedded: EmbeddedServer | undefined;
    if (!adminUrl) {
      if (!options.embedded) {
        throw new Error(
          "createTestQueue needs a PostgreSQL server: set DATABASE_URL (or pass databaseUrl), " +
            "or pass embedded: true to use Leasehold's embedded PostgreSQL",
        );
      }
      // Loaded only here: a test suite with a DATABASE_URL never loads the embedded server.
      embedded = await embeddedServer(options.embedded);
      adminUrl = await embedded.start();
    }
    let name: string | undefined;
    try {
      const template = await ensureTemplate(adminUrl, schema);
      name = await createTestDatabase(adminUrl, template.name);
      const url = urlForDatabase(adminUrl, name);
      const lh = await Leasehold.connect({ databaseUrl: url, schema, migrate: false, logger, metricsRegistry: newRegistry() });
      const clock = new DatabaseClock(lh.pool, lh, template.clock);
      return new TestQueue(lh, url, name, clock, template.clock, options.handlers ?? {}, adminUrl, embedded);
    } catch (err) {
      if (name) await dropTestDatabase(adminUrl, name).catch(() => {});
      await embedded?.stop();
      throw err;
    }
  }

  /** Adds (or replaces) handlers: a map, or a list of tasks made by `defineTask`, as `createTestQueue` takes. */
  register(handlers: TestHandlers): this {
    Object.assign(this.handlers, workerHandlers(handlers, "register"));
    return this;
  }

  /**
   * Runs every job that is ready, and those that become ready while it runs (jobs the handlers
   * enqueue, retries without backoff), with the registered handlers through a real worker,
   * until none is ready. Jobs not due yet wait unless `advanceClock: true`. Returns every attempt
   * run and how it ended, and the jobs left waiting.
   */
  drain(options?: DrainOptions): Promise<DrainResult> {
    return drain({ lh: this.lh, pool: this.lh.pool, clock: this.clock, handlers: this.handlers }, options);
  }

  /**
   * Waits for a job: by id, until it finishes (succeeded, dead or cancelled; or `state`); by
   * predicate, until some job satisfies it. Something else must run the jobs (a worker the code
   * under test started). Fails with an AssertionError after `timeoutMs` (10 s).
   */
  waitFor(target: string | ((job: JobRecord) => boolean), options?: WaitForOptions): Promise<JobRecord> {
    return typeof target === "function" ? waitForMatch(this.lh, target, options) : waitForJob(this.lh, target, options);
  }

  /**
   * Asserts that a job of `task` was enqueued (any state, unless `state`), with a payload matching
   * `payload` when given; throws an AssertionError that lists what was enqueued otherwise. Returns
   * the matching jobs, oldest first.
   */
  expectEnqueued(task: string, payload?: PayloadMatcher, options?: ExpectEnqueuedOptions): Promise<ListedJob[]> {
    return expectEnqueued(this.lh, task, payload, options);
  }

  /** Runs `task`'s registered handler once, inline, with a real JobContext; no job row, no worker. */
  async runInline<R = unknown>(task: string, payload?: unknown, options?: InlineOptions): Promise<InlineResult<R>> {
    const registration = this.handlers[task];
    if (!registration) {
      const known = Object.keys(this.handlers);
      throw new Error(`runInline: no handler registered for task "${task}"` + (known.length > 0 ? ` (registered: ${known.join(", ")})` : ""));
    }
    return runInline<R>(this.inlineHost(), task, handlerOf(registration), payload, options);
  }

  /**
   * Runs a job that an inline run left failed or suspended again, as a worker's next attempt of
   * it would: the same job id, attempt + 1, its recorded steps replayed (their functions do not
   * run again), the budget a suspension did not spend. A sleep resumes once the queue's clock has
   * reached its end (`queue.clock.advanceTo(result.suspended.until)`); a wait receives an event
   * sent meanwhile (`queue.sendEvent`), or times out once the clock passes its deadline.
   */
  async resumeInline<R = unknown>(previous: InlineResult<unknown>, options?: InlineOptions): Promise<InlineResult<R>> {
    const job = previous === null || typeof previous !== "object" ? undefined : inlineJobOf(previous);
    if (!job) throw new Error("resumeInline takes a result of queue.runInline or queue.resumeInline");
    const next = resumeOptions(previous, await this.clock.now(), options);
    return runInline<R>(this.inlineHost(), job.task, job.handler, job.payload, next, job);
  }

  /**
   * Sends an event to the test database (`lh.sendEvent`): suspended jobs waiting for it wake (a
   * drain then runs them), and inline runs waiting for it receive it when resumed. Takes a name,
   * or an event made by `defineEvent` (its data checked against the schema).
   */
  sendEvent<E extends AnyEvent>(event: E, data: EventInput<E>): Promise<{ id: string }>;
  sendEvent(event: string, data?: unknown): Promise<{ id: string }>;
  sendEvent(event: string | AnyEvent, data?: unknown): Promise<{ id: string }> {
    return this.lh.sendEvent(event as string, data);
  }

  /**
   * Completes a callback (`ctx.callback`) with `data`, as `lh.completeCallback` does: a drained
   * job's callback through the database's checks; an inline run's (recorded in memory, not in
   * the database) by sending its event, which the run receives when resumed.
   */
  async completeCallback(token: string, data?: unknown): Promise<void> {
    try {
      await this.lh.completeCallback(token, data);
    } catch (err) {
      if (!(err instanceof CallbackRefusedError && err.reason === "unknown")) throw err;
      await this.lh.sendEvent(callbackEvent(token), data);
    }
  }

  private inlineHost(): InlineHost {
    const pool = this.lh.pool;
    return {
      identity: async () => {
        const { rows } = await pool.query<{ id: string; fence: string }>(
          "SELECT nextval(pg_get_serial_sequence('jobs', 'id'))::text AS id, nextval('fence_seq')::text AS fence",
        );
        return { jobId: rows[0]!.id, fence: rows[0]!.fence };
      },
      pool,
      appPool: () => (this.appPoolInstance ??= new pg.Pool({ connectionString: this.databaseUrl, max: 4 })),
      logger: this.lh.logger,
    };
  }

  /** Closes the client and drops the test database (ending any session left on it). */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    try {
      await this.appPoolInstance?.end();
      await this.lh.close();
      await dropTestDatabase(this.adminUrl, this.databaseName);
    } finally {
      await this.embedded?.stop();
    }
  }
}

/**
 * A queue on a fresh database of its own, cloned from a migrated template (built once per
 * server and migrations version). One per test file, or per test: it costs a database clone.
 * Close it when done (`after(() => queue.close())`).
 */
export function createTestQueue(options?: TestQueueOptions): Promise<TestQueue> {
  return TestQueue.create(options);
}
