-- Leasehold schema, version 26: a rate's starts as rows, so a claim's cost does not grow with
-- the starts in its window (docs/flow-control.md).
--
-- Until this version a rate's window was two arrays in flow_state (and in flow_key_state per
-- key), one entry per claim still in the window, which every claim read whole, summed and
-- rewrote: with a one-day window, 8,000 starts made each claim ~14 times dearer. Now each claim
-- appends one row to flow_starts, carrying the running count of the queue's (or key's) starts;
-- the starts in a window are the last row's count less the count before the window's first row
-- (two index descents), and the claim deletes the rows that left the window.
--
-- Additive: a table, a function; claim_flow() keeps its signature (the previous release's
-- workers call it, and so run this one). The arrays stay, no longer written: the starts in them
-- are copied here, and left in place for a previous release's claim that was already running
-- when this migration committed (it waited for the queue's row, which this migration locks, and
-- reads the arrays after it). What such a claim appends is taken over by the next claim of the
-- queue (see flow_starts_adopt) or, per key, counted until its key's next start takes it over.

-- The starts of a queue's rate ('' as flow_key: a job's key is never empty) or of a key's: one
-- row per claim that started jobs. `total`: the starts recorded up to this row; `started_at`
-- never goes back from one row to the next (a clock that steps back counts a start as later,
-- keeping it in the window a little longer: never more starts than the limit), so the rows in a
-- window are the last ones, and a window's starts are the last `total` less its first row's
-- `total - n`.
CREATE TABLE flow_starts (
  queue      text        NOT NULL,
  flow_key   text        NOT NULL,
  total      bigint      NOT NULL,
  started_at timestamptz NOT NULL,
  n          integer     NOT NULL CHECK (n > 0),
  PRIMARY KEY (queue, flow_key, total)
);
-- A window's first row: one descent (total orders the rows of one time).
CREATE INDEX flow_starts_time_idx ON flow_starts (queue, flow_key, started_at, total);

-- Appends a log of the old form (a time and a count per claim) to a queue's or key's rows: the
-- entries later than its last row (so twice is once), in time order, after it.
CREATE FUNCTION flow_starts_adopt(q text, k text, times timestamptz[], counts integer[]) RETURNS void LANGUAGE sql
SET search_path FROM CURRENT
AS $$
  INSERT INTO flow_starts (queue, flow_key, total, started_at, n)
  SELECT q, k, coalesce(l.total, 0) + sum(e.c) OVER (ORDER BY e.t, e.i), greatest(e.t, l.started_at), e.c
    FROM unnest(times, counts) WITH ORDINALITY AS e(t, c, i)
    LEFT JOIN LATERAL (SELECT f.total, f.started_at FROM flow_starts AS f
                        WHERE f.queue = q AND f.flow_key = k ORDER BY f.total DESC LIMIT 1) AS l ON true
   WHERE e.c > 0 AND (l.started_at IS NULL OR e.t > l.started_at)
$$;

