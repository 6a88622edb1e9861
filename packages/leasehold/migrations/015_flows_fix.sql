-- Leasehold schema, version 15: two cancel cascades that cross no longer deadlock.
--
-- Migration 014 settles the dependents of ended jobs in rounds, locking each round's children
-- in id order. A cancel that cascades takes its grandchildren's locks in a later round, while
-- holding the children's; a second cascade that reaches the same rows from another parent
-- holds some of those grandchildren (its own children) and then wants this one's children
-- (its grandchildren): PostgreSQL found the deadlock and aborted one of the two statements
-- (a cancel, a dead letter, a completion), e.g. for pA -> x2 -> y1 -> x1 <- pA and pB -> y1,
-- pA and pB ending dead or cancelled at once. Now a round with any parent that did not
-- succeed locks every blocked descendant of its parents up front, in one pass in id order;
-- a round of successes alone locks the children only, as before (no added locks on the path
-- of a chain or a fan-in).
--
-- Replaces the function only: same signature, same settings, same triggers.

CREATE OR REPLACE FUNCTION settle_dependents() RETURNS void LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  ended_ids  bigint[];
  doomed_ids bigint[];
  woke       bigint;
  -- every blocked descendant of this statement's ended parents is locked (see below)
  all_locked boolean := false;
BEGIN
  PERFORM set_config('leasehold.settling', 'on', true);
  LOOP
    ended_ids := string_to_array(nullif(current_setting('leasehold.ended_parents', true), ''), ',')::bigint[];
    EXIT WHEN ended_ids IS NULL;
    PERFORM set_config('leasehold.ended_parents', '', true);

    -- Lock before changing any, in id order: no deadlock between two statements that end
    -- parents of the same children. When every ended parent succeeded, only the children
    -- change. When one failed, the cancel may cascade to any depth, and a round that locked
    -- only children would take its grandchildren's locks later, after another cascade
    -- crossing this one took them (014 deadlocked there): every blocked descendant is locked
    -- now, in one ordered pass, and later rounds (the cascade) touch only rows already locked.
    IF all_locked THEN
      NULL;
    ELSIF EXISTS (SELECT 1 FROM unnest(ended_ids) AS e(id)
                WHERE NOT EXISTS (SELECT 1 FROM job_history AS h WHERE h.id = e.id AND h.state = 'succeeded')) THEN
      PERFORM 1 FROM jobs AS c
       WHERE c.state = 'blocked'
         AND c.id IN (WITH RECURSIVE below(id) AS (
                        SELECT d.child_id FROM job_dependencies AS d WHERE d.parent_id = ANY(ended_ids)
                        UNION
                        SELECT d.child_id FROM job_dependencies AS d JOIN below AS b ON d.parent_id = b.id
                      )
                      SELECT b.id FROM below AS b)
       ORDER BY c.id
         FOR UPDATE OF c;
      all_locked := true;
    ELSE
      PERFORM 1 FROM jobs AS c
       WHERE c.state = 'blocked'
         AND c.id IN (SELECT d.child_id FROM job_dependencies AS d WHERE d.parent_id = ANY(ended_ids))
       ORDER BY c.id
         FOR UPDATE OF c;
    END IF;

    WITH ended AS (
      -- How each parent ended: a success is in job_history as succeeded, a dead job in the dead
      -- letter; anything else (cancelled, removed) counts as cancelled.
      SELECT e.id,
             CASE WHEN EXISTS (SELECT 1 FROM job_history AS h WHERE h.id = e.id AND h.state = 'succeeded') THEN 'succeeded'
                  WHEN EXISTS (SELECT 1 FROM dead_jobs AS x WHERE x.id = e.id) THEN 'dead'
                  ELSE 'cancelled' END AS state
        FROM unnest(ended_ids) AS e(id)
    ), per_child AS (
      SELECT d.child_id,
             count(*)::int AS n,
             count(*) FILTER (WHERE e.state = 'dead')::int AS dead,
             count(*) FILTER (WHERE e.state = 'cancelled')::int AS cancelled,
             min(e.id) FILTER (WHERE e.state <> 'succeeded') AS failed_parent,
             (array_agg(e.state ORDER BY e.id) FILTER (WHERE e.state <> 'succeeded'))[1] AS failed_state
        FROM job_dependencies AS d
        JOIN ended AS e ON e.id = d.parent_id
       GROUP BY d.child_id
    ), settled AS (
      UPDATE jobs AS c
         SET parents_pending = c.parents_pending - p.n,
             parents_dead = coalesce(c.parents_dead, 0) + p.dead,
             parents_cancelled = coalesce(c.parents_cancelled, 0) + p.cancelled,
             last_error = CASE WHEN p.failed_parent IS NOT NULL AND c.last_error IS NULL
                               THEN format('parent job %s ended %s', p.failed_parent, p.failed_state)
                               ELSE c.last_error END,
             state = CASE WHEN c.parents_pending - p.n = 0
                           AND (c.on_parent_failure = 'run'
                                OR coalesce(c.parents_dead, 0) + p.dead + coalesce(c.parents_cancelled, 0) + p.cancelled = 0)
                          THEN 'waiting' ELSE 'blocked' END
        FROM per_child AS p
       WHERE c.id = p.child_id AND c.state = 'blocked'
      RETURNING c.id, c.queue, c.state, c.run_at, c.attempt, c.on_parent_failure,
                coalesce(c.parents_dead, 0) + coalesce(c.parents_cancelled, 0) AS failed
    ), woken AS (
      -- released jobs wake workers as an enqueue does, and owe a NATS doorbell while it is active
      SELECT count(pg_notify('leasehold:' || current_schema(), q.queue))
             + count(CASE WHEN nats_dispatch_active() THEN pg_notify('leasehold:' || current_schema() || ':dispatch', '') END) AS n
        FROM (SELECT DISTINCT s.queue FROM settled AS s WHERE s.state = 'waiting' AND s.run_at <= now()) AS q
    ), doorbells AS (
      INSERT INTO dispatch_outbox (job_id, attempt, publish_at)
      SELECT s.id, s.attempt, greatest(s.run_at, now()) FROM settled AS s
       WHERE s.state = 'waiting' AND nats_dispatch_active()
      ON CONFLICT DO NOTHING
      RETURNING job_id
    )
    -- the doorbells are written whether read or not; the notifications only when read
    SELECT (SELECT w.n FROM woken AS w),
           array_agg(s.id) FILTER (WHERE s.state = 'blocked' AND s.failed > 0 AND s.on_parent_failure = 'cancel')
      INTO woke, doomed_ids
      FROM settled AS s;

    -- A parent failed and these jobs do not run on failure: cancelled now, in a statement of
    -- its own (a statement cannot delete the rows it updates); their own dependents are
    -- noted by the row trigger and settled by the next round of this loop.
    IF doomed_ids IS NOT NULL THEN
      WITH doomed AS (
        DELETE FROM jobs AS c WHERE c.id = ANY(doomed_ids) AND c.state = 'blocked' RETURNING c.*
      )
      INSERT INTO job_history (id, queue, task, payload, priority, state, attempt, spent_attempts, max_attempts,
                               lease_ms, progress, checkpoint, last_error, unique_key, created_at, started_at,
                               fence, progress_timeout_ms, max_run_ms, max_run_unlimited, generation)
      SELECT id, queue, task, payload, priority, 'cancelled', attempt, spent_attempts, max_attempts,
             lease_ms, progress, checkpoint, last_error, unique_key, created_at, started_at,
             fence, progress_timeout_ms, max_run_ms, max_run_unlimited, history_generation(now())
        FROM doomed;
    END IF;
  END LOOP;
  PERFORM set_config('leasehold.settling', '', true);
END;
$$;
