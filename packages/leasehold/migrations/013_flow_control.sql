-- Leasehold schema, version 13: flow control (docs/flow-control.md).
--
-- A queue may be paused, limited fleet-wide (attempts at once, starts per window) and limited
-- per key (a job's `flow_key`: a tenant, a customer), with round-robin between keys. All of it
-- is decided in the claim, which is the lease grant, so a limit counts leases: a buffered job
-- holds one and counts, and a crashed worker's slots come back with its leases.
--
-- Queues with no settings and no keyed jobs keep the plain claim (one statement, no lock); it
-- refuses a queue whose `flow` flag is set, in the same statement, so a worker that has not yet
-- heard of a new setting claims nothing there instead of claiming past it. Every other queue is
-- claimed through claim_flow(), which serialises its claims on the queue's flow_state row: a
-- limit counted and then claimed under SKIP LOCKED is exceeded when two claimers count at once;
-- here the second one counts after the first one's claim has committed.
--
-- Additive only: new tables, a nullable column, a partial index, a function. The previous
-- release's workers never see a keyed job's key and ignore the settings.

ALTER TABLE jobs ADD COLUMN flow_key text;

-- A keyed job's place in its key's line: a key's jobs start in (priority, enqueue) order, and
-- one not yet due (delayed, or waiting for its retry) holds its place. Only keyed jobs pay it.
CREATE INDEX jobs_flow_key_idx ON jobs (queue, flow_key, priority, id) WHERE state = 'waiting' AND flow_key IS NOT NULL;
-- Leases held per queue and key, counted by every limited claim. It replaces the lease index
-- (lease_until) rather than joining it: a claim writes one entry into an index of running jobs,
-- as before (a second one cost every claim ~10% more WAL). The watchdog's expired-lease scan
-- reads it whole with lease_until as an index condition: running jobs are few next to waiting
-- ones, and it is a scan of the index alone, never of the table.
DROP INDEX jobs_lease_idx;
CREATE INDEX jobs_running_idx ON jobs (queue, flow_key, lease_until) WHERE state = 'running';

CREATE TABLE queues (
  name              text        PRIMARY KEY,
  paused            boolean     NOT NULL DEFAULT false,
  paused_at         timestamptz,
  -- At most this many attempts hold leases in the queue at once, fleet-wide (null: no limit).
  concurrency       integer     CHECK (concurrency BETWEEN 1 AND 100000),
  -- At most this many per key.
  key_concurrency   integer     CHECK (key_concurrency BETWEEN 1 AND 100000),
  -- At most rate_limit starts in any window of rate_window_ms, in the queue / per key.
  rate_limit        integer     CHECK (rate_limit BETWEEN 1 AND 1000000),
  rate_window_ms    integer     CHECK (rate_window_ms BETWEEN 10 AND 86400000),
  key_rate_limit    integer     CHECK (key_rate_limit BETWEEN 1 AND 1000000),
  key_rate_window_ms integer    CHECK (key_rate_window_ms BETWEEN 10 AND 86400000),
  -- Round-robin weights of some keys ({"key": 3}); the others weigh 1.
  key_weights       jsonb,
  -- Keyed jobs were enqueued here: claims go round-robin between keys.
  keyed             boolean     NOT NULL DEFAULT false,
  -- A handler asked the whole queue to hold back ("rate-limited, retry in X").
  held_until        timestamptz,
  updated_at        timestamptz NOT NULL DEFAULT now(),
  flow              boolean     GENERATED ALWAYS AS (
    paused OR keyed OR concurrency IS NOT NULL OR key_concurrency IS NOT NULL
    OR rate_limit IS NOT NULL OR key_rate_limit IS NOT NULL
  ) STORED,
  CONSTRAINT queues_rate_pair CHECK ((rate_limit IS NULL) = (rate_window_ms IS NULL)),
  CONSTRAINT queues_key_rate_pair CHECK ((key_rate_limit IS NULL) = (key_rate_window_ms IS NULL))
);

-- What claims of a flow-controlled queue share, locked by each such claim: the starts of the
-- current rate window (one entry per claim: its time and how many it started) and where the
-- round-robin goes on: the key that took the last turn, and how many of its round's turns (its
-- weight) it has had, so a weight holds across claims of a few jobs as within one large claim.
CREATE TABLE flow_state (
  queue        text        PRIMARY KEY,
  start_times  timestamptz[] NOT NULL DEFAULT '{}',
  start_counts integer[]   NOT NULL DEFAULT '{}',
  next_key     text,
  next_key_turns integer   NOT NULL DEFAULT 0
);

