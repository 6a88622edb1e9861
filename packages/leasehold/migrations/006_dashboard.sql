-- Leasehold schema, version 6: what the dashboard reads, without scanning the history of jobs.
--
-- The dashboard's refresh must cost the same at 40 jobs/s and at 40,000 jobs/s (an hour of
-- the latter is ~140M finished rows). Nothing here is written on the path of a job that
-- succeeds: throughput comes from PostgreSQL's own row counters, sampled a few times a
-- minute; recoveries from a partial index over the rare audit rows they leave; stale
-- refusals from a table written only when the fence refuses something.

-- Heartbeats and reports the fence refused because their attempt no longer held its lease:
-- until now only a Prometheus counter in whichever process saw it. One row per refused
-- attempt, written on the refusal path only (a worker on a database connection writes its
-- own; the server writes those of remote workers, which it answers 409 or lists as refused).
CREATE TABLE stale_refusals (
  id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  at         timestamptz NOT NULL DEFAULT now(),
  job_id     bigint      NOT NULL,
  attempt    integer     NOT NULL,
  worker_id  text        NOT NULL,
  -- What was refused, and why (the reason describeLostLeases gives).
  kind       text        NOT NULL,
  reason     text        NOT NULL,
  -- Who refused it: a worker on the database ("database") or the server for a remote one ("server").
  via        text        NOT NULL,
  CONSTRAINT stale_refusals_kind_check CHECK (kind IN ('heartbeat', 'complete', 'fail', 'release')),
  CONSTRAINT stale_refusals_reason_check CHECK (reason IN ('lease_expired', 'reclaimed', 'cancelled', 'finished', 'missing')),
  CONSTRAINT stale_refusals_via_check CHECK (via IN ('database', 'server'))
);
CREATE INDEX stale_refusals_at_idx ON stale_refusals (at);

-- Attempts the lease machinery ended (reaped, worker lost, stalled, timed out) or a live worker
-- gave back (released): their audit rows, by end time. Partial, so only those rows are in it:
-- a failure or a success (which writes no audit row at all) costs it nothing. Final attempts
-- that went to the dead letter are found through dead_jobs' finished_at index.
CREATE INDEX job_attempts_recovered_idx ON job_attempts (ended_at)
 WHERE outcome IN ('lease_expired', 'worker_lost', 'stalled', 'timed_out', 'released');

-- Throughput, from the cumulative insert counters PostgreSQL keeps per table
-- (pg_stat_get_tuples_inserted): a sampler reads them every few seconds, so a chart of the last
-- hour reads a few hundred rows here instead of the jobs themselves. One row per slot (the
-- sample time truncated to the sample interval), whichever process sampled it.
CREATE TABLE throughput_samples (
  at          timestamptz PRIMARY KEY,
  sampled_at  timestamptz NOT NULL DEFAULT now(),
  -- Rows ever inserted into: job_history's generations (jobs that succeeded or were cancelled),
  finished    bigint      NOT NULL,
  -- dead_jobs (jobs that went to the dead letter),
  dead        bigint      NOT NULL,
  -- job_attempts (attempts that ended without finishing their job: failures retried,
  -- recoveries, releases),
  requeued    bigint      NOT NULL,
  -- and jobs (enqueues; a manual retry of a finished job too).
  enqueued    bigint      NOT NULL
);
