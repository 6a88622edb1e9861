-- Leasehold schema, version 12: jobs carry headers (docs/tracing.md).
--
-- A job's headers are a small JSON object of string values that travel with the job from its
-- enqueue to every attempt's handler, beside the payload: a W3C trace context (`traceparent`,
-- `tracestate`) that links the attempts' spans to the enqueue, or any metadata a before-enqueue
-- hook adds (a correlation id, a tenant). Only unfinished jobs carry them: the column is on
-- `jobs` alone, so finishing a job is unchanged (a dead job retried by hand starts over
-- without headers).
--
-- Additive only: a nullable column with no default is a catalog change (no table rewrite).
-- The previous release's workers name the columns they claim and insert, so they neither
-- read nor write it; the leasehold.enqueue() SQL function leaves it null.

ALTER TABLE jobs ADD COLUMN headers jsonb;
