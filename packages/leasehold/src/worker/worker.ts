/**
 * The worker runtime: claims jobs ahead into a bounded local buffer (the claim is the lease
 * grant), runs their handlers with up to `concurrency` at once, keeps every lease it holds
 * alive with one heartbeat statement per tick, ends handlers that stall or run too long,
 * and reports their ends in batches, every write fenced by (job id, attempt, worker id).
 *
 * Events (for tests and dashboards), typed in ./events.ts: "job:start" (job), "job:end" (job,
 * outcome), "job:stale" (job, StaleLeaseError), "job:aborted" (job, JobAbortedError), "idle",
 * "identity:lost" (err), "stopped".
 */
import os from "node:os";
import { randomBytes } from "node:crypto";
import { silentLogger, type Logger } from "../logger.js";
import type { CounterChild, HistogramChild, MetricsRegistry } from "../metric-shapes.js";
import type { ClaimedJob } from "../jobs/types.js";
import type pg from "pg";
import { ConfigError, JobSuspendedError, UnknownTaskError, type LostLeaseReason } from "../errors.js";
import { metricsFor, type Metrics } from "../metrics.js";
import { Claimer } from "./claimer.js";
import { JobAbortedError, type AbortReason, type TransactionResult } from "./context.js";
import { Heartbeater, attemptKey, canVouchFor, hasUnsentValues, type InFlight } from "./heartbeat.js";
import { FlowView, REFRESH_IDLE_MS } from "./flow-view.js";
import { createJobContext } from "./job-context.js";
import type { DependencyCounts, ParentRecord } from "../store/dependencies.js";
import { resolveWorkerSettings, type WorkerSettings, type WorkerSettingsInput } from "./options.js";
import { Outage } from "./outage.js";
import { reportEnd, reportPlainSuccess, type JobOutcome } from "./report-end.js";
import { Reporter } from "./reporter.js";
import { stopOnSignals, type StopOnSignalsOptions } from "./signals.js";
import { isConnectionError, type Attachment, type WorkerTransport } from "./transport.js";
import { TransactionRunner } from "./transaction.js";
import { StepHost } from "./step-host.js";
import { LivenessWatch } from "./liveness.js";
import { LimitTimers, disarmLimits, limitPassed, type LimitOutcome } from "./limits.js";
import { releaseAttempts, type ReleaseWhy } from "./release.js";
import type { MaintenanceService } from "../maintenance/service.js";
import type { DispatchFactory, WorkerDispatch } from "./dispatch.js";
import { WorkerEmitter } from "./events.js";
import { checkHooks, composeHooks, type ComposedHooks, type LeaseholdHooks } from "../hooks.js";
import { withBatchHooks } from "./hooked-transport.js";

export type { JobOutcome };

export interface WorkerOptions extends WorkerSettingsInput {
  transport: WorkerTransport;
  /** Maintenance services (a watchdog) that start and stop with this worker. */
  services?: MaintenanceService<unknown>[];
  /** A dispatch mode beside polling (NATS, docs/nats.md), made at start. */
  dispatch?: DispatchFactory;
  logger?: Logger;
  metricsRegistry?: MetricsRegistry;
  /** Hooks around this worker's handlers, attempts, claims and reports (src/hooks.ts, docs/tracing.md#hooks). */
  hooks?: LeaseholdHooks | LeaseholdHooks[];
}

/** How long a stopping worker waits for its last reports. */
const SHUTDOWN_REPORT_WAIT_MS = 5_000;
/** Start-up reconciliation retries connection errors for about 30 s in all. */
const RECONCILE_RETRY_MAX_MS = 16_000;
/** A buffered job not started within this share of its lease is given back. */
const BUFFER_MAX_LEASE_SHARE = 0.25;
const BUFFER_MAX_AGE_MS = 10_000;

/** "<name>/<host>-<pid>-<random>", or without the name part. */
export function makeWorkerId(name?: string): string {
  const base = `${os.hostname()}-${process.pid}-${randomBytes(3).toString("hex")}`;
  return name ? `${name}/${base}` : base;
}

