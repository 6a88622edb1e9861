/**
 * An attempt's time limits, its progress timeout and maximum run time. What the worker does
 * at a limit is its own (Worker.endAtLimit).
 *
 * An attempt under a maximum run time only (every job by default: 15 minutes) waits in a list
 * of the attempts with the same limit, one timer per list: they started in order, so each list
 * is in deadline order and only its head needs a timer. A timer and its closure per job were
 * ~3 % of a no-op worker's CPU, and their garbage more. An attempt with a progress timeout
 * has a timer of its own, armed for the earlier deadline and re-armed when it fires early
 * (progress moved the deadline).
 */
import type { InFlight } from "./heartbeat.js";

export type LimitOutcome = "stalled" | "timed_out";

type Reached = (entry: InFlight, outcome: LimitOutcome) => void;

/** A list's dead entries (ended, not yet at its head) are dropped once they pass this many. */
const MIN_COMPACT_AT = 1_024;

/** The attempts running under one maximum run time (and no progress timeout), in start order. */
export class MaxRunList {
  private entries: InFlight[] = [];
  private head = 0;
  /** Entries still armed here: at 0 the timer goes, so a stopped worker leaves none behind. */
  private armed = 0;
  private compactAt = MIN_COMPACT_AT;
  private timer?: NodeJS.Timeout;
  private readonly fire = () => this.expire();

  constructor(
    private readonly maxRunMs: number,
    private readonly reached: Reached,
  ) {}

  add(entry: InFlight): void {
    entry.limitList = this;
    this.armed++;
    // Ended attempts at the head go now: jobs mostly end in the order they started.
    while (this.head < this.entries.length && this.entries[this.head]!.limitList !== this) this.head++;
    this.entries.push(entry);
    if (this.entries.length - this.head > this.compactAt) this.compact();
    if (!this.timer) this.schedule(performance.now());
  }

  remove(entry: InFlight): void {
    entry.limitList = undefined;
    if (--this.armed > 0) return;
    clearTimeout(this.timer);
    this.timer = undefined;
    this.entries = [];
    this.head = 0;
  }

  private expire(): void {
    this.timer = undefined;
    const now = performance.now();
    while (this.head < this.entries.length) {
      const e = this.entries[this.head]!;
      if (e.limitList !== this || e.phase !== "running") {
        this.head++;
        continue;
      }
      if (e.startedAt! + this.maxRunMs > now) break;
      this.head++;
      this.remove(e);
      this.reached(e, "timed_out");
    }
    if (this.head > MIN_COMPACT_AT && this.head * 2 > this.entries.length) this.compact();
    if (this.armed > 0 && !this.timer) this.schedule(now);
  }

  /** Arms the timer for the first armed entry's deadline. */
  private schedule(now: number): void {
    while (this.head < this.entries.length && this.entries[this.head]!.limitList !== this) this.head++;
    const first = this.entries[this.head];
    if (first) this.timer = setTimeout(this.fire, Math.max(0, first.startedAt! + this.maxRunMs - now) + 1);
  }

  /** Drops ended entries; the next compaction waits until the list doubles, so each costs O(1) an entry. */
  private compact(): void {
    this.entries = this.entries.slice(this.head).filter((e) => e.limitList === this);
    this.head = 0;
    this.compactAt = Math.max(MIN_COMPACT_AT, 2 * this.entries.length);
  }
}

/** The limit lists of one worker, by maximum run time. */
export class LimitTimers {
  private readonly lists = new Map<number, MaxRunList>();

  constructor(private readonly reached: Reached) {}

  /** Arms `entry`'s limits (it has just started running); `reached` is called once it is past one. */
  arm(entry: InFlight): void {
    if (entry.progressTimeoutMs === null && entry.maxRunMs === null) return;
    if (entry.progressTimeoutMs === null) {
      const ms = entry.maxRunMs!;
      let list = this.lists.get(ms);
      if (!list) this.lists.set(ms, (list = new MaxRunList(ms, this.reached)));
      list.add(entry);
      return;
    }
    const reached = this.reached;
    const check = () => {
      if (entry.phase !== "running") return;
      const now = performance.now();
      const runLeft = entry.maxRunMs === null ? Infinity : entry.startedAt! + entry.maxRunMs - now;
      const progressLeft = entry.lastProgressAt! + entry.progressTimeoutMs! - now;
      if (runLeft <= 0) return reached(entry, "timed_out");
      if (progressLeft <= 0) return reached(entry, "stalled");
      entry.limitTimer = setTimeout(check, Math.min(runLeft, progressLeft) + 1);
    };
    check();
  }
}

/** The attempt's limits no longer apply (it ended, or its job was given back or finished). */
export function disarmLimits(entry: InFlight): void {
  clearTimeout(entry.limitTimer);
  entry.limitList?.remove(entry);
}

/** The limit passed, in words: "no progress for 500 ms", "ran longer than 2000 ms". */
export function limitPassed(entry: InFlight, outcome: LimitOutcome): string {
  return outcome === "stalled" ? `no progress for ${entry.progressTimeoutMs} ms` : `ran longer than ${entry.maxRunMs} ms`;
}