-- The same per key, for keys with a rate limit or a hold.
CREATE TABLE flow_key_state (
  queue        text        NOT NULL,
  flow_key     text        NOT NULL,
  start_times  timestamptz[] NOT NULL DEFAULT '{}',
  start_counts integer[]   NOT NULL DEFAULT '{}',
  held_until   timestamptz,
  PRIMARY KEY (queue, flow_key)
);

-- A settings change reaches every worker at once (the worker's own channel, with a payload no
-- queue name can be); workers also read the settings when their session (re)starts.
CREATE FUNCTION notify_queue_settings() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('leasehold:' || TG_TABLE_SCHEMA, '!queues');
  RETURN NULL;
END;
$$;
CREATE TRIGGER queues_notify AFTER INSERT OR UPDATE OR DELETE ON queues
  FOR EACH STATEMENT EXECUTE FUNCTION notify_queue_settings();

-- Starts still inside a window: the entries of a log newer than `since`, and their sum.
CREATE FUNCTION flow_window_used(times timestamptz[], counts integer[], since timestamptz)
RETURNS integer LANGUAGE sql IMMUTABLE AS $$
  SELECT coalesce(sum(c), 0)::int FROM unnest(times, counts) AS l(t, c) WHERE t > since
$$;

-- When the window frees `need` more starts: the time its oldest entries leave it.
CREATE FUNCTION flow_window_frees_at(times timestamptz[], counts integer[], since timestamptz, lim integer, need integer, window_ms integer)
RETURNS timestamptz LANGUAGE sql IMMUTABLE AS $$
  SELECT min(t) + window_ms * interval '1 millisecond'
    FROM (SELECT t, sum(c) OVER (ORDER BY t) AS running_total
            FROM unnest(times, counts) AS l(t, c) WHERE t > since) AS w
   WHERE (SELECT coalesce(sum(c), 0) FROM unnest(times, counts) AS l(t, c) WHERE t > since) - running_total <= lim - need
$$;

