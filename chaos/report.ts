/** The run's report: one JSON object and the same as a Markdown table, written under chaos/results/. */
import fs from "node:fs";
import path from "node:path";
import { FAULT_KINDS, faultKindsFor, type ChaosOptions } from "./config.js";
import type { FaultRecord } from "./faults.js";
import type { CheckResult } from "./invariants.js";
import type { UnexpectedExit } from "./supervisor.js";

export interface ChaosReport {
  passed: boolean;
  startedAt: string;
  durationS: number;
  drainS: number;
  options: Omit<ChaosOptions, "outDir" | "verbose">;
  jobs: number;
  finished: Record<string, number>;
  /** Succeeded jobs that left no record (--record off), each checked through the run's own audit. */
  notKept?: number;
  transactional: number;
  attempts: number;
  faults: Record<string, number>;
  faultsSkipped: number;
  duplicates: CheckResult["duplicates"];
  staleRefused: CheckResult["staleRefused"];
  lateWritesOverwritten: number;
  recoveryMs: CheckResult["recovery"];
  halfOpen: CheckResult["halfOpen"];
  processRestarts: number;
  startupFailures: number;
  producerRetries: number;
  producerDuplicates: number;
  hangs: CheckResult["hangs"];
  overlaps: CheckResult["overlaps"];
  flow: CheckResult["flow"];
  graphs: CheckResult["graphs"];
  steps: CheckResult["steps"];
  pressure: { idleTxnThroughputPerS: number | null; otherThroughputPerS: number | null };
  /** --dispatch nats: what JetStream delivered (all consumers of the run's stream), read after the drain. */
  nats?: { delivered: number; redelivered: number; pending: number; ackPending: number } | null;
  violations: CheckResult["violations"];
  faultLog: FaultRecord[];
}

export function buildReport(p: {
  options: ChaosOptions;
  startedAt: number;
  drainMs: number;
  check: CheckResult;
  faults: FaultRecord[];
  restarts: number;
  exits: UnexpectedExit[];
  producerRetries: number;
  pressure: ChaosReport["pressure"];
  nats?: ChaosReport["nats"];
}): ChaosReport {
  const { outDir: _o, verbose: _v, ...options } = p.options;
  const faults = Object.fromEntries(FAULT_KINDS.map((k) => [k, p.faults.filter((f) => f.kind === k && !f.skipped).length]));
  return {
    passed: p.check.violations.length === 0,
    startedAt: new Date(p.startedAt).toISOString(),
    durationS: Math.round((Date.now() - p.startedAt) / 100) / 10,
    drainS: Math.round(p.drainMs / 100) / 10,
    options,
    jobs: p.options.jobs,
    finished: p.check.finished,
    notKept: p.check.notKept,
    transactional: p.check.transactional,
    attempts: p.check.attempts,
    faults,
    faultsSkipped: p.faults.filter((f) => f.skipped).length,
    duplicates: p.check.duplicates,
    staleRefused: p.check.staleRefused,
    lateWritesOverwritten: p.check.lateWritesOverwritten,
    recoveryMs: p.check.recovery,
    halfOpen: p.check.halfOpen,
    processRestarts: p.restarts,
    startupFailures: p.exits.filter((e) => e.duringStartup).length,
    producerRetries: p.producerRetries,
    producerDuplicates: p.check.producerDuplicates,
    hangs: p.check.hangs,
    overlaps: p.check.overlaps,
    flow: p.check.flow,
    graphs: p.check.graphs,
    steps: p.check.steps,
    pressure: p.pressure,
    ...(p.nats !== undefined && { nats: p.nats }),
    violations: p.check.violations,
    faultLog: p.faults,
  };
}

const ms = (v: number | null) => (v === null ? "–" : `${(v / 1000).toFixed(2)} s`);

