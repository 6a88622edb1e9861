-- Leasehold schema, version 14: jobs that build on jobs (docs/flows.md).
--
-- Results: a handler's return value is kept with the attempt that succeeded, in its
-- job_history row (finished_jobs.result). Retention forgets it with the row.
--
-- Dependencies: a job enqueued with parents waits in state 'blocked', which no claim reads (the
-- claim indexes cover 'waiting' only). job_dependencies holds the edges, kept until retention
-- forgets the child. The blocked job counts its parents that have not ended
-- (parents_pending) and those that ended dead or cancelled. When a parent leaves `jobs`, by
-- whichever path (completion, ctx.transaction, dead letter, cancel, orphan scan), the triggers
-- below settle its dependents in the same transaction: a child whose last parent ended is
-- released to 'waiting' (and wakes workers as an enqueue does); a child of a parent that ended
-- dead or cancelled is cancelled at once, unless it was enqueued with
-- on_parent_failure = 'run', in which case it is released when all its parents have ended and
-- reads their states. A cancel cascades through any depth in one loop, not by nested triggers.
--
-- Two triggers do it, and a row without dependents or a waiter fires neither (their WHEN is
-- checked per row; no event is queued otherwise), so the plain path pays nothing: a row trigger
-- that notes the ended parent's id for the transaction, and a deferred constraint trigger that
-- settles every noted parent at commit (the first one settles them all; the rest find nothing).
-- Children are locked in id order: two transactions ending parents of the same children never
-- deadlock.
--
-- Waiting for a job (lh.waitFor): a waiter marks the job `watched`, and its end sends NOTIFY
-- on the channel "leasehold:<schema>:ended" with the job's id. Cancel requests of running jobs
-- send NOTIFY "leasehold:<schema>:cancel" with "id:attempt:worker", so the worker holding the
-- attempt aborts its handler at once instead of at its next heartbeat.
--
-- Additive: new columns (nullable or with a constant default, no rewrite), a new table, new
-- triggers; 'blocked' jobs are invisible to the previous release's claims (they read
-- state = 'waiting').

-- jobs first: workers' statements lock jobs, then job_history (a completion deletes from one and
-- inserts into the other). Altering job_history first, then waiting for jobs, deadlocked with a
-- completion in flight during a rolling upgrade (test/upgrade.test.ts); locked in their order,
-- the completion finishes and the migration takes jobs after it.
LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE;

ALTER TABLE job_history ADD COLUMN result jsonb;

-- Columns may only be added at the end of a view that others (all_attempts) depend on.
CREATE OR REPLACE VIEW finished_jobs AS
SELECT id, queue, task, payload, priority, state, attempt, spent_attempts, max_attempts, lease_ms, progress,
       checkpoint, last_error, unique_key, created_at, started_at, finished_at, worker_id, outcome,
       fence, progress_timeout_ms, max_run_ms, max_run_unlimited, result
  FROM job_history
UNION ALL
SELECT id, queue, task, payload, priority, state, attempt, spent_attempts, max_attempts, lease_ms, progress,
       checkpoint, last_error, unique_key, created_at, started_at, finished_at, worker_id, outcome,
       fence, progress_timeout_ms, max_run_ms, max_run_unlimited, NULL::jsonb
  FROM dead_jobs;

ALTER TABLE jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_state_check CHECK (state IN ('waiting', 'running', 'blocked'));

ALTER TABLE jobs
  -- set when a job gets its first dependent; its end then settles them
  ADD COLUMN has_dependents    boolean NOT NULL DEFAULT false,
  -- set by a waiter (lh.waitFor); its end then sends a notification
  ADD COLUMN watched           boolean NOT NULL DEFAULT false,
  -- a dependent job's parents: not yet ended, and ended dead or cancelled
  ADD COLUMN parents_pending   integer,
  ADD COLUMN parents_dead      integer,
  ADD COLUMN parents_cancelled integer,
  -- what a parent's failure does to this job: 'cancel' it, or 'run' it once all have ended
  ADD COLUMN on_parent_failure text,
  ADD CONSTRAINT jobs_on_parent_failure_check CHECK (on_parent_failure IN ('cancel', 'run')),
  ADD CONSTRAINT jobs_blocked_has_parents CHECK (state <> 'blocked' OR parents_pending > 0 OR parents_dead > 0 OR parents_cancelled > 0);