export class Worker extends WorkerEmitter {
  readonly id: string;
  readonly settings: WorkerSettings;
  readonly transport: WorkerTransport;
  readonly logger: Logger;
  readonly metrics: Metrics;
  /** Every lease held, keyed by attemptKey (job id and attempt). */
  readonly inFlight = new Map<string, InFlight>();
  /** The newest attempt this worker holds of each job. */
  private readonly newestAttempt = new Map<string, InFlight>();
  /** Claimed, not yet started, in claim order (`head` is the next to start). */
  private buffer: InFlight[] = [];
  private head = 0;
  private running = 0;
  private reporting = 0;
  private readonly outage: Outage;
  private readonly claimer: Claimer;
  private readonly flow: FlowView;
  private readonly heartbeater: Heartbeater;
  private readonly transactions: TransactionRunner;
  /** @internal Where durable steps are recorded (./step-host.ts). */
  readonly steps: StepHost;
  readonly reporter: Reporter;
  private attachment?: Attachment;
  private sweepTimer?: NodeJS.Timeout;
  private state: "new" | "started" | "stopping" | "stopped" = "new";
  /** While stopping: the stop under way, when running handlers' grace ends, and how to wake its wait. */
  private stopped?: Promise<void>;
  private graceDeadline = Infinity;
  private wakeGrace?: () => void;
  private readonly services: MaintenanceService<unknown>[];
  private readonly dispatchFactory?: DispatchFactory;
  private dispatch?: WorkerDispatch;
  private readonly tasks: string[];
  private readonly heldLeases = () => this.inFlight.size;
  private readonly liveness: LivenessWatch;
  /** Running attempts' time limits: one timer per maximum run time, not one per job (./limits.ts). */
  private readonly limits = new LimitTimers((entry, outcome) => this.endAtLimit(entry, outcome));
  /** Labelled metric children, looked up once: labels are hashed on every call otherwise. */
  private readonly durations = new Map<string, HistogramChild>();
  /** By queue, then outcome: no key string made per job. */
  private readonly endings = new Map<string, Map<string, CounterChild>>();
  /** Ends counted and not yet added to their counter (see addEnded). */
  private readonly endedDue = new Map<CounterChild, number>();
  /** The registered hooks, composed once; each is undefined when none is registered (the per-job path then skips it). */
  private readonly hooks: ComposedHooks;

  constructor(options: WorkerOptions) {
    super();
    const { transport, logger, metricsRegistry, services, dispatch, hooks, ...rest } = options;
    this.dispatchFactory = dispatch;
    this.settings = resolveWorkerSettings(rest);
    this.services = services ?? [];
    const hookSets = (hooks === undefined ? [] : Array.isArray(hooks) ? hooks : [hooks]).map((h, i) => {
      try {
        return checkHooks(h, `hooks[${i}]`);
      } catch (err) {
        throw new ConfigError((err as Error).message);
      }
    });
    this.hooks = composeHooks(hookSets, (hook, err) => this.logger.warn({ hook, err: String(err) }, "a hook threw; ignored"));
    this.transport = withBatchHooks(transport, this.hooks);
    this.id = makeWorkerId(this.settings.name);
    this.logger = (logger ?? silentLogger).child({ worker: this.id });
    this.metrics = metricsFor(metricsRegistry);
    this.outage = new Outage(this.logger);
    this.reporter = new Reporter(this.transport, this.id, this.outage);
    const tasks = [...this.settings.tasks.keys()];
    this.tasks = tasks;
    this.flow = new FlowView(
      this.transport,
      this.settings.queues,
      () => this.buffer.length > this.head,
      () => this.flowChanged(),
      this.logger,
    );
    this.claimer = new Claimer(
      {
        buffered: () => this.buffer.length - this.head,
        running: () => this.running,
        reporting: () => this.reporting,
        deliver: (j, at) => this.deliver(j, at),
        idle: () => this.emit("idle"),
        queues: () => ({ queues: this.flow.claimable(), flowQueues: this.flow.flowQueues(), pacedQueues: this.flow.pacedQueues() }),
        queuesStale: () => void this.flow.refresh(),
      },
      this.transport,
      this.id,
      this.settings,
      tasks,
      this.metrics,
      this.outage,
      this.logger,
    );
    this.heartbeater = new Heartbeater(
      this.inFlight,
      {
        lost: (e, reason) => this.leaseLost(e, reason),
        cancelRequested: (e) => this.cancelRequested(e),
        refused: (e, why) => {
          e.refusedValue = why;
          this.logger.warn({ jobId: e.job.id, attempt: e.job.attempt, err: why }, "progress refused; failing this attempt");
          if (e.phase === "running") this.abortJob(e, "progress_refused");
        },
        unrenewable: (e) => (e.phase === "buffered" ? this.drop(e, "renewal_failed") : this.abortJob(e, "renewal_failed")),
      },
      this.transport,
      this.id,
      this.settings.leaseMs,
      this.settings.heartbeatMs,
      this.metrics,
      this.outage,
      this.logger,
    );
    this.transactions = new TransactionRunner(
      {
        stale: (job, err) => this.emit("job:stale", job, err),
        abort: (e, reason) => this.abortJob(e, reason),
        leaseLost: (e, reason) => this.leaseLost(e, reason),
        forget: (e) => this.forget(e),
      },
      this.heartbeater,
      this.transport,
      this.id,
      this.settings.maxResultBytes,
      this.metrics,
      this.logger,
    );
    this.steps = new StepHost({
      id: this.id,
      transport: this.transport,
      metrics: this.metrics,
      logger: this.logger,
      callbackBaseUrl: this.settings.callbackBaseUrl ?? this.transport.callbackBaseUrl ?? null,
      hooks: this.hooks,
      progressed: (e) => this.progressed(e),
      stepLost: (e, reason) => this.leaseLost(e, reason),
      attemptSuspended: (e) => this.forget(e),
      sendPending: (e) => this.heartbeater.sendPending(e),
    });
    this.liveness = new LivenessWatch(
      {
        started: () => this.state === "started",
        lost: () => this.claimer.setHeld(true),
        attempts: () => this.inFlight.values(),
        drop: (e, reason) => this.drop(e, reason),
        abort: (e, reason) => this.abortJob(e, reason),
        back: (givenUp) => {
          if (givenUp.length > 0) void this.release(givenUp, "liveness lost");
          this.claimer.setHeld(false);
          this.dispatch?.kick();
          this.pump();
        },
      },
      this.settings.livenessGraceMs,
      this.logger,
    );
  }

