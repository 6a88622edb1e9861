-- Leasehold schema, version 3: finished jobs in rotating generations, the dead letter apart.
--
-- Retention deleted finished jobs row by row, and each deleted row then waited for vacuum: on
-- a busy queue that was a tenth of the database's work, spent on forgetting. Finished jobs now
-- go to one of eight generations (list partitions) by when they finished; retention empties a
-- whole generation, all of whose jobs are past retention, with TRUNCATE: no row deletes, no
-- dead rows. Dead jobs are kept longer and read by operators, so they live in a table of
-- their own, pruned by age as before (they are few).

DROP VIEW all_attempts;
ALTER TABLE job_history RENAME TO job_history_v2;
ALTER INDEX job_history_finished_at_idx RENAME TO job_history_v2_finished_at_idx;

-- How long one generation lasts (its window): a sixth of the retention time, so that the
-- generation about to be reused holds only jobs past retention (seven windows cover it).
-- Retention sets it; until then, four hours (a day's retention).
CREATE TABLE history_settings (
  singleton      boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  generation_ms  bigint  NOT NULL CHECK (generation_ms >= 1000)
);
INSERT INTO history_settings (generation_ms) VALUES (4 * 3600 * 1000);

-- The generation a job finishing at `at` goes to.
CREATE FUNCTION history_generation(at timestamptz) RETURNS smallint LANGUAGE sql STABLE AS $$
  SELECT (floor(extract(epoch FROM at) * 1000 / generation_ms)::bigint % 8)::smallint FROM history_settings
$$;

CREATE TABLE job_history (
  id                  bigint      NOT NULL,
  queue               text        NOT NULL,
  task                text        NOT NULL,
  payload             jsonb       NOT NULL,
  priority            smallint    NOT NULL,
  state               text        NOT NULL,
  attempt             integer     NOT NULL,
  spent_attempts      integer     NOT NULL,
  max_attempts        integer     NOT NULL,
  lease_ms            integer,
  progress            jsonb,
  checkpoint          jsonb,
  last_error          text,
  unique_key          text,
  created_at          timestamptz NOT NULL,
  started_at          timestamptz,
  finished_at         timestamptz NOT NULL DEFAULT now(),
  worker_id           text,
  outcome             text,
  fence               bigint,
  progress_timeout_ms integer,
  max_run_ms          integer,
  generation          smallint    NOT NULL,
  CONSTRAINT job_history_state_check CHECK (state IN ('succeeded', 'cancelled'))
) PARTITION BY LIST (generation);

CREATE TABLE job_history_0 PARTITION OF job_history FOR VALUES IN (0);
CREATE TABLE job_history_1 PARTITION OF job_history FOR VALUES IN (1);
CREATE TABLE job_history_2 PARTITION OF job_history FOR VALUES IN (2);
CREATE TABLE job_history_3 PARTITION OF job_history FOR VALUES IN (3);
CREATE TABLE job_history_4 PARTITION OF job_history FOR VALUES IN (4);
CREATE TABLE job_history_5 PARTITION OF job_history FOR VALUES IN (5);
CREATE TABLE job_history_6 PARTITION OF job_history FOR VALUES IN (6);
CREATE TABLE job_history_7 PARTITION OF job_history FOR VALUES IN (7);

-- A job is looked up by id in each generation (no index spans partitions; ids are unique by
-- construction: a job finishes once, and leaves history when it is retried).
CREATE INDEX job_history_id_idx ON job_history (id);
-- Append-only: finish time follows the physical order, and a BRIN index costs next to nothing.
CREATE INDEX job_history_finished_at_idx ON job_history USING brin (finished_at);
-- A generation never holds dead rows, and is emptied whole: no vacuum to wait for.
ALTER TABLE job_history_0 SET (autovacuum_vacuum_insert_threshold = -1);
ALTER TABLE job_history_1 SET (autovacuum_vacuum_insert_threshold = -1);
ALTER TABLE job_history_2 SET (autovacuum_vacuum_insert_threshold = -1);
ALTER TABLE job_history_3 SET (autovacuum_vacuum_insert_threshold = -1);
ALTER TABLE job_history_4 SET (autovacuum_vacuum_insert_threshold = -1);
ALTER TABLE job_history_5 SET (autovacuum_vacuum_insert_threshold = -1);
ALTER TABLE job_history_6 SET (autovacuum_vacuum_insert_threshold = -1);
ALTER TABLE job_history_7 SET (autovacuum_vacuum_insert_threshold = -1);

-- The dead letter: jobs whose retry budget is spent (or that gave up), until retried or pruned.
CREATE TABLE dead_jobs (
  id                  bigint      PRIMARY KEY,
  queue               text        NOT NULL,
  task                text        NOT NULL,
  payload             jsonb       NOT NULL,
  priority            smallint    NOT NULL,
  state               text        NOT NULL DEFAULT 'dead' CHECK (state = 'dead'),
  attempt             integer     NOT NULL,
  spent_attempts      integer     NOT NULL,
  max_attempts        integer     NOT NULL,
  lease_ms            integer,
  progress            jsonb,
  checkpoint          jsonb,
  last_error          text,
  unique_key          text,
  created_at          timestamptz NOT NULL,
  started_at          timestamptz,
  finished_at         timestamptz NOT NULL DEFAULT now(),
  worker_id           text,
  outcome             text,
  fence               bigint,
  progress_timeout_ms integer,
  max_run_ms          integer
);
CREATE INDEX dead_jobs_finished_at_idx ON dead_jobs (finished_at);

INSERT INTO dead_jobs (id, queue, task, payload, priority, attempt, spent_attempts, max_attempts, lease_ms, progress,
                       checkpoint, last_error, unique_key, created_at, started_at, finished_at, worker_id, outcome,
                       fence, progress_timeout_ms, max_run_ms)
SELECT id, queue, task, payload, priority, attempt, spent_attempts, max_attempts, lease_ms, progress,
       checkpoint, last_error, unique_key, created_at, started_at, finished_at, worker_id, outcome,
       fence, progress_timeout_ms, max_run_ms
  FROM job_history_v2 WHERE state = 'dead';
INSERT INTO job_history
SELECT id, queue, task, payload, priority, state, attempt, spent_attempts, max_attempts, lease_ms, progress,
       checkpoint, last_error, unique_key, created_at, started_at, finished_at, worker_id, outcome,
       fence, progress_timeout_ms, max_run_ms, history_generation(finished_at)
  FROM job_history_v2 WHERE state <> 'dead';
DROP TABLE job_history_v2;

-- Every finished job, wherever it is kept.
CREATE VIEW finished_jobs AS
SELECT id, queue, task, payload, priority, state, attempt, spent_attempts, max_attempts, lease_ms, progress,
       checkpoint, last_error, unique_key, created_at, started_at, finished_at, worker_id, outcome,
       fence, progress_timeout_ms, max_run_ms
  FROM job_history
UNION ALL
SELECT id, queue, task, payload, priority, state, attempt, spent_attempts, max_attempts, lease_ms, progress,
       checkpoint, last_error, unique_key, created_at, started_at, finished_at, worker_id, outcome,
       fence, progress_timeout_ms, max_run_ms
  FROM dead_jobs;

-- Every attempt of every job, finished or not: the audit trail as one relation.
CREATE VIEW all_attempts AS
SELECT job_id, attempt, worker_id, started_at, ended_at, outcome, error
  FROM job_attempts
UNION ALL
SELECT id, attempt, worker_id, started_at, finished_at, outcome,
       CASE WHEN outcome = 'succeeded' THEN NULL ELSE last_error END
  FROM finished_jobs
 WHERE outcome IS NOT NULL;