-- The edges of every flow; ref is the child's name for the parent (the graph's ref, or null).
CREATE TABLE job_dependencies (
  child_id  bigint NOT NULL,
  parent_id bigint NOT NULL,
  ref       text,
  PRIMARY KEY (child_id, parent_id),
  CONSTRAINT job_dependencies_not_self CHECK (child_id <> parent_id)
);
CREATE INDEX job_dependencies_parent_idx ON job_dependencies (parent_id);

-- A blocked job waits for its parents, not for a time: it is listed apart.
CREATE INDEX jobs_blocked_idx ON jobs (id) WHERE state = 'blocked';

DO $migration$
BEGIN
  EXECUTE format($fn$
-- Per ended row that has dependents or a waiter: note it for the statement trigger, wake the waiter.
CREATE FUNCTION note_ended_job() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF OLD.watched THEN
    PERFORM pg_notify('leasehold:' || TG_TABLE_SCHEMA || ':ended', OLD.id::text);
  END IF;
  -- Noted as id, or -id when the row itself says the job was cancelled (a waiting or blocked
  -- job ends only by a cancel, a running one with a cancel requested ends cancelled): only the
  -- others need a look at the dead letter to tell a success from a death.
  IF OLD.has_dependents THEN
    PERFORM set_config('leasehold.ended_parents',
                       coalesce(nullif(current_setting('leasehold.ended_parents', true), '') || ',', '')
                       || CASE WHEN OLD.state <> 'running' OR OLD.cancel_requested_at IS NOT NULL THEN -OLD.id ELSE OLD.id END,
                       true);
  END IF;
  RETURN NULL;
END;
$$;

-- At commit, per ended parent: settle the dependents of every parent noted (the first call does all).
CREATE FUNCTION settle_ended_parents() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF coalesce(current_setting('leasehold.ended_parents', true), '') = ''
     OR current_setting('leasehold.settling', true) = 'on' THEN
    RETURN NULL;
  END IF;
  PERFORM %1$I.settle_dependents();
  RETURN NULL;
END;
$$;

-- Per cancel request of a running attempt: tell the worker that holds it.
CREATE FUNCTION notify_cancel_requested() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('leasehold:' || TG_TABLE_SCHEMA || ':cancel', NEW.id || ':' || NEW.attempt || ':' || NEW.locked_by);
  RETURN NULL;
END;
$$;
$fn$, current_schema());
END
$migration$;

