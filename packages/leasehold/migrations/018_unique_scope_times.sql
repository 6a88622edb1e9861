-- Leasehold schema, version 18: unique keys matched within a task; times in a sane range;
-- enqueue() never resolves a caller's temporary objects; schedule backfills capped.
--
-- enqueue() as in version 15, plus:
--   - "uniqueScope" (with a "uniqueKey"): which unfinished job holding the key counts as this
--     job's duplicate: "task" (the default: one of the same task), "queue" (one in the same
--     queue) or "global" (any, as before version 18). A key is still held by one unfinished job
--     at a time (the index stays as it was: a previous release's enqueues infer it), so a holder
--     outside the scope is never answered, replaced or cancelled: the enqueue is refused
--     (unique_violation, naming the holder), and nothing is written.
--   - "runAt" must be from 1970-01-01 to 3650 days from now (delayMs' bound).
--   - search_path: Leasehold's schema, then pg_temp (set below, for every function of the
--     schema that sets one): with pg_temp unlisted PostgreSQL searches it first, so a caller's
--     temporary table named "jobs" would have taken the job.

-- The unfinished job holding `key`, if any: its id when it is in `scope` of a job of `task` in
-- `queue`; refused (unique_violation, naming it) when it is not.
CREATE FUNCTION enqueue_check_scope(key text, scope text, task text, queue text) RETURNS bigint LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  held jobs%ROWTYPE;
BEGIN
  SELECT * INTO held FROM jobs AS j WHERE j.unique_key = key;
  IF held.id IS NULL THEN RETURN NULL; END IF;
  IF scope = 'task' AND held.task <> task OR scope = 'queue' AND held.queue <> queue THEN
    RAISE EXCEPTION 'leasehold.enqueue: uniqueKey % is held by unfinished job % of task % in queue % (unique keys are matched within the %; a key is held by one unfinished job at a time)',
                    to_jsonb(key), held.id, to_jsonb(held.task), to_jsonb(held.queue), scope
      USING ERRCODE = 'unique_violation';
  END IF;
  RETURN held.id;
END;
$$;

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
  flow_k     text;
  new_id     bigint;
  mode       text := 'keep';
  inserted   boolean;
  held_state text;
  held_queue text;
  held_run   timestamptz;
  held_try   integer;
  scope      text := 'task';
  -- "maxRunMs": null: this job runs without a time limit, whatever its task says.
  unlimited  boolean := jsonb_typeof(coalesce(options, '{}') -> 'maxRunMs') IS NOT DISTINCT FROM 'null';
BEGIN
  IF jsonb_typeof(opts) <> 'object' THEN
    PERFORM enqueue_refuse(format('options must be a JSON object (got %s)', left(opts::text, 80)));
  END IF;
  SELECT k INTO unknown FROM jsonb_object_keys(opts) AS k
   WHERE k NOT IN ('queue', 'priority', 'runAt', 'delayMs', 'maxAttempts', 'uniqueKey', 'key', 'leaseMs',
                   'progressTimeoutMs', 'maxRunMs', 'onDuplicate', 'uniqueScope')
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
    IF NOT isfinite(run_at_ts) OR run_at_ts < '1970-01-01 00:00:00+00' OR run_at_ts > now() + interval '3650 days' THEN
      PERFORM enqueue_refuse(format('runAt must be from 1970-01-01T00:00:00Z to 3650 days from now (got %s)',
                                    left((opts -> 'runAt')::text, 80)));
    END IF;
  END IF;
  delay := enqueue_integer(opts, 'delayMs', 0, 315360000000, 0);

  IF opts ? 'uniqueKey' THEN
    unique_k := opts ->> 'uniqueKey';
    IF jsonb_typeof(opts -> 'uniqueKey') <> 'string' OR char_length(unique_k) NOT BETWEEN 1 AND 512 THEN
      PERFORM enqueue_refuse(format('uniqueKey must be a non-empty string of at most 512 characters (got %s)',
                                    left((opts -> 'uniqueKey')::text, 80)));
    END IF;
  END IF;

  IF opts ? 'onDuplicate' THEN
    mode := opts ->> 'onDuplicate';
    IF jsonb_typeof(opts -> 'onDuplicate') <> 'string' OR mode NOT IN ('keep', 'replace', 'replace_payload', 'cancel_running') THEN
      PERFORM enqueue_refuse(format('onDuplicate must be one of "keep", "replace", "replace_payload", "cancel_running" (got %s)',
                                    left((opts -> 'onDuplicate')::text, 80)));
    END IF;
    IF unique_k IS NULL THEN
      PERFORM enqueue_refuse(format('onDuplicate %s needs a uniqueKey (it says what to do when an unfinished job holds the same key)',
                                    to_jsonb(mode)));
    END IF;
  END IF;

  IF opts ? 'uniqueScope' THEN
    scope := opts ->> 'uniqueScope';
    IF jsonb_typeof(opts -> 'uniqueScope') <> 'string' OR scope NOT IN ('task', 'queue', 'global') THEN
      PERFORM enqueue_refuse(format('uniqueScope must be one of "task", "queue", "global" (got %s)',
                                    left((opts -> 'uniqueScope')::text, 80)));
    END IF;
    IF unique_k IS NULL THEN
      PERFORM enqueue_refuse(format('uniqueScope %s needs a uniqueKey (it says which job holding the key is a duplicate)',
                                    to_jsonb(scope)));
    END IF;
  END IF;

  IF opts ? 'key' THEN
    flow_k := opts ->> 'key';
    IF jsonb_typeof(opts -> 'key') <> 'string' OR char_length(flow_k) NOT BETWEEN 1 AND 512 THEN
      PERFORM enqueue_refuse(format('key must be a non-empty string of at most 512 characters (got %s)',
                                    left((opts -> 'key')::text, 80)));
    END IF;
    -- A keyed job makes its queue a flow-controlled one before it exists (as lh.enqueue does).
    INSERT INTO queues AS qs (name, keyed) SELECT q, true
     WHERE NOT EXISTS (SELECT 1 FROM queues AS k WHERE k.name = q AND k.keyed)
    ON CONFLICT (name) DO UPDATE SET keyed = true, updated_at = now();
  END IF;

  -- A key held by an unfinished job answers with that job; if it finishes between the
  -- insert and the lookup, try again (a few rounds: each means another job ran to its end).
  FOR tries IN 1..5 LOOP
    IF mode <> 'keep' THEN
      -- A waiting (or blocked) holder takes the payload (and, but for replace_payload, the run
      -- time); a running one is left alone by the WHERE but locked, until this transaction ends.
      INSERT INTO jobs AS cur (queue, task, payload, priority, run_at, max_attempts, unique_key, lease_ms,
                               progress_timeout_ms, max_run_ms, max_run_unlimited, flow_key)
      VALUES (q, task, body,
              enqueue_integer(opts, 'priority', -32768, 32767, 0),
              coalesce(run_at_ts, now() + delay * interval '1 millisecond'),
              enqueue_integer(opts, 'maxAttempts', 1, 1000, 25),
              unique_k,
              enqueue_integer(opts, 'leaseMs', 1000, 86400000, NULL),
              enqueue_integer(opts, 'progressTimeoutMs', 1000, 604800000, NULL),
              CASE WHEN NOT unlimited THEN enqueue_integer(opts, 'maxRunMs', 1000, 604800000, NULL) END,
              unlimited, flow_k)
      ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL DO UPDATE
         SET payload = excluded.payload,
             run_at = CASE WHEN mode = 'replace_payload' THEN cur.run_at ELSE excluded.run_at END
       WHERE cur.state <> 'running'
         AND (scope = 'global' OR (scope = 'task' AND cur.task = excluded.task) OR (scope = 'queue' AND cur.queue = excluded.queue))
      -- xmax is 0 only on a row this statement inserted (an updated one carries our lock)
      RETURNING cur.id, cur.xmax::text = '0', cur.state, cur.queue, cur.run_at, cur.attempt
           INTO new_id, inserted, held_state, held_queue, held_run, held_try;
      IF new_id IS NOT NULL THEN
        IF NOT inserted AND held_state = 'waiting' AND mode <> 'replace_payload' THEN
          -- Its time moved: wake the queue's workers if it is due, and move its NATS doorbell.
          IF held_run <= now() THEN PERFORM pg_notify('leasehold:' || current_schema(), held_queue); END IF;
          IF nats_dispatch_active() THEN
            INSERT INTO dispatch_outbox (job_id, attempt, publish_at) VALUES (new_id, held_try, greatest(held_run, now()))
            ON CONFLICT (job_id, attempt) DO UPDATE SET publish_at = excluded.publish_at;
            PERFORM pg_notify('leasehold:' || current_schema() || ':dispatch', '');
          END IF;
        END IF;
        RETURN new_id;
      END IF;
      -- Held by a running job (or one outside the scope, refused here), which the upsert
      -- locked: free the key from it (and request its cancel), then insert.
      PERFORM enqueue_check_scope(unique_k, scope, task, q);
      UPDATE jobs AS j
         SET unique_key = NULL,
             cancel_requested_at = CASE WHEN mode = 'cancel_running' THEN coalesce(j.cancel_requested_at, now())
                                        ELSE j.cancel_requested_at END
       WHERE j.unique_key = unique_k AND j.state = 'running';
      CONTINUE;
    END IF;
    INSERT INTO jobs (queue, task, payload, priority, run_at, max_attempts, unique_key, lease_ms,
                      progress_timeout_ms, max_run_ms, max_run_unlimited, flow_key)
    VALUES (q, task, body,
            enqueue_integer(opts, 'priority', -32768, 32767, 0),
            coalesce(run_at_ts, now() + delay * interval '1 millisecond'),
            enqueue_integer(opts, 'maxAttempts', 1, 1000, 25),
            unique_k,
            enqueue_integer(opts, 'leaseMs', 1000, 86400000, NULL),
            enqueue_integer(opts, 'progressTimeoutMs', 1000, 604800000, NULL),
            CASE WHEN NOT unlimited THEN enqueue_integer(opts, 'maxRunMs', 1000, 604800000, NULL) END,
            unlimited, flow_k)
    ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL DO NOTHING
    RETURNING id INTO new_id;
    IF new_id IS NOT NULL THEN RETURN new_id; END IF;
    new_id := enqueue_check_scope(unique_k, scope, task, q);
    IF new_id IS NOT NULL THEN RETURN new_id; END IF;
  END LOOP;
  RAISE EXCEPTION 'leasehold.enqueue: unique key % neither inserted nor found after 5 rounds', to_jsonb(unique_k);
END;
$$;

-- pg_temp last, for every function of this schema that sets a search_path (see the header).
DO $$
DECLARE
  f regprocedure;
BEGIN
  FOR f IN SELECT p.oid::regprocedure FROM pg_proc AS p
            WHERE p.pronamespace = current_schema()::regnamespace
              AND EXISTS (SELECT 1 FROM unnest(p.proconfig) AS c WHERE c LIKE 'search\_path=%')
  LOOP
    EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
  END LOOP;
END;
$$;

-- Schedules: how many missed ticks a backfill enqueues at most (the latest ones); NULL: the
-- default (100). A previous release's scheduler ignores it.
ALTER TABLE schedules ADD COLUMN backfill_limit integer CHECK (backfill_limit BETWEEN 1 AND 1000);
