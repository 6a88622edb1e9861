/**
 * What a live view of the queue reads every few seconds (the dashboard, `leasehold jobs
 * watch`). Each statement reads the hot table (unfinished jobs), the dead letter, the
 * workers, or the rare rows recoveries and refusals leave, through indexes on their times:
 * never the history of finished jobs, which at 40,000 jobs/s grows by ~140M rows an hour.
 * Ages and time left are computed with the database's clock, like the leases themselves.
 */
import type { JsonValue } from "../jobs/types.js";
import type { Queryable } from "./db.js";
import { run, statement } from "./sql.js";

/**
 * Per queue: jobs ready to run (waiting), waiting for a later time (scheduled: delayed or
 * backing off), blocked, suspended (durable jobs asleep or waiting for an event), running (and of
 * those, with a lease run out that no watchdog has reaped yet),
 * dead; and how long the oldest ready job has waited. One pass over the unfinished jobs.
 */
const QUEUE_OVERVIEW = statement(
  "queueOverview",
  `
SELECT queue, sum(waiting)::int AS waiting, sum(scheduled)::int AS scheduled, sum(blocked)::int AS blocked,
       sum(suspended)::int AS suspended, sum(running)::int AS running, sum(expired)::int AS expired, sum(dead)::int AS dead,
       max(oldest_waiting_ms)::float8 AS oldest_waiting_ms
  FROM (
    SELECT queue,
           count(*) FILTER (WHERE state = 'waiting' AND run_at <= now()) AS waiting,
           count(*) FILTER (WHERE state = 'waiting' AND run_at > now()) AS scheduled,
           count(*) FILTER (WHERE state = 'blocked') AS blocked,
           count(*) FILTER (WHERE state = 'suspended') AS suspended,
           count(*) FILTER (WHERE state = 'running') AS running,
           count(*) FILTER (WHERE state = 'running' AND lease_until < now()) AS expired,
           0 AS dead,
           extract(epoch FROM now() - min(run_at) FILTER (WHERE state = 'waiting' AND run_at <= now())) * 1000 AS oldest_waiting_ms
      FROM jobs GROUP BY queue
    UNION ALL
    SELECT queue, 0, 0, 0, 0, 0, 0, count(*), NULL FROM dead_jobs GROUP BY queue
  ) AS q
 GROUP BY queue
 ORDER BY queue`,
  {
    queue: "text",
    waiting: "int4",
    scheduled: "int4",
    blocked: "int4",
    suspended: "int4",
    running: "int4",
    expired: "int4",
    dead: "int4",
    oldest_waiting_ms: "float8?",
  },
);

export interface QueueOverview {
  queue: string;
  waiting: number;
  scheduled: number;
  /** Waiting for their parents (docs/flows.md): no claim takes them until those have ended. */
  blocked: number;
  /** Durable jobs sleeping or waiting for an event (docs/durable.md): no claim takes them until woken. */
  suspended: number;
  running: number;
  /** Running jobs whose lease ran out, not yet reaped. */
  expired: number;
  dead: number;
  /** How long the oldest job ready to run has waited; null when none is ready. */
  oldestWaitingMs: number | null;
}

export async function queueOverview(db: Queryable): Promise<QueueOverview[]> {
  const rows = await run(db, QUEUE_OVERVIEW);
  return rows.map(({ oldest_waiting_ms, ...counts }) => ({ ...counts, oldestWaitingMs: oldest_waiting_ms }));
}

/** Most processes a live view lists (a fleet larger than this is summarised by its counts). */
export const MAX_LISTED_PROCESSES = 500;

const LIVE_PROCESSES = statement(
  "liveProcesses",
  `
SELECT id, name, kind, host, pid, queues, tasks, concurrency, in_flight, lease_ms, heartbeat_ms,
       extract(epoch FROM now() - last_seen_at)::float8 * 1000 AS last_seen_ms_ago,
       extract(epoch FROM now() - started_at)::float8 * 1000 AS up_ms,
       lost_at IS NOT NULL AS lost
  FROM workers
 WHERE stopped_at IS NULL
   -- Lost (its session went): listed for an hour, with its jobs' recovery. Silent with no such
   -- mark (killed, with no liveness lock, or cut off): listed as silent for ten minutes, then dropped.
   AND (lost_at > now() - interval '1 hour' OR (lost_at IS NULL AND last_seen_at > now() - interval '10 minutes'))
 ORDER BY kind DESC, id
 LIMIT $1`,
  {
    id: "text",
    name: "text?",
    kind: "text",
    host: "text?",
    pid: "int4?",
    queues: "_text",
    tasks: "_text",
    concurrency: "int4?",
    in_flight: "int4",
    lease_ms: "int4?",
    heartbeat_ms: "int4?",
    last_seen_ms_ago: "float8",
    up_ms: "float8",
    lost: "bool",
  },
);

