/**
 * The library's front door: connect to a database, enqueue, inspect and operate on jobs, and
 * create workers and maintenance services that share the connection pool.
 *
 * A library inside someone's web app must not start servers or create system users on its
 * own: `connect()` needs a URL (or DATABASE_URL). The embedded PostgreSQL is started only when
 * asked for (`embedded: true`), and loaded only then: the zero-setup path is the CLI's.
 */
import type pg from "pg";
import { silentLogger, type Logger } from "./logger.js";
import type { MetricsRegistry } from "./metric-shapes.js";
import { embeddedServer, type EmbeddedPostgresOptions, type EmbeddedServer } from "./embedded-options.js";
import { ConfigError, JobStateError, UnknownQueueError, ValidationError } from "./errors.js";
import type { AttemptRecord, EnqueueOptions, EnqueuedJob, EnqueueWarning, JobRecord, ListedJob, NewJob } from "./jobs/types.js";
import { JOB_STATES } from "./jobs/types.js";
import { checkJobId } from "./jobs/ids.js";
import { checkBatchKeyScopes, checkName, closestName, integerIn, normalizeJob } from "./jobs/validate.js";
import { missingJobError } from "./jobs/missing.js";
import { normalizeQueueHistory, normalizeQueueLimits } from "./jobs/flow-limits.js";
import { attachWarnings, KnownTasks, unknownTasksMode, type UnknownTasksMode } from "./jobs/known-tasks.js";
import { handlerGaps, type HandlerGap } from "./maintenance/handler-gaps.js";
import { metricsFor, type Metrics } from "./metrics.js";
import * as store from "./store/index.js";
import { eventToSend, type AnyEvent, type EventInput } from "./tasks/events.js";
import type { Queryable } from "./store/db.js";
import { Watchdog, type WatchdogOptions } from "./maintenance/watchdog.js";
import { Retention, type RetentionOptions } from "./maintenance/retention.js";
import { Scheduler, type SchedulerOptions } from "./maintenance/scheduler.js";
import type { MaintenanceService } from "./maintenance/service.js";
import { nextTick, normalizeSchedule, type ScheduleDefinition } from "./jobs/schedule.js";
import { DatabaseTransport } from "./worker/transport.js";
import { Worker, type WorkerOptions } from "./worker/worker.js";
import type { DispatchFactory, NatsOptions, NatsPlugin, NatsPublisher } from "./worker/dispatch.js";
import { loadOptional } from "./optional.js";
import { TypedLeasehold } from "./tasks/client.js";
import { checkBatchShape, checkFlowShape, prepareBatch, prepareFlow, type BatchInput, type FlowNode, type PreparedNode } from "./jobs/flow-graph.js";
import type { AnyTask } from "./tasks/define.js";
import { checkHooks, composeHooks, type ComposedHooks, type LeaseholdHooks } from "./hooks.js";
import type { TracingOptions } from "./otel/options.js";
import { JobWaiters, type WaitOptions } from "./waiters.js";
import { checkConnectRetry, checkDatabaseUrl, reachingDatabase, type ConnectRetryOptions } from "./connecting.js";
import { allOrNothing, checkCallerClient } from "./caller-client.js";
import { loadTracing } from "./otel/load.js";
import type { JobRelations } from "./store/admin.js";
import { completeCallback, rerunFromStep, type Rerun, type RerunOptions } from "./durable-admin.js";
import { getJobSteps, type JobSteps } from "./store/step-views.js";