-- Settles the dependents of the parents noted in this transaction (leasehold.ended_parents), and
-- of the dependents it cancels in turn, until none are left: one loop for any depth.
--
-- Generic plans: with custom ones (the default, as their estimates beat the generic plan's)
-- every call planned its statements again, ~8 ms a parent, most of a chain step's time. A
-- generic plan is made once per session, maybe while the tables are nearly empty, so every
-- statement here reaches rows only through ids it was given (an id array, or a LATERAL
-- lookup by parent), and sequential scans are off: no plan can walk all blocked jobs or all
-- edges, however small the tables looked when it was made.
CREATE FUNCTION settle_dependents() RETURNS void LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
DECLARE
  ended_ids  bigint[];
  parent_ids bigint[];
  child_ids  bigint[];
  any_failed boolean;
  doomed_ids bigint[];
  woke       bigint;
  -- every blocked descendant of the ended parents is locked (see below)
  all_locked boolean := false;
BEGIN
  PERFORM set_config('leasehold.settling', 'on', true);
  LOOP
    ended_ids := string_to_array(nullif(current_setting('leasehold.ended_parents', true), ''), ',')::bigint[];
    EXIT WHEN ended_ids IS NULL;
    PERFORM set_config('leasehold.ended_parents', '', true);

    SELECT array_agg(abs(e.id)), bool_or(e.id < 0 OR EXISTS (SELECT 1 FROM dead_jobs AS x WHERE x.id = e.id))
      INTO parent_ids, any_failed
      FROM unnest(ended_ids) AS e(id);
    SELECT array_agg(DISTINCT d.child_id) INTO child_ids
      FROM unnest(parent_ids) AS e(id)
     CROSS JOIN LATERAL (SELECT j.child_id FROM job_dependencies AS j WHERE j.parent_id = e.id) AS d;
    CONTINUE WHEN child_ids IS NULL;

    -- Lock before changing any, in id order: no deadlock between two transactions that end
    -- parents of the same children. When every parent succeeded, only the children change.
    -- When one failed, the cancel may cascade to any depth; a round that locked only children
    -- would take its grandchildren's locks later, after a second cascade crossing this one
    -- (pA -> x2 -> y1 -> x1 <- pA, pB -> y1) took them: every blocked descendant is locked
    -- now, in one ordered pass, and the later rounds touch only rows already locked.
    IF all_locked THEN
      NULL;
    ELSIF any_failed THEN
      PERFORM 1 FROM jobs AS c
       WHERE c.state = 'blocked'
         AND c.id = ANY(ARRAY(WITH RECURSIVE below(id) AS (
                                SELECT u.id FROM unnest(child_ids) AS u(id)
                                UNION
                                SELECT d.child_id FROM below AS b
                                 CROSS JOIN LATERAL (SELECT j.child_id FROM job_dependencies AS j WHERE j.parent_id = b.id) AS d
                              )
                              SELECT b.id FROM below AS b))
       ORDER BY c.id
         FOR UPDATE OF c;
      all_locked := true;
    ELSE
      PERFORM 1 FROM jobs AS c WHERE c.id = ANY(child_ids) AND c.state = 'blocked' ORDER BY c.id FOR UPDATE OF c;
    END IF;

    WITH ended AS (
      -- How each parent ended: noted as cancelled (a negative id), else dead if it is in the
      -- dead letter, else succeeded (a superseded attempt is a success too).
      SELECT abs(e.id) AS id,
             CASE WHEN e.id < 0 THEN 'cancelled'
                  WHEN EXISTS (SELECT 1 FROM dead_jobs AS x WHERE x.id = e.id) THEN 'dead'
                  ELSE 'succeeded' END AS state
        FROM unnest(ended_ids) AS e(id)
    ), per_child AS (
      SELECT d.child_id,
             count(*)::int AS n,
             count(*) FILTER (WHERE e.state = 'dead')::int AS dead,
             count(*) FILTER (WHERE e.state = 'cancelled')::int AS cancelled,
             min(e.id) FILTER (WHERE e.state <> 'succeeded') AS failed_parent,
             (array_agg(e.state ORDER BY e.id) FILTER (WHERE e.state <> 'succeeded'))[1] AS failed_state
        FROM ended AS e
       CROSS JOIN LATERAL (SELECT j.child_id FROM job_dependencies AS j WHERE j.parent_id = e.id) AS d
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
       WHERE c.id = ANY(child_ids) AND c.id = p.child_id AND c.state = 'blocked'
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

CREATE TRIGGER jobs_note_ended AFTER DELETE ON jobs
  FOR EACH ROW WHEN (OLD.has_dependents OR OLD.watched)
  EXECUTE FUNCTION note_ended_job();
CREATE CONSTRAINT TRIGGER jobs_settle_ended AFTER DELETE ON jobs
  DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW WHEN (OLD.has_dependents)
  EXECUTE FUNCTION settle_ended_parents();
CREATE TRIGGER jobs_notify_cancel AFTER UPDATE OF cancel_requested_at ON jobs
  FOR EACH ROW WHEN (OLD.cancel_requested_at IS NULL AND NEW.cancel_requested_at IS NOT NULL AND NEW.state = 'running')
  EXECUTE FUNCTION notify_cancel_requested();
