/** One line per job start and end, for `leasehold worker` and `leasehold dev`. */
import type { ClaimedJob } from "../jobs/types.js";
import type { Worker, JobOutcome } from "../worker/worker.js";

export function printJobEvents(worker: Worker, print: (line: string) => void): void {
  const started = new Map<string, number>();
  worker.on("job:start", (job: ClaimedJob) => {
    started.set(job.id, performance.now());
    print(`▶ job ${job.id} ${job.task} started (attempt ${job.spentAttempts + 1} of ${job.maxAttempts})`);
  });
  worker.on("job:end", (job: ClaimedJob, outcome: JobOutcome) => {
    const took = ((performance.now() - (started.get(job.id) ?? performance.now())) / 1000).toFixed(1);
    started.delete(job.id);
    const name = `job ${job.id} ${job.task}`;
    switch (outcome.state) {
      case "succeeded":
        return print(`✔ ${name} succeeded in ${took}s`);
      case "waiting":
        return print(`↻ ${name} failed after ${took}s; it will be retried after a backoff`);
      case "dead":
        return print(`✖ ${name} failed and is dead (no attempts left); \`leasehold jobs retry ${job.id}\` runs it again`);
      case "cancelled":
        return print(`■ ${name} cancelled`);
      case "stale":
        return print(`! ${name}: report refused, the lease was lost (${outcome.error.reason})`);
      case "lost":
        return print(`! ${name} stopped: ${outcome.reason}`);
      case "report_failed":
        return print(`! ${name}: could not report its end; the watchdog will recover it`);
    }
  });
}
