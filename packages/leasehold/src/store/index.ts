/**
 * The store: the only place SQL runs. One function per statement, named for what it does.
 */
export {
  createPool,
  createAppPool,
  checkOut,
  guardClients,
  withTransaction,
  withSnapshot,
  notifyChannel,
  cancelChannel,
  assertSchemaName,
  quoteIdent,
  isConnectionError,
  DEFAULT_SCHEMA,
} from "./db.js";
export type { Queryable, PoolOptions } from "./db.js";
export { migrate, loadMigrations, checkSchemaVersion } from "./migrate.js";
export type { SchemaVersion, AppliedMigration } from "./migrate.js";
export { resolvePooling, explainStartupRefusal, checkPooledSchema, checkOwnBackend, POOLING_MODES } from "./pooling.js";
export type { PoolingMode } from "./pooling.js";
export { enqueueJobs } from "./enqueue.js";
export { hasReplaceModes } from "./duplicates.js";
export { claimJobs, claimJobsById } from "./claim.js";
export type { ClaimParams, ClaimedJobs } from "./claim.js";
export { extendLeases, describeLostLeases } from "./leases.js";
export type { Beat, BeatResult, HeartbeatParams, LostLease } from "./leases.js";
export { beginWithin, completeJobs, completeWithin, supersedeJobs, resultsObject } from "./finish.js";
export type { AttemptRef, Completion, Supersession } from "./finish.js";
export {
  failJobs,
  reapExpiredLeases,
  recoverLostWorkers,
  endOverdueAttempts,
  releaseJobs,
  rateLimitJobs,
  recoverJobsOfEarlierProcess,
} from "./end-attempts.js";
export type { Failure, FailureOutcome, BackoffPolicy, EndState, Ended, RateLimited } from "./end-attempts.js";
export {
  queueSettings,
  listQueues,
  queueKnown,
  setQueuePaused,
  setQueueLimits,
  setQueueHistory,
  clearQueueHolds,
  pruneFlowKeyState,
  pruneFlowStarts,
  DEFAULT_MAX_HOLD_MS,
  MAX_LISTED_HOLDS,
} from "./flow.js";
export type { QueueSettings, QueueInfo, QueueLimits, QueueHistory, QueueHold, ClearedHolds, RateLimit } from "./flow.js";
export {
  lockLiveness,
  announceWorker,
  attachRemoteWorker,
  markWorkerStopped,
  markLostWorkers,
  workerNameHeldElsewhere,
  pruneWorkers,
} from "./workers.js";
export type { TaskPolicy, WorkerAnnouncement, RemoteAttachment } from "./workers.js";
export {
  getJob,
  getAttempts,
  getJobRelations,
  watchJob,
  unfinishedOf,
  listJobs,
  listJobsWithin,
  cancelJob,
  retryJob,
  queueStats,
  MAX_LISTED_RELATIONS,
} from "./admin.js";
export type { ListJobsFilter, JobFilter, TimeField, CancelResult, RetryResult, QueueStats, JobRelations } from "./admin.js";
export {
  pruneDeadJobs,
  pruneEvents,
  setGenerationWidth,
  truncateOldGenerations,
  vacuumIfBloated,
  isBloated,
  vacuumTable,
  GENERATIONS,
} from "./retention.js";
export { readyPairs } from "./ready.js";
export { parseCancelNotice, cancelsRequested } from "./cancels.js";
export type { QueueTasks } from "./ready.js";
export { findJobsWithoutWorker, findMissingAudit, endOverBudgetJobs, touchWorker, ORPHAN_SCAN_LIMIT } from "./orphans.js";
export { knownTasks, jobsWithoutHandler } from "./handlers.js";
export type { JobsWithoutHandler } from "./handlers.js";
export { fleetHealth } from "./health.js";
export { queueDepth, suspendedByKind } from "./depth.js";
export type { QueueDepth } from "./depth.js";
export type { FleetHealth, FleetProcess } from "./health.js";
export { databaseNow, upsertSchedule, deleteSchedule, listSchedules, nextScheduleDue, lockDueSchedules, advanceSchedules } from "./schedules.js";
export type { ScheduleRecord, ScheduleInput, ScheduleJobOptions, ScheduleAdvance } from "./schedules.js";
export { recordStaleRefusals, pruneStaleRefusals } from "./refusals.js";
export type { StaleRefusal, RefusedKind } from "./refusals.js";
export { sampleThroughput, pruneThroughputSamples, throughputSeries } from "./throughput.js";
export type { ThroughputPoint, ThroughputSeries } from "./throughput.js";
export {
  queueOverview,
  liveProcesses,
  runningJobs,
  recoverySeries,
  recentRecoveries,
  RECOVERY_EVENT_KINDS,
  LISTED_PROGRESS_BYTES,
} from "./monitor.js";
export type { QueueOverview, ProcessRecord, RunningJob, RecoveryCounts, RecoveryEvent, RecoveryEventKind } from "./monitor.js";
export { runningLongerThanUsual, RUN_TIME_SAMPLES, MIN_RUN_TIME_SAMPLES, RUNNING_LONG_FACTOR, RUNNING_LONG_MIN_EXCESS_MS } from "./running-long.js";
export type { RunningLongJob } from "./running-long.js";
export { countMatching, actOnMatching, MAX_BULK_JOBS } from "./bulk.js";
export type { BulkAction, BulkResult } from "./bulk.js";
export {
  keepNatsDispatchActive,
  takeDueDoorbells,
  nextDoorbellIn,
  deletePublishedDoorbells,
  missedSpells,
  readySpellsOf,
  oweDoorbellsAgain,
  dispatchChannel,
  ACTIVATION_LOCK_TIMEOUT_MS,
} from "./dispatch.js";
export type { Doorbell } from "./dispatch.js";
export type { InsertedJob } from "./enqueue.js";
export { insertFlow, parentsOf, parentsPage, PARENTS_PAGE_BYTES, dependencyCounts } from "./dependencies.js";
export type { ParentRecord, ParentsPage, DependencyCounts } from "./dependencies.js";
export {
  loadSteps,
  loadStepsPage,
  recordSteps,
  stepFate,
  recordStepWithin,
  suspendForSleep,
  receiveEvent,
  waitForEvent,
  sendEvents,
  wakeSuspendedJobs,
} from "./steps.js";
export type { StepOutcome, StepFate, StepsPage, SuspendingStep, EventWait, ReceiveResult } from "./steps.js";
export { completeCallback } from "./callbacks.js";
export { rerunFromStep, recordedStepNames, getJobReruns } from "./reruns.js";
export type { JobRerun, RerunResult } from "./reruns.js";
export { startOrAwaitChildren } from "./children.js";
export type { ChildEndRecord, ChildrenAnswer, ChildrenStep } from "./children.js";
