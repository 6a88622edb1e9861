-- Leasehold schema, version 8: each worker's own crash-detection grace.
--
-- A worker that loses its liveness session aborts its attempts after half of its grace, and
-- the watchdog recovers them after the whole of it: the worker stops first. The worker
-- announces the grace it chose, so every watchdog waits that one. Null (workers of earlier
-- releases, and processes without a liveness session): the watchdog's own grace.
ALTER TABLE workers ADD COLUMN liveness_grace_ms integer;