export interface LeaseholdOptions {
  /** A PostgreSQL URL; defaults to DATABASE_URL. One of the two, or `embedded`, is required. */
  databaseUrl?: string;
  /** Schema for Leasehold's tables; default LEASEHOLD_SCHEMA or "leasehold". */
  schema?: string;
  /**
   * How `databaseUrl` reaches PostgreSQL: "session" (default: directly, or through a pooler in
   * session mode) or "transaction" (a pooler in transaction mode, e.g. PgBouncer's
   * `pool_mode = transaction`): then no session state is kept on its connections, the pooler
   * must set search_path (checked at connect), and what needs a session uses
   * `directDatabaseUrl` (docs/deployment.md#pgbouncer-and-other-connection-poolers). Default
   * LEASEHOLD_POOLING, else "session".
   */
  pooling?: "session" | "transaction";
  /**
   * A URL straight to PostgreSQL (or a session-mode pool), for the sessions that need one:
   * each worker's LISTEN, liveness lock and name lock, and `waitFor`'s LISTEN. Everything else
   * (claims, heartbeats, reports, enqueues, migrations) goes through `databaseUrl`. Default
   * LEASEHOLD_DIRECT_DATABASE_URL. Without it in transaction pooling, workers poll, crashed
   * workers' jobs are recovered by lease expiry, and stable worker names are refused.
   */
  directDatabaseUrl?: string;
  /**
   * With no database URL, start a local PostgreSQL for development (`true`, or its options);
   * `close()` stops it. If another process (`leasehold dev`, `serve`, another app) already
   * runs it on the same data directory, that server is used and left running. Never implied:
   * without a URL and without this, `connect()` fails.
   */
  embedded?: boolean | EmbeddedPostgresOptions;
  /**
   * Apply pending migrations on connect; default true. Either way connect refuses a schema this
   * release cannot run against (SchemaVersionError): with `false`, one lacking migrations it
   * needs; always, one a newer release migrated incompatibly (docs/upgrading.md).
   */
  migrate?: boolean;
  /**
   * Wait for a database that cannot be reached yet (refused, reset, starting up) for up to
   * `timeoutMs`, trying again with growing pauses; each wait is logged (`warn`) and passed to
   * `onRetry`. Without it, connect fails at once. Either way it fails with
   * DatabaseUnavailableError, naming the host and port. A wrong password, a missing database
   * or a host that does not resolve is never waited for.
   */
  connectRetry?: ConnectRetryOptions;
  poolSize?: number;
  logger?: Logger;
  metricsRegistry?: MetricsRegistry;
  /**
   * NATS JetStream dispatch (docs/nats.md): a server URL, or its options. Enqueue then
   * publishes each new job's id after its commit, and workers take jobs from JetStream
   * (falling back to polling while NATS is unavailable). The NATS client is loaded only then.
   */
  nats?: string | NatsOptions;
  /**
   * Hooks for this client's enqueues and the workers it makes (docs/tracing.md#hooks); more
   * can be added with `use()`.
   */
  hooks?: LeaseholdHooks | LeaseholdHooks[];
  /**
   * OpenTelemetry tracing (docs/tracing.md): spans for enqueues, attempts, claims and reports,
   * through the global tracer provider. Needs the optional peer `@opentelemetry/api`, which
   * is loaded only then.
   */
  tracing?: boolean | TracingOptions;
  /**
   * Enqueue (and `schedule`) of a task that no worker seen in the last 24 h handles in that
   * queue: "warn" (default: the returned job carries `warnings`; nothing is logged), "refuse"
   * (NoWorkerForTaskError, nothing enqueued) or "allow" (not checked). Default
   * LEASEHOLD_UNKNOWN_TASKS, else "warn".
   */
  unknownTasks?: UnknownTasksMode;
}

export interface ListJobsOptions {
  state?: string;
  queue?: string;
  task?: string;
  /** Only jobs whose time (`timeField`) is at or after this moment. */
  from?: Date;
  /** Only jobs whose time (`timeField`) is before this moment. */
  to?: Date;
  /** Which time `from` and `to` bound: "created" (default) or "finished" (unfinished jobs never match). */
  timeField?: "created" | "finished";
  /** 1 to 10,000; default 50. */
  limit?: number;
  /** Only jobs older than this id (the last id of the previous page). */
  before?: string;
  /** Default true; false leaves payloads out. */
  includePayload?: boolean;
}

export type Stats = store.QueueStats & {
  /** Waiting jobs whose task, in their queue, no live worker runs (at most 100 queue/task pairs). */
  withoutHandler: HandlerGap[];
};

/** connect() waits this long for NATS, then goes on without it (it keeps connecting). */
const NATS_CONNECT_WAIT_MS = 1_000;

/** Jobs per INSERT when enqueueing many; a larger batch is written in one transaction. */
export const ENQUEUE_CHUNK = 5_000;

/** Where enqueue runs: your own `pg` client (a Client or PoolClient), inside your transaction. */
export interface EnqueueTarget {
  /**
   * Enqueue on this client, in its current transaction: the job exists if and only if the
   * transaction commits, and workers are woken at commit. Its search_path need not include
   * Leasehold's schema.
   */
  db?: Queryable;
}

export class Leasehold {
  private readonly hookSets: LeaseholdHooks[] = [];
  private hooks: ComposedHooks = {};

  private constructor(
    readonly pool: pg.Pool,
    readonly databaseUrl: string,
    /**
     * Where sessions that need session state connect (LISTEN, the liveness and name locks):
     * the direct URL if given, else `databaseUrl` in session pooling; undefined in transaction
     * pooling without a direct URL (no such sessions: polling, recovery by lease expiry).
     */
    readonly sessionUrl: string | undefined,
    readonly pooling: store.PoolingMode,
    readonly schema: string,
    readonly logger: Logger,
    readonly metrics: Metrics,
    private readonly embedded?: EmbeddedServer,
    /** The NATS connection, when NATS dispatch is configured. */
    readonly nats?: NatsPublisher,
    private readonly natsPlugin?: NatsPlugin,
    unknownTasks: UnknownTasksMode = "warn",
  ) {
    this.knownTasks = new KnownTasks(pool, unknownTasks);
  }

