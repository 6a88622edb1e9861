/**
 * `--record off`: the run's queues keep no record of their succeeded jobs (lh.setQueueHistory),
 * so a job that succeeds on its first attempt with nothing waiting for its result leaves no
 * job_history row, no audit row, no finished_at. The checker keeps every invariant checkable
 * through the run's own audit instead: a trigger (installed only in this mode) copies each row
 * that leaves `jobs` into end_ledger, in the same transaction as the end, with the attempt and
 * worker that held it; the handlers' own log says which attempts settled. The views below give
 * the checker one place to read finished jobs and attempts either way: with the record on the
 * ledger is empty and they are finished_jobs and all_attempts.
 */
import type { Leasehold } from "../packages/leasehold/src/index.js";
import { QUEUE } from "./workload.js";
import { LIMITED_QUEUES } from "./flow-queues.js";

export type RecordMode = "on" | "off";

/** Part of the run's schema in both modes (chaos/downstream.ts creates it). */
export const AUDIT_SQL = `
CREATE TABLE end_ledger (
  id             bigint      NOT NULL,
  queue          text        NOT NULL,
  payload        jsonb       NOT NULL,
  attempt        integer     NOT NULL,
  spent_attempts integer     NOT NULL,
  max_attempts   integer     NOT NULL,
  worker_id      text,
  started_at     timestamptz,
  -- the ending statement's now(), as job_history's finished_at would be
  ended_at       timestamptz NOT NULL DEFAULT now()
);
-- Finished jobs: the kept records, and the ended jobs that left none (succeeded: a dead or
-- cancelled job always keeps its record); kept says which. The record of a job that ended
-- more than once (a retry) is the one to read: the ledger's other rows are left out.
CREATE VIEW audit_finished AS
SELECT id, queue, payload, state, attempt, spent_attempts, max_attempts, worker_id, started_at, finished_at, outcome, result, true AS kept
  FROM finished_jobs
UNION ALL
SELECT l.id, l.queue, l.payload, 'succeeded', l.attempt, l.spent_attempts, l.max_attempts, l.worker_id, l.started_at, l.ended_at,
       'succeeded', NULL::jsonb, false
  FROM end_ledger AS l
 WHERE NOT EXISTS (SELECT 1 FROM finished_jobs AS f WHERE f.id = l.id);
-- Every attempt: the audit trail, and the one attempt of each job that left no record.
CREATE VIEW audit_attempts AS
SELECT job_id, attempt, worker_id, started_at, ended_at, outcome, error FROM all_attempts
UNION ALL
SELECT id, attempt, worker_id, started_at, finished_at, 'succeeded', NULL FROM audit_finished WHERE NOT kept;`;

/** The ledger's trigger: every row leaving jobs, by whatever end. Its search_path is the run's schema, whoever deletes. */
const LEDGER_TRIGGER_SQL = `
CREATE FUNCTION ledger_ended_job() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
  INSERT INTO end_ledger (id, queue, payload, attempt, spent_attempts, max_attempts, worker_id, started_at)
  VALUES (OLD.id, OLD.queue, OLD.payload, OLD.attempt, OLD.spent_attempts, OLD.max_attempts, OLD.locked_by, OLD.started_at);
  RETURN NULL;
END;
$$;
CREATE TRIGGER jobs_end_ledger AFTER DELETE ON jobs FOR EACH ROW EXECUTE FUNCTION ledger_ended_job();`;

/** Turns the record off on every queue the workload uses, and starts the ledger. Before the first job. */
export async function recordOff(lh: Leasehold, admin: { query(sql: string): Promise<unknown> }): Promise<void> {
  await admin.query(LEDGER_TRIGGER_SQL);
  for (const name of [QUEUE, ...LIMITED_QUEUES.map((q) => q.name)]) await lh.setQueueHistory(name, { keepSucceeded: false }, { create: true });
}
