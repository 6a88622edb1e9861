/**
 * Split execution: no attempt of a job may start while another attempt of that job is still
 * running with its signal not yet fired. Read from the attempt timelines the worker processes
 * logged (start, abort, settled: process-log.ts), the processes' ends (supervisor.ts) and the
 * fault log; every stamp is the same machine's wall clock.
 *
 * An attempt is *running, unsignalled* from its start until the first of: its signal fired,
 * its handler settled, its process ended (a killed process runs nothing more, whatever it
 * last logged). An overlap is an attempt starting at t while another attempt of its job is
 * running, unsignalled at t:
 *   - a newer attempt starting while an older one runs: the older one's worker should have
 *     aborted it before its job could be recovered (unless it could not: see below);
 *   - an older attempt starting while a newer one runs (a stale start): the worker started a
 *     job it no longer held.
 * Classified as:
 *   - killed (unavoidable): the older attempt never logged its end because its process had
 *     ended before t; it was not running, so this is no overlap in fact, only counted;
 *   - frozen (unavoidable): the older attempt's process was stopped (SIGSTOP, the zombie
 *     fault) at t, and stopped running the attempt at once on waking (WAKE_MS): while
 *     stopped it could observe nothing;
 *   - avoidable: everything else. One breaks the run.
 * The only clock allowance is the millisecond the stamps are floored to (below).
 */
import type { FaultRecord } from "./faults.js";
import type { LogLine } from "./process-log.js";
import type { ProcessEnd } from "./supervisor.js";

/**
 * How soon after SIGCONT a woken worker must have stopped running the attempts it lost while
 * stopped, for the freeze to explain the overlap. A stopped process wakes in its event loop's
 * poll phase: it first handles the I/O that arrived meanwhile, then runs its overdue timers,
 * the lease check (every lease/20) among them, which fires the signals. That, plus being
 * scheduled again on a busy machine, took 1-60 ms in short runs on 2 shared cores
 * (docs/chaos.md, "Overlaps"), and 136 and 173 ms with the load average at 15 to 20 (other
 * work sharing the 2 cores); 250 ms allows for that with some margin. A worker still running a
 * lost attempt later than that after waking could have stopped it: avoidable.
 */
export const WAKE_MS = 250;

export type OverlapCause = "avoidable" | "frozen" | "killed";

export interface Overlap {
  job: string;
  cause: OverlapCause;
  /** "newer": a newer attempt started while an older one ran; "stale": an older attempt started while a newer one ran. */
  order: "newer" | "stale";
  /** The attempt that started, and when (ms since epoch). */
  started: { attempt: number; w: string; t: number };
  /** The attempt already running, since when, and when it stopped running unsignalled (null: never seen to). */
  running: { attempt: number; w: string; t: number; until: number | null; by: string };
  /** Faults on the older attempt's worker (or on every worker) between the first start and the overlap. */
  faults: { kind: string; text: string }[];
}

export interface OverlapResult {
  overlaps: Overlap[];
  counts: { avoidable: number; frozen: number; killed: number };
  /** What the timelines held: attempts started, signals fired, handlers settled. */
  timeline: { started: number; aborted: number; settled: number };
}

interface Timeline {
  job: string;
  attempt: number;
  w: string;
  start: number;
  abort?: { t: number; reason: string };
  settled?: number;
  /** When its process ended, if it did. */
  died?: number;
}

/** Faults that touch every worker at once. */
const GLOBAL_FAULTS = new Set(["pg_restart", "terminate_storm", "nats_restart"]);

/** One worker process: its id in the logs, its pid, when it said hello and when it ended. */
interface Proc {
  pid: number;
  born: number;
  died?: number;
}