  /** Which tasks some worker runs, for enqueue's check (the `unknownTasks` option). */
  private readonly knownTasks: KnownTasks;

  static async connect(options: LeaseholdOptions = {}): Promise<Leasehold> {
    const logger = options.logger ?? silentLogger;
    const schema = store.assertSchemaName(options.schema ?? process.env.LEASEHOLD_SCHEMA ?? store.DEFAULT_SCHEMA);
    const unknownTasks = unknownTasksMode(
      options.unknownTasks ?? process.env.LEASEHOLD_UNKNOWN_TASKS,
      options.unknownTasks === undefined ? "LEASEHOLD_UNKNOWN_TASKS" : "unknownTasks",
    );
    const pooling = store.resolvePooling(options.pooling);
    const directUrl = options.directDatabaseUrl ?? (process.env.LEASEHOLD_DIRECT_DATABASE_URL || undefined);
    if (directUrl !== undefined) checkDatabaseUrl(directUrl, "directDatabaseUrl");
    let url = options.databaseUrl ?? process.env.DATABASE_URL;
    let embedded: EmbeddedServer | undefined;
    if (url) {
      checkDatabaseUrl(url);
    } else if (options.embedded) {
      embedded = await embeddedServer(options.embedded);
      url = await embedded.start();
      const { owner } = embedded;
      if (owner) {
        logger.info({ dataDir: embedded.dataDir, port: new URL(url).port, owner }, "using the embedded PostgreSQL another process runs");
      } else {
        logger.info({ dataDir: embedded.dataDir, port: new URL(url).port }, "started embedded PostgreSQL");
      }
    } else {
      throw new ConfigError(
        "Leasehold.connect needs a database: pass databaseUrl or set DATABASE_URL " +
          "(or pass embedded: true to start a local PostgreSQL for development)",
      );
    }
    let natsOptions: unknown;
    let natsPlugin: NatsPlugin | undefined;
    try {
      if (options.nats !== undefined) {
        natsPlugin = (await loadOptional<{ default: NatsPlugin }>("@leasehold/nats", "the nats option")).default;
        natsOptions = natsPlugin.resolveNatsOptions(options.nats, schema);
      }
    } catch (err) {
      await embedded?.stop();
      throw err;
    }
    let connectRetry: ConnectRetryOptions | undefined;
    try {
      connectRetry = checkConnectRetry(options.connectRetry);
    } catch (err) {
      await embedded?.stop();
      throw err;
    }
    const pool = store.createPool({ connectionString: url, schema, max: options.poolSize, pooling });
    try {
      // The first statement connects: a database that cannot be reached fails here, by name
      // (or is waited for, with connectRetry). Migrations run in one transaction (with a
      // transaction-scoped lock): through a transaction pooler too. The checks after it are
      // waited for the same way: a server restarting between two of them (its connections
      // ended, 57P01) is a database coming up again, not a refusal.
      const { applied, ahead } = await reachingDatabase(url, connectRetry, logger, async () => {
        const applied = options.migrate === false ? (await pool.query("SELECT 1"), []) : await store.migrate(pool, schema);
        if (pooling === "transaction") await store.checkPooledSchema(pool, schema);
        // Refuses a schema this code cannot run against; one ahead of it is a rolling upgrade (docs/upgrading.md).
        return { applied, ahead: (await store.checkSchemaVersion(pool, schema)).ahead };
      });
      if (applied.length > 0) logger.info({ schema, migrations: applied }, "applied migrations");
      if (ahead.length > 0) {
        logger.info(
          { schema, migrations: ahead.map((m) => m.name) },
          "the schema has migrations of a newer release of Leasehold, all compatible with this one: running beside it",
        );
      }
    } catch (err) {
      await pool.end().catch(() => {});
      await embedded?.stop();
      throw store.explainStartupRefusal(err, "databaseUrl");
    }
    const sessionUrl = directUrl ?? (pooling === "session" ? url : undefined);
    const metrics = metricsFor(options.metricsRegistry);
    let nats: NatsPublisher | undefined;
    if (natsPlugin) {
      // Loaded only here: the library without NATS never loads its client. The connection
      // comes up in the background; NATS being down fails nothing.
      nats = natsPlugin.connect(natsOptions, { logger, metrics, name: `leasehold:${schema}` });
      // A moment for the connection, so the first enqueue publishes (not waiting on a NATS that is down).
      await nats.waitConnected(NATS_CONNECT_WAIT_MS);
    }
    const lh = new Leasehold(pool, url, sessionUrl, pooling, schema, logger, metrics, embedded, nats, natsPlugin, unknownTasks);
    try {
      // Tracing first: its middlewares are the outermost, so the user's run inside its spans.
      if (options.tracing) lh.use(await loadTracing(options.tracing));
      const hooks = options.hooks === undefined ? [] : Array.isArray(options.hooks) ? options.hooks : [options.hooks];
      for (const h of hooks) lh.use(h);
    } catch (err) {
      await lh.close();
      throw err;
    }
    return lh;
  }

