/**
 * Prometheus metrics. One set per registry (memoised), so several workers, a watchdog and
 * a server in one process share counters instead of colliding on registration.
 */
import { Counter, Histogram, Registry, register as globalRegistry } from "prom-client";

/**
 * Queues get a label value each, up to this many per process; later ones are counted under
 * "other", so a producer inventing queue names cannot grow the metrics without bound.
 */
export const MAX_QUEUE_LABELS = 100;

export interface Metrics {
  registry: Registry;
  /** The label value for a queue: its name, or "other" past MAX_QUEUE_LABELS distinct queues. */
  queueLabel(queue: string): string;
  jobsClaimed: Counter<"queue">;
  jobsEnded: Counter<"queue" | "outcome">;
  staleReports: Counter<"kind" | "reason">;
  leasesLost: Counter<"reason">;
  heartbeats: Counter<"result">;
  jobDuration: Histogram<"task">;
  reaped: Counter<"result">;
  retentionDeleted: Counter;
  released: Counter<"cause">;
}

const cache = new WeakMap<Registry, Metrics>();

export function metricsFor(registry: Registry = globalRegistry): Metrics {
  const existing = cache.get(registry);
  if (existing) return existing;
  const registers = [registry];
  const queues = new Set<string>();
  const m: Metrics = {
    registry,
    queueLabel(queue) {
      if (queues.has(queue)) return queue;
      if (queues.size >= MAX_QUEUE_LABELS) return "other";
      queues.add(queue);
      return queue;
    },
    jobsClaimed: new Counter({ name: "leasehold_jobs_claimed_total", help: "Jobs claimed (leases granted).", labelNames: ["queue"], registers }),
    jobsEnded: new Counter({
      name: "leasehold_job_attempts_ended_total",
      help: "Attempts ended by this process, by outcome: succeeded, retry, dead, cancelled.",
      labelNames: ["queue", "outcome"],
      registers,
    }),
    staleReports: new Counter({
      name: "leasehold_stale_reports_total",
      help: "Heartbeats, completions and failures refused by the fence because the attempt no longer held the lease.",
      labelNames: ["kind", "reason"],
      registers,
    }),
    leasesLost: new Counter({
      name: "leasehold_leases_lost_total",
      help: "Handlers aborted because their lease was lost, cancelled, or could not be renewed in time.",
      labelNames: ["reason"],
      registers,
    }),
    heartbeats: new Counter({ name: "leasehold_heartbeats_total", help: "Heartbeat statements, by result (ok, error).", labelNames: ["result"], registers }),
    jobDuration: new Histogram({
      name: "leasehold_job_duration_seconds",
      help: "Handler run time.",
      labelNames: ["task"],
      buckets: [0.001, 0.01, 0.1, 0.5, 1, 5, 15, 60, 300, 1800],
      registers,
    }),
    reaped: new Counter({
      name: "leasehold_watchdog_reaped_total",
      help: "Expired leases reaped by the watchdog (rescues), by what became of the job: retry, dead, cancelled.",
      labelNames: ["result"],
      registers,
    }),
    retentionDeleted: new Counter({ name: "leasehold_retention_deleted_total", help: "Finished jobs deleted by retention.", registers }),
    released: new Counter({
      name: "leasehold_jobs_released_total",
      help: "Jobs given back without spending an attempt, by cause (shutdown, reconciliation, response_cap).",
      labelNames: ["cause"],
      registers,
    }),
  };
  cache.set(registry, m);
  return m;
}
