/**
 * Stale refusals: heartbeats and reports the fence refused because their attempt no longer
 * held its lease. Written only on that path (never for a job that succeeds), so an operator
 * can see afterwards what the lease machinery absorbed; the Prometheus counter
 * (leasehold_fencing_rejections_total) only counts them, per process.
 */
import type { LostLeaseReason } from "../errors.js";
import type { Queryable } from "./db.js";
import { run, statement } from "./sql.js";

export type RefusedKind = "heartbeat" | "complete" | "fail" | "release" | "supersede" | "step";

export interface StaleRefusal {
  jobId: string;
  attempt: number;
  workerId: string;
  kind: RefusedKind;
  reason: LostLeaseReason;
}

const RECORD_STALE_REFUSALS = statement(
  "recordStaleRefusals",
  `
INSERT INTO stale_refusals (job_id, attempt, worker_id, kind, reason, via)
SELECT * FROM unnest($1::bigint[], $2::int[], $3::text[], $4::text[], $5::text[]) CROSS JOIN (VALUES ($6::text)) AS v(via)`,
  {},
);

/** `via`: "database" from a worker's own connection, "server" for a remote worker's request. */
export async function recordStaleRefusals(db: Queryable, refusals: StaleRefusal[], via: "database" | "server"): Promise<void> {
  if (refusals.length === 0) return;
  await run(db, RECORD_STALE_REFUSALS, [
    refusals.map((r) => r.jobId),
    refusals.map((r) => r.attempt),
    refusals.map((r) => r.workerId),
    refusals.map((r) => r.kind),
    refusals.map((r) => r.reason),
    via,
  ]);
}

const PRUNE_STALE_REFUSALS = statement(
  "pruneStaleRefusals",
  `
WITH gone AS (
  DELETE FROM stale_refusals
   WHERE id IN (SELECT id FROM stale_refusals WHERE at < now() - $1::bigint * interval '1 millisecond' LIMIT $2)
  RETURNING 1
)
SELECT count(*)::int AS deleted FROM gone`,
  { deleted: "int4" },
);

/** Forgets refusals older than `retainMs`, at most `limit` per call. */
export async function pruneStaleRefusals(db: Queryable, p: { retainMs: number; limit: number }): Promise<number> {
  const [row] = await run(db, PRUNE_STALE_REFUSALS, [p.retainMs, p.limit]);
  return row!.deleted;
}
