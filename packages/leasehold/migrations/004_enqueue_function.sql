-- Leasehold schema, version 4: enqueue from SQL.
--
-- enqueue(task, payload, options) makes a job from a trigger, a migration or psql, in the
-- caller's transaction, with the checks the TypeScript client applies: a bad value raises
-- invalid_parameter_value (22023) naming it, and so rolls the caller's transaction back. It
-- returns the job's id (with a uniqueKey held by an unfinished job: that job's id). The
-- NOTIFY that wakes workers goes out at commit, like every enqueue's.
--
--   SELECT leasehold.enqueue('send-email', '{"to": "a@example.com"}');
--   SELECT leasehold.enqueue('ship', jsonb_build_object('order', 42), '{"queue": "orders", "delayMs": 5000}');
--
-- Options, as in `lh.enqueue`: queue, priority, runAt (a timestamp with time zone, as text),
-- delayMs, maxAttempts, uniqueKey, leaseMs, progressTimeoutMs, maxRunMs.
-- Keep the bounds here equal to src/jobs/validate.ts (a test enqueues the same bad values
-- both ways and expects both refused).

-- Statements that name Leasehold's schema run from other search_paths (enqueue and ctx.transaction
-- on the application's connections): the functions they call must find their own tables.
ALTER FUNCTION history_generation(timestamptz) SET search_path FROM CURRENT;

CREATE FUNCTION enqueue_refuse(message text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'leasehold.enqueue: %', message USING ERRCODE = 'invalid_parameter_value';
END;
$$;

-- An integer option: absent gives `fallback`; anything but a whole number in [lo, hi] is refused.
CREATE FUNCTION enqueue_integer(options jsonb, name text, lo bigint, hi bigint, fallback bigint)
RETURNS bigint LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  v jsonb := options -> name;
BEGIN
  IF v IS NULL THEN RETURN fallback; END IF;
  IF jsonb_typeof(v) <> 'number' OR v::text::numeric <> trunc(v::text::numeric)
     OR v::text::numeric < lo OR v::text::numeric > hi THEN
    PERFORM enqueue_refuse(format('%s must be an integer from %s to %s (got %s)', name, lo, hi, left(v::text, 80)));
  END IF;
  RETURN v::text::numeric::bigint;
END;
$$;

CREATE FUNCTION enqueue_check_name(value text, what text) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  IF value IS NULL OR value !~ '^[A-Za-z0-9_.:/-]{1,128}$' THEN
    PERFORM enqueue_refuse(format('%s must be 1-128 characters of letters, digits and _ . : - / (got %s)',
                                  what, coalesce(left(to_jsonb(value)::text, 80), 'null')));
  END IF;
  RETURN value;
END;
$$;

-- How deeply arrays and objects nest, counted level by level; stops past `limit`.
CREATE FUNCTION enqueue_nesting_exceeds(value jsonb, "limit" int) RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  level jsonb[] := CASE WHEN jsonb_typeof(value) IN ('object', 'array') THEN ARRAY[value] ELSE '{}' END;
  depth int := 0;
BEGIN
  WHILE cardinality(level) > 0 LOOP
    depth := depth + 1;
    IF depth > "limit" THEN RETURN true; END IF;
    level := ARRAY(
      SELECT child
        FROM unnest(level) AS parent
       CROSS JOIN LATERAL (
             SELECT c.value FROM jsonb_each(CASE WHEN jsonb_typeof(parent) = 'object' THEN parent ELSE '{}' END) AS c
             UNION ALL
             SELECT c.value FROM jsonb_array_elements(CASE WHEN jsonb_typeof(parent) = 'array' THEN parent ELSE '[]' END) AS c
           ) AS children(child)
       WHERE jsonb_typeof(child) IN ('object', 'array'));
  END LOOP;
  RETURN false;
END;
$$;

CREATE FUNCTION enqueue(task text, payload jsonb DEFAULT '{}', options jsonb DEFAULT '{}')
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
  new_id     bigint;
BEGIN
  IF jsonb_typeof(opts) <> 'object' THEN
    PERFORM enqueue_refuse(format('options must be a JSON object (got %s)', left(opts::text, 80)));
  END IF;
  SELECT k INTO unknown FROM jsonb_object_keys(opts) AS k
   WHERE k NOT IN ('queue', 'priority', 'runAt', 'delayMs', 'maxAttempts', 'uniqueKey', 'leaseMs',
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

  -- A key held by an unfinished job answers with that job; if it finishes between the
  -- insert and the lookup, try again (a few rounds: each means another job ran to its end).
  FOR tries IN 1..5 LOOP
    INSERT INTO jobs (queue, task, payload, priority, run_at, max_attempts, unique_key, lease_ms,
                      progress_timeout_ms, max_run_ms)
    VALUES (q, task, body,
            enqueue_integer(opts, 'priority', -32768, 32767, 0),
            coalesce(run_at_ts, now() + delay * interval '1 millisecond'),
            enqueue_integer(opts, 'maxAttempts', 1, 1000, 25),
            unique_k,
            enqueue_integer(opts, 'leaseMs', 1000, 86400000, NULL),
            enqueue_integer(opts, 'progressTimeoutMs', 1000, 604800000, NULL),
            enqueue_integer(opts, 'maxRunMs', 1000, 604800000, NULL))
    ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL DO NOTHING
    RETURNING id INTO new_id;
    IF new_id IS NOT NULL THEN RETURN new_id; END IF;
    SELECT id INTO new_id FROM jobs WHERE unique_key = unique_k;
    IF new_id IS NOT NULL THEN RETURN new_id; END IF;
  END LOOP;
  RAISE EXCEPTION 'leasehold.enqueue: unique key % neither inserted nor found after 5 rounds', to_jsonb(unique_k);
END;
$$;
