/**
 * Schedules as users write them: validation (the cron pattern through croner, the time zone
 * through Intl, the jobs' options through the same checks as enqueue) and the tick
 * arithmetic the scheduler needs. Patterns have five fields, or six with seconds first; croner
 * also takes nicknames (@hourly, @daily, ...), L, W and #.
 */
import { Cron } from "croner";
import { ValidationError } from "../errors.js";
import { DEFAULT_BACKFILL_LIMIT, MAX_BACKFILL_LIMIT, type ScheduleInput, type ScheduleJobOptions } from "../store/schedules.js";
import { checkName, describeValue, normalizeJob, suggest } from "./validate.js";

export interface ScheduleDefinition {
  /** Unique per schedule: saving a schedule of the same name updates it. */
  name: string;
  /** `* * * * *` (minute hour day month weekday), or with seconds first: `*\/10 * * * * *`. */
  cron: string;
  task: string;
  payload?: unknown;
  queue?: string;
  /** An IANA time zone ("Europe/Paris"); default UTC. */
  timezone?: string;
  /**
   * After downtime: enqueue only the latest missed tick (false, the default), or the latest
   * missed ticks up to a limit: true for 100, or a number from 1 to 1000. Older ones are skipped.
   */
  backfill?: boolean | number;
  priority?: number;
  maxAttempts?: number;
  leaseMs?: number;
  progressTimeoutMs?: number;
  /** `null`: the schedule's jobs run without a time limit (see EnqueueOptions.maxRunMs). */
  maxRunMs?: number | null;
}

const SCHEDULE_KEYS = new Set([
  "name",
  "cron",
  "task",
  "payload",
  "queue",
  "timezone",
  "backfill",
  "priority",
  "maxAttempts",
  "leaseMs",
  "progressTimeoutMs",
  "maxRunMs",
]);
const JOB_OPTION_KEYS = ["priority", "maxAttempts", "leaseMs", "progressTimeoutMs", "maxRunMs"] as const;

/** A pattern ready for tick arithmetic; throws ValidationError naming what is wrong. */
export function parseCron(pattern: unknown, timezone = "UTC", what = "cron"): Cron {
  if (typeof pattern !== "string" || pattern.trim() === "" || pattern.length > 256) {
    throw new ValidationError(`${what} must be a cron pattern such as "*/5 * * * *" (got ${describeValue(pattern)})`);
  }
  checkTimeZone(timezone);
  try {
    return new Cron(pattern, { timezone, paused: true });
  } catch (err) {
    throw new ValidationError(`${what} ${describeValue(pattern)} is not a valid cron pattern: ${(err as Error).message}`);
  }
}

function checkTimeZone(timezone: unknown): asserts timezone is string {
  try {
    if (typeof timezone !== "string" || timezone === "") throw new RangeError();
    new Intl.DateTimeFormat("en-US", { timeZone: timezone });
  } catch {
    throw new ValidationError(`timezone must be an IANA time zone such as "Europe/Paris" or "UTC" (got ${describeValue(timezone)})`);
  }
}

/** The first tick strictly after `after`, or null if the pattern has no more. */
export function nextTick(cron: Cron, after: Date): Date | null {
  return cron.nextRun(after);
}

/**
 * The latest tick in [from, now], or null if there is none. Found by widening a window back
 * from `now` (1 s, 2 s, 4 s, ...) until it holds a tick: a handful of steps for any period,
 * where walking tick by tick from `from` could take millions after long downtime.
 */
export function latestTick(cron: Cron, from: Date, now: Date): Date | null {
  if (from.getTime() > now.getTime()) return null;
  for (let width = 1_000; ; width *= 2) {
    const start = Math.max(from.getTime() - 1, now.getTime() - width);
    let tick = cron.nextRun(new Date(start));
    if (tick && tick.getTime() <= now.getTime()) {
      for (let next = cron.nextRun(tick); next && next.getTime() <= now.getTime(); next = cron.nextRun(next)) tick = next;
      return tick;
    }
    if (start <= from.getTime() - 1) return null;
  }
}

/** Checks a definition as `lh.schedule` receives it; the first tick is computed later, on the database's clock. */
export function normalizeSchedule(def: ScheduleDefinition): Omit<ScheduleInput, "firstRunAt"> & { parsed: Cron } {
  if (def === null || typeof def !== "object") throw new ValidationError("a schedule must be an object with a name, a cron pattern and a task");
  for (const key of Object.keys(def)) {
    if (!SCHEDULE_KEYS.has(key)) throw new ValidationError(`schedule: unknown option "${key}"${suggest(key, SCHEDULE_KEYS)}`);
  }
  checkName(def.name, "schedule name");
  const where = `schedule ${def.name}`;
  const timezone = def.timezone ?? "UTC";
  const parsed = parseCron(def.cron, timezone, `${where}: cron`);
  const backfillLimit = backfillLimitOf(def.backfill, where);
  const job = normalizeJob(
    {
      task: def.task,
      payload: def.payload,
      queue: def.queue,
      priority: def.priority,
      maxAttempts: def.maxAttempts,
      leaseMs: def.leaseMs,
      progressTimeoutMs: def.progressTimeoutMs,
      maxRunMs: def.maxRunMs,
    },
    where,
  );
  const jobOptions: ScheduleJobOptions = {};
  for (const key of JOB_OPTION_KEYS) if (def[key] !== undefined) Object.assign(jobOptions, { [key]: def[key] });
  return {
    name: def.name,
    cron: def.cron,
    timezone,
    task: job.task,
    queue: job.queue,
    payloadJson: job.payloadJson,
    jobOptions,
    backfill: backfillLimit !== null,
    backfillLimit,
    parsed,
  };
}

/** A schedule's `backfill` as the most missed ticks it enqueues, or null for none but the latest. */
function backfillLimitOf(backfill: unknown, where: string): number | null {
  if (backfill === undefined || backfill === false) return null;
  if (backfill === true) return DEFAULT_BACKFILL_LIMIT;
  if (typeof backfill !== "number" || !Number.isInteger(backfill) || backfill < 1 || backfill > MAX_BACKFILL_LIMIT) {
    throw new ValidationError(
      `${where}: backfill must be true (at most ${DEFAULT_BACKFILL_LIMIT} missed ticks), false, or the most missed ticks to enqueue, ` +
        `an integer from 1 to ${MAX_BACKFILL_LIMIT} (got ${describeValue(backfill)})`,
    );
  }
  return backfill;
}
