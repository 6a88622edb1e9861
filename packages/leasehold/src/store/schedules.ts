/**
 * Schedules (periodic jobs): saved by `lh.schedule`, read by the scheduler, which locks the
 * due ones, enqueues their ticks and moves them on in one transaction (see
 * maintenance/scheduler.ts). Times come from the database (`now()`), never a worker's clock.
 */
import type { JsonValue } from "../jobs/types.js";
import type { Queryable } from "./db.js";
import { run, statement, type RowOf } from "./sql.js";

export interface ScheduleRecord {
  name: string;
  cron: string;
  timezone: string;
  task: string;
  queue: string;
  payload: JsonValue;
  jobOptions: ScheduleJobOptions;
  backfill: boolean;
  /** With backfill: the most missed ticks it enqueues (the latest); null without backfill. */
  backfillLimit: number | null;
  nextRunAt: Date;
  lastRunAt: Date | null;
  lastJobId: string | null;
  createdAt: Date;
  updatedAt: Date;
}

/** Per-job options a schedule gives each of its jobs. */
export interface ScheduleJobOptions {
  priority?: number;
  maxAttempts?: number;
  leaseMs?: number;
  progressTimeoutMs?: number;
  /** Null: no time limit. */
  maxRunMs?: number | null;
}

const SCHEDULE_COLUMNS = {
  name: "text",
  cron: "text",
  timezone: "text",
  task: "text",
  queue: "text",
  payload: "jsonb",
  job_options: "jsonb",
  backfill: "bool",
  backfill_limit: "int4?",
  next_run_at: "timestamptz",
  last_run_at: "timestamptz?",
  last_job_id: "int8?",
  created_at: "timestamptz",
  updated_at: "timestamptz",
} as const;
const SELECT_SCHEDULE = `name, cron, timezone, task, queue, payload, job_options, backfill, backfill_limit, next_run_at, last_run_at,
       last_job_id, created_at, updated_at`;

function toRecord(r: RowOf<typeof SCHEDULE_COLUMNS>): ScheduleRecord {
  return {
    name: r.name,
    cron: r.cron,
    timezone: r.timezone,
    task: r.task,
    queue: r.queue,
    payload: r.payload,
    jobOptions: r.job_options as ScheduleJobOptions,
    backfill: r.backfill,
    // A schedule saved by a release before the limit: the default one.
    backfillLimit: r.backfill ? (r.backfill_limit ?? DEFAULT_BACKFILL_LIMIT) : null,
    nextRunAt: r.next_run_at,
    lastRunAt: r.last_run_at,
    lastJobId: r.last_job_id,
    createdAt: r.created_at,
    updatedAt: r.updated_at,
  };
}

/** `backfill: true`: the latest 100 missed ticks at most. */
export const DEFAULT_BACKFILL_LIMIT = 100;
/** The most a schedule may ask to backfill (all enqueued in one scheduler run). */
export const MAX_BACKFILL_LIMIT = 1_000;

const DATABASE_NOW = statement("databaseNow", `SELECT now() AS now`, { now: "timestamptz" });

/** The database's clock: the only one schedules are computed against. */
export async function databaseNow(db: Queryable): Promise<Date> {
  const [row] = await run(db, DATABASE_NOW);
  return row!.now;
}

const UPSERT_SCHEDULE = statement(
  "upsertSchedule",
  `
INSERT INTO schedules AS s (name, cron, timezone, task, queue, payload, job_options, backfill, next_run_at, backfill_limit)
VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7::jsonb, $8, $9, $10)
ON CONFLICT (name) DO UPDATE
   SET cron = EXCLUDED.cron, timezone = EXCLUDED.timezone, task = EXCLUDED.task, queue = EXCLUDED.queue,
       payload = EXCLUDED.payload, job_options = EXCLUDED.job_options, backfill = EXCLUDED.backfill,
       backfill_limit = EXCLUDED.backfill_limit,
       -- The same pattern keeps its place (a redeploy neither skips nor repeats a tick); a new
       -- one starts from its next tick.
       next_run_at = CASE WHEN (s.cron, s.timezone) = (EXCLUDED.cron, EXCLUDED.timezone) THEN s.next_run_at
                          ELSE EXCLUDED.next_run_at END,
       updated_at = now()
RETURNING ${SELECT_SCHEDULE}, (xmax = 0) AS created`,
  { ...SCHEDULE_COLUMNS, created: "bool" },
);

