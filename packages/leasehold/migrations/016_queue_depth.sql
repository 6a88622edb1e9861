-- Leasehold schema, version 16: queue_depth, what an autoscaler reads (docs/deployment.md#autoscaling).
--
-- One row per queue that has unfinished jobs or a row in `queues` (settings, a pause; such a
-- queue with no jobs shows zeros, so a paused or configured queue is listed before its first
-- job). Queues known only from finished jobs or from workers are not listed: their depth is 0.
--
--   queue                     the queue's name
--   paused                    the queue is paused: its ready jobs are counted, and wait however
--                             many workers run, so an autoscaler should leave them out
--   ready                     waiting jobs due now (run_at <= now()): what more workers would start
--   oldest_ready_age_seconds  how long the longest-waiting ready job has been due (now() - its
--                             run_at), in seconds; 0 when none is ready
--   running                   jobs holding a lease (running, or buffered by a worker)
--   delayed                   waiting jobs not yet due (a delay, a run time, a retry's backoff)
--   blocked                   jobs waiting for their parents (version 14), not for a worker
--
-- Times are the database's (now()), like every time Leasehold compares. A queue held back by a
-- limit (concurrency, rate, a hold) is not marked: its ready jobs are ready, more workers may
-- not start them faster.
--
-- Each state is read on its own, so each can use its partial index: ready, delayed and the
-- oldest come from one pass over the waiting jobs (the claim index holds queue and run_at; with
-- most of the table waiting, the planner scans the table instead), running jobs from the lease
-- index, blocked ones from theirs; a filter on `queue` reaches every part. One row per state
-- and queue comes out of each part, so the outer grouping costs nothing. Counting is still
-- counting: the view reads every unfinished job once, as count(*) would (~5 ms for 10,000).
--
-- Additive: a view, nothing else.

CREATE VIEW queue_depth AS
SELECT d.queue,
       coalesce(bool_or(d.paused), false) AS paused,
       sum(d.ready)::bigint AS ready,
       coalesce(extract(epoch FROM now() - min(d.oldest_ready_at))::float8, 0) AS oldest_ready_age_seconds,
       sum(d.running)::bigint AS running,
       sum(d.delayed)::bigint AS delayed,
       sum(d.blocked)::bigint AS blocked
  FROM (SELECT j.queue, NULL::boolean AS paused,
               count(*) FILTER (WHERE j.run_at <= now()) AS ready,
               min(j.run_at) FILTER (WHERE j.run_at <= now()) AS oldest_ready_at,
               0::bigint AS running,
               count(*) FILTER (WHERE j.run_at > now()) AS delayed,
               0::bigint AS blocked
          FROM jobs AS j
         WHERE j.state = 'waiting'
         GROUP BY j.queue
        UNION ALL
        SELECT j.queue, NULL, 0, NULL, count(*), 0, 0
          FROM jobs AS j
         WHERE j.state = 'running'
         GROUP BY j.queue
        UNION ALL
        SELECT j.queue, NULL, 0, NULL, 0, 0, count(*)
          FROM jobs AS j
         WHERE j.state = 'blocked'
         GROUP BY j.queue
        UNION ALL
        SELECT q.name, q.paused, 0, NULL, 0, 0, 0
          FROM queues AS q) AS d
 GROUP BY d.queue;

COMMENT ON VIEW queue_depth IS
  'Per queue: ready jobs (waiting, due now), the oldest ready job''s age in seconds (0: none), running, delayed and blocked jobs, and whether the queue is paused. For autoscalers: see docs/deployment.md#autoscaling.';
