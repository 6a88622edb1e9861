/**
 * `leasehold doctor`: reads what the fleet recorded (its processes, their heartbeat delays,
 * leases nobody reaped, states that should not exist, jobs running far longer than their task
 * usually takes) and says what is wrong and what to change, with a lease length taken from
 * evidence rather than guessed.
 */
import type { FleetHealth } from "../store/health.js";
import type { RunningLongJob } from "../store/running-long.js";
import { BEAT_DELAY_BUCKETS_MS } from "../worker/heartbeat.js";
import { describeGap, type HandlerGap } from "./handler-gaps.js";

export interface Finding {
  level: "ok" | "warn" | "error";
  message: string;
}

export interface LeaseAdvice {
  /** Beats recorded, fleet-wide. */
  beats: number;
  /** The 99th percentile beat delay (ms), as the upper bound of its histogram bucket; null past the last bound. */
  p99DelayMs: number | null;
  /** Per live worker: its lease and the lease its beat interval and the fleet's delays call for. */
  workers: { id: string; queues: string[]; leaseMs: number; heartbeatMs: number; recommendedMs: number }[];
}

export interface Diagnosis {
  findings: Finding[];
  lease: LeaseAdvice;
  /** Running jobs past twice their task's usual (p99) run time, furthest past first. */
  runningLong: RunningLongJob[];
}

export interface OrphanCounts {
  /** Waiting jobs no live worker can run (handler-gaps.ts), at once: not after a delay. */
  withoutHandler: HandlerGap[];
  missingAudit: number;
  overBudget: number;
}

/**
 * A lease must outlast the beat interval plus the worst delay a beat meets, with room for
 * one more: max(3 × heartbeat, heartbeat + p99 + max(p99, 1 s)).
 */
export function recommendLease(heartbeatMs: number, p99DelayMs: number): number {
  const ms = Math.max(3 * heartbeatMs, heartbeatMs + p99DelayMs + Math.max(p99DelayMs, 1_000));
  return Math.ceil(ms / 1_000) * 1_000;
}

/** The delay under which 99% of the recorded beats fell (a bucket's upper bound). */
export function p99Delay(histogram: number[]): { beats: number; p99: number | null } {
  const beats = histogram.reduce((a, b) => a + b, 0);
  if (beats === 0) return { beats, p99: 0 };
  let seen = 0;
  for (let i = 0; i < histogram.length; i++) {
    seen += histogram[i]!;
    if (seen >= 0.99 * beats) return { beats, p99: BEAT_DELAY_BUCKETS_MS[i] ?? null };
  }
  return { beats, p99: null };
}

/** Running-long jobs named one by one; past this, counted. */
const LISTED_RUNNING_LONG = 10;

export function diagnose(health: FleetHealth, orphans: OrphanCounts, runningLong: RunningLongJob[] = []): Diagnosis {
  const findings: Finding[] = [];
  const live = health.processes.filter((p) => p.live);
  const watchdogs = live.filter((p) => p.kind === "watchdog");
  const workers = live.filter((p) => p.kind === "worker");
  findings.push(
    watchdogs.length > 0
      ? { level: "ok", message: `${watchdogs.length} watchdog(s) running` }
      : {
          level: health.expiredLeases > 0 ? "error" : "warn",
          message:
            "no watchdog is running: expired leases and dead workers' jobs are not recovered " +
            "(run `leasehold watchdog`, or workers and `serve` with their watchdog on)",
        },
  );
  if (health.expiredLeases > 0) {
    const age = health.oldestExpiredSeconds ?? 0;
    findings.push({
      level: watchdogs.length === 0 || age > 30 ? "error" : "warn",
      message: `${health.expiredLeases} lease(s) ran out and are not reaped yet (the oldest ${age.toFixed(1)} s ago)`,
    });
  }
  const lost = health.processes.filter((p) => p.kind === "worker" && !p.live && p.secondsSinceSeen < 3600);
  if (lost.length > 0)
    findings.push({ level: "warn", message: `${lost.length} worker(s) died or stopped in the last hour: ${lost.map((p) => p.id).join(", ")}` });
  findings.push({ level: workers.length > 0 ? "ok" : "warn", message: `${workers.length} worker(s) running` });
  // Ready jobs nobody runs are an error (they wait forever); jobs due later only a warning
  // (a worker may yet be deployed before they are due).
  for (const g of orphans.withoutHandler) findings.push({ level: g.waiting > 0 ? "error" : "warn", message: describeGap(g) });
  if (orphans.missingAudit > 0)
    findings.push({ level: "error", message: `${orphans.missingAudit} finished job(s) have fewer audit rows than attempts` });
  if (orphans.overBudget > 0)
    findings.push({
      level: "warn",
      message: `${orphans.overBudget} waiting job(s) have spent their retry budget (the watchdog moves them to the dead letter)`,
    });
  for (const j of runningLong.slice(0, LISTED_RUNNING_LONG)) {
    findings.push({
      level: "warn",
      message:
        `job ${j.id} (task ${j.task}, queue ${j.queue}) has run ${humanMs(j.runningMs)}, longer than its task usually takes ` +
        `(p99 ${humanMs(j.usualP99Ms)} over its last ${j.samples} successes): stuck? \`leasehold jobs show ${j.id}\``,
    });
  }
  if (runningLong.length > LISTED_RUNNING_LONG) {
    findings.push({
      level: "warn",
      message: `and ${runningLong.length - LISTED_RUNNING_LONG} more job(s) running longer than their task usually takes`,
    });
  }

  const histogram = new Array<number>(BEAT_DELAY_BUCKETS_MS.length + 1).fill(0);
  for (const p of health.processes) p.beatDelays?.forEach((n, i) => (histogram[i] = (histogram[i] ?? 0) + n));
  const { beats, p99 } = p99Delay(histogram);
  const advice: LeaseAdvice = { beats, p99DelayMs: p99, workers: [] };
  for (const w of workers) {
    if (w.leaseMs === null || w.heartbeatMs === null) continue;
    const recommendedMs = recommendLease(w.heartbeatMs, p99 ?? 2 * BEAT_DELAY_BUCKETS_MS.at(-1)!);
    advice.workers.push({ id: w.id, queues: w.queues, leaseMs: w.leaseMs, heartbeatMs: w.heartbeatMs, recommendedMs });
    if (w.leaseMs < recommendedMs) {
      findings.push({
        level: "warn",
        message:
          `worker ${w.id} (queues ${w.queues.join(", ")}) has a ${w.leaseMs} ms lease, shorter than the ${recommendedMs} ms its ` +
          `${w.heartbeatMs} ms beat and the fleet's beat delays (p99 ${p99 === null ? "over 30 s" : `${p99} ms`}) call for`,
      });
    }
  }
  return { findings, lease: advice, runningLong };
}

/** 850 ms, 12.3 s, 4m 05s, 2h 03m. */
export function humanMs(ms: number): string {
  if (ms < 1_000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1_000).toFixed(1)} s`;
  const pad = (n: number) => String(n).padStart(2, "0");
  const s = Math.floor(ms / 1_000);
  if (s < 3_600) return `${Math.floor(s / 60)}m ${pad(s % 60)}s`;
  return `${Math.floor(s / 3_600)}h ${pad(Math.floor(s / 60) % 60)}m`;
}
