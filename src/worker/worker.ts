/**
 * The worker runtime: claims jobs in batches (the claim is the lease grant), runs their
 * handlers with up to `concurrency` at once, keeps their leases alive with one heartbeat
 * statement per tick, and reports their ends in batches, every write fenced by
 * (job id, attempt, worker id).
 *
 * Events (for tests and dashboards): "job:start" (job), "job:end" (job, outcome),
 * "job:stale" (job, StaleLeaseError), "job:aborted" (job, JobAbortedError),
 * "claim:error" (err), "idle".
 */
import { EventEmitter } from "node:events";
import os from "node:os";
import { randomBytes } from "node:crypto";
import pino, { type Logger } from "pino";
import type { Registry } from "prom-client";
import type { ClaimedJob } from "../jobs/types.js";
import { StaleLeaseError, UnknownTaskError } from "../errors.js";
import { metricsFor, type Metrics } from "../metrics.js";
import { JobAbortedError, PermanentJobError, type AbortReason, type JobContext } from "./context.js";
import { Heartbeater, attemptKey, type InFlight } from "./heartbeat.js";
import { resolveWorkerSettings, MAX_CLAIM_BATCH, type WorkerSettings, type WorkerSettingsInput } from "./options.js";
import { Reporter, type ReportOutcome } from "./reporter.js";
import { retryDelayMs } from "./backoff.js";
import { sanitizeText, serializePayload } from "../jobs/validate.js";
import { isConnectionError, type WorkerTransport } from "./transport.js";
import type { MaintenanceService } from "../maintenance/service.js";

export interface WorkerOptions extends WorkerSettingsInput {
  transport: WorkerTransport;
  /** Maintenance services (a watchdog) that start and stop with this worker. */
  services?: MaintenanceService<unknown>[];
  logger?: Logger;
  metricsRegistry?: Registry;
}

export type JobOutcome =
  | { state: "succeeded" | "cancelled" | "waiting" | "dead" }
  | { state: "stale"; error: StaleLeaseError }
  | { state: "lost"; reason: AbortReason }
  | { state: "report_failed"; error: unknown };

const CLAIM_ERROR_BACKOFF_MAX_MS = 5_000;
/** How long a stopping worker waits for its last reports. */
const SHUTDOWN_REPORT_WAIT_MS = 5_000;
/** Start-up reconciliation retries connection errors for about 30 s in all. */
const RECONCILE_RETRY_MAX_MS = 16_000;
const MAX_ERROR_LENGTH = 4_000;

/** "<name>/<host>-<pid>-<random>", or without the name part. */
export function makeWorkerId(name?: string): string {
  const base = `${os.hostname()}-${process.pid}-${randomBytes(3).toString("hex")}`;
  return name ? `${name}/${base}` : base;
}

export class Worker extends EventEmitter {
  readonly id: string;
  readonly settings: WorkerSettings;
  private readonly transport: WorkerTransport;
  private readonly logger: Logger;
  private readonly metrics: Metrics;
  /** Keyed by attemptKey (job id and attempt). */
  private readonly inFlight = new Map<string, InFlight>();
  /** The newest attempt this worker holds of each job. */
  private readonly newestAttempt = new Map<string, InFlight>();
  private readonly heartbeater: Heartbeater;
  private readonly reporter: Reporter;
  private running = 0;
  private state: "new" | "started" | "stopping" | "stopped" = "new";
  private loop?: Promise<void>;
  private unsubscribe?: () => Promise<void>;
  private notified = false;
  private nudge?: () => void;
  private readonly tasks: string[];
  private readonly services: MaintenanceService<unknown>[];