  /**
   * Registers hooks (docs/tracing.md#hooks): for this client's enqueues from now on, and for
   * the workers it makes from now on. Later sets run inside earlier ones.
   */
  use(hooks: LeaseholdHooks): this {
    try {
      this.hookSets.push(checkHooks(hooks));
    } catch (err) {
      throw new ConfigError((err as Error).message);
    }
    this.hooks = composeHooks(this.hookSets, (hook, err) => this.logger.warn({ hook, err: String(err) }, "a hook threw; ignored"));
    return this;
  }

  async enqueue(task: string, payload?: unknown, options: EnqueueOptions & EnqueueTarget = {}): Promise<EnqueuedJob> {
    const { db, ...jobOptions } = options ?? {};
    const [job] = await this.enqueueMany([{ ...jobOptions, task, payload }], { db });
    return job!;
  }

  /**
   * Validates every job first (a bad one fails the batch, naming its index), then inserts,
   * all or nothing. With `db`, on your client inside your transaction.
   */
  async enqueueMany(jobs: NewJob[], target: EnqueueTarget = {}): Promise<EnqueuedJob[]> {
    if (!Array.isArray(jobs)) throw new ValidationError("enqueueMany takes an array of jobs");
    return this.withEnqueueHooks(jobs, target, (copies) => this.writeJobs(copies, target));
  }

  /**
   * Runs the enqueue hooks (beforeEnqueue, aroundEnqueue: headers, tracing) around a write of
   * `jobs`, of one enqueue call, a graph's nodes or a batch's jobs alike. Hooks may change the
   * jobs: they get copies, never the caller's objects.
   */
  private async withEnqueueHooks<J extends NewJob>(
    jobs: J[],
    target: EnqueueTarget,
    write: (jobs: J[]) => Promise<EnqueuedJob[]>,
  ): Promise<EnqueuedJob[]> {
    const { beforeEnqueue, aroundEnqueue } = this.hooks;
    if (!beforeEnqueue && !aroundEnqueue) return write(jobs);
    const copies = jobs.map((j) => (j !== null && typeof j === "object" ? { ...j, ...(j.headers && { headers: { ...j.headers } }) } : j));
    const info = target?.db !== undefined ? { db: target.db } : {};
    if (beforeEnqueue) await beforeEnqueue(copies, info);
    return aroundEnqueue ? aroundEnqueue(copies, info, () => write(copies)) : write(copies);
  }

  private async writeJobs(jobs: NewJob[], target: EnqueueTarget): Promise<EnqueuedJob[]> {
    const normalized = jobs.map((j, i) => normalizeJob(j, `job ${i}`));
    checkBatchKeyScopes(normalized, (i) => `job ${i}`);
    // Refusing must come first; a warning can be worked out while the jobs are written.
    const checking = this.knownTasks.check(normalized, (i) => `job ${i}`);
    if (this.knownTasks.mode === "refuse") await checking;
    // Replacing on a duplicate key frees a running job's key and enqueues its successor in
    // several statements: one transaction, always.
    const replacing = store.hasReplaceModes(normalized);
    // A batch with unique keys may be refused after its insert (a key held outside a job's
    // uniqueScope): one transaction, so the refusal writes nothing.
    const atomic = replacing || (normalized.length > 1 && normalized.some((j) => j.uniqueKey !== null));
    const insertAll = async (db: Queryable, schema?: string) => {
      const out: EnqueuedJob[] = [];
      for (let i = 0; i < normalized.length; i += ENQUEUE_CHUNK) {
        out.push(...(await store.enqueueJobs(db, normalized.slice(i, i + ENQUEUE_CHUNK), schema)));
      }
      return out;
    };
    let enqueued: EnqueuedJob[];
    if (target.db !== undefined) {
      checkCallerClient(target.db);
      enqueued =
        normalized.length <= ENQUEUE_CHUNK && !atomic
          ? await insertAll(target.db, this.schema)
          : await allOrNothing(target.db, () => insertAll(target.db!, this.schema));
    } else if (this.nats) {
      // NATS dispatch: the doorbells of new jobs due now are published right after the
      // commit; the outbox keeps them owed (for PUBLISH_GRACE_MS) in case that publish fails.
      const publishing = this.nats.connected ? this.natsPlugin!.PUBLISH_GRACE_MS : undefined;
      const insertPublishing = async (db: Queryable) => {
        const out: store.InsertedJob[] = [];
        for (let i = 0; i < normalized.length; i += ENQUEUE_CHUNK) {
          out.push(...(await store.enqueueJobs(db, normalized.slice(i, i + ENQUEUE_CHUNK), undefined, publishing)));
        }
        return out;
      };
      const inserted =
        normalized.length <= ENQUEUE_CHUNK && !atomic ? await insertPublishing(this.pool) : await store.withTransaction(this.pool, insertPublishing);
      if (publishing !== undefined) await this.publishNew(normalized, inserted);
      enqueued = inserted.map(({ due: _due, ...job }) => job);
    } else if (normalized.length <= ENQUEUE_CHUNK && !atomic) {
      enqueued = await store.enqueueJobs(this.pool, normalized);
    } else {
      enqueued = await store.withTransaction(this.pool, (client) => insertAll(client));
    }
    this.countEnqueued(normalized);
    return attachWarnings(enqueued, normalized, await checking);
  }

