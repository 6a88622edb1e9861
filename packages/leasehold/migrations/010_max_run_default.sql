-- Leasehold schema, version 10: every job has a maximum run time unless it opts out.
--
-- Workers now give every task a maximum run time (15 minutes unless the worker, the task or the
-- job sets another) and announce it in task_policies as before, so the watchdog applies the same
-- limit from the database's side. A task opts out with `maxRunMs: null` (announced as a null
-- max_run_ms, as before). A job opts out with `maxRunMs: null` at enqueue, kept here apart from
-- "not set" (a null max_run_ms): max_run_unlimited. The flag travels with the job into
-- job_history and dead_jobs, so a manual retry keeps it.
--
-- Additive: the previous release's statements name their columns and leave the flag false.
-- Until every watchdog runs this release, an older one ignores a job's opt-out (it knows only
-- max_run_ms and the task's announced limit).
--
-- `leasehold doctor` and the dashboard compare running jobs with their task's recent successful
-- run times: job_history_task_success_idx reads the latest successes of one task (one more
-- index entry per finished job; a partial index, so cancelled jobs cost nothing).

ALTER TABLE jobs ADD COLUMN max_run_unlimited boolean NOT NULL DEFAULT false;
ALTER TABLE job_history ADD COLUMN max_run_unlimited boolean NOT NULL DEFAULT false;
ALTER TABLE dead_jobs ADD COLUMN max_run_unlimited boolean NOT NULL DEFAULT false;

-- Columns may only be added at the end of a view that others (all_attempts) depend on.
CREATE OR REPLACE VIEW finished_jobs AS
SELECT id, queue, task, payload, priority, state, attempt, spent_attempts, max_attempts, lease_ms, progress,
       checkpoint, last_error, unique_key, created_at, started_at, finished_at, worker_id, outcome,
       fence, progress_timeout_ms, max_run_ms, max_run_unlimited
  FROM job_history
UNION ALL
SELECT id, queue, task, payload, priority, state, attempt, spent_attempts, max_attempts, lease_ms, progress,
       checkpoint, last_error, unique_key, created_at, started_at, finished_at, worker_id, outcome,
       fence, progress_timeout_ms, max_run_ms, max_run_unlimited
  FROM dead_jobs;

CREATE INDEX job_history_task_success_idx ON job_history (task, finished_at) WHERE outcome = 'succeeded';

-- enqueue() as in version 4, and "maxRunMs": null is an opt-out instead of a refusal.
CREATE OR REPLACE FUNCTION enqueue(task text, payload jsonb DEFAULT '{}', options jsonb DEFAULT '{}')
RETURNS bigint LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  opts       jsonb := coalesce(options, '{}');
  body       jsonb := coalesce(payload, '{}');
  unknown    text;
  q          text;
  run_at_ts  timestamptz;
  delay      bigint;
  unique_k   text;
  new_id     bigint;
  -- "maxRunMs": null: this job runs without a time limit, whatever its task says.
  unlimited  boolean := jsonb_typeof(coalesce(options, '{}') -> 'maxRunMs') IS NOT DISTINCT FROM 'null';
BEGIN
  IF jsonb_typeof(opts) <> 'object' THEN
    PERFORM enqueue_refuse(format('options must be a JSON object (got %s)', left(opts::text, 80)));
  END IF;
  SELECT k INTO unknown FROM jsonb_object_keys(opts) AS k
   WHERE k NOT IN ('queue', 'priority', 'runAt', 'delayMs', 'maxAttempts', 'uniqueKey', 'leaseMs',
                   'progressTimeoutMs', 'maxRunMs')
   LIMIT 1;
  IF unknown IS NOT NULL THEN PERFORM enqueue_refuse(format('unknown option %s', to_jsonb(unknown))); END IF;

  PERFORM enqueue_check_name(task, 'task');
  IF opts ? 'queue' AND jsonb_typeof(opts -> 'queue') <> 'string' THEN
    PERFORM enqueue_refuse(format('queue must be a string (got %s)', left((opts -> 'queue')::text, 80)));
  END IF;
  q := enqueue_check_name(coalesce(opts ->> 'queue', 'default'), 'queue');

  IF octet_length(body::text) > 1048576 THEN PERFORM enqueue_refuse('payload is larger than 1048576 bytes'); END IF;
  IF enqueue_nesting_exceeds(body, 256) THEN PERFORM enqueue_refuse('payload is nested deeper than 256 levels'); END IF;

  IF opts ? 'runAt' AND opts ? 'delayMs' THEN PERFORM enqueue_refuse('give runAt or delayMs, not both'); END IF;
  IF opts ? 'runAt' THEN
    IF jsonb_typeof(opts -> 'runAt') <> 'string' THEN
      PERFORM enqueue_refuse(format('runAt must be a timestamp as text (got %s)', left((opts -> 'runAt')::text, 80)));
    END IF;
    BEGIN
      run_at_ts := (opts ->> 'runAt')::timestamptz;
    EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR invalid_parameter_value THEN
      PERFORM enqueue_refuse(format('runAt is not a valid timestamp (got %s)', left((opts -> 'runAt')::text, 80)));
    END;
    IF NOT isfinite(run_at_ts) THEN PERFORM enqueue_refuse('runAt must be a finite timestamp'); END IF;
  END IF;
  delay := enqueue_integer(opts, 'delayMs', 0, 315360000000, 0);

  IF opts ? 'uniqueKey' THEN
    unique_k := opts ->> 'uniqueKey';
    IF jsonb_typeof(opts -> 'uniqueKey') <> 'string' OR char_length(unique_k) NOT BETWEEN 1 AND 512 THEN
      PERFORM enqueue_refuse(format('uniqueKey must be a non-empty string of at most 512 characters (got %s)',
                                    left((opts -> 'uniqueKey')::text, 80)));
    END IF;
  END IF;

  -- A key held by an unfinished job answers with that job; if it finishes between the
  -- insert and the lookup, try again (a few rounds: each means another job ran to its end).
  FOR tries IN 1..5 LOOP
    INSERT INTO jobs (queue, task, payload, priority, run_at, max_attempts, unique_key, lease_ms,
                      progress_timeout_ms, max_run_ms, max_run_unlimited)
    VALUES (q, task, body,
            enqueue_integer(opts, 'priority', -32768, 32767, 0),
            coalesce(run_at_ts, now() + delay * interval '1 millisecond'),
            enqueue_integer(opts, 'maxAttempts', 1, 1000, 25),
            unique_k,
            enqueue_integer(opts, 'leaseMs', 1000, 86400000, NULL),
            enqueue_integer(opts, 'progressTimeoutMs', 1000, 604800000, NULL),
            CASE WHEN NOT unlimited THEN enqueue_integer(opts, 'maxRunMs', 1000, 604800000, NULL) END,
            unlimited)
    ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL DO NOTHING
    RETURNING id INTO new_id;
    IF new_id IS NOT NULL THEN RETURN new_id; END IF;
    SELECT id INTO new_id FROM jobs WHERE unique_key = unique_k;
    IF new_id IS NOT NULL THEN RETURN new_id; END IF;
  END LOOP;
  RAISE EXCEPTION 'leasehold.enqueue: unique key % neither inserted nor found after 5 rounds', to_jsonb(unique_k);
END;
$$;
