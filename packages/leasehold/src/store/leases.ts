import type { Queryable } from "./db.js";
import { run, statement } from "./sql.js";
import type { AttemptOutcome } from "../jobs/types.js";
import type { LostLeaseReason } from "../errors.js";

/**
 * One heartbeat for all of a worker's in-flight jobs. Each row is fenced by
 * (id, attempt, worker): a job that was reaped, re-claimed or finished matches nothing,
 * and its absence from the result tells the worker the lease is lost. A beat may carry
 * progress and a checkpoint (null leaves the stored value alone); either one is progress, so
 * it moves progress_at, which the watchdog's stall check reads.
 *
 * The same statement refreshes the worker's own row (last seen, jobs in flight, its beat
 * delays): one round trip per tick, whatever the worker is doing.
 *
 * Plan notes, shared by every fenced statement: `id = ANY($1)` keeps the plan on the
 * primary key whatever the statistics say. The fence has no `state = 'running'`: a CHECK
 * makes locked_by non-null only while running, and with that predicate a generic plan
 * walked the whole partial lease index (every running job) instead (test/claim.test.ts).
 */
const EXTEND_LEASES = statement(
  "extendLeases",
  `
WITH renewed AS (
  UPDATE jobs AS j
     SET lease_until = now() + coalesce(j.lease_ms, $6) * interval '1 millisecond',
         heartbeat_at = now(),
         progress = coalesce(b.progress, j.progress),
         checkpoint = coalesce(b.checkpoint, j.checkpoint),
         progress_at = CASE WHEN b.progress IS NULL AND b.checkpoint IS NULL THEN j.progress_at ELSE now() END
    FROM unnest($1::bigint[], $2::int[], $3::jsonb[], $4::jsonb[]) AS b(id, attempt, progress, checkpoint)
   WHERE j.id = ANY($1::bigint[])
     AND j.id = b.id AND j.attempt = b.attempt AND j.locked_by = $5
  RETURNING j.id, j.cancel_requested_at IS NOT NULL AS cancel_requested
), seen AS (
  UPDATE workers
     SET last_seen_at = now(), in_flight = coalesce($7, in_flight), beat_gaps = coalesce($8, beat_gaps)
   WHERE id = $5
)
SELECT id, cancel_requested FROM renewed`,
  { id: "int8", cancel_requested: "bool" },
);

export interface Beat {
  id: string;
  attempt: number;
  /** JSON text, or null to leave it as it is. */
  progressJson?: string | null;
  checkpointJson?: string | null;
}

export interface BeatResult {
  /** Leases renewed; `cancelRequested` jobs should stop: a user cancelled them. */
  renewed: Map<string, { cancelRequested: boolean }>;
  /** Jobs whose lease this worker no longer holds. */
  lost: string[];
  /**
   * Jobs whose progress or checkpoint was refused (why, by job id); their leases were renewed
   * without it. Validation at the boundary should make this empty; it keeps one bad value
   * from failing every other job's beat.
   */
  refused?: Map<string, string>;
}

export interface HeartbeatParams {
  workerId: string;
  leaseMs: number;
  beats: Beat[];
  /** For the worker's own row: jobs it holds now, and its beat delay histogram. */
  inFlight?: number;
  beatDelays?: number[];
}

/** Renews the beats' leases; with no beats it only refreshes the worker's row. */
export async function extendLeases(db: Queryable, p: HeartbeatParams): Promise<BeatResult> {
  if (p.beats.length === 0 && p.inFlight === undefined) return { renewed: new Map(), lost: [] };
  const rows = await run(db, EXTEND_LEASES, [
    p.beats.map((b) => b.id),
    p.beats.map((b) => b.attempt),
    p.beats.map((b) => b.progressJson ?? null),
    p.beats.map((b) => b.checkpointJson ?? null),
    p.workerId,
    p.leaseMs,
    p.inFlight ?? null,
    p.beatDelays ?? null,
  ]);
  const renewed = new Map(rows.map((r) => [r.id, { cancelRequested: r.cancel_requested }]));
  return { renewed, lost: p.beats.filter((b) => !renewed.has(b.id)).map((b) => b.id) };
}

/** Why these attempts no longer hold their jobs; read only after a fence refused them. */
const DESCRIBE_LOST = statement(
  "describeLostLeases",
  `
SELECT a.id::text AS id, a.attempt, j.state, j.attempt AS current_attempt,
       j.cancel_requested_at IS NOT NULL AS cancel_requested, h.state AS finished_state, ja.outcome AS ended_as
  FROM unnest($1::bigint[], $2::int[]) AS a(id, attempt)
  LEFT JOIN jobs AS j ON j.id = a.id
  LEFT JOIN finished_jobs AS h ON h.id = a.id
  LEFT JOIN all_attempts AS ja ON ja.job_id = a.id AND ja.attempt = a.attempt`,
  { id: "text", attempt: "int4", state: "text?", current_attempt: "int4?", cancel_requested: "bool?", finished_state: "text?", ended_as: "text?" },
);

export interface LostLease {
  reason: LostLeaseReason;
  /** The job's final state if it has finished (succeeded, dead, cancelled). */
  finishedState?: string | null;
  /**
   * How this attempt ended, from its audit row. After an ambiguous commit (the connection
   * dropped while a completion committed) "succeeded" says the completion landed.
   */
  endedAs: AttemptOutcome | null;
}

export async function describeLostLeases(db: Queryable, attempts: { id: string; attempt: number }[]): Promise<Map<string, LostLease>> {
  const rows = await run(db, DESCRIBE_LOST, [attempts.map((a) => a.id), attempts.map((a) => a.attempt)]);
  const lost = new Map<string, LostLease>();
  for (const r of rows) {
    let reason: LostLeaseReason;
    if (r.finished_state === "cancelled") reason = "cancelled";
    else if (r.finished_state) reason = "finished";
    else if (r.state === null) reason = "missing";
    else if (r.current_attempt! > r.attempt) reason = "reclaimed";
    // Still ours, and running: only a completion that refuses cancelled jobs (ctx.transaction) gets here.
    else if (r.cancel_requested && r.state === "running") reason = "cancelled";
    else reason = "lease_expired";
    lost.set(r.id, { reason, endedAs: r.ended_as as AttemptOutcome | null, finishedState: r.finished_state });
  }
  return lost;
}