  /** Jobs whose leases this worker holds now (buffered, running or being reported). */
  get inFlightCount(): number {
    return this.inFlight.size;
  }

  async start(): Promise<this> {
    if (this.state !== "new") throw new Error("a worker can be started once");
    this.state = "started";
    const s = this.settings;
    this.attachment = await this.transport.attach({
      workerId: this.id,
      name: s.name,
      waitForName: s.waitForName,
      livenessGraceMs: s.livenessGraceMs,
      holdsLeases: () => this.inFlight.size > 0,
      queues: s.queues,
      concurrency: s.concurrency,
      leaseMs: s.leaseMs,
      heartbeatMs: s.heartbeatMs,
      policies: [...s.tasks].map(([task, t]) => ({ task, backoff: t.backoff, progressTimeoutMs: t.progressTimeoutMs, maxRunMs: t.maxRunMs })),
      wake: () => this.claimer.wake(),
      onCancelRequested: (attempt) => this.cancelNoticed(attempt),
      onQueueSettings: () => void this.flow.refresh(),
      onIdentityLost: (err) => {
        this.logger.error({ err: err.message }, "this worker's name was taken by another process; stopping");
        this.emit("identity:lost", err);
        void this.stop();
      },
      onConnection: (state, err, lateByMs) => {
        if (state === "up") this.outage.ok();
        else this.outage.failed("listen", err);
        this.liveness.changed(state, lateByMs ?? 0);
      },
    });
    this.reportSession(this.attachment.session);
    if (s.name) {
      const recovered = await this.reconcile(s.name);
      if (recovered > 0) {
        this.metrics.recoveries.inc({ cause: "reconciliation" }, recovered);
        this.logger.info({ recovered }, "recovered the jobs an earlier process of this worker name still held");
      }
    }
    this.metrics.leaseHolders.add(this.heldLeases);
    await this.flow.start();
    this.heartbeater.start();
    if (this.dispatchFactory) {
      // Polling waits until the dispatch says it is unavailable.
      this.claimer.setPaused(true);
      this.dispatch = await this.dispatchFactory();
      try {
        await this.dispatch.start({
          workerId: this.id,
          settings: s,
          tasks: this.tasks,
          logger: this.logger,
          metrics: this.metrics,
          capacity: () => (this.liveness.lost ? 0 : this.claimer.target() - (this.buffer.length - this.head) - this.running),
          deliver: (jobs, at) => this.deliver(jobs, at),
          setPolling: (on) => this.claimer.setPaused(!on),
        });
      } catch (err) {
        await this.heartbeater.stop();
        await this.attachment.detach(true).catch(() => {});
        this.state = "stopped";
        throw err;
      }
    }
    this.claimer.start();
    const sweepMs = Math.max(50, Math.min(1_000, Math.floor(s.leaseMs * BUFFER_MAX_LEASE_SHARE)));
    this.sweepTimer = setInterval(() => this.sweepBuffer(), sweepMs);
    this.sweepTimer.unref();
    for (const service of this.services) service.start();
    this.logger.info({ queues: s.queues, concurrency: s.concurrency, tasks: [...s.tasks.keys()] }, "worker started");
    return this;
  }