  /**
   * Enqueues a graph of jobs in one transaction (docs/flows.md#dependencies): each node waits
   * ('blocked', which no claim takes) until every parent in `dependsOn` has succeeded, and is
   * released in the transaction of its last parent's success. Refused whole, nothing written,
   * for a cycle, an unknown or duplicate ref, a finished or unknown parent id, a graph over
   * 25,000 nodes or 100,000 edges, or any node an enqueue would refuse. Returns ref → job id.
   * With `db`, on your client inside your transaction.
   */
  async enqueueFlow(nodes: FlowNode[], target: EnqueueTarget = {}): Promise<{ jobs: Record<string, string> }> {
    checkFlowShape(nodes);
    let prepared: PreparedNode[] = [];
    const enqueued = await this.withEnqueueHooks(nodes, target, async (copies) => {
      prepared = prepareFlow(copies);
      return (await this.writeFlow(prepared, target)).map((id) => ({ id, created: true }));
    });
    return { jobs: Object.fromEntries(prepared.map((n, i) => [n.ref, enqueued[i]!.id])) };
  }

  /**
   * Enqueues a batch (docs/flows.md#batches): its jobs, and `onComplete`, a job released once
   * every member has ended (succeeded, dead or cancelled); it reads the counts with
   * `ctx.dependencies()` and the members with `ctx.parents()`. One transaction.
   */
  async enqueueBatch(batch: BatchInput, target: EnqueueTarget = {}): Promise<{ callbackId: string; jobIds: string[] }> {
    // The hooks see the members and then the callback, as one enqueue's jobs.
    checkBatchShape(batch);
    const enqueued = await this.withEnqueueHooks([...batch.jobs, batch.onComplete as NewJob], target, async (copies) => {
      const prepared = prepareBatch({ jobs: copies.slice(0, -1), onComplete: copies[copies.length - 1]! });
      return (await this.writeFlow(prepared, target)).map((id) => ({ id, created: true }));
    });
    const ids = enqueued.map((j) => j.id);
    return { callbackId: ids[ids.length - 1]!, jobIds: ids.slice(0, -1) };
  }

  private async writeFlow(nodes: PreparedNode[], target: EnqueueTarget): Promise<string[]> {
    const jobs = nodes.map((n) => n.job);
    if (this.knownTasks.mode === "refuse") await this.knownTasks.check(jobs, (i) => `node ${JSON.stringify(nodes[i]!.ref)}`);
    let ids: string[];
    if (target.db !== undefined) {
      checkCallerClient(target.db);
      ids = await allOrNothing(target.db, () => store.insertFlow(target.db!, nodes, this.schema));
    } else {
      ids = await store.withTransaction(this.pool, (client) => store.insertFlow(client, nodes));
    }
    this.countEnqueued(jobs);
    return ids;
  }

  /**
   * Publishes the doorbells of jobs just enqueued and due, then marks them published. Never
   * throws: a publish that fails leaves them owed, and the workers' dispatchers publish them.
   */
  private async publishNew(jobs: { queue: string; task: string }[], inserted: store.InsertedJob[]): Promise<void> {
    const doorbells: store.Doorbell[] = [];
    inserted.forEach((j, i) => {
      if (j.created && j.due) doorbells.push({ id: j.id, attempt: 0, queue: jobs[i]!.queue, task: jobs[i]!.task, recovery: false });
    });
    if (doorbells.length === 0) return;
    try {
      await this.nats!.publish(doorbells);
      await store.deletePublishedDoorbells(
        this.pool,
        doorbells.map((d) => d.id),
      );
    } catch (err) {
      this.logger.debug({ err: String(err), jobs: doorbells.length }, "publishing new jobs to NATS failed; they stay owed");
    }
  }

  /** One counter increment per queue per batch: a label lookup per job would cost ~1 µs each. */
  private countEnqueued(jobs: { queue: string }[]): void {
    const perQueue = new Map<string, number>();
    for (const j of jobs) perQueue.set(j.queue, (perQueue.get(j.queue) ?? 0) + 1);
    for (const [queue, n] of perQueue) this.metrics.jobsEnqueued.inc({ queue: this.metrics.queueLabel(queue) }, n);
  }

