-- Leasehold schema, version 9: an attempt can end as superseded (docs/fencing.md).
--
-- A handler's `ctx.fencedWrite` refused because a newer claim of another job already wrote the
-- row ends its attempt as superseded: the job finishes (state succeeded, outcome superseded,
-- last_error saying which write was refused) without spending its retry budget, instead of
-- failing and being retried into overwriting the newer value. The finished job's row in
-- job_history carries the outcome, and job_history has no CHECK on outcomes, so finishing a
-- job this way needs no schema change. This version only widens two vocabularies, additively:
--   - job_attempts may hold a superseded attempt (an audit row made from a finished job's,
--     as a manual retry of it would), so every outcome of all_attempts is allowed in both of
--     its tables;
--   - stale_refusals may record a refused superseded report (kind 'supersede').
-- The previous release's workers and readers write neither value and read them as text.
--
-- The constraints are added NOT VALID: every existing row met the narrower one, so it meets
-- these; skipping the scan keeps the migration's exclusive lock on job_attempts short.
-- PostgreSQL enforces them on every new row all the same.

ALTER TABLE job_attempts DROP CONSTRAINT job_attempts_outcome_check;
ALTER TABLE job_attempts ADD CONSTRAINT job_attempts_outcome_check CHECK (
  outcome IN ('succeeded', 'failed', 'lease_expired', 'worker_lost', 'stalled', 'timed_out', 'released', 'cancelled', 'superseded')
) NOT VALID;

ALTER TABLE stale_refusals DROP CONSTRAINT stale_refusals_kind_check;
ALTER TABLE stale_refusals ADD CONSTRAINT stale_refusals_kind_check CHECK (
  kind IN ('heartbeat', 'complete', 'fail', 'release', 'supersede')
) NOT VALID;
