/**
 * What readers see of a durable job (docs/api.md, getJob): its recorded steps,
 * bounded, and what a suspended job waits for. The worker's replay reads steps through
 * store/steps.ts; this module is for `getJob`, `leasehold jobs show`, the API and the dashboard.
 */
import type { Queryable } from "./db.js";
import { run, statement } from "./sql.js";
import type { JsonValue } from "../jobs/types.js";
import type { StepKind, StepState } from "../jobs/steps.js";

/** A job's steps listed at most this many: the latest (a job may record 1,000). */
export const MAX_LISTED_STEPS = 100;
/** Listed steps' results shown up to this many bytes of JSON in all (a result may be 256 KiB). */
export const MAX_LISTED_STEP_RESULT_BYTES = 1024 * 1024;

/** A recorded step as readers see it. */
export interface JobStep {
  seq: number;
  name: string;
  occurrence: number;
  kind: StepKind;
  state: StepState;
  /** The attempt that recorded it. */
  attempt: number;
  durationMs: number | null;
  /** Its result's size as JSON; null when it returned undefined (or has no result yet). */
  resultBytes: number | null;
  /**
   * Its result, when shown: absent when the step has none, when the listed results passed
   * MAX_LISTED_STEP_RESULT_BYTES, or where payloads are hidden.
   */
  result?: JsonValue;
  error: string | null;
  /** A sleep's end, a wait's deadline. */
  wakeAt: Date | null;
  /** The event a wait is for. */
  event: string | null;
  recordedAt: Date;
}

/** Why a suspended job waits (the job's `wait`, written by its suspension). */
export interface JobWait {
  kind: "sleep" | "event" | "callback" | "children";
  /** The step (ctx.sleep or ctx.waitForEvent name) that suspended it. */
  step: string;
  /** When it wakes anyway: a sleep's end, a wait's deadline. */
  until: Date | null;
  event: string | null;
  /** What the event's data must contain; null: any. */
  match: JsonValue | null;
}

export interface JobSteps {
  /** The latest MAX_LISTED_STEPS recorded steps, in the order the handler called them. */
  steps: JobStep[];
  /** How many steps the job recorded in all. */
  stepCount: number;
  /** A suspended job's wait; null for a job in any other state. */
  wait: JobWait | null;
}

/**
 * The latest $2 steps, with each result's size; results themselves while their running sum
 * (oldest listed first) stays within $3 bytes, so a page of large results stays bounded.
 */
const LIST_STEPS = statement(
  "listJobSteps",
  `
WITH latest AS (
  SELECT s.*, octet_length(s.result::text) AS result_bytes, count(*) OVER () AS total
    FROM job_steps AS s WHERE s.job_id = $1 ORDER BY s.seq DESC LIMIT $2
)
SELECT seq, name, occurrence, kind, state, attempt, duration_ms, result_bytes, error, wake_at, event, recorded_at, total::int AS total,
       CASE WHEN sum(coalesce(result_bytes, 0)) OVER (ORDER BY seq) <= $3 THEN result::text END AS result_json
  FROM latest
 ORDER BY seq`,
  {
    seq: "int4",
    name: "text",
    occurrence: "int4",
    kind: "text",
    state: "text",
    attempt: "int4",
    duration_ms: "int4?",
    result_bytes: "int4?",
    error: "text?",
    wake_at: "timestamptz?",
    event: "text?",
    recorded_at: "timestamptz",
    total: "int4",
    result_json: "text?",
  },
);

const JOB_WAIT = statement("jobWait", `SELECT wait FROM jobs WHERE id = $1 AND state = 'suspended'`, { wait: "jsonb?" });

/** A job's latest steps and, if it is suspended, its wait (read in the caller's snapshot). */
export async function getJobSteps(db: Queryable, id: string): Promise<JobSteps> {
  const rows = await run(db, LIST_STEPS, [id, MAX_LISTED_STEPS, MAX_LISTED_STEP_RESULT_BYTES]);
  const [waitRow] = await run(db, JOB_WAIT, [id]);
  return {
    steps: rows.map((r) => {
      const step: JobStep = {
        seq: r.seq,
        name: r.name,
        occurrence: r.occurrence,
        kind: r.kind as StepKind,
        state: r.state as StepState,
        attempt: r.attempt,
        durationMs: r.duration_ms,
        resultBytes: r.result_bytes,
        error: r.error,
        wakeAt: r.wake_at,
        event: r.event,
        recordedAt: r.recorded_at,
      };
      if (r.result_json !== null) step.result = JSON.parse(r.result_json) as JsonValue;
      return step;
    }),
    stepCount: rows[0]?.total ?? 0,
    wait: waitRow?.wait ? toWait(waitRow.wait as Record<string, JsonValue>) : null,
  };
}

function toWait(w: Record<string, JsonValue>): JobWait {
  return {
    kind: w.kind as JobWait["kind"],
    step: String(w.step),
    until: typeof w.until === "string" ? new Date(w.until) : null,
    event: typeof w.event === "string" ? w.event : null,
    match: w.match === undefined ? null : w.match,
  };
}
