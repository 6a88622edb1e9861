/** Builds the JobContext a handler receives for one attempt. */
import type { Logger } from "pino";
import { serializePayload } from "../jobs/validate.js";
import { fencedWrite } from "../fencing.js";
import type { Metrics } from "../metrics.js";
import type { AbortReason, JobContext } from "./context.js";
import type { InFlight } from "./heartbeat.js";

export interface ContextHost {
  logger: Logger;
  metrics: Metrics;
  /** The handler made progress (a progress or checkpoint call). */
  progressed(entry: InFlight): void;
  abort(entry: InFlight, reason: AbortReason): void;
}

export function createJobContext(entry: InFlight, host: ContextHost): JobContext {
  const { job } = entry;
  let childLogger: Logger | undefined;
  return {
    jobId: job.id,
    attempt: job.attempt,
    fence: job.fence,
    queue: job.queue,
    task: job.task,
    spentAttempts: job.spentAttempts,
    maxAttempts: job.maxAttempts,
    previousOutcome: job.previousOutcome,
    lastError: job.lastError,
    signal: entry.controller.signal,
    previousCheckpoint: job.checkpoint,
    progress: (data) => {
      // Validated here, so a value PostgreSQL would refuse throws to this handler only.
      entry.progressJson = serializePayload(data, "", "progress");
      host.progressed(entry);
    },
    checkpoint: (data) => {
      entry.checkpointJson = serializePayload(data, "", "checkpoint");
      host.progressed(entry);
    },
    fencedWrite: async (db, write) => {
      const accepted = await fencedWrite(db, { ...write, token: job.fence });
      if (!accepted) {
        host.metrics.fencingRejections.inc({ kind: "downstream", reason: "newer_token" });
        host.abort(entry, "fence_refused");
      }
      return accepted;
    },
    // Created on first use: most handlers never log, and a child logger per job measured
    // ~2 µs (docs/benchmarks.md).
    get logger() {
      return (childLogger ??= host.logger.child({ jobId: job.id, attempt: job.attempt, task: job.task }));
    },
  };
}
