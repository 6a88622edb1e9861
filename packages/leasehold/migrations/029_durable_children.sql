-- Leasehold schema, version 29: a durable handler's children (ctx.children, docs/durable-children.md).
--
-- A durable job starts child jobs (or a child flow) as a step, and suspends until every child
-- has ended (succeeded, dead or cancelled). Each child names the job that awaits it
-- (awaited_by); the awaiting job counts its children that have not ended (children_pending).
-- When a child leaves `jobs`, by whichever path (completion, ctx.transaction, dead letter,
-- cancel, a flow's cancel cascade, orphan scan), the triggers below take one off its awaiting
-- job's count in the same transaction, and wake that job (suspended -> waiting) when the count
-- reaches 0. A job still running when its last child ends (it has not suspended yet, or is
-- replaying) is not woken: its own suspension finds the count at 0 and reads the ends instead.
--
-- The plain path pays nothing: a row without awaited_by fires neither trigger (their WHEN is
-- checked per row, and no event is queued otherwise). As in version 14, a row trigger notes the
-- awaiting job for the transaction and a deferred constraint trigger settles every noted job at
-- commit, locked in id order: two transactions ending children of the same jobs never deadlock.
--
-- Additive: two nullable columns (no rewrite), two functions, two triggers. A previous release
-- never sets awaited_by; its workers' ends of a child fire these triggers like this release's.

ALTER TABLE jobs
  ADD COLUMN awaited_by       bigint,
  ADD COLUMN children_pending integer;

DO $migration$
BEGIN
  EXECUTE format($fn$
-- Per ended child: note the job that awaits it (once per child: a count is kept per job id).
CREATE FUNCTION note_ended_child() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM set_config('leasehold.ended_children',
                     coalesce(nullif(current_setting('leasehold.ended_children', true), '') || ',', '') || OLD.awaited_by,
                     true);
  RETURN NULL;
END;
$$;

-- At commit: settle the awaiting jobs of every child noted (the first call does all).
CREATE FUNCTION settle_ended_children() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF coalesce(current_setting('leasehold.ended_children', true), '') = '' THEN
    RETURN NULL;
  END IF;
  PERFORM %1$I.settle_awaiting_jobs();
  RETURN NULL;
END;
$$;
$fn$, current_schema());
END
$migration$;

-- Takes the ended children off their awaiting jobs' counts; a suspended job waiting for its
-- children whose count reaches 0 is released to 'waiting' and wakes workers as an enqueue does.
-- Reaches rows only through the ids noted (generic plans, as settle_dependents() in version 14).
CREATE FUNCTION settle_awaiting_jobs() RETURNS void LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
DECLARE
  noted bigint[];
  woke  bigint;
BEGIN
  noted := string_to_array(nullif(current_setting('leasehold.ended_children', true), ''), ',')::bigint[];
  PERFORM set_config('leasehold.ended_children', '', true);
  IF noted IS NULL THEN
    RETURN;
  END IF;
  PERFORM 1 FROM jobs AS p WHERE p.id = ANY(noted) ORDER BY p.id FOR UPDATE OF p;
  WITH ended AS (
    -- per awaiting job (gone: cancelled or dead meanwhile, nothing to do): its ended children,
    -- and whether they were its last while it waits for them
    SELECT p.id, count(*)::int AS n,
           p.children_pending - count(*) <= 0 AND p.state = 'suspended' AND p.wait ->> 'kind' = 'children' AS wake
      FROM unnest(noted) AS e(id)
      JOIN jobs AS p ON p.id = e.id
     GROUP BY p.id
  ), settled AS (
    UPDATE jobs AS p
       SET children_pending = greatest(p.children_pending - e.n, 0),
           state = CASE WHEN e.wake THEN 'waiting' ELSE p.state END,
           run_at = CASE WHEN e.wake THEN now() ELSE p.run_at END
      FROM ended AS e
     WHERE p.id = e.id
    RETURNING p.id, p.queue, p.attempt, e.wake
  ), doorbells AS (
    INSERT INTO dispatch_outbox (job_id, attempt, publish_at, recovery)
    SELECT s.id, s.attempt, now(), false FROM settled AS s WHERE s.wake AND nats_dispatch_active()
    ON CONFLICT DO NOTHING
  )
  -- the doorbells are written whether read or not; the notifications only when read
  SELECT count(pg_notify('leasehold:' || current_schema(), q.queue))
         + count(CASE WHEN nats_dispatch_active() THEN pg_notify('leasehold:' || current_schema() || ':dispatch', '') END)
    INTO woke
    FROM (SELECT DISTINCT s.queue FROM settled AS s WHERE s.wake) AS q;
END;
$$;

CREATE TRIGGER jobs_note_ended_child AFTER DELETE ON jobs
  FOR EACH ROW WHEN (OLD.awaited_by IS NOT NULL)
  EXECUTE FUNCTION note_ended_child();
CREATE CONSTRAINT TRIGGER jobs_settle_ended_children AFTER DELETE ON jobs
  DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW WHEN (OLD.awaited_by IS NOT NULL)
  EXECUTE FUNCTION settle_ended_children();