export interface ScheduleInput {
  name: string;
  cron: string;
  timezone: string;
  task: string;
  queue: string;
  payloadJson: string;
  jobOptions: ScheduleJobOptions;
  backfill: boolean;
  /** With backfill: the most missed ticks enqueued after downtime; null without. */
  backfillLimit: number | null;
  /** The first tick after now, used if the schedule is new or its pattern changed. */
  firstRunAt: Date;
}

export async function upsertSchedule(db: Queryable, s: ScheduleInput): Promise<ScheduleRecord & { created: boolean }> {
  const [row] = await run(db, UPSERT_SCHEDULE, [
    s.name,
    s.cron,
    s.timezone,
    s.task,
    s.queue,
    s.payloadJson,
    JSON.stringify(s.jobOptions),
    s.backfill,
    s.firstRunAt,
    s.backfillLimit,
  ]);
  return { ...toRecord(row!), created: row!.created };
}

const DELETE_SCHEDULE = statement("deleteSchedule", `DELETE FROM schedules WHERE name = $1 RETURNING name`, { name: "text" });

export async function deleteSchedule(db: Queryable, name: string): Promise<boolean> {
  return (await run(db, DELETE_SCHEDULE, [name])).length === 1;
}

const LIST_SCHEDULES = statement("listSchedules", `SELECT ${SELECT_SCHEDULE} FROM schedules ORDER BY name`, SCHEDULE_COLUMNS);

export async function listSchedules(db: Queryable): Promise<ScheduleRecord[]> {
  return (await run(db, LIST_SCHEDULES)).map(toRecord);
}

const NEXT_DUE = statement("nextScheduleDue", `SELECT (extract(epoch FROM min(next_run_at) - now()) * 1000)::float8 AS due_in_ms FROM schedules`, {
  due_in_ms: "float8?",
});

/**
 * One cheap probe (an index's first entry): milliseconds until the earliest tick is due
 * (zero or less: due now), or null with no schedules. The transaction only when something is due.
 */
export async function nextScheduleDue(db: Queryable): Promise<number | null> {
  const [row] = await run(db, NEXT_DUE);
  return row!.due_in_ms;
}

const LOCK_DUE = statement(
  "lockDueSchedules",
  `
SELECT ${SELECT_SCHEDULE}, now() AS db_now
  FROM schedules
 WHERE next_run_at <= now()
 ORDER BY next_run_at
 LIMIT $1
   FOR UPDATE SKIP LOCKED`,
  { ...SCHEDULE_COLUMNS, db_now: "timestamptz" },
);

/** Due schedules, locked until the caller's transaction ends (others skip them meanwhile). */
export async function lockDueSchedules(db: Queryable, limit: number): Promise<{ schedules: ScheduleRecord[]; now: Date }> {
  const rows = await run(db, LOCK_DUE, [limit]);
  return { schedules: rows.map(toRecord), now: rows[0]?.db_now ?? new Date(0) };
}

const ADVANCE = statement(
  "advanceSchedules",
  `
UPDATE schedules AS s
   SET next_run_at = a.next_run_at, last_run_at = coalesce(a.last_run_at, s.last_run_at),
       last_job_id = coalesce(a.last_job_id, s.last_job_id)
  FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[], $4::bigint[]) AS a(name, next_run_at, last_run_at, last_job_id)
 WHERE s.name = a.name`,
  {},
);

export interface ScheduleAdvance {
  name: string;
  nextRunAt: Date;
  lastRunAt: Date | null;
  lastJobId: string | null;
}

export async function advanceSchedules(db: Queryable, advances: ScheduleAdvance[]): Promise<void> {
  if (advances.length === 0) return;
  await run(db, ADVANCE, [
    advances.map((a) => a.name),
    advances.map((a) => a.nextRunAt),
    advances.map((a) => a.lastRunAt),
    advances.map((a) => a.lastJobId),
  ]);
}
