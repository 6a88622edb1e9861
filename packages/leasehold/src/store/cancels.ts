/**
 * Instant cancel: which of a worker's attempts a user asked to cancel. Migration 014 sends a
 * notice per cancel request of a running job; this module reads it, and answers the check a
 * listener makes after a gap in which notices may have been lost.
 */
import type { Queryable } from "./db.js";
import type { AttemptRef } from "./finish.js";
import { run, statement } from "./sql.js";

export interface CancelNotice extends AttemptRef {
  workerId: string;
}

/**
 * "id:attempt:worker id" (the worker id may itself hold colons: it comes last). Undefined for
 * anything else: a malformed notice is ignored, never taken for another attempt.
 */
export function parseCancelNotice(payload: string): CancelNotice | undefined {
  const m = /^([1-9][0-9]{0,18}):([1-9][0-9]{0,9}):(.+)$/s.exec(payload);
  if (!m) return undefined;
  return { id: m[1]!, attempt: Number(m[2]), workerId: m[3]! };
}

/**
 * Of these attempts, those still held by `workerId` whose cancel was requested. By primary key
 * (`id = ANY`), like the heartbeat: no index on the worker is needed.
 */
const CANCELS_REQUESTED = statement(
  "cancelsRequested",
  `
SELECT j.id, j.attempt
  FROM jobs AS j
  JOIN unnest($1::bigint[], $2::int[]) AS a(id, attempt) ON a.id = j.id AND a.attempt = j.attempt
 WHERE j.id = ANY($1::bigint[]) AND j.locked_by = $3 AND j.cancel_requested_at IS NOT NULL`,
  { id: "int8", attempt: "int4" },
);

export async function cancelsRequested(db: Queryable, workerId: string, attempts: AttemptRef[]): Promise<AttemptRef[]> {
  if (attempts.length === 0) return [];
  const rows = await run(db, CANCELS_REQUESTED, [attempts.map((a) => a.id), attempts.map((a) => a.attempt), workerId]);
  return rows.map((r) => ({ id: r.id, attempt: r.attempt }));
}