export interface ProcessRecord {
  id: string;
  name: string | null;
  kind: "worker" | "watchdog";
  host: string | null;
  pid: number | null;
  queues: string[];
  tasks: string[];
  concurrency: number | null;
  inFlight: number;
  leaseMs: number | null;
  heartbeatMs: number | null;
  /** Since its last beat (a worker) or run (a watchdog). */
  lastSeenMsAgo: number;
  upMs: number;
  /** Its liveness lock is gone: the process died (its jobs are being recovered). */
  lost: boolean;
}

/** Workers and watchdogs seen in the last hour and not stopped, workers first. */
export async function liveProcesses(db: Queryable): Promise<ProcessRecord[]> {
  const rows = await run(db, LIVE_PROCESSES, [MAX_LISTED_PROCESSES]);
  return rows.map((r) => ({
    id: r.id,
    name: r.name,
    kind: r.kind as ProcessRecord["kind"],
    host: r.host,
    pid: r.pid,
    queues: r.queues,
    tasks: r.tasks,
    concurrency: r.concurrency,
    inFlight: r.in_flight,
    leaseMs: r.lease_ms,
    heartbeatMs: r.heartbeat_ms,
    lastSeenMsAgo: r.last_seen_ms_ago,
    upMs: r.up_ms,
    lost: r.lost,
  }));
}

/** A progress value larger than this is not sent in lists (it may be up to 1 MiB); a job's own page has it. */
export const LISTED_PROGRESS_BYTES = 2_048;

const RUNNING_JOBS = statement(
  "runningJobs",
  `
SELECT id, queue, task, attempt, spent_attempts, max_attempts, locked_by, started_at, heartbeat_at,
       extract(epoch FROM now() - started_at)::float8 * 1000 AS running_ms,
       extract(epoch FROM now() - heartbeat_at)::float8 * 1000 AS heartbeat_ms_ago,
       extract(epoch FROM lease_until - now())::float8 * 1000 AS lease_left_ms,
       CASE WHEN octet_length(progress::text) <= $3 THEN progress END AS progress,
       coalesce(octet_length(progress::text) > $3, false) AS progress_too_large,
       cancel_requested_at IS NOT NULL AS cancel_requested
  FROM jobs
 WHERE state = 'running' AND ($1::text IS NULL OR queue = $1)
 ORDER BY started_at, id
 LIMIT $2`,
  {
    id: "int8",
    queue: "text",
    task: "text",
    attempt: "int4",
    spent_attempts: "int4",
    max_attempts: "int4",
    locked_by: "text",
    started_at: "timestamptz",
    heartbeat_at: "timestamptz",
    running_ms: "float8",
    heartbeat_ms_ago: "float8",
    lease_left_ms: "float8",
    progress: "jsonb?",
    progress_too_large: "bool",
    cancel_requested: "bool",
  },
);

export interface RunningJob {
  id: string;
  queue: string;
  task: string;
  attempt: number;
  spentAttempts: number;
  maxAttempts: number;
  workerId: string;
  startedAt: Date;
  heartbeatAt: Date;
  runningMs: number;
  heartbeatMsAgo: number;
  /** Negative: the lease ran out and the watchdog has not reaped it yet. */
  leaseLeftMs: number;
  progress: JsonValue | null;
  /** The progress is larger than LISTED_PROGRESS_BYTES and left out. */
  progressTooLarge: boolean;
  cancelRequested: boolean;
}

/** Running jobs, longest running first. */
export async function runningJobs(db: Queryable, p: { queue?: string; limit: number }): Promise<RunningJob[]> {
  const rows = await run(db, RUNNING_JOBS, [p.queue ?? null, p.limit, LISTED_PROGRESS_BYTES]);
  return rows.map((r) => ({
    id: r.id,
    queue: r.queue,
    task: r.task,
    attempt: r.attempt,
    spentAttempts: r.spent_attempts,
    maxAttempts: r.max_attempts,
    workerId: r.locked_by,
    startedAt: r.started_at,
    heartbeatAt: r.heartbeat_at,
    runningMs: r.running_ms,
    heartbeatMsAgo: r.heartbeat_ms_ago,
    leaseLeftMs: r.lease_left_ms,
    progress: r.progress,
    progressTooLarge: r.progress_too_large,
    cancelRequested: r.cancel_requested,
  }));
}

