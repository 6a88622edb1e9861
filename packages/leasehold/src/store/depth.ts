/**
 * Queue depth (the queue_depth view, migrations 016 and 017): per queue, what an autoscaler scales on
 * (docs/deployment.md#autoscaling). One statement; the watchdog's gauges read it too.
 */
import type { Queryable } from "./db.js";
import { run, statement } from "./sql.js";

const QUEUE_DEPTH = statement(
  "queueDepth",
  `
SELECT queue, paused, ready::int AS ready, oldest_ready_age_seconds, running::int AS running,
       delayed::int AS delayed, blocked::int AS blocked, concurrency_limit, limited, suspended::int AS suspended
  FROM queue_depth
 ORDER BY queue`,
  {
    queue: "text",
    paused: "bool",
    ready: "int4",
    oldest_ready_age_seconds: "float8",
    running: "int4",
    delayed: "int4",
    blocked: "int4",
    concurrency_limit: "int4?",
    limited: "bool",
    suspended: "int4",
  },
);

/** One queue's depth, as the database counts it now. */
export interface QueueDepth {
  queue: string;
  /** Paused: its ready jobs wait however many workers run (leave them out when scaling). */
  paused: boolean;
  /** Waiting jobs due now: what more workers would start. */
  ready: number;
  /** How long the longest-waiting ready job has been due, in seconds; 0 when none is ready. */
  oldestReadyAgeSeconds: number;
  /** Jobs holding a lease: running, or buffered by a worker. */
  running: number;
  /** Waiting jobs not yet due (a delay, a run time, a retry's backoff). */
  delayed: number;
  /** Jobs waiting for their parents (docs/flows.md). */
  blocked: number;
  /** Durable jobs sleeping or waiting for an event (docs/durable.md): they hold no worker and wake by themselves. */
  suspended: number;
  /** The queue's fleet-wide concurrency limit: no more of its jobs run at once; null: none. */
  concurrencyLimit: number | null;
  /**
   * A start rate, a per-key limit or a handler's hold applies: ready jobs may wait however many
   * workers run, so more workers help only as far as the limit lets jobs start.
   */
  limited: boolean;
}

/**
 * Suspended jobs per queue by what they wait for (their wait's kind: sleep, event, callback,
 * children). Only suspended jobs are in jobs_wake_idx, so this reads them alone.
 */
const SUSPENDED_BY_KIND = statement(
  "suspendedByKind",
  `
SELECT queue, coalesce(wait ->> 'kind', 'unknown') AS kind, count(*)::int AS n
  FROM jobs WHERE state = 'suspended'
 GROUP BY 1, 2
 ORDER BY 1, 2`,
  { queue: "text", kind: "text", n: "int4" },
);

export async function suspendedByKind(db: Queryable): Promise<{ queue: string; kind: string; n: number }[]> {
  return run(db, SUSPENDED_BY_KIND);
}

/** Every queue with unfinished jobs or settings, by name. */
export async function queueDepth(db: Queryable): Promise<QueueDepth[]> {
  return (await run(db, QUEUE_DEPTH)).map((r) => ({
    queue: r.queue,
    paused: r.paused,
    ready: r.ready,
    oldestReadyAgeSeconds: r.oldest_ready_age_seconds,
    running: r.running,
    delayed: r.delayed,
    blocked: r.blocked,
    suspended: r.suspended,
    concurrencyLimit: r.concurrency_limit,
    limited: r.limited,
  }));
}
