-- Leasehold schema, version 30: callback tokens and re-runs from a step (docs/durable-callbacks.md).
--
-- A callback (ctx.callback) is a step of kind 'callback' whose record holds its token: a replay
-- hands out the same token. Its wait is a wait for the event 'callback:<sha256 of the token, hex>',
-- so the token itself never appears in an event, a job's `wait` or a log. complete_callback()
-- is the one way to use a token: it checks the token was handed out and not used, then sends
-- the event under the event's lock, so two completions of one token cannot both send it.
--
-- A re-run from a step (lh.rerunFromStep) moves a finished job back to waiting and drops the
-- step records from that step's place on; job_reruns keeps what was dropped, who asked and when.
--
-- Additive: new objects only. A previous release's workers never record a 'callback' step.

-- The tokens' records: a callback's wait is a 'callback' record too, but with its event (and the
-- data it was completed with, which is the caller's to shape), so it is never read as a token.
CREATE INDEX job_steps_callback_token_idx ON job_steps ((result ->> 'token')) WHERE kind = 'callback' AND event IS NULL;

-- Uses a callback token: 'completed' (the event is sent: its job resumes with `data`), or why
-- not: 'unknown' (never handed out, or its record was dropped by a re-run), 'used' (completed
-- before), 'timed_out' (its wait ended without it), 'finished' (its job is no longer active).
CREATE FUNCTION complete_callback(token text, data jsonb DEFAULT NULL) RETURNS text LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  handed_job bigint;
  event_name text;
  wait_event_id bigint;
BEGIN
  IF token IS NULL OR token !~ '^[A-Za-z0-9_-]{43}$' THEN
    RETURN 'unknown';
  END IF;
  SELECT s.job_id INTO handed_job FROM job_steps AS s WHERE s.kind = 'callback' AND s.event IS NULL AND s.result ->> 'token' = token;
  IF NOT FOUND THEN
    RETURN 'unknown';
  END IF;
  event_name := 'callback:' || encode(sha256(convert_to(token, 'UTF8')), 'hex');
  -- Exclusive: a second completion of this token waits here until the first commits, then sees its event.
  PERFORM pg_advisory_xact_lock(event_lock_key(event_name));
  IF EXISTS (SELECT 1 FROM events AS e WHERE e.name = event_name) THEN
    RETURN 'used';
  END IF;
  SELECT s.event_id INTO wait_event_id FROM job_steps AS s
   WHERE s.job_id = handed_job AND s.event = event_name AND s.state = 'succeeded';
  IF FOUND THEN
    -- The wait is over: it received the token's event (since removed by retention), or timed out.
    RETURN CASE WHEN wait_event_id IS NULL THEN 'timed_out' ELSE 'used' END;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM jobs AS j WHERE j.id = handed_job) THEN
    RETURN 'finished';
  END IF;
  PERFORM send_event(event_name, data);
  RETURN 'completed';
END;
$$;

-- The audit trail of re-runs: one row per re-run, with the records it dropped as they were.
CREATE TABLE job_reruns (
  id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  job_id          bigint      NOT NULL,
  from_seq        integer     NOT NULL,
  from_step       text        NOT NULL,
  from_occurrence integer     NOT NULL,
  -- The state the job had finished in: succeeded, cancelled or dead.
  previous_state  text        NOT NULL,
  requested_by    text,
  requested_at    timestamptz NOT NULL DEFAULT now(),
  steps_dropped   jsonb       NOT NULL
);
CREATE INDEX job_reruns_job_idx ON job_reruns (job_id, id);