  /**
   * A job's record (with its result once it succeeded), its attempts, and its place in a flow:
   * its parents and children with their states (see store.getJobRelations); its latest durable
   * steps and, while suspended, what it waits for (store/step-views.ts).
   */
  async getJob(id: string): Promise<{ job: JobRecord; attempts: AttemptRecord[] } & JobRelations & { reruns: store.JobRerun[] } & JobSteps> {
    checkJobId(id);
    // One snapshot: read apart, a completion committing between the reads would show a
    // finished job without its final attempt, or a running one with it.
    const [job, attempts, relations, reruns, steps] = await store.withSnapshot(
      this.pool,
      async (client) =>
        [
          await store.getJob(client, id),
          await store.getAttempts(client, id),
          await store.getJobRelations(client, id),
          await store.getJobReruns(client, id),
          await getJobSteps(client, id),
        ] as const,
    );
    if (!job) throw await missingJobError(this.pool, id);
    return { job, attempts, ...relations, reruns, ...steps };
  }

  /** Waits for jobs on one shared LISTEN session, made on the first wait. */
  private waiters?: JobWaiters;

  /**
   * Resolves with the job's record once it has finished: succeeded (with its `result`), dead
   * or cancelled. Woken by the database's notification, on one connection this client shares
   * between all its waits (none per wait, no polling). JobNotFoundError for an unknown id
   * (JobNotKeptError, one of them, for a job that finished without a record kept),
   * WaitTimeoutError after `timeoutMs`, the signal's reason when `signal` aborts.
   */
  waitFor(id: string, options: WaitOptions = {}): Promise<JobRecord> {
    this.waiters ??= new JobWaiters(this.pool, this.sessionUrl, this.schema, this.logger);
    return this.waiters.waitFor(id, options);
  }

  /**
   * Jobs, newest first. Page with `before`: the last id of the previous page. With
   * `includePayload: false` the records carry no payload (cheap for large payloads).
   */
  async listJobs(filter: ListJobsOptions = {}): Promise<ListedJob[]> {
    if (filter.state !== undefined && !JOB_STATES.includes(filter.state as never)) {
      throw new ValidationError(`state must be one of ${JOB_STATES.join(", ")} (got ${JSON.stringify(filter.state)})`);
    }
    if (filter.queue !== undefined) checkName(filter.queue, "queue");
    if (filter.task !== undefined) checkName(filter.task, "task");
    for (const key of ["from", "to"] as const) {
      const at = filter[key];
      if (at !== undefined && !(at instanceof Date && Number.isFinite(at.getTime()))) throw new ValidationError(`${key} must be a valid Date`);
    }
    if (filter.timeField !== undefined && filter.timeField !== "created" && filter.timeField !== "finished") {
      throw new ValidationError(`timeField must be "created" or "finished" (got ${JSON.stringify(filter.timeField)})`);
    }
    if (filter.before !== undefined) checkJobId(filter.before, "before");
    const limit = integerIn(filter.limit ?? 50, 1, 10_000, "limit");
    const includePayload = filter.includePayload ?? true;
    if (typeof includePayload !== "boolean") throw new ValidationError("includePayload must be true or false");
    return store.listJobs(this.pool, {
      state: filter.state as JobRecord["state"],
      queue: filter.queue,
      task: filter.task,
      from: filter.from,
      to: filter.to,
      timeField: filter.timeField,
      limit,
      before: filter.before,
      includePayload,
    });
  }

  /**
   * Cancels a job: a waiting or blocked one ends now (a blocked one's dependents are settled
   * as for any failed parent); a running one has its handler aborted at once (a notification
   * to the worker holding it; its next heartbeat at the latest), and its late report ends it as
   * cancelled. Returns which happened.
   */
  async cancel(id: string): Promise<"cancelled" | "cancel_requested"> {
    checkJobId(id);
    const result = await store.cancelJob(this.pool, id);
    if (result === "not_found") throw await missingJobError(this.pool, id);
    if (typeof result === "object") throw new JobStateError(`job ${id} already finished (${result.finished}); nothing to cancel`);
    return result;
  }

  /** Moves a dead or cancelled job back to waiting with a fresh retry budget. */
  /**
   * Sends an event to the jobs waiting for it (ctx.waitForEvent, docs/durable.md#events-and-the-race-with-a-wait): each
   * waiter whose `match` the data contains resumes with the data. Kept for the events' retention
   * window, so a wait that begins after the send (of a job enqueued before it) still receives it.
   * With `{ db }`, inside your transaction: the event exists only if it commits. Returns its id.
   * An event made by `defineEvent` types the data and checks it against its schema first.
   */
  sendEvent<E extends AnyEvent>(event: E, data: EventInput<E>, target?: EnqueueTarget): Promise<{ id: string }>;
  sendEvent(event: string, data?: unknown, target?: EnqueueTarget): Promise<{ id: string }>;
  async sendEvent(event: string | AnyEvent, data?: unknown, target: EnqueueTarget = {}): Promise<{ id: string }> {
    const sent = await eventToSend(event, data, "sendEvent");
    if (target.db !== undefined) checkCallerClient(target.db);
    const [id] = await store.sendEvents(target.db ?? this.pool, [sent], target.db && this.schema);
    return { id: id! };
  }