export function toMarkdown(r: ChaosReport): string {
  const o = r.options;
  const lines = [
    `## Chaos run ${r.startedAt}: ${r.passed ? "PASSED" : `FAILED (${r.violations.length} violations)`}`,
    "",
    `${r.jobs} jobs, dispatch ${o.dispatch ?? "polling"}, record of succeeded jobs ${o.record ?? "on"}, ${o.workers} worker processes × ${o.concurrency}, ${o.watchdogs} watchdog processes, lease ${o.leaseMs} ms, ` +
      `beat ${o.heartbeatMs} ms, watchdog every ${o.watchdogIntervalMs} ms, seed ${o.seed}. ` +
      `Run ${r.durationS} s, of which drain after the last fault ${r.drainS} s.`,
    "",
    "| measure | value |",
    "|---|---|",
    `| jobs succeeded / dead / cancelled (graph jobs after a failed parent) | ${r.finished.succeeded ?? 0} / ${r.finished.dead ?? 0} / ${r.finished.cancelled ?? 0} |`,
    `| jobs that left no record (--record off; checked through the run's own audit) | ${r.notKept ?? 0} |`,
    `| jobs ended inside ctx.transaction (one row each if succeeded, none if dead) | ${r.transactional} |`,
    `| attempts (audit rows) | ${r.attempts} |`,
    ...faultKindsFor(o.dispatch ?? "polling").map((k) => `| faults: ${k} | ${r.faults[k]} |`),
    `| faults skipped (no free target) | ${r.faultsSkipped} |`,
    `| duplicate executions (at-least-once) | ${r.duplicates.total} (after lease expired ${r.duplicates.afterLeaseExpired}, after worker lost ${r.duplicates.afterWorkerLost}, after a stall or time-out ${r.duplicates.afterLimit}, after release ${r.duplicates.afterRelease}; overlapping in time ${r.duplicates.overlapping}) |`,
    `| stale reports refused: heartbeat / complete / fail / release | ${r.staleRefused.heartbeat} / ${r.staleRefused.complete} / ${r.staleRefused.fail} / ${r.staleRefused.release} |`,
    `| overlaps (an attempt started while another of its job ran, its signal not fired): avoidable (must be 0) | ${r.overlaps.avoidable}${
      r.overlaps.avoidable
        ? ` (faults on the older attempt's worker around them: ${Object.entries(r.overlaps.avoidableAround)
            .map(([k, n]) => `${k} ${n}`)
            .join(", ")})`
        : ""
    } |`,
    `| overlaps unavoidable: frozen (SIGSTOP over the window) / killed (its process had ended: not running in fact) | ${r.overlaps.unavoidable.frozen} / ${r.overlaps.unavoidable.killed} |`,
    `| attempt timelines: handlers started / signals fired / handlers settled | ${r.overlaps.timeline.started} / ${r.overlaps.timeline.aborted} / ${r.overlaps.timeline.settled} |`,
    `| stale downstream writes refused by the fence | ${r.staleRefused.downstream} |`,
    `| late downstream writes accepted before the newer attempt wrote (all overwritten) | ${r.lateWritesOverwritten} |`,
    `| process restarts (supervisor) / failed start-ups | ${r.processRestarts} / ${r.startupFailures} |`,
    `| producer retries / jobs enqueued twice by a retry | ${r.producerRetries} / ${r.producerDuplicates} |`,
    ...(r.nats
      ? [
          `| NATS messages delivered / redelivered (JetStream) / left pending or unacknowledged after the drain | ${r.nats.delivered} / ${r.nats.redelivered} / ${r.nats.pending + r.nats.ackPending} |`,
        ]
      : []),
    `| throughput during idle transaction / otherwise | ${fmtRate(r.pressure.idleTxnThroughputPerS)} / ${fmtRate(r.pressure.otherThroughputPerS)} |`,
    "",
    "Time from worker death (kill, SIGSTOP, partition, connection reset) to the job running again, and to its lease being given back " +
      "(reaped by a watchdog or released by the restarted worker); running again adds retry backoff and any backlog:",
    "",
    "| fault | jobs measured | running again p50 | p99 | max | lease given back p50 | p99 | max | not recovered by a new claim (report landed, or dead) |",
    "|---|---|---|---|---|---|---|---|---|",
    ...(["kill", "zombie", "partition", "reset"] as const).map((k) => {
      const x = r.recoveryMs[k];
      const a = x.toRunningAgain;
      const b = x.toLeaseEnded;
      return `| ${k} | ${x.n} | ${ms(a.p50)} | ${ms(a.p99)} | ${ms(a.max)} | ${ms(b.p50)} | ${ms(b.p99)} | ${ms(b.max)} | ${x.finishedAnyway} |`;
    }),
    "",
    `Hung handlers (${r.hangs.n}; no progress, never settling, on a worker that keeps beating): ended after ` +
      `p50 ${ms(r.hangs.endedAfter.p50)} / max ${ms(r.hangs.endedAfter.max)} (progress timeout ${ms(r.options.progressTimeoutMs)}, watchdog every ${ms(r.options.watchdogIntervalMs)}).`,
    "",
    `Half-open partitions (${r.halfOpen.n}; open connections go silent, new ones work): the worker next got an answer from the database ` +
      `after p50 ${ms(r.halfOpen.backAfter.p50)} / max ${ms(r.halfOpen.backAfter.max)}, while the faults lasted p50 ${ms(r.halfOpen.faultLasted.p50)} / max ${ms(r.halfOpen.faultLasted.max)}.`,
    "",
    ...flowLines(r.flow),
    ...graphLines(r.graphs),
    ...stepLines(r.steps),
  ];
  if (r.violations.length) {
    lines.push("### Violations", "", "| invariant | job | detail |", "|---|---|---|");
    for (const v of r.violations.slice(0, 50))
      lines.push(`| ${v.invariant} | ${v.job ?? ""} | ${v.detail.replace(/\|/g, "\\|").replace(/\n/g, " ")} |`);
    if (r.violations.length > 50) lines.push(`| … | | ${r.violations.length - 50} more in the JSON report |`);
    lines.push("");
  }
  return lines.join("\n");
}