  /**
   * Says what the worker's database session gives it: a gauge per feature, and one warning
   * when a pooler took some away (never a silent change of how crashes are recovered).
   */
  private reportSession(session: Attachment["session"]): void {
    if (!session) return;
    const g = this.metrics.sessionFeatures;
    g.set({ feature: "listen" }, session.listen ? 1 : 0);
    g.set({ feature: "liveness" }, session.liveness ? 1 : 0);
    g.set({ feature: "name_lock" }, session.nameLock ? 1 : 0);
    if (session.degraded === undefined) return;
    const s = this.settings;
    this.logger.warn(
      { listen: session.listen, liveness: session.liveness, nameLock: session.nameLock, pollIntervalMs: s.pollIntervalMs, leaseMs: s.leaseMs },
      `${session.degraded}: no LISTEN session, so this worker polls for jobs every ${s.pollIntervalMs} ms, hears a cancel at its next heartbeat ` +
        `(every ${s.heartbeatMs} ms) and queue settings within ${REFRESH_IDLE_MS} ms; no liveness lock, so if it dies its jobs are ` +
        `recovered when their leases run out (${s.leaseMs} ms plus the watchdog's interval), not in about a second; ` +
        "a stable name is refused. Set directDatabaseUrl (LEASEHOLD_DIRECT_DATABASE_URL, --direct-database-url) for all of these",
    );
  }

  /** Recovers what an earlier process of this name left running; retried through a restart. */
  private async reconcile(name: string): Promise<number> {
    for (let delay = 200; ; delay *= 2) {
      try {
        return await this.transport.reconcile({ workerName: name, currentWorkerId: this.id, backoff: this.settings.backoff });
      } catch (err) {
        if (!isConnectionError(err) || delay > RECONCILE_RETRY_MAX_MS) throw err;
        this.outage.failed("reconciliation", err);
        await new Promise((r) => setTimeout(r, delay));
      }
    }
  }

  /** Beat now, outside the schedule (tests, or before a known pause). */
  heartbeatNow(): Promise<void> {
    return this.heartbeater.beatNow();
  }

  /**
   * Graceful shutdown, in order: stop claiming; give back buffered jobs not started; let
   * running handlers finish for up to `timeoutMs` (the grace; their `ctx.signal` is not
   * fired during it); then abort the rest (signal reason "shutdown") and release their jobs
   * to run again without spending an attempt. Called again while stopping, it shortens the
   * grace to `timeoutMs` from now (`stop(0)`: abort now) and resolves when the worker has stopped.
   */
  stop(timeoutMs = this.settings.shutdownTimeoutMs): Promise<void> {
    if (this.state === "stopping") {
      this.graceDeadline = Math.min(this.graceDeadline, Date.now() + timeoutMs);
      this.wakeGrace?.();
      return this.stopped ?? Promise.resolve();
    }
    if (this.state !== "started") return Promise.resolve();
    this.state = "stopping";
    this.graceDeadline = Infinity;
    this.stopped = this.shutDown(timeoutMs);
    return this.stopped;
  }

  /**
   * SIGINT and SIGTERM stop this worker gracefully; a second signal ends the grace at once
   * (see worker/signals.ts). `afterStop` runs once it has stopped, e.g. `() => lh.close()`.
   * Returns a function that removes the listeners.
   */
  stopOnSignals(options?: StopOnSignalsOptions): () => void {
    return stopOnSignals(this, this.logger, options);
  }

