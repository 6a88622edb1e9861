/** `leasehold doctor`: what is wrong with this queue's fleet, and the lease its beats call for. */
import type { Command } from "commander";
import { diagnose, type Diagnosis } from "leasehold/internal/maintenance/doctor";
import { handlerGaps } from "leasehold/internal/maintenance/handler-gaps";
import * as store from "leasehold/internal/store/index";
import type { Run } from "../context.js";
import { EXIT } from "../errors.js";

/** Processes seen within a day count as evidence; within a minute, as live. */
const EVIDENCE_MS = 24 * 3600_000;
const ALIVE_MS = 60_000;
/** Running-long jobs read (the report names the first ten and counts the rest). */
const RUNNING_LONG_LIMIT = 1_000;

export function registerDoctor(program: Command, run: Run): void {
  program
    .command("doctor")
    .description(
      "check the fleet: watchdogs, unreaped leases, lost workers, orphaned jobs, jobs running longer than their task usually takes, and a lease length from recorded heartbeat delays",
    )
    .action(
      run(async (cli) => {
        const lh = await cli.connect({ quiet: true });
        const [health, withoutHandler, missing, runningLong] = await Promise.all([
          store.fleetHealth(lh.pool, { withinMs: EVIDENCE_MS, aliveMs: ALIVE_MS }),
          handlerGaps(lh.pool),
          store.findMissingAudit(lh.pool, { withinMs: EVIDENCE_MS }),
          store.runningLongerThanUsual(lh.pool, { limit: RUNNING_LONG_LIMIT }),
        ]);
        const overBudget = (
          await lh.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM jobs WHERE state = 'waiting' AND spent_attempts >= max_attempts")
        ).rows[0]!.n;
        const diagnosis = diagnose(health, { withoutHandler, missingAudit: missing.length, overBudget }, runningLong);
        cli.result(diagnosis, () => report(diagnosis));
        // Like a linter: a non-zero exit when something needs fixing, for scripts and CI.
        if (diagnosis.findings.some((f) => f.level === "error")) process.exitCode = EXIT.failure;
      }),
    );
}

function report(d: Diagnosis): string {
  const mark = { ok: "✔", warn: "!", error: "✖" } as const;
  const lines = d.findings.map((f) => `${mark[f.level]} ${f.message}`);
  lines.push("");
  const { beats, p99DelayMs } = d.lease;
  if (beats === 0) {
    lines.push("lease: no heartbeats recorded in the last day; run workers for a while and ask again");
  } else {
    lines.push(`lease: ${beats} heartbeats recorded in the last day, p99 delay ${p99DelayMs === null ? "over 30 s" : `${p99DelayMs} ms`}`);
    for (const w of d.lease.workers) {
      const verdict = w.leaseMs >= w.recommendedMs ? "ok" : "too short";
      lines.push(`  ${w.id}: lease ${w.leaseMs} ms, beat ${w.heartbeatMs} ms → recommended at least ${w.recommendedMs} ms (${verdict})`);
    }
  }
  return lines.join("\n");
}
