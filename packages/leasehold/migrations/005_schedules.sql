-- Leasehold schema, version 5: periodic jobs.
--
-- A schedule enqueues one job per tick of its cron pattern. Any number of schedulers may run
-- (one inside every worker): each locks the due schedules it handles (FOR UPDATE SKIP LOCKED),
-- enqueues their ticks' jobs and moves next_run_at past them in one transaction, so a tick is
-- enqueued once. Each tick's job also carries the unique key 'schedule:<name>:<tick>'.

CREATE TABLE schedules (
  name         text        PRIMARY KEY,
  cron         text        NOT NULL,
  timezone     text        NOT NULL DEFAULT 'UTC',
  task         text        NOT NULL,
  queue        text        NOT NULL,
  payload      jsonb       NOT NULL DEFAULT '{}',
  -- The jobs' options (priority, maxAttempts, leaseMs, progressTimeoutMs, maxRunMs), validated
  -- when the schedule was saved.
  job_options  jsonb       NOT NULL DEFAULT '{}',
  -- After downtime: false enqueues the latest missed tick only; true every missed tick.
  backfill     boolean     NOT NULL DEFAULT false,
  -- The earliest tick not yet enqueued.
  next_run_at  timestamptz NOT NULL,
  last_run_at  timestamptz,
  last_job_id  bigint,
  created_at   timestamptz NOT NULL DEFAULT now(),
  updated_at   timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX schedules_due_idx ON schedules (next_run_at);