  private async shutDown(timeoutMs: number): Promise<void> {
    this.transport.interrupt?.();
    clearInterval(this.sweepTimer);
    this.liveness.stop();
    this.flow.stop();
    await Promise.all([this.claimer.stop(), this.dispatch?.stop(), ...this.services.map((s) => s.stop())]);
    await this.release(this.takeBuffered(), "shutdown");
    this.graceDeadline = Math.min(this.graceDeadline, Date.now() + timeoutMs);
    while (this.running > 0 && Date.now() < this.graceDeadline) {
      await new Promise<void>((resolve) => {
        this.once("slot", resolve);
        this.wakeGrace = resolve;
        setTimeout(resolve, Math.max(0, this.graceDeadline - Date.now())).unref();
      });
    }
    this.wakeGrace = undefined;
    const unfinished = [...this.inFlight.values()].filter((e) => e.phase === "running" && !e.lostReason);
    for (const e of unfinished) {
      e.lostReason = "shutdown";
      this.abortJob(e, "shutdown");
    }
    await this.release(unfinished, "shutdown");
    // Reports still unsent after this are abandoned: their leases expire and the watchdog
    // puts the jobs through the retry path.
    this.reporter.giveUpAfter = Date.now() + SHUTDOWN_REPORT_WAIT_MS;
    await Promise.race([this.reporter.drain(), new Promise((r) => setTimeout(r, SHUTDOWN_REPORT_WAIT_MS).unref())]);
    await this.heartbeater.stop();
    await this.attachment?.detach(true).catch(() => {});
    this.metrics.leaseHolders.delete(this.heldLeases);
    this.state = "stopped";
    this.logger.info("worker stopped");
    this.emit("stopped");
  }

  /** Gives jobs back without spending an attempt (this worker is alive and chose to). */
  private async release(entries: InFlight[], why: ReleaseWhy): Promise<void> {
    if (entries.length === 0) return;
    for (const e of entries) this.forget(e);
    await releaseAttempts(this.transport, this.id, entries, why, this.metrics, this.logger);
  }

  private deliver(jobs: ClaimedJob[], sentAt: number): void {
    let shortestLease = Infinity;
    const stale: InFlight[] = [];
    const perQueue = new Map<string, number>();
    for (const job of jobs) {
      const task = this.settings.tasks.get(job.task);
      const key = attemptKey(job);
      const entry: InFlight = {
        job,
        key,
        renewedAt: sentAt,
        claimedAt: sentAt,
        phase: "buffered",
        progressTimeoutMs: job.progressTimeoutMs ?? task?.progressTimeoutMs ?? null,
        // the job's own limit or opt-out, else its task's (the worker's default included)
        maxRunMs: job.maxRunUnlimited ? null : (job.maxRunMs ?? task?.maxRunMs ?? null),
      };
      const older = this.newestAttempt.get(job.id);
      // This worker lost the older attempt's lease (it was too slow to beat) and has now
      // claimed the job again: the older attempt can only be refused, so stop it.
      if (older) this.leaseLost(older, "reclaimed");
      this.inFlight.set(key, entry);
      this.newestAttempt.set(job.id, entry);
      // Claimed before this worker gave up on its liveness: the watchdog may recover it.
      if (sentAt <= this.liveness.gaveUpAt) stale.push(entry);
      else this.buffer.push(entry);
      shortestLease = Math.min(shortestLease, job.leaseMs);
      perQueue.set(job.queue, (perQueue.get(job.queue) ?? 0) + 1);
    }
    for (const [queue, n] of perQueue) this.metrics.jobsClaimed.inc({ queue: this.metrics.queueLabel(queue) }, n);
    if (jobs.length > 0) this.heartbeater.jobsClaimed(shortestLease);
    this.giveBack(stale);
    this.pump();
  }

