-- Leasehold schema, version 21: a remote worker's declared task limits are its own.
--
-- A remote worker's retry and time limits, as it declared them at attach: they apply to the
-- jobs that worker holds, and to no other. A worker token is shared by a fleet, so a remote
-- worker's declaration cannot be the fleet's (task_policies, written by workers on the
-- database, stays the fleet-wide one). The watchdog takes the holder's own declaration first.
-- Additive: an older release never reads this table and keeps task_policies as it was.
CREATE TABLE worker_task_policies (
  worker_id           text    NOT NULL REFERENCES workers (id) ON DELETE CASCADE,
  task                text    NOT NULL,
  backoff_base_ms     bigint  NOT NULL,
  backoff_factor      float8  NOT NULL,
  backoff_max_ms      bigint  NOT NULL,
  backoff_jitter      float8  NOT NULL,
  progress_timeout_ms integer,
  max_run_ms          integer,
  PRIMARY KEY (worker_id, task)
);
