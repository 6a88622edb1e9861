-- Leasehold schema, version 17: queue_depth says which queues a limit holds back.
--
-- An autoscaler reading version 16's view scaled a queue with a fleet-wide concurrency limit on
-- its whole backlog: past the limit, the extra workers only wait. Two columns, added at the end
-- (a view's existing columns keep their names, types and order):
--
--   concurrency_limit  the queue's fleet-wide concurrency limit (queues.concurrency); null: none.
--                      No more than this many of its jobs run at once, however many workers run.
--   limited            a start rate, a per-key limit or a handler's hold applies: its ready jobs
--                      may wait however many workers run, so more workers help only as far as
--                      the limit lets jobs start (docs/deployment.md#autoscaling)
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
       coalesce(bool_or(d.limited), false) AS limited
  FROM (SELECT j.queue, NULL::boolean AS paused,
               count(*) FILTER (WHERE j.run_at <= now()) AS ready,
               min(j.run_at) FILTER (WHERE j.run_at <= now()) AS oldest_ready_at,
               0::bigint AS running,
               count(*) FILTER (WHERE j.run_at > now()) AS delayed,
               0::bigint AS blocked,
               NULL::integer AS concurrency_limit,
               NULL::boolean AS limited
          FROM jobs AS j
         WHERE j.state = 'waiting'
         GROUP BY j.queue
        UNION ALL
        SELECT j.queue, NULL, 0, NULL, count(*), 0, 0, NULL, NULL
          FROM jobs AS j
         WHERE j.state = 'running'
         GROUP BY j.queue
        UNION ALL
        SELECT j.queue, NULL, 0, NULL, 0, 0, count(*), NULL, NULL
          FROM jobs AS j
         WHERE j.state = 'blocked'
         GROUP BY j.queue
        UNION ALL
        SELECT q.name, q.paused, 0, NULL, 0, 0, 0, q.concurrency,
               q.rate_limit IS NOT NULL OR q.key_concurrency IS NOT NULL OR q.key_rate_limit IS NOT NULL
               OR coalesce(q.held_until > now(), false)
          FROM queues AS q) AS d
 GROUP BY d.queue;

COMMENT ON VIEW queue_depth IS
  'Per queue: ready jobs (waiting, due now), the oldest ready job''s age in seconds (0: none), running, delayed and blocked jobs, whether the queue is paused, its fleet-wide concurrency limit (null: none), and whether a rate, per-key limit or hold holds it back. For autoscalers: see docs/deployment.md#autoscaling.';