  constructor(options: WorkerOptions) {
    super();
    const { transport, logger, metricsRegistry, services, ...rest } = options;
    this.settings = resolveWorkerSettings(rest);
    this.services = services ?? [];
    this.transport = transport;
    this.id = makeWorkerId(this.settings.name);
    this.logger = (logger ?? pino({ level: process.env.LEASEHOLD_LOG_LEVEL ?? "info" })).child({ worker: this.id });
    this.metrics = metricsFor(metricsRegistry);
    this.tasks = [...this.settings.tasks.keys()];
    this.reporter = new Reporter(transport, this.id);
    this.heartbeater = new Heartbeater(
      this.inFlight,
      transport,
      this.id,
      this.settings.leaseMs,
      this.settings.heartbeatMs,
      (entry, reason) => this.abortJob(entry, reason),
      this.metrics,
      this.logger,
    );
  }

  /** Jobs whose leases this worker holds now (running or being reported). */
  get inFlightCount(): number {
    return this.inFlight.size;
  }

  async start(): Promise<this> {
    if (this.state !== "new") throw new Error("a worker can be started once");
    this.state = "started";
    if (this.settings.name) {
      const released = await this.reconcile(this.settings.name);
      if (released > 0) {
        this.metrics.released.inc({ cause: "reconciliation" }, released);
        this.logger.info({ released }, "released jobs still held by an earlier process of this worker name");
      }
    }
    this.unsubscribe = await this.transport.subscribe(this.settings.queues, () => this.wake());
    this.heartbeater.start();
    this.loop = this.claimLoop();
    for (const service of this.services) service.start();
    this.logger.info({ queues: this.settings.queues, concurrency: this.settings.concurrency, tasks: this.tasks }, "worker started");
    return this;
  }

  /**
   * Releases the jobs an earlier process of this name still holds. A database that is
   * restarting or a terminated connection should not end the worker: retry for a while.
   */
  private async reconcile(name: string): Promise<number> {
    for (let delay = 200; ; delay *= 2) {
      try {
        return await this.transport.reconcile({ workerName: name, currentWorkerId: this.id });
      } catch (err) {
        if (!isConnectionError(err) || delay > RECONCILE_RETRY_MAX_MS) throw err;
        this.logger.warn({ err: String(err) }, "start-up reconciliation failed; retrying");
        await new Promise((r) => setTimeout(r, delay));
      }
    }
  }

  /** Beat now, outside the schedule (tests, or before a known pause). */
  heartbeatNow(): Promise<void> {
    return this.heartbeater.beatNow();
  }

  /**
   * Graceful shutdown: stop claiming; let running handlers finish until the deadline; then
   * abort the rest and release their jobs to run again without spending an attempt.
   */
  async stop(timeoutMs = this.settings.shutdownTimeoutMs): Promise<void> {
    if (this.state !== "started") return;
    this.state = "stopping";
    this.wake();
    this.transport.interrupt?.();
    await Promise.all([this.loop, ...this.services.map((s) => s.stop())]);
    const deadline = Date.now() + timeoutMs;
    while (this.running > 0 && Date.now() < deadline) {
      await new Promise<void>((resolve) => {
        this.once("slot", resolve);
        setTimeout(resolve, Math.max(0, deadline - Date.now())).unref();
      });
    }
    const unfinished = [...this.inFlight.values()].filter((e) => e.phase === "running" && !e.lostReason);
    if (unfinished.length > 0) {
      for (const e of unfinished) {
        e.lostReason = "shutdown";
        this.abortJob(e, "shutdown");
      }
      try {
        const released = await this.transport.release({
          workerId: this.id,
          jobs: unfinished.map((e) => ({ id: e.job.id, attempt: e.job.attempt })),
          reason: "released: worker shut down",
        });
        this.metrics.released.inc({ cause: "shutdown" }, released.size);
        this.logger.info({ released: released.size }, "released unfinished jobs");
      } catch (err) {
        // Their leases will expire and the watchdog will recover them.
        this.logger.warn({ err: String(err) }, "could not release unfinished jobs");
      }
    }
    // Reports still unsent after this are abandoned: their leases expire and the watchdog
    // puts the jobs through the retry path.
    this.reporter.giveUpAfter = Date.now() + SHUTDOWN_REPORT_WAIT_MS;
    await Promise.race([
      this.reporter.drain(),
      new Promise((r) => setTimeout(r, SHUTDOWN_REPORT_WAIT_MS).unref()),
    ]);
    await this.heartbeater.stop();
    await this.unsubscribe?.();
    this.state = "stopped";
    this.logger.info("worker stopped");
    this.emit("stopped");
  }

