-- Leasehold schema, version 31: queue_depth counts suspended jobs.
--
-- A durable job that sleeps or waits for an event (version 27) is in state 'suspended': not
-- ready, not running, and until now in none of the view's counts. One column, added at the end
-- (a view's existing columns keep their names, types and order):
--
--   suspended  jobs sleeping or waiting for an event, a callback or children: they hold no
--              worker, and wake by themselves (docs/durable.md), so autoscalers leave them out
--
-- Additive: the view is replaced with the same columns first; nothing else changes.

CREATE OR REPLACE VIEW queue_depth AS
SELECT d.queue,
       coalesce(bool_or(d.paused), false) AS paused,
       sum(d.ready)::bigint AS ready,
       coalesce(extract(epoch FROM now() - min(d.oldest_ready_at))::float8, 0) AS oldest_ready_age_seconds,
       sum(d.running)::bigint AS running,
       sum(d.delayed)::bigint AS delayed,
       sum(d.blocked)::bigint AS blocked,
       max(d.concurrency_limit) AS concurrency_limit,
       coalesce(bool_or(d.limited), false) AS limited,
       sum(d.suspended)::bigint AS suspended
  FROM (SELECT j.queue, NULL::boolean AS paused,
               count(*) FILTER (WHERE j.run_at <= now()) AS ready,
               min(j.run_at) FILTER (WHERE j.run_at <= now()) AS oldest_ready_at,
               0::bigint AS running,
               count(*) FILTER (WHERE j.run_at > now()) AS delayed,
               0::bigint AS blocked,
               NULL::integer AS concurrency_limit,
               NULL::boolean AS limited,
               0::bigint AS suspended
          FROM jobs AS j
         WHERE j.state = 'waiting'
         GROUP BY j.queue
        UNION ALL
        SELECT j.queue, NULL, 0, NULL, count(*), 0, 0, NULL, NULL, 0
          FROM jobs AS j
         WHERE j.state = 'running'
         GROUP BY j.queue
        UNION ALL
        SELECT j.queue, NULL, 0, NULL, 0, 0, count(*), NULL, NULL, 0
          FROM jobs AS j
         WHERE j.state = 'blocked'
         GROUP BY j.queue
        UNION ALL
        SELECT j.queue, NULL, 0, NULL, 0, 0, 0, NULL, NULL, count(*)
          FROM jobs AS j
         WHERE j.state = 'suspended'
         GROUP BY j.queue
        UNION ALL
        SELECT q.name, q.paused, 0, NULL, 0, 0, 0, q.concurrency,
               q.rate_limit IS NOT NULL OR q.key_concurrency IS NOT NULL OR q.key_rate_limit IS NOT NULL
               OR coalesce(q.held_until > now(), false), 0
          FROM queues AS q) AS d
 GROUP BY d.queue;

COMMENT ON VIEW queue_depth IS
  'Per queue: ready jobs (waiting, due now), the oldest ready job''s age in seconds (0: none), running, delayed and blocked jobs, whether the queue is paused, its fleet-wide concurrency limit (null: none), whether a rate, per-key limit or hold holds it back, and suspended jobs (sleeping or waiting for an event: they wake by themselves). For autoscalers: see docs/deployment.md#autoscaling.';
