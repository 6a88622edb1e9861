/**
 * Leasehold: a durable, lease-based job queue on PostgreSQL.
 *
 * Delivery is at-least-once: a handler may run more than once for the same job (after a
 * crash, a hang or a partition). Handlers must be idempotent; (job id, attempt) is the
 * dedup key and the fencing token for writes elsewhere. See docs/concepts.md.
 */
export { Leasehold, ENQUEUE_CHUNK } from "./client.js";
export type { LeaseholdOptions, ListJobsOptions } from "./client.js";
export { Worker, makeWorkerId } from "./worker/worker.js";
export type { WorkerOptions, JobOutcome } from "./worker/worker.js";
export { JobAbortedError, PermanentJobError } from "./worker/context.js";
export type { JobContext, Handler, TaskDefinition, TaskHandlers, AbortReason } from "./worker/context.js";
export type { WorkerTransport } from "./worker/transport.js";
export { DatabaseTransport, isConnectionError } from "./worker/transport.js";
export { RemoteTransport, ServerUnavailableError, ServerError } from "./worker/remote-transport.js";
export type { RemoteTransportOptions } from "./worker/remote-transport.js";
export { DEFAULT_BACKOFF, retryDelayMs } from "./worker/backoff.js";
export type { BackoffPolicy } from "./worker/backoff.js";
export * from "./worker/options.js";
export { MaintenanceService } from "./maintenance/service.js";
export { Watchdog, DEFAULT_WATCHDOG_INTERVAL_MS } from "./maintenance/watchdog.js";
export type { ReapSummary } from "./maintenance/watchdog.js";
export { Retention } from "./maintenance/retention.js";
export type { RetentionOptions } from "./maintenance/retention.js";
export { EmbeddedPostgres } from "./embedded/postgres.js";
export type { EmbeddedPostgresOptions } from "./embedded/postgres.js";
export { metricsFor } from "./metrics.js";
export type { Metrics } from "./metrics.js";
export * from "./errors.js";
export * from "./jobs/types.js";
export * as store from "./store/index.js";
export { fencedWrite, fencedWriteSql } from "./fencing.js";
export type { FencedWrite, FencedWriteDb } from "./fencing.js";
