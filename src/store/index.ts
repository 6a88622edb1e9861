/**
 * The store: the only place SQL runs. One function per statement, named for what it does.
 */
export { createPool, withTransaction, notifyChannel, assertSchemaName, DEFAULT_SCHEMA } from "./db.js";
export type { Queryable, PoolOptions } from "./db.js";
export { migrate, loadMigrations } from "./migrate.js";
export { enqueueJobs } from "./enqueue.js";
export { claimJobs } from "./claim.js";
export type { ClaimParams } from "./claim.js";
export { extendLeases, describeLostLeases } from "./leases.js";
export type { Beat, BeatResult, LostLease } from "./leases.js";
export { completeJobs } from "./finish.js";
export type { AttemptRef } from "./finish.js";
export { failJobs, reapExpiredLeases, releaseJobs, releaseJobsOfEarlierProcess } from "./end-attempts.js";
export type { Failure, BackoffPolicy, EndState } from "./end-attempts.js";
export { getJob, getAttempts, listJobs, cancelJob, retryJob, queueStats } from "./admin.js";
export type { ListJobsFilter, CancelResult, RetryResult, QueueStats } from "./admin.js";
export { pruneFinishedJobs } from "./retention.js";
export { readyPairs } from "./ready.js";
export type { QueueTasks } from "./ready.js";