  /** Completes a callback's wait (ctx.callback) with `data`, once; CallbackRefusedError says why not (docs/durable-callbacks.md). */
  completeCallback(token: string, data?: unknown): Promise<void> {
    return completeCallback(this.pool, token, data);
  }

  /** Re-runs a finished or dead durable job from a recorded step: the steps before it replay, it and those after run again. */
  rerunFromStep(id: string, step: string, options?: RerunOptions): Promise<Rerun> {
    return rerunFromStep(this.pool, id, step, options);
  }

  async retry(id: string): Promise<void> {
    checkJobId(id);
    let result: store.RetryResult;
    try {
      result = await store.retryJob(this.pool, id);
    } catch (err) {
      if ((err as { code?: string }).code === "23505") {
        throw new JobStateError(`job ${id} cannot be retried: an unfinished job holds its unique key`);
      }
      throw err;
    }
    if (result === "not_found") throw await missingJobError(this.pool, id);
    if (typeof result === "object") {
      throw new JobStateError(`job ${id} is ${result.notRetryable}; only dead or cancelled jobs can be retried`);
    }
  }

  /**
   * Every queue: its flow-control settings (paused, limits, rates) and how many jobs wait and
   * hold leases in it (docs/flow-control.md).
   */
  listQueues(): Promise<store.QueueInfo[]> {
    return store.listQueues(this.pool);
  }

  /**
   * Pauses a queue for the whole fleet: from the moment this returns no claim anywhere takes
   * its jobs, and every worker gives back the jobs it buffered but did not start (without
   * spending an attempt) within a second. Enqueue goes on; running jobs finish.
   */
  async pauseQueue(name: string, options: { create?: boolean } = {}): Promise<store.QueueSettings> {
    await this.checkQueue(name, options);
    return store.setQueuePaused(this.pool, name, true);
  }

  /**
   * Resumes a paused queue, and lifts the holds handlers set on it (as `clearQueueHolds`):
   * "resume" means the queue runs again, whatever stopped it. Sleeping workers are woken at once.
   */
  async resumeQueue(name: string, options: { create?: boolean } = {}): Promise<store.QueueSettings> {
    await this.checkQueue(name, options);
    await store.clearQueueHolds(this.pool, name);
    return store.setQueuePaused(this.pool, name, false);
  }

  /**
   * Lifts the holds handlers set with RateLimitedError on a queue: the queue's own and every
   * key's, and makes its rate-limited jobs due now. Its next claims start jobs again. Returns
   * what was lifted.
   */
  async clearQueueHolds(name: string): Promise<store.ClearedHolds> {
    await this.checkQueue(name, {});
    return store.clearQueueHolds(this.pool, name);
  }

  /**
   * Sets a queue's limits at run time, for every worker, without restarting any: each given
   * limit takes its value (null: no limit), the others stay. A new limit binds claims that
   * start after it is stored; attempts already running finish.
   */
  async setQueueLimits(name: string, limits: Partial<store.QueueLimits>, options: { create?: boolean } = {}): Promise<store.QueueSettings> {
    const checked = normalizeQueueLimits(limits);
    await this.checkQueue(name, options);
    return store.setQueueLimits(this.pool, name, checked);
  }

  /**
   * Sets what a queue keeps of its finished jobs. `keepSucceeded: false`: a job that succeeds
   * leaves no record (no result, no `getJob`, not listed; JobNotKeptError instead), which saves
   * the record's write. Failed, dead and cancelled jobs keep theirs, and so does a succeeded job
   * whose result someone needs: with dependents, a waiter (`waitFor`), or a durable parent
   * awaiting it (docs/flow-control.md#records-of-succeeded-jobs). Takes effect for the
   * completions that start after it returns.
   */
  async setQueueHistory(name: string, history: store.QueueHistory, options: { create?: boolean } = {}): Promise<store.QueueSettings> {
    const checked = normalizeQueueHistory(history);
    await this.checkQueue(name, options);
    return store.setQueueHistory(this.pool, name, checked);
  }

  private async checkQueue(name: string, options: { create?: boolean }): Promise<void> {
    checkName(name, "queue");
    if (options.create || (await store.queueKnown(this.pool, name))) return;
    const known = (await store.listQueues(this.pool)).map((q) => q.name);
    throw new UnknownQueueError(name, known, closestName(name, known));
  }

