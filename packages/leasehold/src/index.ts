/**
 * Leasehold: a durable, lease-based job queue on PostgreSQL. This is the documented API
 * (docs/api.md); everything else in the package is internal and may change.
 *
 * Delivery is at-least-once: a handler may run more than once for the same job (after a
 * crash, a hang or a partition). Handlers must be idempotent; (job id, attempt) is the
 * dedup key and the fencing token for writes elsewhere. See docs/concepts.md.
 *
 * The tooling lives in packages of its own: `@leasehold/cli` (the command line, the HTTP server,
 * the dashboard and the embedded PostgreSQL for development) and `@leasehold/nats` (NATS
 * dispatch), loaded by the library only when an option asks for them.
 */
export { Leasehold } from "./client.js";
export type { LeaseholdOptions, EnqueueTarget, ListJobsOptions, Stats } from "./client.js";
export type { ConnectRetryOptions, ConnectRetry } from "./connecting.js";
export type { WaitOptions } from "./waiters.js";
export type { JobRelations } from "./store/admin.js";
export type { JobStep, JobSteps, JobWait } from "./store/step-views.js";
export type {
  LeaseholdHooks,
  EnqueueInfo,
  AttemptEnd,
  ClaimBatch,
  SettleBatch,
  HandlerMiddleware,
  EnqueueMiddleware,
  BatchMiddleware,
} from "./hooks.js";
export type { TracingOptions } from "./otel/options.js";
export type { UnknownTasksMode } from "./jobs/known-tasks.js";
export type { HandlerGap } from "./maintenance/handler-gaps.js";
export type { NatsOptions, NatsPlugin, NatsPublisher } from "./worker/dispatch.js";
export type { Logger, LogFn } from "./logger.js";
export type { MetricsRegistry } from "./metric-shapes.js";
export { silentLogger } from "./logger.js";
export type { EmbeddedPostgresOptions } from "./embedded-options.js";
export { Worker } from "./worker/worker.js";
export type { WorkerOptions, JobOutcome } from "./worker/worker.js";
export type { StopOnSignalsOptions } from "./worker/signals.js";
export type { WorkerEvents, WorkerEventName } from "./worker/events.js";
export { defineTask } from "./tasks/define.js";
export type { TaskConfig, DefinedTask, AnyTask, TaskName, TaskOf, TaskInput, TaskOutput, TaskResult, ResultOf } from "./tasks/define.js";
export type {
  TypedBatchInput,
  TypedEnqueuedJob,
  TypedFlowNode,
  TypedJobRecord,
  TypedLeasehold,
  TypedNewJob,
  TypedScheduleDefinition,
  TypedWorkerOptions,
} from "./tasks/client.js";
export type { TypedParentRecord } from "./tasks/parents.js";
export type { ChildEnd, ChildFlow, ChildrenFunction, TypedChildJob } from "./worker/children.js";
export { PayloadValidationError } from "./tasks/validate.js";
export { defineEvent, EventValidationError } from "./tasks/events.js";
export type { DefinedEvent, AnyEvent, EventInput, EventData } from "./tasks/events.js";
export type { PayloadIssue } from "./tasks/validate.js";
export type { StandardSchemaV1 } from "./tasks/standard-schema.js";
export { JobAbortedError, PermanentJobError, RetrySupersededError, RateLimitedError } from "./worker/context.js";
export type { JobContext, Handler, TaskDefinition, TaskHandlers, AbortReason, TransactionResult } from "./worker/context.js";
export type { WorkerTransport } from "./worker/transport.js";
export type { StepFunction, StepOptions, StepRetry, WaitForEventOptions } from "./worker/steps.js";
export type { Duration, StepKind, StepRecord, StepState } from "./jobs/steps.js";
export { MAX_STEPS_PER_JOB, MAX_STEP_RESULT_BYTES, MAX_EVENT_DATA_BYTES, MAX_EVENT_NAME_LENGTH } from "./jobs/steps.js";
export { RemoteTransport, ServerUnavailableError, ServerError } from "./worker/remote-transport.js";
export type { RemoteTransportOptions } from "./worker/remote-transport.js";
export { DEFAULT_BACKOFF } from "./worker/backoff.js";
export type { BackoffPolicy } from "./worker/backoff.js";
export {
  DEFAULT_CONCURRENCY,
  DEFAULT_LEASE_MS,
  DEFAULT_HEARTBEAT_MS,
  DEFAULT_POLL_INTERVAL_MS,
  DEFAULT_SHUTDOWN_TIMEOUT_MS,
} from "./worker/options.js";
export { DEFAULT_MAX_RESULT_BYTES } from "./jobs/validate.js";
export type { Watchdog, WatchdogOptions, ReapSummary, RecoverySummary } from "./maintenance/watchdog.js";
export { DEFAULT_WATCHDOG_INTERVAL_MS } from "./maintenance/watchdog.js";
export type { Retention, RetentionOptions } from "./maintenance/retention.js";
export type { QueueStats } from "./store/admin.js";
export type { QueueDepth } from "./store/depth.js";
export * from "./errors.js";
export type { Callback, CallbackOptions } from "./worker/steps.js";
export * from "./jobs/types.js";
export { fencedWrite, fencedWriteSql } from "./fencing.js";
export type { FencedWrite, FencedWriteDb } from "./fencing.js";
export type { Scheduler, SchedulerOptions } from "./maintenance/scheduler.js";
export type { ScheduleDefinition } from "./jobs/schedule.js";
export type { FlowNode, BatchInput, OnParentFailure } from "./jobs/flow-graph.js";
export { MAX_FLOW_NODES, MAX_FLOW_EDGES } from "./jobs/flow-graph.js";
export type { ParentRecord, DependencyCounts } from "./store/dependencies.js";
export type { ScheduleRecord, ScheduleJobOptions } from "./store/schedules.js";
