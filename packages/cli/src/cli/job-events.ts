/**
 * One line per job start and end, for `leasehold worker` and `leasehold dev`: readable text,
 * or with --json one JSON object per line ({"event":"job:end","id":"42",...}). `print` may
 * hold lines back a moment (`leasehold worker` writes them once per turn of the event loop);
 * the end of a job that failed or was lost goes to `printNow`, written at once.
 */
import type { ClaimedJob } from "leasehold/internal/jobs/types";
import type { Worker, JobOutcome } from "leasehold/internal/worker/worker";

export function printJobEvents(worker: Worker, print: (line: string) => void, json = false, printNow: (line: string) => void = print): void {
  const started = new Map<string, number>();
  worker.on("job:start", (job: ClaimedJob) => {
    started.set(job.id, performance.now());
    if (json) return print(JSON.stringify({ event: "job:start", id: job.id, task: job.task, queue: job.queue, attempt: job.attempt }));
    print(`▶ job ${job.id} ${job.task} started (attempt ${job.spentAttempts + 1} of ${job.maxAttempts})`);
  });
  worker.on("job:end", (job: ClaimedJob, outcome: JobOutcome) => {
    const out = FINE.has(outcome.state) ? print : printNow;
    const seconds = (performance.now() - (started.get(job.id) ?? performance.now())) / 1000;
    started.delete(job.id);
    if (json) {
      const detail = outcome.state === "stale" ? { reason: outcome.error.reason } : outcome.state === "lost" ? { reason: outcome.reason } : {};
      return out(
        JSON.stringify({
          event: "job:end",
          id: job.id,
          task: job.task,
          attempt: job.attempt,
          state: outcome.state,
          seconds: Number(seconds.toFixed(3)),
          ...detail,
        }),
      );
    }
    const took = seconds.toFixed(1);
    const name = `job ${job.id} ${job.task}`;
    switch (outcome.state) {
      case "succeeded":
        return out(`✔ ${name} succeeded in ${took}s`);
      case "waiting":
        return out(`↻ ${name} failed after ${took}s; it will be retried after a backoff`);
      case "dead":
        return out(`✖ ${name} ${whyDead(job, outcome.error)}; \`leasehold jobs retry ${job.id}\` runs it again`);
      case "cancelled":
        return out(`■ ${name} cancelled`);
      case "superseded":
        return out(`⤼ ${name} superseded after ${took}s: a newer job wrote first; finished without a retry`);
      case "stale":
        return out(`! ${name}: report refused, the lease was lost (${outcome.error.reason})`);
      case "lost":
        return out(`! ${name} stopped: ${outcome.reason}`);
      case "report_failed":
        return out(`! ${name}: could not report its end; the watchdog will recover it`);
    }
  });
}

/** Ends printed with the rest; any other (a failure, a lost lease, a report that failed) at once. */
const FINE: ReadonlySet<JobOutcome["state"]> = new Set(["succeeded", "superseded", "cancelled", "suspended"]);

/**
 * Whether the job ran out of attempts, or was ended for good with attempts left (a
 * PermanentJobError, a payload its schema refuses, a result that cannot be stored): saying
 * "no attempts left" then would send the reader after the wrong cause.
 */
function whyDead(job: ClaimedJob, error: Error | undefined): string {
  const left = job.maxAttempts - (job.spentAttempts + 1);
  if (left <= 0) return `failed and is dead (no attempts left: all ${job.maxAttempts} spent)`;
  const what = error ? error.message.split("\n")[0] : "a permanent failure, e.g. a payload its schema refuses";
  return `failed for good and is dead, not retried (${what}; ${left} of ${job.maxAttempts} attempts unused): \`leasehold jobs show ${job.id}\` has its error`;
}
