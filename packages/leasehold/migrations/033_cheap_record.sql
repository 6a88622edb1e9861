-- Leasehold schema, version 33: a cheaper record of every finished job.
--
-- A completion moves each job from `jobs` to its record in job_history in one statement. What
-- that statement paid per job beyond the two row writes, measured on 500-job batches (server
-- CPU, PostgreSQL 17): ~0.85 µs for job_history_task_success_idx, ~0.2 µs for four AFTER DELETE
-- row triggers whose WHEN clauses are checked on every row that leaves `jobs`. Both go:
--
--   - The run-time sample (`leasehold doctor` and the dashboard's "running longer than usual",
--     store/running-long.ts) reads a task's latest successes. It now reads a fixed one-in-eight
--     sample of them, chosen by a hash of the job id (ids are sequential; a hash does not favour
--     every eighth job of a batch), so seven successes in eight write no index entry. The
--     percentile from 500 sampled successes is as good as from 500 consecutive ones; a task is
--     judged once it has ~160 successes instead of 20.
--   - Flows (version 14) and durable children (version 29) each had a row trigger that notes an
--     ended job and a deferred one that settles at commit. One trigger of each kind now serves
--     both, with one WHEN per row: a plain job checks three columns once instead of four times.
--
-- Additive for a rolling upgrade: a previous release's statements never name the triggers, their
-- functions or the index, and its `doctor` still finds its answer (by a scan of job_history
-- instead of the dropped index). The index is built inside the migration's transaction, so
-- claims and completions wait while it reads job_history once (~0.6 s per million records
-- here; see docs/upgrading.md). `jobs` is locked first, as workers' statements lock it before
-- job_history: taken in the other order (job_history for the index, then jobs for the
-- triggers), a completion in flight deadlocks.

LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE;

CREATE INDEX job_history_task_sample_idx ON job_history (task, finished_at)
  WHERE outcome = 'succeeded' AND (hashint8(id) & 7) = 0;
DROP INDEX job_history_task_success_idx;

DO $migration$
BEGIN
  EXECUTE format($fn$
-- Per ended row that has dependents, a waiter or an awaiting job: wake the waiter, note the
-- parent (as version 14's note_ended_job) and the awaiting job (as version 29's note_ended_child).
CREATE FUNCTION note_ended_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF OLD.watched THEN
    PERFORM pg_notify('leasehold:' || TG_TABLE_SCHEMA || ':ended', OLD.id::text);
  END IF;
  IF OLD.has_dependents THEN
    PERFORM set_config('leasehold.ended_parents',
                       coalesce(nullif(current_setting('leasehold.ended_parents', true), '') || ',', '')
                       || CASE WHEN OLD.state <> 'running' OR OLD.cancel_requested_at IS NOT NULL THEN -OLD.id ELSE OLD.id END,
                       true);
  END IF;
  IF OLD.awaited_by IS NOT NULL THEN
    PERFORM set_config('leasehold.ended_children',
                       coalesce(nullif(current_setting('leasehold.ended_children', true), '') || ',', '') || OLD.awaited_by,
                       true);
  END IF;
  RETURN NULL;
END;
$$;

-- At commit: settle the dependents of every parent noted, then the awaiting jobs of every child
-- noted (the first call does all; a dependent cancelled meanwhile that a job awaits is noted
-- by its own delete, and settled by the trigger event that delete queued).
CREATE FUNCTION settle_ended_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF coalesce(current_setting('leasehold.ended_parents', true), '') <> ''
     AND coalesce(current_setting('leasehold.settling', true), '') <> 'on' THEN
    PERFORM %1$I.settle_dependents();
  END IF;
  IF coalesce(current_setting('leasehold.ended_children', true), '') <> '' THEN
    PERFORM %1$I.settle_awaiting_jobs();
  END IF;
  RETURN NULL;
END;
$$;
$fn$, current_schema());
END
$migration$;

DROP TRIGGER jobs_note_ended ON jobs;
DROP TRIGGER jobs_settle_ended ON jobs;
DROP TRIGGER jobs_note_ended_child ON jobs;
DROP TRIGGER jobs_settle_ended_children ON jobs;

CREATE TRIGGER jobs_note_ended_row AFTER DELETE ON jobs
  FOR EACH ROW WHEN (OLD.has_dependents OR OLD.watched OR OLD.awaited_by IS NOT NULL)
  EXECUTE FUNCTION note_ended_row();
CREATE CONSTRAINT TRIGGER jobs_settle_ended_rows AFTER DELETE ON jobs
  DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW WHEN (OLD.has_dependents OR OLD.awaited_by IS NOT NULL)
  EXECUTE FUNCTION settle_ended_rows();

DROP FUNCTION note_ended_job();
DROP FUNCTION settle_ended_parents();
DROP FUNCTION note_ended_child();
DROP FUNCTION settle_ended_children();