/** Flow control: each limit against the most the audit trail shows, the pauses, the killed workers' slots. */
function flowLines(f: ChaosReport["flow"]): string[] {
  const p = f.probes;
  const pauses = f.pauses;
  return [
    "Flow control, from the audit trail (a slot is held from the claim to the attempt's recorded end):",
    "",
    "| queue | limit | attempts | most at once / per window (must not pass the limit) |",
    "|---|---|---|---|",
    ...f.limits.map((l) => `| ${l.queue} | ${l.limit} | ${l.attempts} | ${l.peak} of ${l.max} |`),
    "",
    `Pauses (${pauses.length}, ${pauses.map((x) => `${(x.durationMs / 1000).toFixed(1)} s`).join(", ") || "none"}): attempts started while paused (must be 0) ` +
      `${pauses.reduce((n, x) => n + x.startsInside, 0)}; claims that raced the pause's commit ${pauses.reduce((n, x) => n + x.raced, 0)}; ` +
      `jobs waiting at the resumes ${pauses.map((x) => x.waitingAtResume ?? "?").join(", ") || "–"}.`,
    "",
    `Killed while holding a limited queue's only slot (flow_kill, ${p.n}; ${p.probeJobs} probe jobs): the slot came back after p50 ${ms(p.slotBack.p50)} / max ${ms(p.slotBack.max)} ` +
      `(bound ${ms(p.bounds.slotBackMs)}), the job waiting for it started after p50 ${ms(p.nextStart.p50)} / max ${ms(p.nextStart.max)} (bound ${ms(p.bounds.nextStartMs)})` +
      `${p.notMeasured.length ? `; not measured: ${p.notMeasured.join(", ")}` : ""}.`,
    "",
  ];
}

/** Jobs that build on jobs: how the dependent jobs ended, the batches, the results checked, the step latency. */
function graphLines(g: ChaosReport["graphs"] | undefined): string[] {
  if (!g) return [];
  const ended = Object.entries(g.dependents)
    .map(([state, n]) => `${n} ${state}`)
    .join(", ");
  return [
    `Jobs that build on jobs (invariants 13-16): dependent jobs ${ended || "none"} (${g.runOnFailure} run whatever their parents' end, batch callbacks among them); ` +
      `${g.batches} batch callbacks; ${g.results} stored results checked against the attempt that succeeded. ` +
      `A job's last parent's end to its first start: p50 ${ms(g.step.p50)} / p99 ${ms(g.step.p99)} / max ${ms(g.step.max)} (backlog and retry backoff included).`,
    "",
  ];
}

/** Durable jobs: steps recorded and run, each run left unrecorded and why, suspensions, waits. */
function stepLines(s: ChaosReport["steps"] | undefined): string[] {
  if (!s) return [];
  const because = Object.entries(s.reExecutedBecause)
    .map(([outcome, n]) => `${outcome} ${n}`)
    .join(", ");
  const w = s.waits;
  return [
    `Durable jobs (invariants 17-20): ${s.durableJobs} jobs; ${s.stepsRecorded} plain steps recorded, their bodies run ${s.runs} times: ` +
      `${s.reExecutions.length} runs not recorded, so run again (${because || "none"}), each by an attempt that ended without recording; ` +
      `runs after their record by a stale attempt frozen until then (the only ones allowed): ${s.frozenAfterRecord}; ${s.replays} later attempts found a step recorded and replayed it. ` +
      `${s.transactionalSteps} transactional steps, one row each. Suspended ${s.suspensions.sleeps} times in a sleep and ${s.suspensions.waits} in a wait; ` +
      `wake to running again p50 ${ms(s.suspensions.wakeToStart.p50)} / p99 ${ms(s.suspensions.wakeToStart.p99)} / max ${ms(s.suspensions.wakeToStart.max)}. ` +
      `Waits: ${w.received} received (${w.eventBeforeWait} events sent before the wait began), ${w.timedOut} timed out (${w.neverSent} events never sent, the rest sent after the timeout).`,
    "",
    ...(s.reExecutions.length
      ? [
          "| job | step | attempt | worker | why it ran again |",
          "|---|---|---|---|---|",
          ...s.reExecutions.slice(0, 30).map((x) => `| ${x.job} | ${x.step} | ${x.attempt} | ${x.worker} | ${x.because.replace(/\|/g, "\\|")} |`),
          ...(s.reExecutions.length > 30 ? [`| … | | | | ${s.reExecutions.length - 30} more in the JSON report |`] : []),
          "",
        ]
      : []),
  ];
}

function fmtRate(v: number | null): string {
  return v === null ? "–" : `${v.toFixed(1)} jobs/s`;
}

export function writeReport(outDir: string, r: ChaosReport): { json: string; markdown: string } {
  fs.mkdirSync(outDir, { recursive: true });
  const stamp = r.startedAt.replace(/[:.]/g, "-");
  const json = path.join(outDir, `chaos-${stamp}.json`);
  const markdown = path.join(outDir, `chaos-${stamp}.md`);
  fs.writeFileSync(json, JSON.stringify(r, null, 2));
  fs.writeFileSync(markdown, toMarkdown(r));
  return { json, markdown };
}