  /**
   * Starts buffered jobs while slots are free, never one whose lease this process cannot
   * vouch for by its own clock (after a freeze, a job that waited in the buffer may already
   * have been recovered and started elsewhere: the renewal check is a timer and may not have
   * run yet), and none while the liveness session is gone.
   */
  private pump(): void {
    if (this.liveness.lost) return;
    let unvouched: InFlight[] | undefined;
    let pausedNow: InFlight[] | undefined;
    let now = performance.now();
    while (this.running < this.settings.concurrency && this.head < this.buffer.length && this.state === "started") {
      const entry = this.buffer[this.head++]!;
      if (!this.waiting(entry)) continue;
      if (this.flow.isPaused(entry.job.queue)) {
        // Paused since it was claimed: given back (flowChanged), never started.
        (pausedNow ??= []).push(entry);
        continue;
      }
      // Handlers may have started since `now` was read; a stale `now` only errs toward vouching
      // less, so read the clock again only when the answer would be no.
      if (!canVouchFor(entry, this.settings.heartbeatMs, now) && !canVouchFor(entry, this.settings.heartbeatMs, (now = performance.now()))) {
        (unvouched ??= []).push(entry);
        continue;
      }
      this.runJob(entry);
    }
    if (this.head > 1_024 && this.head * 2 > this.buffer.length) {
      this.buffer = this.buffer.slice(this.head);
      this.head = 0;
    }
    if (pausedNow) void this.release(pausedNow, "queue paused");
    if (unvouched) {
      this.logger.warn(
        { jobs: unvouched.map((e) => e.job.id) },
        "buffered jobs not started: their leases could not be vouched for (the process was paused?)",
      );
      this.giveBack(unvouched);
    }
  }

  /**
   * Attempts that must not start, given back: the release is fenced, so one the watchdog
   * already recovered is refused, and one still held runs again without spending an attempt.
   */
  private giveBack(entries: InFlight[]): void {
    if (entries.length === 0) return;
    for (const e of entries) {
      e.lostReason = "renewal_failed";
      this.metrics.leasesLost.inc({ reason: "renewal_failed" });
    }
    void this.release(entries, "not vouched for");
  }

  /**
   * Whether a buffered entry may still start: not dropped, and still held (not given back by
   * a release: one that waited too long, or was cancelled, stays in the buffer array).
   */
  private waiting(e: InFlight): boolean {
    return e.phase === "buffered" && !e.lostReason && this.newestAttempt.get(e.job.id) === e;
  }

  /**
   * A queue was paused or resumed, or came under flow control or left it: buffered jobs of a
   * paused queue are given back (no attempt spent; they never start here), and claims are
   * asked for again with the new view (a resumed queue's backlog at once).
   */
  private flowChanged(): void {
    if (this.state !== "started") return;
    const paused = this.buffer.slice(this.head).filter((e) => this.waiting(e) && this.flow.isPaused(e.job.queue));
    if (paused.length > 0) {
      this.logger.info({ jobs: paused.length }, "queue paused: buffered jobs given back");
      void this.release(paused, "queue paused");
    }
    this.claimer.wake();
  }

  /** Takes every job still buffered (not started), in order. */
  private takeBuffered(): InFlight[] {
    const rest = this.buffer.slice(this.head).filter((e) => this.waiting(e));
    this.buffer = [];
    this.head = 0;
    return rest;
  }

  /** Gives back buffered jobs that waited too long for a slot (handlers slowed down). */
  private sweepBuffer(): void {
    const now = performance.now();
    const stale = this.buffer.slice(this.head).filter((e) => {
      const maxAge = Math.min(BUFFER_MAX_AGE_MS, e.job.leaseMs * BUFFER_MAX_LEASE_SHARE);
      return this.waiting(e) && now - e.claimedAt > maxAge;
    });
    if (stale.length > 0) void this.release(stale, "buffered too long");
  }

  private runJob(entry: InFlight): void {
    const { job } = entry;
    entry.phase = "running";
    entry.startedAt = entry.lastProgressAt = performance.now();
    this.running++;
    this.limits.arm(entry);
    this.emit("job:start", job);
    const task = this.settings.tasks.get(job.task);
    const around = this.hooks.aroundHandler;
    // Called here rather than in an async wrapper (a closure and a promise per job); a handler
    // that throws before returning its promise ends the same way as one whose promise rejects.
    let running: unknown;
    try {
      if (!task) throw new UnknownTaskError(job.task, [...this.settings.tasks.keys()]);
      const ctx = createJobContext(entry, this);
      // Without middleware, no closure is made for `next`.
      running = around ? around(job, ctx, async () => task.handler(job.payload, ctx)) : task.handler(job.payload, ctx);
    } catch (err) {
      running = Promise.reject(err);
    }
    Promise.resolve(running).then(
      (value) => {
        entry.returned = value;
        this.handlerEnded(entry, undefined);
      },
      (err: unknown) => this.handlerEnded(entry, err ?? new Error("handler threw a nullish value")),
    );
  }

  private durationOf(task: string): HistogramChild {
    let child = this.durations.get(task);
    if (!child) this.durations.set(task, (child = this.metrics.jobDuration.labels({ task })));
    return child;
  }

