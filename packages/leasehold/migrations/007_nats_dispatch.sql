-- Leasehold schema, version 7: NATS JetStream dispatch (docs/nats.md).
--
-- With NATS dispatch, workers learn of a job from a JetStream message carrying its id (a
-- doorbell) instead of polling, and claim it by id with the usual lease-granting claim: the
-- job row still decides who owns a job. This version keeps the doorbells owed: one row in
-- dispatch_outbox per waiting job whose message has not been published yet, written in the
-- same transaction that makes the job waiting, whoever does it (the TypeScript client, the
-- enqueue() function, a trigger, a retry, a recovery, a release). Dispatchers publish the
-- rows once their job is due and delete them; a publish that fails leaves its row for the
-- next try. Nothing here is written unless NATS dispatch is active: without NATS workers
-- the hot path writes no row more than before.

-- Active while a NATS worker has renewed it recently; the workers renew it as they run. It
-- is read once per statement (a one-row table), never per row. The function names this schema
-- (fixed when it is created): the insert trigger calls it on connections with any search_path.
CREATE TABLE dispatch_settings (
  singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  active_until  timestamptz
);
INSERT INTO dispatch_settings (active_until) VALUES (NULL);

DO $migration$
BEGIN
  EXECUTE format($fn$
CREATE FUNCTION nats_dispatch_active() RETURNS boolean LANGUAGE sql STABLE AS $$
  SELECT coalesce((SELECT active_until > now() FROM %1$I.dispatch_settings), false)
$$ $fn$, current_schema());
END
$migration$;

-- One owed doorbell per waiting spell of a job: (job, attempt) names the spell (every
-- claim raises attempt, so a job waits at most once with each value). `recovery`: the job
-- is back because recovery or a release ended its previous attempt.
CREATE TABLE dispatch_outbox (
  job_id      bigint      NOT NULL,
  attempt     integer     NOT NULL,
  publish_at  timestamptz NOT NULL,
  recovery    boolean     NOT NULL DEFAULT false,
  PRIMARY KEY (job_id, attempt)
);
CREATE INDEX dispatch_outbox_publish_at_idx ON dispatch_outbox (publish_at);

-- The insert trigger also owes a doorbell for every new waiting job while NATS dispatch is
-- active. A client that publishes its own jobs right after its commit says so for its
-- transaction (leasehold.publishing_ms): their rows wait that long before a dispatcher
-- publishes them for it, as after a publish that failed or a process that died. Other rows
-- are due at once (or at run_at), and wake the dispatchers at commit. Inserts may come from
-- connections with any search_path (enqueue on the application's own client), so the
-- function names this schema, fixed here when it is created.
DO $migration$
BEGIN
  EXECUTE format($fn$
CREATE OR REPLACE FUNCTION notify_jobs_ready() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  grace_ms bigint;
BEGIN
  PERFORM pg_notify('leasehold:' || TG_TABLE_SCHEMA, q.queue)
  FROM (SELECT DISTINCT queue FROM ready_jobs WHERE state = 'waiting' AND run_at <= now()) AS q;
  IF %1$I.nats_dispatch_active() THEN
    grace_ms := coalesce(nullif(current_setting('leasehold.publishing_ms', true), '')::bigint, 0);
    INSERT INTO %1$I.dispatch_outbox (job_id, attempt, publish_at)
    SELECT id, attempt, CASE WHEN run_at <= now() THEN now() + grace_ms * interval '1 millisecond' ELSE run_at END
      FROM ready_jobs
     WHERE state = 'waiting'
    ON CONFLICT DO NOTHING;
    IF grace_ms = 0 AND EXISTS (SELECT 1 FROM ready_jobs WHERE state = 'waiting' AND run_at <= now()) THEN
      PERFORM pg_notify('leasehold:' || TG_TABLE_SCHEMA || ':dispatch', '');
    END IF;
  END IF;
  RETURN NULL;
END;
$$ $fn$, current_schema());
END
$migration$;