  /**
   * Every queue's depth now, from the queue_depth view (docs/deployment.md#autoscaling): ready
   * jobs and the oldest one's age, running, delayed and blocked jobs, and whether it is paused.
   * Lists the queues with unfinished jobs or settings, by name.
   */
  queueDepth(): Promise<store.QueueDepth[]> {
    return store.queueDepth(this.pool);
  }

  /** Counts by queue and state, leases, the fleet, and the waiting jobs no live worker can run. */
  async stats(): Promise<Stats> {
    const [stats, withoutHandler] = await Promise.all([store.queueStats(this.pool), handlerGaps(this.pool)]);
    return { ...stats, withoutHandler };
  }

  /**
   * Saves a schedule (a periodic job): one job of `task` per tick of `cron`, enqueued by the
   * scheduler inside any running worker. Saving a schedule that exists updates it; with the
   * same pattern and time zone it keeps its place (a redeploy neither skips nor repeats a
   * tick), with a new one it starts from its next tick.
   */
  async schedule(def: ScheduleDefinition): Promise<store.ScheduleRecord & { created: boolean; warnings?: EnqueueWarning[] }> {
    const { parsed, ...input } = normalizeSchedule(def);
    const [warnings] = attachWarnings([{}], [input], await this.knownTasks.check([input], () => `schedule ${def.name}`));
    const firstRunAt = nextTick(parsed, await store.databaseNow(this.pool));
    if (!firstRunAt) throw new ValidationError(`schedule ${def.name}: cron ${JSON.stringify(def.cron)} has no tick in the future`);
    return { ...(await store.upsertSchedule(this.pool, { ...input, firstRunAt })), ...warnings };
  }

  /** Removes a schedule (its jobs already enqueued stay); false if there was none. */
  async unschedule(name: string): Promise<boolean> {
    checkName(name, "schedule name");
    return store.deleteSchedule(this.pool, name);
  }

  listSchedules(): Promise<store.ScheduleRecord[]> {
    return store.listSchedules(this.pool);
  }

  /**
   * A worker on this connection, with a watchdog and a scheduler inside it (set
   * `watchdog: false` or `scheduler: false` to run them elsewhere). Call `start()` on it.
   */
  worker(options: Omit<WorkerOptions, "transport"> & { watchdog?: boolean | WatchdogOptions; scheduler?: boolean | SchedulerOptions }): Worker {
    const { watchdog = true, scheduler = true, hooks, ...rest } = options;
    const services: MaintenanceService<unknown>[] = [];
    if (watchdog) services.push(this.watchdog(typeof watchdog === "object" ? watchdog : {}));
    if (scheduler) services.push(this.scheduler(typeof scheduler === "object" ? scheduler : {}));
    return new Worker({
      logger: this.logger,
      metricsRegistry: this.metrics.registry,
      ...rest,
      transport: new DatabaseTransport(this.pool, this.databaseUrl, this.schema, this.sessionUrl ?? null),
      services,
      dispatch: this.dispatchFactory(),
      hooks: [...this.hookSets, ...(hooks === undefined ? [] : Array.isArray(hooks) ? hooks : [hooks])],
    });
  }

  /**
   * @internal With NATS configured, what a Worker built by hand (`new Worker({ transport, dispatch })`)
   * needs for NATS dispatch on this client; undefined otherwise.
   */
  dispatchFactory(): DispatchFactory | undefined {
    const link = this.nats;
    const plugin = this.natsPlugin;
    if (!link || !plugin) return undefined;
    const sessionUrl = this.sessionUrl;
    return async () => {
      // Its publisher is woken by LISTEN, which a transaction pooler cannot carry.
      if (sessionUrl === undefined) {
        throw new ConfigError('NATS dispatch in a worker needs a LISTEN session: with pooling "transaction", give directDatabaseUrl');
      }
      return plugin.workerDispatch(link, { pool: this.pool, connectionString: sessionUrl, schema: this.schema });
    };
  }

  watchdog(options: WatchdogOptions = {}): Watchdog {
    return new Watchdog(this.pool, this.metrics, this.logger, options);
  }

  /** Enqueues the jobs of due schedules; runs inside every worker unless `scheduler: false`. */
  scheduler(options: SchedulerOptions = {}): Scheduler {
    return new Scheduler(this.pool, this.metrics, this.logger, options);
  }

  retention(options: RetentionOptions = {}): Retention {
    return new Retention(this.pool, this.metrics, this.logger, options);
  }

  /**
   * This client typed by a set of tasks made by `defineTask` (docs/typescript.md): its
   * `enqueue`, `enqueueMany` and `schedule` take only their names and payloads, checked by
   * their schemas, and its `worker()` runs their handlers.
   */
  typed<const T extends readonly AnyTask[]>(tasks: T): TypedLeasehold<T> {
    return new TypedLeasehold(this, tasks);
  }

  async close(): Promise<void> {
    await this.waiters?.close();
    await this.nats?.close();
    await this.pool.end();
    await this.embedded?.stop();
  }
}
