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