export function findOverlaps(logs: LogLine[], faults: FaultRecord[], ends: ProcessEnd[]): OverlapResult {
  // A pid may be reused by a later process: each process's end is the first end of its pid after its hello.
  const procs = new Map<string, Proc>();
  for (const l of logs) {
    if (l.ev !== "hello") continue;
    const died = ends.filter((e) => e.pid === l.pid && e.at >= l.t).reduce((m, e) => Math.min(m, e.at), Infinity);
    procs.set(l.w, { pid: l.pid, born: l.t, died: Number.isFinite(died) ? died : undefined });
  }
  /** The fault hit this worker process (it names the pid, and struck while that process lived). */
  const hit = (f: FaultRecord, w: string) => {
    const p = procs.get(w);
    return !!p && f.pid === p.pid && f.at >= p.born && f.at <= (p.died ?? Infinity);
  };

  const attempts = new Map<string, Timeline>();
  const key = (job: string, attempt: number) => `${job}/${attempt}`;
  const timeline = { started: 0, aborted: 0, settled: 0 };
  for (const l of logs) {
    if (l.ev === "start") {
      timeline.started++;
      attempts.set(key(l.job, l.attempt), { job: l.job, attempt: l.attempt, w: l.w, start: l.t, died: procs.get(l.w)?.died });
    }
  }
  for (const l of logs) {
    if (l.ev !== "abort" && l.ev !== "settled") continue;
    const a = attempts.get(key(l.job, l.attempt));
    if (!a) continue;
    if (l.ev === "abort") {
      timeline.aborted++;
      if (!a.abort || l.t < a.abort.t) a.abort = { t: l.t, reason: l.reason };
    } else {
      timeline.settled++;
      a.settled = Math.min(a.settled ?? Infinity, l.t);
    }
  }

  const byJob = new Map<string, Timeline[]>();
  for (const a of attempts.values()) byJob.set(a.job, [...(byJob.get(a.job) ?? []), a]);
  const overlaps: Overlap[] = [];
  for (const list of byJob.values()) {
    list.sort((x, y) => x.start - y.start || x.attempt - y.attempt);
    for (const [i, later] of list.entries()) {
      const t = later.start;
      for (const earlier of list.slice(0, i)) {
        // Stamps are floored to the ms: an end stamped in the same ms as the start cannot be
        // ordered, and is not counted as an overlap.
        const untilAlive = Math.min(earlier.abort?.t ?? Infinity, earlier.settled ?? Infinity);
        if (untilAlive <= t) continue;
        const until = Math.min(untilAlive, earlier.died ?? Infinity);
        const order = later.attempt > earlier.attempt ? "newer" : "stale";
        const older = order === "newer" ? earlier : later;
        overlaps.push({
          job: later.job,
          cause: until <= t ? "killed" : order === "newer" && frozenThrough(earlier, t, until, faults, hit) ? "frozen" : "avoidable",
          order,
          started: { attempt: later.attempt, w: later.w, t },
          running: {
            attempt: earlier.attempt,
            w: earlier.w,
            t: earlier.start,
            until: Number.isFinite(until) ? until : null,
            by: stopKind(earlier, until),
          },
          faults: faultsAround(older.w, earlier.start, t, faults, hit),
        });
      }
    }
  }
  const counts = { avoidable: 0, frozen: 0, killed: 0 };
  for (const o of overlaps) counts[o.cause]++;
  return { overlaps, counts, timeline };
}

/** The running attempt's process was stopped at t and stopped running the attempt as soon as it woke. */
function frozenThrough(a: Timeline, t: number, until: number, faults: FaultRecord[], hit: (f: FaultRecord, w: string) => boolean): boolean {
  return faults.some((f) => f.kind === "zombie" && !f.skipped && hit(f, a.w) && f.at <= t && f.endedAt !== undefined && until <= f.endedAt + WAKE_MS);
}

function stopKind(a: Timeline, until: number): string {
  if (!Number.isFinite(until)) return "never";
  if (a.abort?.t === until) return `signal (${a.abort.reason})`;
  if (a.settled === until) return "settled";
  return "process ended";
}

/** Faults on this worker's process, or on all workers, from `from` to `to`: what an avoidable overlap happened in. */
function faultsAround(w: string, from: number, to: number, faults: FaultRecord[], hit: (f: FaultRecord, w: string) => boolean): Overlap["faults"] {
  return faults
    .filter((f) => !f.skipped && (GLOBAL_FAULTS.has(f.kind) || hit(f, w)))
    .filter((f) => f.at <= to && (f.endedAt ?? f.at + (f.durationMs ?? 0)) >= from)
    .map((f) => ({ kind: f.kind, text: `${f.kind}${f.kind === "partition" ? ` (${f.detail})` : ""} at ${signed(f.at - from)} ms` }));
}

const signed = (n: number) => (n < 0 ? `${n}` : `+${n}`);