-- The time now, inside a statement that has run a while (waited for a lock): clock_timestamp(),
-- written so that a clock that moves now() moves it too (the test kit's fake clock replaces now()).
CREATE FUNCTION flow_clock() RETURNS timestamptz LANGUAGE sql VOLATILE AS $$
  SELECT now() + (clock_timestamp() - transaction_timestamp())
$$;

-- The claim of a flow-controlled queue: up to `lim` jobs within every limit of the queue, in
-- claim order for keyless jobs and round-robin between keys. Returns the claimed jobs and, when
-- a limit (not the queue's backlog) held the claim back, one more row with a null id and
-- `retry_ms`: how long until asking again may find a slot (null: paused; wait for a resume).
--
-- Times: the lease, the attempt's start and the rate logs take the time once the jobs are
-- chosen (t_start), not now() (this statement's start, before it waited) nor the time the
-- claim began counting (t_now): each statement that counts leases sees the ends committed before
-- it began, and such an end's recorded time (its statement's now()) can be later than t_now. Taken
-- after the last count, an attempt's recorded start is after every end its claim counted, so the
-- audit trail shows a limit as it held. (The rate logs are read at t_now and written at t_start:
-- a window ending at t_start holds no start the claim did not count.)
CREATE FUNCTION claim_flow(q text, lim integer, worker text, default_lease_ms integer, task_names text[])
RETURNS TABLE (id bigint, queue text, task text, payload jsonb, attempt integer, fence bigint,
               spent_attempts integer, max_attempts integer, lease_ms integer, checkpoint jsonb,
               last_outcome text, last_error text, progress_timeout_ms integer, max_run_ms integer,
               max_run_unlimited boolean, headers jsonb, flow_key text, retry_ms integer)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
  s          queues;
  st         flow_state;
  budget     integer := lim;
  held_ms    integer;          -- a limit held the claim back: ask again after this long
  running_q  integer;
  picked     bigint[];
  claimed    integer;
  keys       text[];
  t_now      timestamptz;      -- due times, holds and rate windows are judged at this time
  t_start    timestamptz;      -- the claimed attempts' start: after every count (see above)
  rate_since timestamptz;
  key_since  timestamptz;
  share      float8;           -- a weight-1 key's share of this claim
  heads      bigint[];         -- each visited key's first job in its line
  key_running jsonb;           -- leases held per visited key
  visit_cap  integer;
  last_turns integer;          -- turns of its round the last key served has had
BEGIN
  -- One claimer of this queue at a time: every count below sees the claims before it.
  INSERT INTO flow_state AS fs (queue) VALUES (q) ON CONFLICT DO NOTHING;
  SELECT * INTO st FROM flow_state AS fs WHERE fs.queue = q FOR UPDATE;
  SELECT * INTO s FROM queues AS qs WHERE qs.name = q;
  t_now := flow_clock();
  IF s.paused THEN
    RETURN QUERY SELECT NULL::bigint, q, NULL::text, NULL::jsonb, NULL::int, NULL::bigint, NULL::int, NULL::int, NULL::int,
                        NULL::jsonb, NULL::text, NULL::text, NULL::int, NULL::int, NULL::boolean, NULL::jsonb, NULL::text, NULL::int;
    RETURN;
  END IF;

  IF s.held_until > t_now THEN
    budget := 0;
    held_ms := ceil(extract(epoch FROM s.held_until - t_now) * 1000);
  END IF;
  IF budget > 0 THEN
    SELECT count(*) INTO running_q FROM jobs AS j WHERE j.state = 'running' AND j.queue = q;
    IF s.concurrency - running_q < budget THEN
      budget := greatest(s.concurrency - running_q, 0);
      held_ms := 100;  -- a slot frees when a job ends, on whichever worker: ask again soon
    END IF;
  END IF;
  IF budget > 0 AND s.rate_limit IS NOT NULL THEN
    rate_since := t_now - s.rate_window_ms * interval '1 millisecond';
    IF s.rate_limit - flow_window_used(st.start_times, st.start_counts, rate_since) < budget THEN
      budget := greatest(s.rate_limit - flow_window_used(st.start_times, st.start_counts, rate_since), 0);
      held_ms := least(coalesce(held_ms, 2147483647), greatest(1, ceil(extract(epoch FROM
        flow_window_frees_at(st.start_times, st.start_counts, rate_since, s.rate_limit, 1, s.rate_window_ms) - t_now) * 1000)))::int;
    END IF;
  END IF;

  IF budget > 0 AND NOT coalesce(s.keyed, false) AND s.key_concurrency IS NULL AND s.key_rate_limit IS NULL THEN
    -- No keys: the plain claim order.
    picked := ARRAY(
      SELECT j.id FROM jobs AS j
       WHERE j.state = 'waiting' AND j.queue = q AND j.run_at <= t_now AND j.task = ANY(task_names)
       ORDER BY j.priority, j.run_at, j.id
       LIMIT budget
         FOR UPDATE SKIP LOCKED);
    t_start := flow_clock();
  ELSIF budget > 0 THEN
    -- The keys with waiting jobs, from where the round-robin stopped, wrapping around: each
    -- step one descent of the keyed index, which also finds the key's first job in its line
    -- (its head: most claims take one job per key). Enough keys to pass those at their limit.
    visit_cap := least(5000, 2 * budget + running_q + 16);
    SELECT coalesce(array_agg(l.k ORDER BY l.n), '{}'), coalesce(array_agg(l.head ORDER BY l.n), '{}')
      INTO keys, heads
      FROM (
        WITH RECURSIVE line AS (
          (SELECT j.flow_key AS k, j.id AS head, 1 AS n FROM jobs AS j
            WHERE j.state = 'waiting' AND j.flow_key IS NOT NULL AND j.queue = q AND j.flow_key >= coalesce(st.next_key, '')
            ORDER BY j.flow_key, j.priority, j.id LIMIT 1)
          UNION ALL
          SELECT nx.flow_key, nx.id, l.n + 1
            FROM line AS l
           CROSS JOIN LATERAL (
                 SELECT j.flow_key, j.id FROM jobs AS j
                  WHERE j.state = 'waiting' AND j.flow_key IS NOT NULL AND j.queue = q AND j.flow_key > l.k
                  ORDER BY j.flow_key, j.priority, j.id LIMIT 1) AS nx
           WHERE l.n < visit_cap
        ) SELECT * FROM line) AS l;
    IF st.next_key IS NOT NULL AND cardinality(keys) < visit_cap THEN
      SELECT keys || coalesce(array_agg(l.k ORDER BY l.n), '{}'), heads || coalesce(array_agg(l.head ORDER BY l.n), '{}')
        INTO keys, heads
        FROM (
          WITH RECURSIVE line AS (
            (SELECT j.flow_key AS k, j.id AS head, 1 AS n FROM jobs AS j
              WHERE j.state = 'waiting' AND j.flow_key IS NOT NULL AND j.queue = q AND j.flow_key < st.next_key
              ORDER BY j.flow_key, j.priority, j.id LIMIT 1)
            UNION ALL
            SELECT nx.flow_key, nx.id, l.n + 1
              FROM line AS l
             CROSS JOIN LATERAL (
                   SELECT j.flow_key, j.id FROM jobs AS j
                    WHERE j.state = 'waiting' AND j.flow_key IS NOT NULL AND j.queue = q AND j.flow_key > l.k
                      AND j.flow_key < st.next_key
                    ORDER BY j.flow_key, j.priority, j.id LIMIT 1) AS nx
             WHERE l.n < visit_cap - cardinality(keys)
          ) SELECT * FROM line) AS l;
    END IF;
    key_since := t_now - s.key_rate_window_ms * interval '1 millisecond';
    -- No key takes more than its weighted share of the claim: a key with a deep backlog is not
    -- read past what it can get (it gets the rest at the next claim, which comes at once).
    SELECT budget / greatest(sum(coalesce((s.key_weights ->> k)::float8, 1)), 1) INTO share FROM unnest(keys) AS k;

    -- Each key's line: its next jobs in (priority, enqueue) order, as many as it has slots for;
    -- one not yet due keeps its place (so with a limit of 1 a key runs strictly in order).
    -- Round-robin in rounds: each key in line takes its turns (its weight: w turns in a row),
    -- then the next; keyless jobs take one turn per round as one more key, first. The line
    -- starts at the key that took the last turn, with the turns of its round it already had, so
    -- claims of one job each go heavy, heavy, heavy, light as one claim of four would.
    -- Leases per visited key, as a map: joined as a relation, its row estimate (one) made the
    -- planner loop over it once per key (55 ms for 800 keys).
    IF s.key_concurrency IS NOT NULL THEN
      SELECT coalesce(jsonb_object_agg(r.k, r.n), '{}') INTO key_running
        FROM (SELECT j.flow_key AS k, count(*)::int AS n
                FROM jobs AS j WHERE j.state = 'running' AND j.queue = q AND j.flow_key = ANY(keys)
               GROUP BY j.flow_key) AS r;
    END IF;
    WITH visited AS (
      SELECT v.k, v.head, v.ord FROM unnest(keys, heads) WITH ORDINALITY AS v(k, head, ord)
    ), slots AS (
      SELECT v.k, v.head, v.ord, coalesce((s.key_weights ->> v.k)::int, 1) AS weight,
             CASE WHEN v.k = st.next_key THEN st.next_key_turns ELSE 0 END AS had,
             least(budget,
                   ceil(coalesce(share, budget) * coalesce((s.key_weights ->> v.k)::float8, 1))::int,
                   coalesce(s.key_concurrency - coalesce((key_running ->> v.k)::int, 0), budget),
                   CASE WHEN s.key_rate_limit IS NULL THEN budget
                        ELSE s.key_rate_limit - flow_window_used(ks.start_times, ks.start_counts, key_since) END,
                   CASE WHEN ks.held_until > t_now THEN 0 ELSE budget END) AS n
        FROM visited AS v
        LEFT JOIN flow_key_state AS ks ON ks.queue = q AND ks.flow_key = v.k
    ), candidates AS (
      SELECT c.id, sl.k, sl.ord, c.rank, (c.rank - 1 + sl.had) / sl.weight AS round,
             (c.rank - 1 + sl.had) % sl.weight + 1 AS turns
        FROM slots AS sl
       CROSS JOIN LATERAL (
             SELECT j.id, 1::bigint AS rank, j.run_at, j.task FROM jobs AS j WHERE j.id = sl.head AND sl.n >= 1
             UNION ALL
             SELECT l.id, l.rank, l.run_at, l.task  -- row_number() counts before the OFFSET: 2, 3, ...
               FROM (SELECT j.id, j.run_at, j.task, row_number() OVER (ORDER BY j.priority, j.id) AS rank
                       FROM jobs AS j
                      WHERE sl.n > 1 AND j.state = 'waiting' AND j.flow_key IS NOT NULL AND j.queue = q AND j.flow_key = sl.k
                      ORDER BY j.priority, j.id
                      OFFSET 1 LIMIT greatest(sl.n - 1, 0)) AS l
           ) AS c
       WHERE c.run_at <= t_now AND c.task = ANY(task_names)
      UNION ALL
      SELECT l.id, NULL, 0, row_number() OVER (ORDER BY l.priority, l.run_at, l.id), row_number() OVER (ORDER BY l.priority, l.run_at, l.id) - 1, 1
        FROM (SELECT j.id, j.priority, j.run_at, j.flow_key, j.task
                FROM jobs AS j
               WHERE j.state = 'waiting' AND j.queue = q AND j.run_at <= t_now
               ORDER BY j.priority, j.run_at, j.id
               LIMIT 1000) AS l
       WHERE l.flow_key IS NULL AND l.task = ANY(task_names)
    ), chosen AS (
      SELECT c.id, c.k, c.turns, row_number() OVER (ORDER BY c.round, c.ord, c.rank) AS pos
        FROM candidates AS c
       ORDER BY c.round, c.ord, c.rank
       LIMIT budget
    )
    SELECT array_agg(c.id ORDER BY c.pos), (array_agg(c.k ORDER BY c.pos DESC) FILTER (WHERE c.k IS NOT NULL))[1],
           (array_agg(c.turns ORDER BY c.pos DESC) FILTER (WHERE c.k IS NOT NULL))[1]
      INTO picked, st.next_key, last_turns
      FROM chosen AS c;
    t_start := flow_clock();

    IF coalesce(cardinality(picked), 0) < budget AND (s.key_concurrency IS NOT NULL OR s.key_rate_limit IS NOT NULL
                                                      OR EXISTS (SELECT 1 FROM flow_key_state AS ks WHERE ks.queue = q AND ks.held_until > t_now)) THEN
      held_ms := least(coalesce(held_ms, 100), 100);  -- keys at their limits: ask again soon
    END IF;
    IF cardinality(picked) > 0 AND cardinality(picked) < budget AND cardinality(keys) > 1 THEN
      held_ms := 1;  -- shares may have left jobs behind: ask again at once
    END IF;
    UPDATE flow_state AS fs SET next_key = st.next_key, next_key_turns = last_turns
     WHERE fs.queue = q AND st.next_key IS NOT NULL AND last_turns IS NOT NULL;
    IF s.key_rate_limit IS NOT NULL AND cardinality(picked) > 0 THEN
      INSERT INTO flow_key_state AS ks (queue, flow_key, start_times, start_counts)
      SELECT q, j.flow_key, ARRAY[t_start], ARRAY[count(*)::int]
        FROM jobs AS j WHERE j.id = ANY(picked) AND j.flow_key IS NOT NULL
       GROUP BY j.flow_key
      ON CONFLICT (queue, flow_key) DO UPDATE
         SET start_times = ARRAY(SELECT t FROM unnest(ks.start_times) AS t WHERE t > key_since ORDER BY t) || t_start,
             start_counts = ARRAY(SELECT c FROM unnest(ks.start_times, ks.start_counts) AS l(t, c) WHERE t > key_since ORDER BY t)
                            || EXCLUDED.start_counts;
    END IF;
  END IF;

  claimed := coalesce(cardinality(picked), 0);
  IF claimed > 0 THEN
    IF s.rate_limit IS NOT NULL THEN
      UPDATE flow_state AS fs
         SET start_times = ARRAY(SELECT t FROM unnest(fs.start_times) AS t WHERE t > rate_since ORDER BY t) || t_start,
             start_counts = ARRAY(SELECT c FROM unnest(fs.start_times, fs.start_counts) AS l(t, c) WHERE t > rate_since ORDER BY t)
                            || claimed
       WHERE fs.queue = q;
    END IF;
    RETURN QUERY
    UPDATE jobs AS j
       SET state = 'running',
           attempt = j.attempt + 1,
           fence = nextval('fence_seq'),
           locked_by = worker,
           lease_until = t_start + coalesce(j.lease_ms, default_lease_ms) * interval '1 millisecond',
           heartbeat_at = t_start,
           started_at = t_start,
           progress_at = t_start
     WHERE j.id = ANY(picked)
       AND j.state = 'waiting'
    RETURNING j.id, j.queue, j.task, j.payload, j.attempt, j.fence, j.spent_attempts, j.max_attempts,
              coalesce(j.lease_ms, default_lease_ms), j.checkpoint, j.last_outcome, j.last_error,
              j.progress_timeout_ms, j.max_run_ms, j.max_run_unlimited, j.headers, j.flow_key, NULL::int;
  END IF;
  IF held_ms IS NOT NULL AND claimed < lim THEN
    RETURN QUERY SELECT NULL::bigint, q, NULL::text, NULL::jsonb, NULL::int, NULL::bigint, NULL::int, NULL::int, NULL::int,
                        NULL::jsonb, NULL::text, NULL::text, NULL::int, NULL::int, NULL::boolean, NULL::jsonb, NULL::text, held_ms;
  END IF;
END;
$$;

-- A hold a handler asked for ("rate-limited, retry in X"): its key, or its whole queue, starts
-- nothing until `until`. A later hold never shortens an earlier one.
CREATE FUNCTION flow_hold(q text, k text, until timestamptz) RETURNS void LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
  IF k IS NULL THEN
    INSERT INTO queues AS qs (name, held_until) VALUES (q, until)
    ON CONFLICT (name) DO UPDATE SET held_until = greatest(qs.held_until, EXCLUDED.held_until);
  ELSE
    INSERT INTO flow_key_state AS ks (queue, flow_key, held_until) VALUES (q, k, until)
    ON CONFLICT (queue, flow_key) DO UPDATE SET held_until = greatest(ks.held_until, EXCLUDED.held_until);
  END IF;
END;
$$;

ALTER TABLE job_attempts DROP CONSTRAINT job_attempts_outcome_check;
ALTER TABLE job_attempts ADD CONSTRAINT job_attempts_outcome_check CHECK (
  outcome IN ('succeeded', 'failed', 'lease_expired', 'worker_lost', 'stalled', 'timed_out', 'released', 'cancelled',
              'superseded', 'rate_limited')
) NOT VALID;

-- enqueue() as in version 10, with the flow-control `key` option (checked as lh.enqueue checks it).
CREATE OR REPLACE FUNCTION enqueue(task text, payload jsonb DEFAULT '{}', options jsonb DEFAULT '{}')
RETURNS bigint LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  opts       jsonb := coalesce(options, '{}');
  body       jsonb := coalesce(payload, '{}');
  unknown    text;
  q          text;
  run_at_ts  timestamptz;
  delay      bigint;
  unique_k   text;
  flow_k     text;
  new_id     bigint;
  -- "maxRunMs": null: this job runs without a time limit, whatever its task says.
  unlimited  boolean := jsonb_typeof(coalesce(options, '{}') -> 'maxRunMs') IS NOT DISTINCT FROM 'null';
BEGIN
  IF jsonb_typeof(opts) <> 'object' THEN
    PERFORM enqueue_refuse(format('options must be a JSON object (got %s)', left(opts::text, 80)));
  END IF;
  SELECT k INTO unknown FROM jsonb_object_keys(opts) AS k
   WHERE k NOT IN ('queue', 'priority', 'runAt', 'delayMs', 'maxAttempts', 'uniqueKey', 'key', 'leaseMs',
                   'progressTimeoutMs', 'maxRunMs')
   LIMIT 1;
  IF unknown IS NOT NULL THEN PERFORM enqueue_refuse(format('unknown option %s', to_jsonb(unknown))); END IF;

  PERFORM enqueue_check_name(task, 'task');
  IF opts ? 'queue' AND jsonb_typeof(opts -> 'queue') <> 'string' THEN
    PERFORM enqueue_refuse(format('queue must be a string (got %s)', left((opts -> 'queue')::text, 80)));
  END IF;
  q := enqueue_check_name(coalesce(opts ->> 'queue', 'default'), 'queue');

  IF octet_length(body::text) > 1048576 THEN PERFORM enqueue_refuse('payload is larger than 1048576 bytes'); END IF;
  IF enqueue_nesting_exceeds(body, 256) THEN PERFORM enqueue_refuse('payload is nested deeper than 256 levels'); END IF;

  IF opts ? 'runAt' AND opts ? 'delayMs' THEN PERFORM enqueue_refuse('give runAt or delayMs, not both'); END IF;
  IF opts ? 'runAt' THEN
    IF jsonb_typeof(opts -> 'runAt') <> 'string' THEN
      PERFORM enqueue_refuse(format('runAt must be a timestamp as text (got %s)', left((opts -> 'runAt')::text, 80)));
    END IF;
    BEGIN
      run_at_ts := (opts ->> 'runAt')::timestamptz;
    EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR invalid_parameter_value THEN
      PERFORM enqueue_refuse(format('runAt is not a valid timestamp (got %s)', left((opts -> 'runAt')::text, 80)));
    END;
    IF NOT isfinite(run_at_ts) THEN PERFORM enqueue_refuse('runAt must be a finite timestamp'); END IF;
  END IF;
  delay := enqueue_integer(opts, 'delayMs', 0, 315360000000, 0);

  IF opts ? 'uniqueKey' THEN
    unique_k := opts ->> 'uniqueKey';
    IF jsonb_typeof(opts -> 'uniqueKey') <> 'string' OR char_length(unique_k) NOT BETWEEN 1 AND 512 THEN
      PERFORM enqueue_refuse(format('uniqueKey must be a non-empty string of at most 512 characters (got %s)',
                                    left((opts -> 'uniqueKey')::text, 80)));
    END IF;
  END IF;

  IF opts ? 'key' THEN
    flow_k := opts ->> 'key';
    IF jsonb_typeof(opts -> 'key') <> 'string' OR char_length(flow_k) NOT BETWEEN 1 AND 512 THEN
      PERFORM enqueue_refuse(format('key must be a non-empty string of at most 512 characters (got %s)',
                                    left((opts -> 'key')::text, 80)));
    END IF;
    -- A keyed job makes its queue a flow-controlled one before it exists (as lh.enqueue does).
    INSERT INTO queues AS qs (name, keyed) SELECT q, true
     WHERE NOT EXISTS (SELECT 1 FROM queues AS k WHERE k.name = q AND k.keyed)
    ON CONFLICT (name) DO UPDATE SET keyed = true, updated_at = now();
  END IF;

  -- A key held by an unfinished job answers with that job; if it finishes between the
  -- insert and the lookup, try again (a few rounds: each means another job ran to its end).
  FOR tries IN 1..5 LOOP
    INSERT INTO jobs (queue, task, payload, priority, run_at, max_attempts, unique_key, lease_ms,
                      progress_timeout_ms, max_run_ms, max_run_unlimited, flow_key)
    VALUES (q, task, body,
            enqueue_integer(opts, 'priority', -32768, 32767, 0),
            coalesce(run_at_ts, now() + delay * interval '1 millisecond'),
            enqueue_integer(opts, 'maxAttempts', 1, 1000, 25),
            unique_k,
            enqueue_integer(opts, 'leaseMs', 1000, 86400000, NULL),
            enqueue_integer(opts, 'progressTimeoutMs', 1000, 604800000, NULL),
            CASE WHEN NOT unlimited THEN enqueue_integer(opts, 'maxRunMs', 1000, 604800000, NULL) END,
            unlimited, flow_k)
    ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL DO NOTHING
    RETURNING id INTO new_id;
    IF new_id IS NOT NULL THEN RETURN new_id; END IF;
    SELECT id INTO new_id FROM jobs WHERE unique_key = unique_k;
    IF new_id IS NOT NULL THEN RETURN new_id; END IF;
  END LOOP;
  RAISE EXCEPTION 'leasehold.enqueue: unique key % neither inserted nor found after 5 rounds', to_jsonb(unique_k);
END;
$$;