  /** @internal Counts an attempt's end by queue and outcome. */
  countEnded(queue: string, outcome: string): void {
    let ofQueue = this.endings.get(queue);
    if (!ofQueue) this.endings.set(queue, (ofQueue = new Map()));
    let child = ofQueue.get(outcome);
    if (!child) ofQueue.set(outcome, (child = this.metrics.jobsEnded.labels({ queue: this.metrics.queueLabel(queue), outcome })));
    const due = this.endedDue.get(child);
    if (due === undefined && this.endedDue.size === 0) queueMicrotask(this.addEnded);
    this.endedDue.set(child, (due ?? 0) + 1);
  }

  /** Adds the ends counted this turn: once per label set, not per job (prom-client hashes the labels at every inc). */
  private readonly addEnded = () => {
    for (const [child, n] of this.endedDue) child.inc(n);
    this.endedDue.clear();
  };

  /** @internal The handler made progress (ctx.progress or ctx.checkpoint). */
  progressed(entry: InFlight): void {
    entry.lastProgressAt = performance.now();
  }

  /** @internal */
  abort(entry: InFlight, reason: AbortReason): void {
    this.abortJob(entry, reason);
  }

  /** @internal ctx.parents */
  parents(entry: InFlight): Promise<ParentRecord[]> {
    if (!this.transport.parents) return Promise.reject(new ConfigError("ctx.parents: this worker's transport cannot read a job's parents"));
    return this.transport.parents({ workerId: this.id, job: { id: entry.job.id, attempt: entry.job.attempt } });
  }

  /** @internal ctx.dependencies */
  dependencies(entry: InFlight): Promise<DependencyCounts> {
    if (!this.transport.dependencies) {
      return Promise.reject(new ConfigError("ctx.dependencies: this worker's transport cannot read a job's parents"));
    }
    return this.transport.dependencies({ workerId: this.id, job: { id: entry.job.id, attempt: entry.job.attempt } });
  }

  /**
   * @internal ctx.transaction: the handler's writes and the attempt's completion in one
   * transaction (./transaction.ts).
   */
  transaction<T>(entry: InFlight, work: (tx: pg.PoolClient) => Promise<T>, pool?: pg.Pool, resultOption?: TransactionResult<T>): Promise<T> {
    return this.transactions.run(entry, work, pool, resultOption);
  }

  /**
   * A handler past its limit: abort it, stop renewing it, and report the attempt's end now;
   * whatever the handler does later (if it ever settles) is ignored, and its slot is free.
   */
  private endAtLimit(entry: InFlight, outcome: LimitOutcome): void {
    if (entry.within) return; // its transaction is finishing the job: that decides

    const limit = limitPassed(entry, outcome);
    this.logger.warn(
      { jobId: entry.job.id, attempt: entry.job.attempt, outcome },
      `handler ${outcome === "stalled" ? "stalled" : "timed out"}: ${limit}`,
    );
    this.abortJob(entry, outcome);
    this.slotFreed(entry);
    void this.report(
      entry,
      new JobAbortedError(entry.job.id, entry.job.attempt, outcome),
      outcome,
      `${outcome === "stalled" ? "stalled" : "timed out"}: ${limit}`,
    );
  }

  private handlerEnded(entry: InFlight, err: unknown): void {
    // Ended already (at a limit) or dropped: nothing is reported twice.
    if (entry.phase !== "running") return;
    this.slotFreed(entry);
    const w = entry.within;
    if (w === "committed" || w === "suspended" || w === "cancelled") {
      // Its transaction finished the job, or a sleep or wait suspended it (./step-host.ts): what
      // the handler did after cannot change that.
      const state = w === "committed" ? "succeeded" : w;
      if (err !== undefined && !(err instanceof JobSuspendedError)) {
        this.logger.warn({ jobId: entry.job.id, attempt: entry.job.attempt, err: String(err) }, `handler threw after its attempt ended (${state})`);
      }
      this.countEnded(entry.job.queue, state);
      this.ended(entry, { state }, err);
      this.claimer.reportLanded(); // its end is in the database already: a limited queue's slot is free
      return;
    }
    if (entry.lostReason) {
      // The lease is known to be gone (or released at shutdown): a report would be refused.
      this.forget(entry);
      this.ended(entry, { state: "lost", reason: entry.lostReason }, err);
      return;
    }
    if (err === undefined) {
      this.reporting++;
      if (reportPlainSuccess(this, entry, (result) => this.reported(entry, result, undefined))) return;
      this.reporting--;
    }
    void this.report(entry, err);
  }

