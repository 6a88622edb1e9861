/**
 * Re-running a finished durable job from a named step (docs/durable-callbacks.md#re-run-from-a-step): the
 * job goes back to waiting with a fresh retry budget, the records before the step stay (its
 * next attempt replays them), and the step's record and those after it move into job_reruns,
 * the audit trail, with who asked and when. One statement: all of it or nothing.
 */
import { FINISHED_COLUMNS, REVIVE } from "./admin.js";
import type { Queryable } from "./db.js";
import { run, statement } from "./sql.js";
import type { JsonValue } from "../jobs/types.js";

const RERUN_FROM_STEP = statement(
  "rerunFromStep",
  `
WITH target AS (
  SELECT min(s.seq) AS seq FROM job_steps AS s WHERE s.job_id = $1 AND s.name = $2 AND s.occurrence = $3 HAVING min(s.seq) IS NOT NULL
), dead AS (
  DELETE FROM dead_jobs WHERE id = $1 AND EXISTS (SELECT 1 FROM target) RETURNING ${FINISHED_COLUMNS}
), finished AS (
  DELETE FROM job_history WHERE id = $1 AND state IN ('succeeded', 'cancelled') AND EXISTS (SELECT 1 FROM target) RETURNING ${FINISHED_COLUMNS}
), revived AS (
  SELECT * FROM dead UNION ALL SELECT * FROM finished
), dropped AS (
  DELETE FROM job_steps AS s USING target AS t
   WHERE s.job_id = $1 AND s.seq >= t.seq AND EXISTS (SELECT 1 FROM revived)
  RETURNING s.*
), audit AS (
  INSERT INTO job_reruns (job_id, from_seq, from_step, from_occurrence, previous_state, requested_by, steps_dropped)
  SELECT $1, t.seq, $2, $3, r.state, $4,
         coalesce((SELECT jsonb_agg(to_jsonb(d) - 'job_id' ORDER BY d.seq) FROM dropped AS d), '[]'::jsonb)
    FROM target AS t, revived AS r
  RETURNING id, from_seq, previous_state, requested_at, jsonb_array_length(steps_dropped) AS steps_dropped
), ${REVIVE}
SELECT a.id, a.from_seq, a.previous_state, a.requested_at, a.steps_dropped FROM audit AS a, requeued AS q`,
  { id: "int8", from_seq: "int4", previous_state: "text", requested_at: "timestamptz", steps_dropped: "int4" },
);

/** A re-run as the audit trail keeps it. */
export interface JobRerun {
  id: string;
  jobId: string;
  /** The step it re-ran from: its name, the how-many-th call of that name, and its place. */
  fromStep: string;
  fromOccurrence: number;
  fromSeq: number;
  /** How the job had finished: succeeded, cancelled or dead. */
  previousState: string;
  requestedBy: string | null;
  requestedAt: Date;
  /** The records dropped (that step's and those after it), as they were. */
  stepsDropped: JsonValue[];
}

export type RerunResult =
  { rerun: Omit<JobRerun, "stepsDropped"> & { stepsDropped: number } } | "job_not_finished" | "step_not_recorded" | "not_found";

export async function rerunFromStep(
  db: Queryable,
  p: { id: string; step: string; occurrence: number; requestedBy: string | null },
): Promise<RerunResult> {
  const [row] = await run(db, RERUN_FROM_STEP, [p.id, p.step, p.occurrence, p.requestedBy]);
  if (row) {
    return {
      rerun: {
        id: row.id,
        jobId: p.id,
        fromStep: p.step,
        fromOccurrence: p.occurrence,
        fromSeq: row.from_seq,
        previousState: row.previous_state,
        requestedBy: p.requestedBy,
        requestedAt: row.requested_at,
        stepsDropped: row.steps_dropped,
      },
    };
  }
  const [why] = await run(db, RERUN_REFUSAL, [p.id]);
  if (!why!.finished && !why!.active) return "not_found";
  return why!.active ? "job_not_finished" : "step_not_recorded";
}

/** Why nothing was re-run: the job is missing, still active (not finished), or has no such step. */
const RERUN_REFUSAL = statement(
  "rerunFromStep (refusal)",
  `SELECT EXISTS (SELECT 1 FROM jobs WHERE id = $1) AS active,
          EXISTS (SELECT 1 FROM dead_jobs WHERE id = $1) OR EXISTS (SELECT 1 FROM job_history WHERE id = $1) AS finished`,
  { active: "bool", finished: "bool" },
);

/** The steps a job recorded, named (for an error that lists what a re-run could start from). */
const STEP_NAMES = statement(
  "recordedStepNames",
  `SELECT DISTINCT ON (name, occurrence) name, occurrence FROM job_steps WHERE job_id = $1 ORDER BY name, occurrence`,
  { name: "text", occurrence: "int4" },
);

export async function recordedStepNames(db: Queryable, id: string): Promise<{ name: string; occurrence: number }[]> {
  return run(db, STEP_NAMES, [id]);
}

const JOB_RERUNS = statement(
  "getJobReruns",
  `SELECT id, job_id, from_seq, from_step, from_occurrence, previous_state, requested_by, requested_at, steps_dropped
     FROM job_reruns WHERE job_id = $1 ORDER BY id`,
  {
    id: "int8",
    job_id: "int8",
    from_seq: "int4",
    from_step: "text",
    from_occurrence: "int4",
    previous_state: "text",
    requested_by: "text?",
    requested_at: "timestamptz",
    steps_dropped: "jsonb",
  },
);

/** A job's re-runs, oldest first. */
export async function getJobReruns(db: Queryable, id: string): Promise<JobRerun[]> {
  const rows = await run(db, JOB_RERUNS, [id]);
  return rows.map((r) => ({
    id: r.id,
    jobId: r.job_id,
    fromStep: r.from_step,
    fromOccurrence: r.from_occurrence,
    fromSeq: r.from_seq,
    previousState: r.previous_state,
    requestedBy: r.requested_by,
    requestedAt: r.requested_at,
    stepsDropped: r.steps_dropped as JsonValue[],
  }));
}
