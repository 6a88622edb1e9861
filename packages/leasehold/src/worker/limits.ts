/**
 * An attempt's time limits, its progress timeout and maximum run time: one timer per attempt
 * with limits, armed for the earlier deadline and re-armed when it fires early (progress moved
 * the deadline). What the worker does at a limit is its own (Worker.endAtLimit).
 */
import type { InFlight } from "./heartbeat.js";

export type LimitOutcome = "stalled" | "timed_out";

/** Arms `entry`'s limit timer; `reached` is called once a running attempt is past one. */
export function armLimits(entry: InFlight, reached: (entry: InFlight, outcome: LimitOutcome) => void): void {
  if (entry.progressTimeoutMs === null && entry.maxRunMs === null) return;
  const check = () => {
    if (entry.phase !== "running") return;
    const now = performance.now();
    const runLeft = entry.maxRunMs === null ? Infinity : entry.startedAt! + entry.maxRunMs - now;
    const progressLeft = entry.progressTimeoutMs === null ? Infinity : entry.lastProgressAt! + entry.progressTimeoutMs - now;
    if (runLeft <= 0) return reached(entry, "timed_out");
    if (progressLeft <= 0) return reached(entry, "stalled");
    entry.limitTimer = setTimeout(check, Math.min(runLeft, progressLeft) + 1);
  };
  check();
}

/** The limit passed, in words: "no progress for 500 ms", "ran longer than 2000 ms". */
export function limitPassed(entry: InFlight, outcome: LimitOutcome): string {
  return outcome === "stalled" ? `no progress for ${entry.progressTimeoutMs} ms` : `ran longer than ${entry.maxRunMs} ms`;
}
