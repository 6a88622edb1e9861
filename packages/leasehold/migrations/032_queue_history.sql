-- Leasehold schema, version 32: a queue can keep no record of its succeeded jobs (docs/flow-control.md#records-of-succeeded-jobs).
--
--   keep_succeeded  false: a job of this queue that succeeds leaves `jobs` without a
--                   job_history row (no result, no audit of its last attempt, not in lists).
--                   Failures, dead and cancelled jobs keep theirs, and so does a succeeded job
--                   whose result someone needs or whose other rows retention forgets with its
--                   record: one with dependents or a waiter, a durable child awaited, a job
--                   in a flow, one with earlier attempts or durable steps (store/finish.ts).
--
-- Additive: one column with a constant default (no rewrite), true: every queue keeps its
-- records as before. The previous release's workers read no such column and keep every record
-- while they run; its completions and this release's agree on everything else.

ALTER TABLE queues ADD COLUMN keep_succeeded boolean NOT NULL DEFAULT true;
