/**
 * Prometheus metrics. One set per registry (memoised), so several workers, a watchdog and a
 * server in one process share counters instead of colliding on registration. docs/metrics.md
 * lists each with an example alert.
 */
import { createRequire } from "node:module";
import type * as PromClient from "prom-client";
import type { Counter, Gauge, Histogram, MetricsRegistry } from "./metric-shapes.js";

/**
 * prom-client is an optional peer dependency: an app that exports metrics has it (its own
 * registry is passed as `metricsRegistry`), and the library then records into it. Without it
 * (an app that only enqueues, a serverless function) nothing is recorded, and its install
 * stays small: prom-client brings 4.6 MB of dependencies. It is CommonJS, so it loads
 * synchronously here, with no top-level await (which would keep CommonJS apps from
 * require()-ing the library).
 */
const prom: typeof PromClient = (() => {
  try {
    return createRequire(import.meta.url)("prom-client") as typeof PromClient;
  } catch {
    return recordNothing();
  }
})();

/** Whether metrics are recorded (prom-client is installed). */
export const metricsRecorded = !(prom as { nothing?: boolean }).nothing;

/** The parts of prom-client the library uses, recording nothing. */
function recordNothing(): typeof PromClient {
  class Metric {
    labels(): this {
      return this;
    }
    inc(): void {}
    dec(): void {}
    set(): void {}
    observe(): void {}
    reset(): void {}
  }
  class NoRegistry {
    registerMetric(): void {}
    metrics(): Promise<string> {
      return Promise.resolve("");
    }
  }
  return {
    nothing: true,
    Counter: Metric,
    Gauge: Metric,
    Histogram: Metric,
    Registry: NoRegistry,
    register: new NoRegistry(),
  } as unknown as typeof PromClient;
}

/**
 * Queues get a label value each, up to this many per process; later ones are counted under
 * "other", so a producer inventing queue names cannot grow the metrics without bound.
 */
export const MAX_QUEUE_LABELS = 100;

export interface Metrics {
  registry: MetricsRegistry;
  /** The label value for a queue: its name, or "other" past MAX_QUEUE_LABELS distinct queues. */
  queueLabel(queue: string): string;
  /**
   * Counts the worker_leases gauge reads at scrape time (a set per job ran at every claim and
   * end): each worker adds a function returning the leases it holds, and removes it at stop.
   */
  leaseHolders: Set<() => number>;
  // The eight operational metrics.
  leasesHeld: Gauge;
  activeLeases: Gauge;
  claimDuration: Histogram;
  heartbeatLeases: Counter<"outcome">;
  heartbeatDuration: Histogram;
  leaseExpirations: Counter<"result">;
  recoveries: Counter<"cause">;
  fencingRejections: Counter<"kind" | "reason">;
  orphanedJobs: Gauge<"kind">;
  recoveryDelay: Histogram<"cause">;
  // Throughput and the rest.
  jobs: Gauge<"queue" | "state">;
  jobsWithoutHandler: Gauge<"queue" | "task">;
  queuesPaused: Gauge;
  queueOldestReadyAge: Gauge<"queue">;
  queuePaused: Gauge<"queue">;
  jobsEnqueued: Counter<"queue">;
  jobsClaimed: Counter<"queue">;
  jobsEnded: Counter<"queue" | "outcome">;
  jobDuration: Histogram<"task">;
  leasesLost: Counter<"reason">;
  heartbeats: Counter<"result">;
  cancelNotices: Counter;
  sessionFeatures: Gauge<"feature">;
  released: Counter<"cause">;
  orphansRepaired: Counter<"kind">;
  retentionDeleted: Counter;
  scheduledJobs: Counter;
  // NATS dispatch (docs/nats.md).
  natsPublished: Counter<"kind">;
  natsPublishFailures: Counter;
  natsMessages: Counter<"result" | "kind">;
  natsFallback: Gauge;
  natsFallbacks: Counter;
  // Durable steps (docs/durable.md).
  stepsRecorded: Counter<"kind">;
  stepsReplayed: Counter<"kind">;
  suspendedJobs: Gauge<"queue" | "kind">;
}

const cache = new WeakMap<MetricsRegistry, Metrics>();

const SECONDS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];

