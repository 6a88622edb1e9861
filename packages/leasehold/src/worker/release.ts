/**
 * Giving jobs back without spending an attempt: the worker is alive and chose to (it stops,
 * a job waited too long or cannot be vouched for, a queue was paused...). The release is
 * fenced: an attempt the watchdog already recovered is refused.
 */
import type { Logger } from "../logger.js";
import type { Metrics } from "../metrics.js";
import type { InFlight } from "./heartbeat.js";
import type { WorkerTransport } from "./transport.js";

/** Why a live worker gives jobs back, and the `cause` label it is counted under. */
const RELEASE_CAUSE = {
  shutdown: "shutdown",
  "buffered too long": "buffer_age",
  cancelled: "cancelled",
  "not vouched for": "unvouched",
  "liveness lost": "liveness_lost",
  "queue paused": "paused",
} as const;

export type ReleaseWhy = keyof typeof RELEASE_CAUSE;

/** Never throws: jobs not released keep their leases until they expire, and the watchdog recovers them. */
export async function releaseAttempts(
  transport: WorkerTransport,
  workerId: string,
  entries: InFlight[],
  why: ReleaseWhy,
  metrics: Metrics,
  logger: Logger,
): Promise<void> {
  try {
    const released = await transport.release({
      workerId,
      jobs: entries.map((e) => ({ id: e.job.id, attempt: e.job.attempt })),
      reason: why === "shutdown" ? "released: worker shut down" : `released: ${why}`,
    });
    metrics.released.inc({ cause: RELEASE_CAUSE[why] }, released.size);
    if (why === "shutdown") logger.info({ released: released.size }, "released unfinished jobs");
  } catch (err) {
    // Their leases will expire and the watchdog will recover them.
    logger.warn({ err: String(err), jobs: entries.length }, `could not release jobs (${why})`);
  }
}
