/**
 * Running jobs that have run much longer than their task usually takes: a handler stuck on
 * something that never answers shows up here long before its maximum run time ends it (15
 * minutes by default). "Usually" is the task's recent successful attempts, from job_history.
 *
 * One statement. For each task with a running job it reads only that task's latest
 * RUN_TIME_SAMPLES sampled successes, newest first, through job_history_task_sample_idx
 * (migration 033): a few hundred index entries per task, however long the history is. The
 * index holds one success in eight (chosen by a hash of the id), so seven completions in eight
 * write no entry for it. A task with fewer than MIN_RUN_TIME_SAMPLES sampled successes is not
 * judged: a new task would flag everything.
 */
import type { Queryable } from "./db.js";
import { run, statement } from "./sql.js";

/** Sampled successes per task the usual run time is taken from (the newest). */
export const RUN_TIME_SAMPLES = 500;
/** Fewer sampled successes than this (about eight times as many successes): the task's usual run time is not known yet. */
export const MIN_RUN_TIME_SAMPLES = 20;
/**
 * Running long: past twice the task's p99 run time, and by at least 10 s, so that a task of a
 * few milliseconds is not flagged for a garbage-collection pause or one slow query.
 */
export const RUNNING_LONG_FACTOR = 2;
export const RUNNING_LONG_MIN_EXCESS_MS = 10_000;

const RUNNING_LONG = statement(
  "runningLongerThanUsual",
  `
WITH running AS (
  SELECT id, queue, task, attempt, locked_by, started_at,
         extract(epoch FROM now() - started_at)::float8 * 1000 AS running_ms
    FROM jobs
   WHERE state = 'running' AND ($5::text IS NULL OR queue = $5)
), usual AS (
  SELECT t.task, count(*)::int AS samples,
         percentile_cont(0.99) WITHIN GROUP (ORDER BY s.ms)::float8 AS p99_ms
    FROM (SELECT DISTINCT task FROM running) AS t
   CROSS JOIN LATERAL (
         SELECT extract(epoch FROM h.finished_at - h.started_at)::float8 * 1000 AS ms
           FROM job_history AS h
          WHERE h.task = t.task AND h.outcome = 'succeeded' AND (hashint8(h.id) & 7) = 0 AND h.started_at IS NOT NULL
          ORDER BY h.finished_at DESC
          LIMIT $1
         ) AS s
   GROUP BY t.task
  HAVING count(*) >= $2
)
SELECT r.id, r.queue, r.task, r.attempt, r.locked_by, r.started_at, r.running_ms, u.p99_ms, u.samples
  FROM running AS r
  JOIN usual AS u ON u.task = r.task
 WHERE r.running_ms > greatest(u.p99_ms * $3, u.p99_ms + $4)
 ORDER BY r.running_ms / greatest(u.p99_ms, 1) DESC, r.id
 LIMIT $6`,
  {
    id: "int8",
    queue: "text",
    task: "text",
    attempt: "int4",
    locked_by: "text",
    started_at: "timestamptz",
    running_ms: "float8",
    p99_ms: "float8",
    samples: "int4",
  },
);

export interface RunningLongJob {
  id: string;
  queue: string;
  task: string;
  attempt: number;
  workerId: string;
  startedAt: Date;
  /** How long this attempt has run (the database's clock). */
  runningMs: number;
  /** The 99th percentile run time of the task's latest successes ... */
  usualP99Ms: number;
  /** ... from this many of them. */
  samples: number;
}

/** Running jobs past RUNNING_LONG_FACTOR × their task's usual p99, the furthest past it first. */
export async function runningLongerThanUsual(db: Queryable, p: { queue?: string; limit: number }): Promise<RunningLongJob[]> {
  const rows = await run(db, RUNNING_LONG, [
    RUN_TIME_SAMPLES,
    MIN_RUN_TIME_SAMPLES,
    RUNNING_LONG_FACTOR,
    RUNNING_LONG_MIN_EXCESS_MS,
    p.queue ?? null,
    p.limit,
  ]);
  return rows.map((r) => ({
    id: r.id,
    queue: r.queue,
    task: r.task,
    attempt: r.attempt,
    workerId: r.locked_by,
    startedAt: r.started_at,
    runningMs: r.running_ms,
    usualP99Ms: r.p99_ms,
    samples: r.samples,
  }));
}
