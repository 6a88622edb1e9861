-- Leasehold schema, version 19: a handler's hold is bounded, scoped and visible (docs/flow-control.md).
--
-- A handler that throws RateLimitedError holds back its key or its queue. Before this version it
-- could hold its whole queue for 24 h, again and again, and only SQL could lift it. Now:
--
--   max_hold_ms       the longest hold a handler may ask for in this queue; a longer one is
--                     clamped to it (null: the default, 5 minutes). So is the job's own wait
--                     (in rateLimitJobs): a keyed job not yet due blocks its key's line.
--   allow_queue_hold  a handler may hold the whole queue (scope "queue", or a keyless job).
--                     Off by default: a keyed job holds only its own key, a keyless one only
--                     itself.
--   held_by_job       which job set the hold in force (of the queue; of a key in flow_key_state).
--
-- Additive: nullable columns and one with a default; flow_hold() keeps its signature (the
-- previous release's workers call it) and now applies the same cap and scope.

ALTER TABLE queues ADD COLUMN max_hold_ms integer CHECK (max_hold_ms BETWEEN 1000 AND 86400000);
ALTER TABLE queues ADD COLUMN allow_queue_hold boolean NOT NULL DEFAULT false;
ALTER TABLE queues ADD COLUMN held_by_job bigint;
ALTER TABLE flow_key_state ADD COLUMN held_by_job bigint;

-- The hold a rate-limited job asked for, as its queue allows it: its key (or, where the queue
-- allows it, the whole queue) starts nothing for delay_ms, at most the queue's max_hold_ms. A
-- later hold never shortens an earlier one; the job of the later-ending one is recorded.
CREATE FUNCTION rate_limit_hold(q text, k text, whole_queue boolean, delay_ms bigint, job bigint) RETURNS void LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  s     queues;
  until timestamptz;
BEGIN
  SELECT * INTO s FROM queues AS qs WHERE qs.name = q;
  until := now() + least(delay_ms, coalesce(s.max_hold_ms, 300000)) * interval '1 millisecond';
  IF (whole_queue OR k IS NULL) AND coalesce(s.allow_queue_hold, false) THEN
    UPDATE queues AS qs
       SET held_until = until, held_by_job = job
     WHERE qs.name = q AND (qs.held_until IS NULL OR qs.held_until < until);
  ELSIF k IS NOT NULL THEN
    INSERT INTO flow_key_state AS ks (queue, flow_key, held_until, held_by_job) VALUES (q, k, until, job)
    ON CONFLICT (queue, flow_key) DO UPDATE
       SET held_until = EXCLUDED.held_until, held_by_job = EXCLUDED.held_by_job
     WHERE ks.held_until IS NULL OR ks.held_until < EXCLUDED.held_until;
  END IF;
  -- Otherwise (a keyless job, its queue not allowing a queue hold) only the job itself waits.
END;
$$;

-- Version 13's entry, for the previous release's workers: a null key asked for the whole queue.
CREATE OR REPLACE FUNCTION flow_hold(q text, k text, until timestamptz) RETURNS void LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
  PERFORM rate_limit_hold(q, k, k IS NULL, greatest(ceil(extract(epoch FROM until - now()) * 1000), 1)::bigint, NULL);
END;
$$;
