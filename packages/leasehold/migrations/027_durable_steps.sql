-- Leasehold schema, version 27: durable steps (docs/durable.md).
--
-- A durable handler records each step's result under its attempt's fence (job_steps), so a later
-- attempt replays the recorded steps instead of running them again. A handler can suspend its
-- job: a sleep, or a wait for an event (events). A suspended job holds no lease and no worker
-- slot: it is a row in state 'suspended' that no claim reads, woken by the watchdog when its time
-- comes (jobs_wake_idx) or by the event it waits for (jobs_wait_event_idx).
--
-- Additive: a previous release's workers never claim a suspended job (they claim 'waiting'
-- only), and its statements leave `wait` alone. Only this release's watchdogs wake suspended
-- jobs, so upgrade every process before handlers use ctx.sleep or ctx.waitForEvent.

ALTER TABLE jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_state_check CHECK (state IN ('waiting', 'running', 'blocked', 'suspended')) NOT VALID;

-- Why a suspended job waits, for readers and for the wake: {kind, step, until, event, match}.
-- Kept while the woken job runs (the last wait it had), cleared when an attempt ends otherwise.
ALTER TABLE jobs ADD COLUMN wait jsonb;

-- The watchdog's wake: due suspended jobs, in wake order. Only suspended jobs are in it.
CREATE INDEX jobs_wake_idx ON jobs (run_at) WHERE state = 'suspended';
-- An event's waiters.
CREATE INDEX jobs_wait_event_idx ON jobs ((wait ->> 'event')) WHERE state = 'suspended';

ALTER TABLE job_attempts DROP CONSTRAINT job_attempts_outcome_check;
ALTER TABLE job_attempts ADD CONSTRAINT job_attempts_outcome_check CHECK (
  outcome IN ('succeeded', 'failed', 'lease_expired', 'worker_lost', 'stalled', 'timed_out', 'released', 'cancelled',
              'superseded', 'rate_limited', 'suspended')
) NOT VALID;

-- A step's record (or a suspension) refused by the fence is kept like a refused report.
ALTER TABLE stale_refusals DROP CONSTRAINT stale_refusals_kind_check;
ALTER TABLE stale_refusals ADD CONSTRAINT stale_refusals_kind_check CHECK (
  kind IN ('heartbeat', 'complete', 'fail', 'release', 'supersede', 'step')
) NOT VALID;

-- A job's recorded steps, in the order its handler called them (seq). A step is identified by
-- its name and its occurrence (the how-many-th call of that name); seq checks the order on
-- replay. Rows outlive the job's row (a finished job's steps stay readable) until retention
-- removes them with the job's history.
CREATE TABLE job_steps (
  job_id      bigint      NOT NULL,
  seq         integer     NOT NULL CHECK (seq >= 0),
  name        text        NOT NULL,
  occurrence  integer     NOT NULL CHECK (occurrence >= 0),
  kind        text        NOT NULL CHECK (kind IN ('step', 'transaction', 'sleep', 'event', 'children', 'callback')),
  -- 'waiting': a wait begun, not over (its deadline in wake_at); 'failed': the step threw, and
  -- a later attempt runs it again (the failure is kept for readers until then).
  state       text        NOT NULL CHECK (state IN ('succeeded', 'failed', 'waiting')),
  attempt     integer     NOT NULL,
  result      jsonb,
  error       text,
  duration_ms integer,
  wake_at     timestamptz,
  event       text,
  event_id    bigint,
  recorded_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (job_id, seq)
);