-- The logs so far, under the rows' locks: a claim already running waits, and its start is either
-- in what is copied here or appended after (and taken over as above).
SELECT count(*) FROM (SELECT 1 FROM flow_state FOR UPDATE) AS locked;
SELECT count(*) FROM (SELECT 1 FROM flow_key_state FOR UPDATE) AS locked;
SELECT flow_starts_adopt(fs.queue, '', fs.start_times, fs.start_counts) FROM flow_state AS fs WHERE cardinality(fs.start_times) > 0;
SELECT flow_starts_adopt(ks.queue, ks.flow_key, ks.start_times, ks.start_counts) FROM flow_key_state AS ks WHERE cardinality(ks.start_times) > 0;

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
--
-- As in version 13, but for the rate logs: rows of flow_starts, each read by one index descent,
-- where version 13 read and rewrote whole arrays. A log of the old form is taken over (above).
CREATE OR REPLACE FUNCTION claim_flow(q text, lim integer, worker text, default_lease_ms integer, task_names text[])
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
  rate_total bigint;           -- the queue's starts recorded so far (its last row's total)
  rate_last_at timestamptz;    -- the time of its last row
  rate_before bigint;          -- its starts recorded before the window
  rate_used  integer;          -- its starts in the window
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
  -- A log of the old form: a previous release's claim, running when version 26 was applied.
  IF cardinality(st.start_times) > 0 THEN
    PERFORM flow_starts_adopt(q, '', st.start_times, st.start_counts);
    UPDATE flow_state AS fs SET start_times = '{}', start_counts = '{}' WHERE fs.queue = q;
  END IF;
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
    -- The starts in the window: the last row's total less the total before the window's first
    -- row (none: no start in the window). One index descent each, however many starts.
    SELECT f.total, f.started_at INTO rate_total, rate_last_at
      FROM flow_starts AS f WHERE f.queue = q AND f.flow_key = '' ORDER BY f.total DESC LIMIT 1;
    SELECT f.total - f.n INTO rate_before
      FROM flow_starts AS f WHERE f.queue = q AND f.flow_key = '' AND f.started_at > rate_since ORDER BY f.started_at, f.total LIMIT 1;
    rate_used := coalesce(rate_total - rate_before, 0);
    IF s.rate_limit - rate_used < budget THEN
      budget := greatest(s.rate_limit - rate_used, 0);
      -- One more start fits once the window has lost the starts up to the first row whose
      -- total reaches rate_total - rate_limit + 1 (and none before the window's first row).
      held_ms := least(coalesce(held_ms, 2147483647), greatest(1, ceil(extract(epoch FROM
        (SELECT f.started_at + s.rate_window_ms * interval '1 millisecond'
           FROM flow_starts AS f
          WHERE f.queue = q AND f.flow_key = '' AND f.total >= greatest(rate_total - s.rate_limit + 1, rate_before + 1)
          ORDER BY f.total LIMIT 1) - t_now) * 1000)))::int;
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
                        ELSE s.key_rate_limit - coalesce(kr.last_total - kr.before_window, 0)
                             - flow_window_used(ks.start_times, ks.start_counts, greatest(key_since, kr.last_at)) END,
                   CASE WHEN ks.held_until > t_now THEN 0 ELSE budget END) AS n
        FROM visited AS v
        LEFT JOIN flow_key_state AS ks ON ks.queue = q AND ks.flow_key = v.k
        -- The key's starts in its window, counted as the queue's above; and those of a log of the
        -- old form newer than its rows (a claim of the previous release), until its next start.
        LEFT JOIN LATERAL (
              SELECT l.total AS last_total, l.started_at AS last_at,
                     (SELECT f.total - f.n FROM flow_starts AS f
                       WHERE f.queue = q AND f.flow_key = v.k AND f.started_at > key_since
                       ORDER BY f.started_at, f.total LIMIT 1) AS before_window
                FROM (SELECT f.total, f.started_at FROM flow_starts AS f
                       WHERE f.queue = q AND f.flow_key = v.k ORDER BY f.total DESC LIMIT 1) AS l
               WHERE s.key_rate_limit IS NOT NULL) AS kr ON true
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
      -- Each key that starts jobs: its log of the old form taken over, if any; the rows that
      -- left its window deleted; one row for this claim's starts.
      PERFORM flow_starts_adopt(q, ks.flow_key, ks.start_times, ks.start_counts)
         FROM flow_key_state AS ks
        WHERE ks.queue = q AND cardinality(ks.start_times) > 0
          AND ks.flow_key IN (SELECT j.flow_key FROM jobs AS j WHERE j.id = ANY(picked));
      UPDATE flow_key_state AS ks SET start_times = '{}', start_counts = '{}'
       WHERE ks.queue = q AND cardinality(ks.start_times) > 0
         AND ks.flow_key IN (SELECT j.flow_key FROM jobs AS j WHERE j.id = ANY(picked));
      DELETE FROM flow_starts AS f
       WHERE f.queue = q AND f.started_at <= key_since
         AND f.flow_key IN (SELECT j.flow_key FROM jobs AS j WHERE j.id = ANY(picked));
      INSERT INTO flow_starts (queue, flow_key, total, started_at, n)
      SELECT q, p.k, coalesce(l.total, 0) + p.c, greatest(t_start, l.started_at), p.c
        FROM (SELECT j.flow_key AS k, count(*)::int AS c FROM jobs AS j
               WHERE j.id = ANY(picked) AND j.flow_key IS NOT NULL GROUP BY j.flow_key) AS p
        LEFT JOIN LATERAL (SELECT f.total, f.started_at FROM flow_starts AS f
                            WHERE f.queue = q AND f.flow_key = p.k ORDER BY f.total DESC LIMIT 1) AS l ON true;
    END IF;
  END IF;

  claimed := coalesce(cardinality(picked), 0);
  IF claimed > 0 THEN
    IF s.rate_limit IS NOT NULL THEN
      -- The rows that left the window (each deleted once: together as cheap as its insert),
      -- then this claim's. The total goes on from the last row's, deleted or not.
      DELETE FROM flow_starts AS f WHERE f.queue = q AND f.flow_key = '' AND f.started_at <= rate_since;
      INSERT INTO flow_starts (queue, flow_key, total, started_at, n)
      VALUES (q, '', coalesce(rate_total, 0) + claimed, greatest(t_start, rate_last_at), claimed);
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