  private wake(): void {
    this.notified = true;
    this.nudge?.();
  }

  /**
   * Waits until the timeout or a nudge that `accept` takes: nudges come from notifications,
   * freed slots and stop.
   */
  private waitForNudge(timeoutMs: number, accept: () => boolean = () => true): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.nudge = undefined;
        resolve();
      };
      const timer = setTimeout(done, timeoutMs);
      this.nudge = () => {
        if (accept()) done();
      };
    });
  }

  private async claimLoop(): Promise<void> {
    let errorDelay = 100;
    while (this.state === "started") {
      // A slot frees when its handler ends, before its report commits, so claims and reports
      // overlap. But while reports hang (a half-open connection), leases pile up: count
      // jobs waiting to report beyond a second `concurrency` against the free slots.
      const reporting = this.inFlight.size - this.running;
      const free = this.settings.concurrency - this.running - Math.max(0, reporting - this.settings.concurrency);
      if (free <= 0) {
        await this.waitForNudge(this.settings.pollIntervalMs);
        continue;
      }
      const limit = Math.min(free, MAX_CLAIM_BATCH);
      this.notified = false;
      const sentAt = performance.now();
      let jobs: ClaimedJob[];
      try {
        jobs = await this.transport.claim({
          queues: this.settings.queues,
          limit,
          workerId: this.id,
          leaseMs: this.settings.leaseMs,
          tasks: this.tasks,
        });
        errorDelay = 100;
      } catch (err) {
        this.logger.warn({ err: String(err) }, "claim failed; retrying");
        this.emit("claim:error", err);
        await this.waitForNudge(errorDelay);
        errorDelay = Math.min(errorDelay * 2, CLAIM_ERROR_BACKOFF_MAX_MS);
        continue;
      }
      for (const job of jobs) this.runJob(job, sentAt);
      if (jobs.length < limit && !this.notified && this.state === "started") {
        // The queue is drained for now: sleep until a NOTIFY or the poll interval. A freed
        // slot must not wake us here: there is nothing to claim.
        this.emit("idle");
        await this.waitForNudge(this.settings.pollIntervalMs, () => this.notified || this.state !== "started");
      }
    }
  }

  private runJob(job: ClaimedJob, sentAt: number): void {
    const entry: InFlight = { job, controller: new AbortController(), renewedAt: sentAt, phase: "running" };
    const older = this.newestAttempt.get(job.id);
    if (older) {
      // This worker lost the older attempt's lease (it was too slow to beat) and has now
      // claimed the job again: the older attempt can only be refused, so stop it.
      older.lostReason = "reclaimed";
      this.abortJob(older, "reclaimed");
    }
    this.inFlight.set(attemptKey(job), entry);
    this.newestAttempt.set(job.id, entry);
    this.heartbeater.jobStarted(job.leaseMs);
    this.running++;
    this.metrics.jobsClaimed.inc({ queue: this.metrics.queueLabel(job.queue) });
    this.emit("job:start", job);
    const task = this.settings.tasks.get(job.task);
    const started = performance.now();
    const run = async () => {
      if (!task) throw new UnknownTaskError(job.task, this.tasks);
      return task.handler(job.payload, this.contextFor(entry));
    };
    run().then(
      () => this.endJob(entry, started, undefined),
      (err: unknown) => this.endJob(entry, started, err ?? new Error("handler threw a nullish value")),
    );
  }

  private forget(entry: InFlight): void {
    this.inFlight.delete(attemptKey(entry.job));
    if (this.newestAttempt.get(entry.job.id) === entry) this.newestAttempt.delete(entry.job.id);
  }

  private contextFor(entry: InFlight): JobContext {
    const { job } = entry;
    const parent = this.logger;
    let childLogger: Logger | undefined;
    return {
      jobId: job.id,
      attempt: job.attempt,
      queue: job.queue,
      task: job.task,
      spentAttempts: job.spentAttempts,
      maxAttempts: job.maxAttempts,
      signal: entry.controller.signal,
      previousCheckpoint: job.checkpoint,
      progress: (data) => {
        entry.progressJson = serializePayload(data, "", "progress");
      },
      checkpoint: (data) => {
        entry.checkpointJson = serializePayload(data, "", "checkpoint");
      },
      // Created on first use: most handlers never log, and a child logger per job measured
      // ~2 µs (docs/benchmarks.md).
      get logger() {
        return (childLogger ??= parent.child({ jobId: job.id, attempt: job.attempt, task: job.task }));
      },
    };
  }

  private abortJob(entry: InFlight, reason: AbortReason): void {
    if (entry.controller.signal.aborted) return;
    const error = new JobAbortedError(entry.job.id, entry.job.attempt, reason);
    this.metrics.leasesLost.inc({ reason });
    this.emit("job:aborted", entry.job, error);
    entry.controller.abort(error);
  }

  private async endJob(entry: InFlight, started: number, err: unknown): Promise<void> {
    const { job } = entry;
    this.metrics.jobDuration.observe({ task: job.task }, (performance.now() - started) / 1000);
    this.running--;
    this.emit("slot");
    this.nudge?.();
    if (entry.lostReason) {
      // The lease is known to be gone (or released at shutdown): a report would be refused.
      this.forget(entry);
      this.emit("job:end", job, { state: "lost", reason: entry.lostReason } satisfies JobOutcome);
      return;
    }
    entry.phase = "reporting";
    // A handler that returns after its progress was refused still fails: the job's recorded
    // state would otherwise miss what the handler reported.
    if (entry.refusedValue !== undefined && (err === undefined || err instanceof JobAbortedError)) err = new Error(entry.refusedValue);
    let outcome: ReportOutcome;
    if (err === undefined) {
      outcome = await this.reporter.succeed({ id: job.id, attempt: job.attempt });
    } else {
      const task = this.settings.tasks.get(job.task);
      outcome = await this.reporter.fail({
        id: job.id,
        attempt: job.attempt,
        error: describeError(err),
        retryDelayMs: retryDelayMs(task?.backoff ?? this.settings.backoff, job.spentAttempts),
        giveUp: err instanceof PermanentJobError,
      });
      if (!(err instanceof JobAbortedError)) this.logger.warn({ jobId: job.id, attempt: job.attempt, err: describeError(err) }, "job failed");
    }
    this.forget(entry);
    this.nudge?.(); // a report that landed may free a claim slot (see claimLoop)
    let result: JobOutcome;
    if (outcome.applied) {
      result = { state: outcome.state };
      this.metrics.jobsEnded.inc({ queue: this.metrics.queueLabel(job.queue), outcome: outcome.state === "waiting" ? "retry" : outcome.state });
    } else if ("reason" in outcome) {
      const stale = new StaleLeaseError(job.id, job.attempt, outcome.reason);
      this.metrics.staleReports.inc({ kind: err === undefined ? "complete" : "fail", reason: outcome.reason });
      this.logger.warn({ jobId: job.id, attempt: job.attempt, reason: outcome.reason }, "report refused: stale lease");
      this.emit("job:stale", job, stale);
      result = { state: "stale", error: stale };
    } else {
      // Not a fence refusal: the report could not be written. The lease will expire and
      // the watchdog will put the job through the retry path.
      this.logger.error({ jobId: job.id, err: String(outcome.error) }, "could not report job end");
      result = { state: "report_failed", error: outcome.error };
    }
    this.emit("job:end", job, result);
  }
}

function describeError(err: unknown): string {
  let text: string;
  try {
    if (err instanceof Error) text = err.stack ?? `${err.name}: ${err.message}`;
    else text = typeof err === "string" ? err : (JSON.stringify(err) ?? String(err));
  } catch {
    text = Object.prototype.toString.call(err);
  }
  // A NUL or a lone surrogate in the message would make PostgreSQL refuse the failure report.
  return sanitizeText(text, MAX_ERROR_LENGTH);
}