-- Events for waiting jobs. Kept for a retention window (docs/durable.md#events), so that a wait
-- that begins after its event was sent still receives it.
CREATE TABLE events (
  id      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  name    text        NOT NULL,
  data    jsonb,
  sent_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX events_name_idx ON events (name, id);
-- Append-only: retention finds old rows by time for almost nothing.
CREATE INDEX events_sent_at_idx ON events USING brin (sent_at);

-- The lock that orders an event's senders and its beginning waits (below), keyed like the
-- workers' locks: by schema and name, so two Leasehold schemas in one database never share one.
CREATE FUNCTION event_lock_key(event text) RETURNS bigint LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$ SELECT hashtextextended('leasehold:' || current_schema() || ':event:' || event, 0) $$;

-- Sends an event: stores it and wakes the jobs suspended on it whose match it satisfies. Every
-- sender comes here (the library, `leasehold serve`, the CLI, a trigger), so there is one rule.
-- Inside the caller's transaction: the event exists, and its waiters wake, only if it commits.
--
-- The race with a wait that is beginning: a wait looks for a stored event and suspends if there
-- is none, holding the event's lock exclusively (store/steps.ts); a sender holds it shared until
-- its transaction ends. So either the wait's look sees the committed event, or the send comes
-- after the suspension and wakes the job here.
CREATE FUNCTION send_event(event text, data jsonb DEFAULT NULL) RETURNS bigint LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  sent_id bigint;
  woken_queues text[];
BEGIN
  IF event IS NULL OR length(event) = 0 OR length(event) > 255 OR event ~ '[[:cntrl:]]' THEN
    RAISE EXCEPTION 'leasehold: an event name is 1 to 255 characters without control characters, got %',
      coalesce(quote_literal(left(event, 80)), 'NULL')
      USING ERRCODE = '22023';
  END IF;
  IF octet_length(coalesce(data, 'null'::jsonb)::text) > 262144 THEN
    RAISE EXCEPTION 'leasehold: event data is % bytes as JSON; the limit is 262144 (256 KiB)', octet_length(data::text)
      USING ERRCODE = '22023';
  END IF;
  PERFORM pg_advisory_xact_lock_shared(event_lock_key(event));
  INSERT INTO events (name, data) VALUES (event, data) RETURNING id INTO sent_id;
  WITH woken AS (
    UPDATE jobs AS j
       SET state = 'waiting', run_at = now()
     WHERE j.state = 'suspended' AND j.wait ->> 'event' = event
       AND (NOT j.wait ? 'match' OR coalesce(data, 'null'::jsonb) @> (j.wait -> 'match'))
       AND j.created_at <= now()
    RETURNING j.id, j.queue, j.attempt
  ), doorbells AS (
    INSERT INTO dispatch_outbox (job_id, attempt, publish_at, recovery)
    SELECT w.id, w.attempt, now(), false FROM woken AS w WHERE nats_dispatch_active()
    ON CONFLICT DO NOTHING
  )
  SELECT array_agg(DISTINCT w.queue) INTO woken_queues FROM woken AS w;
  IF woken_queues IS NOT NULL THEN
    PERFORM pg_notify('leasehold:' || current_schema(), q) FROM unnest(woken_queues) AS q;
    IF nats_dispatch_active() THEN
      PERFORM pg_notify('leasehold:' || current_schema() || ':dispatch', '');
    END IF;
  END IF;
  RETURN sent_id;
END;
$$;

-- enqueue() as in version 18, but a unique key held by a suspended job (a durable job, its steps
-- half done) is treated as one held by a running job: its payload and wake time are never
-- replaced; the key is freed for the new job, and cancel_running ends it at once.
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
  freed_id    bigint;
  freed_state text;
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
      -- time); a running or suspended one is left alone by the WHERE but locked, until this
      -- transaction ends.
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
       WHERE cur.state NOT IN ('running', 'suspended')
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
      -- Held by a running or suspended job (or one outside the scope, refused here), which the
      -- upsert locked: free the key from it, then insert. cancel_running requests a running
      -- holder's cancel, and ends a suspended one (no handler to abort) as lh.cancel does.
      PERFORM enqueue_check_scope(unique_k, scope, task, q);
      UPDATE jobs AS j
         SET unique_key = NULL,
             cancel_requested_at = CASE WHEN mode = 'cancel_running' AND j.state = 'running'
                                        THEN coalesce(j.cancel_requested_at, now()) ELSE j.cancel_requested_at END
       WHERE j.unique_key = unique_k AND j.state IN ('running', 'suspended')
      RETURNING j.id, j.state INTO freed_id, freed_state;
      IF mode = 'cancel_running' AND freed_state = 'suspended' THEN
        WITH ended AS (
          DELETE FROM jobs AS j WHERE j.id = freed_id AND j.state = 'suspended' RETURNING j.*
        )
        INSERT INTO job_history (id, queue, task, payload, priority, state, attempt, spent_attempts, max_attempts,
                                 lease_ms, progress, checkpoint, last_error, unique_key, created_at, started_at,
                                 fence, progress_timeout_ms, max_run_ms, max_run_unlimited, generation)
        SELECT e.id, e.queue, e.task, e.payload, e.priority, 'cancelled', e.attempt, e.spent_attempts, e.max_attempts,
               e.lease_ms, e.progress, e.checkpoint, e.last_error, e.unique_key, e.created_at, e.started_at,
               e.fence, e.progress_timeout_ms, e.max_run_ms, e.max_run_unlimited, history_generation(now())
          FROM ended AS e;
      END IF;
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