/**
 * What the lease machinery absorbed: attempts it ended (outcomes lease_expired, worker_lost,
 * stalled, timed_out), attempts live workers gave back (released), and heartbeats and reports
 * the fence refused. Audit rows come through their partial index (job_attempts_recovered_idx);
 * final attempts that went dead through dead_jobs' finished_at index; refusals through theirs.
 * The outcome lists must stay those of the partial index for the planner to use it.
 */
const EVENTS = `
  SELECT ended_at AS at, outcome AS event, job_id, attempt, worker_id, error AS detail, false AS went_dead, NULL AS via
    FROM job_attempts
   WHERE ended_at >= now() - $1::bigint * interval '1 millisecond'
     AND outcome IN ('lease_expired', 'worker_lost', 'stalled', 'timed_out', 'released')
  UNION ALL
  SELECT finished_at, outcome, id, attempt, worker_id, last_error, true, NULL
    FROM dead_jobs
   WHERE finished_at >= now() - $1::bigint * interval '1 millisecond'
     AND outcome IN ('lease_expired', 'worker_lost', 'stalled', 'timed_out')
  UNION ALL
  SELECT at, 'refused', job_id, attempt, worker_id, kind || ' refused: ' || reason, false, via
    FROM stale_refusals
   WHERE at >= now() - $1::bigint * interval '1 millisecond'`;

export type RecoveryEventKind = "lease_expired" | "worker_lost" | "stalled" | "timed_out" | "released" | "refused";
export const RECOVERY_EVENT_KINDS: readonly RecoveryEventKind[] = ["lease_expired", "worker_lost", "stalled", "timed_out", "released", "refused"];

const RECOVERY_SERIES = statement(
  "recoverySeries",
  `
SELECT to_timestamp(floor(extract(epoch FROM at) / 60) * 60) AS minute, event, count(*)::int AS count
  FROM (${EVENTS}) AS e
 GROUP BY 1, 2
 ORDER BY 1, 2`,
  { minute: "timestamptz", event: "text", count: "int4" },
);

export interface RecoveryCounts {
  minute: Date;
  counts: Partial<Record<RecoveryEventKind, number>>;
}

/** Events per minute over the last `windowMs`, for the minutes that had any. */
export async function recoverySeries(db: Queryable, p: { windowMs: number }): Promise<RecoveryCounts[]> {
  const rows = await run(db, RECOVERY_SERIES, [p.windowMs]);
  const byMinute = new Map<number, RecoveryCounts>();
  for (const r of rows) {
    const key = r.minute.getTime();
    let entry = byMinute.get(key);
    if (!entry) byMinute.set(key, (entry = { minute: r.minute, counts: {} }));
    entry.counts[r.event as RecoveryEventKind] = r.count;
  }
  return [...byMinute.values()];
}

const RECENT_RECOVERIES = statement(
  "recentRecoveries",
  `
SELECT e.at, e.event, e.job_id, e.attempt, e.worker_id, e.detail, e.went_dead, e.via, t.queue, t.task
  FROM (${EVENTS}) AS e
  LEFT JOIN LATERAL (
    SELECT queue, task FROM jobs WHERE id = e.job_id
    UNION ALL
    SELECT queue, task FROM finished_jobs WHERE id = e.job_id
    LIMIT 1
  ) AS t ON true
 ORDER BY e.at DESC
 LIMIT $2`,
  {
    at: "timestamptz",
    event: "text",
    job_id: "int8",
    attempt: "int4",
    worker_id: "text",
    detail: "text?",
    went_dead: "bool",
    via: "text?",
    queue: "text?",
    task: "text?",
  },
);

export interface RecoveryEvent {
  at: Date;
  event: RecoveryEventKind;
  jobId: string;
  attempt: number;
  workerId: string;
  /** The error the attempt ended with, or what was refused and why. */
  detail: string | null;
  /** The recovery spent the job's last attempt: it is in the dead letter. */
  wentDead: boolean;
  /** A refusal: refused by a worker on the database, or by the server for a remote worker. */
  via: "database" | "server" | null;
  /** Null when the job no longer exists (retention removed it). */
  queue: string | null;
  task: string | null;
}

/** The newest `limit` events of the last `windowMs`. */
export async function recentRecoveries(db: Queryable, p: { windowMs: number; limit: number }): Promise<RecoveryEvent[]> {
  const rows = await run(db, RECENT_RECOVERIES, [p.windowMs, p.limit]);
  return rows.map((r) => ({
    at: r.at,
    event: r.event as RecoveryEventKind,
    jobId: r.job_id,
    attempt: r.attempt,
    workerId: r.worker_id,
    detail: r.detail,
    wentDead: r.went_dead,
    via: r.via as RecoveryEvent["via"],
    queue: r.queue,
    task: r.task,
  }));
}
