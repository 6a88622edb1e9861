-- Leasehold schema, version 2: fewer row writes per finished job, a fencing token shared by all
-- jobs, progress and run-time limits, live workers and their task policies, crash detection.

-- A token that grows across every claim of every job, for resources several jobs write.
-- No CACHE: cached ranges per session would not grow in claim order across sessions.
CREATE SEQUENCE fence_seq;

ALTER TABLE jobs
  ADD COLUMN fence bigint,
  -- The last time a beat carried progress or a checkpoint (a claim starts it).
  ADD COLUMN progress_at timestamptz,
  -- Limits set at enqueue (null: the task's policy): no progress for this long is a stall;
  -- an attempt running this long has timed out.
  ADD COLUMN progress_timeout_ms integer,
  ADD COLUMN max_run_ms integer,
  -- How the previous attempt ended, for the next one to see (ctx.previousOutcome).
  ADD COLUMN last_outcome text;

-- A finished job's history row carries its final attempt's audit fields (worker, start, end,
-- outcome): job_attempts holds only the attempts that did not finish their job, so success
-- is two row writes (the DELETE and this INSERT) instead of three.
ALTER TABLE job_history
  ADD COLUMN worker_id text,
  ADD COLUMN outcome text,
  ADD COLUMN fence bigint,
  ADD COLUMN progress_timeout_ms integer,
  ADD COLUMN max_run_ms integer;

ALTER TABLE job_attempts DROP CONSTRAINT job_attempts_outcome_check;
ALTER TABLE job_attempts ADD CONSTRAINT job_attempts_outcome_check CHECK (
  outcome IN ('succeeded', 'failed', 'lease_expired', 'worker_lost', 'stalled', 'timed_out', 'released', 'cancelled')
);

-- Every attempt of every job, finished or not: the audit trail as one relation.
CREATE VIEW all_attempts AS
SELECT job_id, attempt, worker_id, started_at, ended_at, outcome, error
  FROM job_attempts
UNION ALL
SELECT id, attempt, worker_id, started_at, finished_at, outcome,
       CASE WHEN outcome = 'succeeded' THEN NULL ELSE last_error END
  FROM job_history
 WHERE outcome IS NOT NULL;

-- Processes that run jobs or recover them, announced at start and refreshed with every beat.
CREATE TABLE workers (
  id            text        PRIMARY KEY,
  name          text,
  kind          text        NOT NULL,
  host          text,
  pid           integer,
  queues        text[]      NOT NULL DEFAULT '{}',
  tasks         text[]      NOT NULL DEFAULT '{}',
  concurrency   integer,
  -- Its lease and heartbeat interval, for `leasehold doctor` to judge against its beat delays.
  lease_ms      integer,
  heartbeat_ms  integer,
  in_flight     integer     NOT NULL DEFAULT 0,
  -- The session-level advisory lock the process holds while it lives (null: it holds none,
  -- e.g. a remote worker): when it is gone, the process is gone.
  liveness_key  bigint,
  started_at    timestamptz NOT NULL DEFAULT now(),
  last_seen_at  timestamptz NOT NULL DEFAULT now(),
  -- When a watchdog first found its liveness lock released; cleared if it comes back.
  lost_at       timestamptz,
  stopped_at    timestamptz,
  -- Histogram of the gaps between its successful lease renewals (bucket bounds in code).
  beat_gaps     integer[],
  CONSTRAINT workers_kind_check CHECK (kind IN ('worker', 'watchdog'))
);

-- Each task's retry and time limits, as the workers that run it declared them (the latest
-- announcement wins), so the watchdog recovers a job with its own task's policy.
CREATE TABLE task_policies (
  task                text        PRIMARY KEY,
  backoff_base_ms     bigint      NOT NULL,
  backoff_factor      float8      NOT NULL,
  backoff_max_ms      bigint      NOT NULL,
  backoff_jitter      float8      NOT NULL,
  progress_timeout_ms integer,
  max_run_ms          integer,
  updated_at          timestamptz NOT NULL DEFAULT now(),
  updated_by          text
);

-- The retry delay after `spent` attempts: base * factor^spent, capped, with jitter taken off
-- the top. The only copy of the formula: failures and every recovery use it. Computed in
-- logarithms so a large exponent cannot overflow.
CREATE FUNCTION retry_delay_ms(spent integer, base_ms float8, factor float8, max_ms float8, jitter float8)
RETURNS bigint LANGUAGE sql VOLATILE AS $$
  SELECT CASE WHEN base_ms <= 0 OR max_ms <= 0 THEN 0::bigint
         ELSE round(exp(least(ln(base_ms) + spent * ln(greatest(factor, 1)), ln(max_ms))) * (1 - jitter * random()))::bigint
         END
$$;

-- The hot table churns a row per job: vacuum it early (a fixed number of dead rows, not a
-- fraction of a table that may be small) and without the cost-based throttle.
ALTER TABLE jobs SET (
  autovacuum_vacuum_scale_factor = 0,
  autovacuum_vacuum_threshold = 5000,
  autovacuum_vacuum_insert_scale_factor = 0,
  autovacuum_vacuum_insert_threshold = 20000,
  autovacuum_analyze_scale_factor = 0,
  autovacuum_analyze_threshold = 20000,
  autovacuum_vacuum_cost_delay = 0
);