export function metricsFor(registry: MetricsRegistry = prom.register): Metrics {
  const existing = cache.get(registry);
  if (existing) return existing;
  // Registries come from prom-client itself (the app's, or prom.register).
  const registers = [registry as PromClient.Registry];
  const queues = new Set<string>();
  const leaseHolders = new Set<() => number>();
  const m: Metrics = {
    leaseHolders,
    registry,
    queueLabel(queue) {
      if (queues.has(queue)) return queue;
      if (queues.size >= MAX_QUEUE_LABELS) return "other";
      queues.add(queue);
      return queue;
    },
    leasesHeld: new prom.Gauge({
      name: "leasehold_worker_leases",
      help: "Leases this process's workers hold now: jobs buffered, running, or being reported.",
      registers,
      collect() {
        let n = 0;
        for (const held of leaseHolders) n += held();
        this.set(n);
      },
    }),
    activeLeases: new prom.Gauge({
      name: "leasehold_active_leases",
      help: "Running jobs in the database (each holds a lease), as the watchdog or server last counted.",
      registers,
    }),
    claimDuration: new prom.Histogram({
      name: "leasehold_lease_acquisition_seconds",
      help: "Claim round trip: from sending a claim to holding its leases.",
      buckets: SECONDS,
      registers,
    }),
    heartbeatLeases: new prom.Counter({
      name: "leasehold_heartbeat_leases_total",
      help: "Leases a heartbeat tried to renew, by outcome: renewed, lost (reaped, re-claimed, finished), cancelled (a cancel was requested), error (the beat failed).",
      labelNames: ["outcome"],
      registers,
    }),
    heartbeatDuration: new prom.Histogram({
      name: "leasehold_heartbeat_seconds",
      help: "Heartbeat round trip (one statement renews all of a worker's leases).",
      buckets: SECONDS,
      registers,
    }),
    leaseExpirations: new prom.Counter({
      name: "leasehold_lease_expirations_total",
      help: "Leases that ran out and were reaped by a watchdog, by what became of the job: retry, dead, cancelled.",
      labelNames: ["result"],
      registers,
    }),
    recoveries: new prom.Counter({
      name: "leasehold_recoveries_total",
      help: "Attempts ended and their jobs requeued (or sent to the dead letter) by recovery, by cause: lease_expired, worker_lost, stalled, timed_out, reconciliation, undelivered.",
      labelNames: ["cause"],
      registers,
    }),
    fencingRejections: new prom.Counter({
      name: "leasehold_fencing_rejections_total",
      help: "Writes refused by a fence because the attempt no longer held its lease (heartbeat, complete, fail, release, supersede) or a newer claim had written first (downstream, from ctx.fencedWrite).",
      labelNames: ["kind", "reason"],
      registers,
    }),
    orphanedJobs: new prom.Gauge({
      name: "leasehold_orphaned_jobs",
      help: "Jobs in states that should not exist, as the last scan found them, by kind (see docs/metrics.md).",
      labelNames: ["kind"],
      registers,
    }),
    recoveryDelay: new prom.Histogram({
      name: "leasehold_recovery_delay_seconds",
      help: "From an attempt's last heartbeat to its job being requeued by recovery, by cause.",
      labelNames: ["cause"],
      buckets: [0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120, 300],
      registers,
    }),
    jobs: new prom.Gauge({
      name: "leasehold_jobs",
      help: "Unfinished jobs by queue and state (waiting: ready now; scheduled: due later; running; blocked: waiting for parents), as the watchdog last counted.",
      labelNames: ["queue", "state"],
      registers,
    }),
    jobsWithoutHandler: new prom.Gauge({
      name: "leasehold_jobs_without_handler",
      help: "Waiting jobs whose task no live worker runs in their queue, as the watchdog last counted (at most 100 queue/task pairs).",
      labelNames: ["queue", "task"],
      registers,
    }),
    queuesPaused: new prom.Gauge({
      name: "leasehold_queues_paused",
      help: "Queues paused (by lh.pauseQueue, `leasehold queues pause`, the API or the dashboard), as the watchdog last counted.",
      registers,
    }),
    queueOldestReadyAge: new prom.Gauge({
      name: "leasehold_queue_oldest_ready_age_seconds",
      help: "How long the oldest ready job of each queue has been due, in seconds (0: none ready), as the watchdog last counted.",
      labelNames: ["queue"],
      registers,
    }),
    queuePaused: new prom.Gauge({
      name: "leasehold_queue_paused",
      help: "1 for a paused queue, 0 for one that is not, for every queue with jobs or settings, as the watchdog last counted.",
      labelNames: ["queue"],
      registers,
    }),
    jobsEnqueued: new prom.Counter({
      name: "leasehold_jobs_enqueued_total",
      help: "Jobs enqueued by this process.",
      labelNames: ["queue"],
      registers,
    }),
    jobsClaimed: new prom.Counter({ name: "leasehold_jobs_claimed_total", help: "Jobs claimed (leases granted).", labelNames: ["queue"], registers }),
    jobsEnded: new prom.Counter({
      name: "leasehold_job_attempts_ended_total",
      help: "Attempts ended by this process, by outcome: succeeded, retry, dead, cancelled, superseded (a ctx.fencedWrite a newer claim overtook: finished, not retried).",
      labelNames: ["queue", "outcome"],
      registers,
    }),
    jobDuration: new prom.Histogram({
      name: "leasehold_job_duration_seconds",
      help: "Handler run time.",
      labelNames: ["task"],
      buckets: [0.001, 0.01, 0.1, 0.5, 1, 5, 15, 60, 300, 1800],
      registers,
    }),
    leasesLost: new prom.Counter({
      name: "leasehold_leases_lost_total",
      help: "Handlers aborted before their end, by reason: lease lost, cancelled, renewal failed, stalled, timed out, shutdown, ...",
      labelNames: ["reason"],
      registers,
    }),
    heartbeats: new prom.Counter({
      name: "leasehold_heartbeats_total",
      help: "Heartbeat statements, by result (ok, error).",
      labelNames: ["result"],
      registers,
    }),
    sessionFeatures: new prom.Gauge({
      name: "leasehold_worker_session_features",
      help: 'What the last worker started in this process has of its database session, 1 or 0 by feature: listen (wake-ups and instant cancel by notification; 0: polling), liveness (crash detection by its lock; 0: recovery by lease expiry), name_lock (its stable name held). 0s with pooling "transaction" and no directDatabaseUrl.',
      labelNames: ["feature"],
      registers,
    }),
    cancelNotices: new prom.Counter({
      name: "leasehold_cancel_notices_total",
      help: "Cancel requests a worker heard by notice (LISTEN, or the server's cancel poll) before its next heartbeat would have told it.",
      registers,
    }),
    released: new prom.Counter({
      name: "leasehold_jobs_released_total",
      help: "Jobs given back without spending an attempt, by cause: shutdown, buffer_age and cancelled (a live worker), response_cap (a claim answer over the server's size cap).",
      labelNames: ["cause"],
      registers,
    }),
    orphansRepaired: new prom.Counter({
      name: "leasehold_orphans_repaired_total",
      help: "Jobs in states that should not exist that the watchdog repaired, by kind.",
      labelNames: ["kind"],
      registers,
    }),
    retentionDeleted: new prom.Counter({ name: "leasehold_retention_deleted_total", help: "Finished jobs forgotten by retention.", registers }),
    scheduledJobs: new prom.Counter({ name: "leasehold_scheduled_jobs_total", help: "Jobs enqueued by schedules (one per tick).", registers }),
    natsPublished: new prom.Counter({
      name: "leasehold_nats_published_total",
      help: "NATS dispatch: doorbells (job messages) JetStream stored, by kind: new (enqueued, due, retried after a failure) or recovery (back after recovery or a release).",
      labelNames: ["kind"],
      registers,
    }),
    natsPublishFailures: new prom.Counter({
      name: "leasehold_nats_publish_failures_total",
      help: "NATS dispatch: doorbells whose publish failed; each stays owed in the outbox and is published again.",
      registers,
    }),
    natsMessages: new prom.Counter({
      name: "leasehold_nats_messages_total",
      help: "NATS dispatch: messages workers received, by result (claimed; skipped: their job was claimed, finished, cancelled or had moved on; redelivered: given back to JetStream; refused: their job is of another queue or task than the consumer they came on, so not published by Leasehold) and kind (new, recovery).",
      labelNames: ["result", "kind"],
      registers,
    }),
    natsFallback: new prom.Gauge({
      name: "leasehold_nats_fallback",
      help: "NATS dispatch: workers of this process claiming from the database by polling because NATS is unavailable.",
      registers,
    }),
    natsFallbacks: new prom.Counter({
      name: "leasehold_nats_fallbacks_total",
      help: "NATS dispatch: times a worker of this process fell back to claiming from the database by polling.",
      registers,
    }),
    stepsRecorded: new prom.Counter({
      name: "leasehold_steps_recorded_total",
      help: "Durable steps recorded by this process's handlers, by kind: step, transaction, sleep, event, callback, children.",
      labelNames: ["kind"],
      registers,
    }),
    stepsReplayed: new prom.Counter({
      name: "leasehold_steps_replayed_total",
      help: "Recorded durable steps a replay returned without running them again, by kind.",
      labelNames: ["kind"],
      registers,
    }),
    suspendedJobs: new prom.Gauge({
      name: "leasehold_suspended_jobs",
      help: "Suspended durable jobs by queue and what they wait for (sleep, event, callback, children), as the watchdog last counted.",
      labelNames: ["queue", "kind"],
      registers,
    }),
  };
  cache.set(registry, m);
  return m;
}

/** A registry of its own (e.g. one per test queue, so their metrics never collide); a stand-in without prom-client. */
export function newRegistry(): MetricsRegistry {
  return new prom.Registry();
}