  private slotFreed(entry: InFlight): void {
    disarmLimits(entry);
    if (entry.startedAt !== undefined) this.durationOf(entry.job.task).observe((performance.now() - entry.startedAt) / 1000);
    entry.phase = "reporting";
    this.running--;
    this.emit("slot");
    this.claimer.jobFinished();
    this.dispatch?.kick();
    this.pump();
  }

  private async report(entry: InFlight, err: unknown, outcome?: LimitOutcome, message?: string): Promise<void> {
    this.reporting++;
    let result: JobOutcome;
    try {
      if (hasUnsentValues(entry)) await this.heartbeater.sendPending(entry);
      result = await reportEnd(this, entry, err, outcome, message);
    } catch (e) {
      this.reportDone(entry);
      throw e;
    }
    this.reported(entry, result, err);
  }

  /** An attempt's end is reported (see report, and reportPlainSuccess for the common success). */
  private reported(entry: InFlight, result: JobOutcome, err: unknown): void {
    try {
      // A handler that returned a result the worker refused threw nothing: the refusal is the error.
      this.ended(entry, result, err ?? (result.state === "dead" ? result.error : undefined));
    } finally {
      this.reportDone(entry);
    }
  }

  private reportDone(entry: InFlight): void {
    this.reporting--;
    this.forget(entry);
    this.claimer.reportLanded(); // may let claims resume (see Claimer), or free a limited queue's slot
  }

  /** An attempt whose handler started has ended: the job:end event, and the afterAttempt hooks. */
  private ended(entry: InFlight, outcome: JobOutcome, err: unknown): void {
    this.emit("job:end", entry.job, outcome);
    const after = this.hooks.afterAttempt;
    if (after) after(entry.job, { outcome, error: err, durationMs: performance.now() - entry.startedAt! });
  }

  private forget(entry: InFlight): void {
    disarmLimits(entry);
    this.inFlight.delete(entry.key ?? attemptKey(entry.job));
    if (this.newestAttempt.get(entry.job.id) === entry) this.newestAttempt.delete(entry.job.id);
  }

  private leaseLost(entry: InFlight, reason: LostLeaseReason | "reclaimed"): void {
    if (entry.within) return; // being finished by its own transaction
    if (entry.phase === "buffered") return this.drop(entry, reason);
    if (entry.phase !== "running") return;
    entry.lostReason = reason;
    this.abortJob(entry, reason);
  }

  /** A buffered job that must not start: its lease is gone or may be. */
  private drop(entry: InFlight, reason: AbortReason): void {
    entry.lostReason = reason;
    this.forget(entry);
  }

  /**
   * Instant cancel: the transport heard that a user cancelled one of this worker's attempts,
   * and it is cancelled as a heartbeat that found it would (same reason, same release). With no
   * attempt named, notices may have been lost (the listening session reconnected): a beat now
   * asks the database about every attempt held, rather than waiting up to a beat interval.
   */
  private cancelNoticed(attempt: { id: string; attempt: number } | undefined): void {
    // While stopping, handlers still run until the shutdown deadline: a cancel still stops them.
    if (this.state !== "started" && this.state !== "stopping") return;
    if (attempt === undefined) {
      if (this.inFlight.size > 0) void this.heartbeater.beatNow().catch(() => {});
      return;
    }
    const entry = this.inFlight.get(attemptKey(attempt));
    if (!entry || entry.lostReason) return;
    this.metrics.cancelNotices.inc();
    this.cancelRequested(entry);
  }

  private cancelRequested(entry: InFlight): void {
    if (entry.phase === "running") return this.abortJob(entry, "cancelled");
    // Not started: give it back; the release ends it as cancelled.
    if (entry.phase === "buffered" && !entry.lostReason) {
      entry.lostReason = "cancelled";
      void this.release([entry], "cancelled");
    }
  }

  private abortJob(entry: InFlight, reason: AbortReason): void {
    if (entry.abortedWith) return;
    const error = new JobAbortedError(entry.job.id, entry.job.attempt, reason);
    this.metrics.leasesLost.inc({ reason });
    this.emit("job:aborted", entry.job, error);
    entry.abortedWith = error;
    entry.controller?.abort(error);
  }
}
