/**
 * Flow control under faults (invariants 10-12 in docs/chaos.md), read from the audit trail on
 * the database's clock (microseconds):
 *
 * 10. **No limit exceeded.** A limit counts leases, not handlers: claim_flow() counts the jobs
 *     in state 'running' (buffered ones included) and grants at most the limit. So a slot is
 *     held from the attempt's claim (started_at) to its end as recorded (ended_at): when the
 *     database freed it — a report, a release, or a watchdog recovering the job. At every
 *     moment, the attempts of a queue (of a key) holding their slot are at most its
 *     concurrency (key concurrency); an attempt ending at the very instant another starts has
 *     freed its slot. A frozen (SIGSTOP) or cut-off worker keeps its slot while its lease
 *     holds, and loses it when the watchdog recovers the job; a killed worker's slot is held
 *     until crash detection recovers it. A frozen worker's handler may run on after that
 *     (overlaps.ts counts such executions, invariant 9): that is no excess, the slot was
 *     freed and the old attempt is fenced. Only the recorded ends count here, so an attempt
 *     that "ended late by recovery" holds its slot until that recovery, and the next claim
 *     in its place starts after it.
 *     Exact, not a tolerance: claim_flow() serialises a queue's claims on its flow_state row
 *     and stamps its attempts (and rate logs) with the time taken after its counts, so
 *     an end the claim did not count had committed before, and its recorded end (the ending
 *     statement's now(), before its commit) precedes the claim's start. An end the claim did
 *     count may be recorded before the claim's start too: that only shows a slot free that the
 *     claim left unused, never an excess.
 *     Rates: a claim counts the starts in the window (t - window, t] before it grants more,
 *     and its attempts' started_at is that t; so for every start t, at most `limit` attempts
 *     started in (t - window, t].
 * 11. **A paused queue starts nothing.** The pause fault records, on the database's clock, its
 *     statement's now() (paused_at), a time after its commit (confirmed) and a time before the
 *     resume's (resume from). No attempt of the queue starts in (confirmed, resume from).
 *     A claim whose snapshot preceded the pause's commit may still start in (paused_at,
 *     confirmed]: counted as raced, not an error.
 * 12. **A crashed worker's slot is back within crash detection.** For each flow_kill fault, the
 *     killed worker's attempt holding the probe queue's only slot ends within SLOT_BACK_MS of
 *     the kill, and the next attempt in the queue (the job that only that slot kept waiting)
 *     starts within NEXT_START_MS. Not measured when a database restart's start-up grace (no
 *     worker is called lost in it) or a watchdog kill comes near the kill; the fault avoids both.
 */
import type pg from "pg";
import { DEFAULT_LIVENESS_INTERVAL_MS, DEFAULT_LOST_WORKER_GRACE_MS, STARTUP_GRACE_MS } from "../packages/leasehold/src/maintenance/watchdog.js";
import { WORKER_POLL_MS } from "./config.js";
import type { FaultRecord } from "./faults.js";
import { LIMITED_QUEUES, type FlowQueue } from "./flow-queues.js";
import type { Violation } from "./invariants.js";

/** One attempt of a limited queue's job, times in µs since the epoch (database clock). */
export interface FlowAttempt {
  job: string;
  attempt: number;
  worker: string;
  outcome: string | null;
  queue: string;
  key: string | null;
  started: number;
  /** Infinity: still holding its lease (a run that did not drain). */
  ended: number;
}

/**
 * Crash detection at its defaults, as the watchdog accounts for it (maintenance/watchdog.ts):
 * a dead worker's lock is seen gone within three liveness slots (two, three while a dead
 * watchdog is still counted), and its jobs are recovered on the first tick after the grace.
 */
export const CRASH_DETECTION_MS = 3 * DEFAULT_LIVENESS_INTERVAL_MS + DEFAULT_LOST_WORKER_GRACE_MS + DEFAULT_LIVENESS_INTERVAL_MS;
/** Statements on 2 shared cores under faults take their time: the slack invariants.ts allows an end to commit. */
const LOADED_MACHINE_MS = 1_000;
/** From the kill to the slot's end in the audit trail. */
export const SLOT_BACK_MS = CRASH_DETECTION_MS + LOADED_MACHINE_MS;
/** From the kill to the next start in the queue: plus a worker's next claim (a claim held back by the limit asks again sooner). */
export const NEXT_START_MS = SLOT_BACK_MS + WORKER_POLL_MS;
/** Faults that cut every worker's connections at once. */
const EVERY_CONNECTION = new Set(["terminate_storm", "pg_restart"]);
/** Faults that take one worker away from claiming for a while. */
const WORKER_DOWN = new Set(["kill", "zombie", "partition", "reset", "flow_kill"]);

const MAX_LISTED = 5;
const us = (col: string) => `(extract(epoch FROM ${col}) * 1000000)::bigint::text`;

/**
 * Every attempt of the given queues' jobs (the limited ones, and the paused ones), finished or
 * still holding a lease. The key comes from the payload: a finished job keeps its payload but
 * not its flow_key.
 */
export async function loadFlowAttempts(admin: pg.Pool, queues: string[]): Promise<FlowAttempt[]> {
  const { rows } = await admin.query<{
    job: string;
    attempt: number;
    worker: string;
    outcome: string | null;
    queue: string;
    key: string | null;
    started: string;
    ended: string | null;
  }>(
    `WITH limited AS (
       SELECT id, queue, payload->>'key' AS key FROM audit_finished WHERE queue = ANY($1)
       UNION ALL
       SELECT id, queue, coalesce(flow_key, payload->>'key') FROM jobs WHERE queue = ANY($1)
     )
     SELECT a.job_id::text AS job, a.attempt, a.worker_id AS worker, a.outcome, l.queue, l.key,
            ${us("a.started_at")} AS started, ${us("a.ended_at")} AS ended
       FROM audit_attempts AS a JOIN limited AS l ON l.id = a.job_id
     UNION ALL
     SELECT id::text, attempt, locked_by, NULL, queue, coalesce(flow_key, payload->>'key'), ${us("started_at")}, NULL
       FROM jobs WHERE state = 'running' AND queue = ANY($1)`,
    [queues],
  );
  return rows.map((r) => ({ ...r, started: Number(r.started), ended: r.ended === null ? Infinity : Number(r.ended) }));
}

/** The most attempts holding a slot at once, and the first instants past `limit` with who held them. */
export function peakHeld(
  attempts: FlowAttempt[],
  limit: number,
): { peak: number; over: { at: number; holding: FlowAttempt[] }[]; overCount: number } {
  const starts = attempts.map((a) => a.started).sort((x, y) => x - y);
  const ends = attempts.map((a) => a.ended).sort((x, y) => x - y);
  let peak = 0;
  let overCount = 0;
  const over: { at: number; holding: FlowAttempt[] }[] = [];
  let e = 0;
  for (let s = 0; s < starts.length; s++) {
    const t = starts[s]!;
    if (starts[s + 1] === t) continue; // one claim's attempts start together: count after the last
    while (e < ends.length && ends[e]! <= t) e++; // ended at t or before: freed
    const held = s + 1 - e;
    peak = Math.max(peak, held);
    if (held > limit) {
      overCount++;
      if (over.length < MAX_LISTED) over.push({ at: t, holding: attempts.filter((a) => a.started <= t && a.ended > t) });
    }
  }
  return { peak, over, overCount };
}

/** The most starts in any window (t - window, t], and the first windows past `limit`. */
export function peakStarts(attempts: FlowAttempt[], windowMs: number, limit: number): { peak: number; over: number[]; overCount: number } {
  const starts = attempts.map((a) => a.started).sort((x, y) => x - y);
  const windowUs = windowMs * 1000;
  let peak = 0;
  let overCount = 0;
  const over: number[] = [];
  let first = 0;
  for (let s = 0; s < starts.length; s++) {
    const t = starts[s]!;
    if (starts[s + 1] === t) continue;
    while (starts[first]! <= t - windowUs) first++;
    const n = s + 1 - first;
    peak = Math.max(peak, n);
    if (n > limit) {
      overCount++;
      if (over.length < MAX_LISTED) over.push(t);
    }
  }
  return { peak, over, overCount };
}

export interface FlowResult {
  /** Each limit: the most seen at once (or per window) against it; the peak reaching the limit shows it bound. */
  limits: { queue: string; limit: string; attempts: number; peak: number; max: number }[];
  pauses: { queue: string; durationMs: number; startsInside: number; raced: number; waitingAtResume: number | null }[];
  /** flow_kill faults: ms from the kill to the slot's end and to the next start in the probe queue. */
  probes: { n: number; slotBackMs: number[]; nextStartMs: number[]; notMeasured: string[] };
}

const iso = (t: number) => new Date(t / 1000).toISOString();
const who = (a: FlowAttempt) =>
  `job ${a.job} attempt ${a.attempt} (${a.worker}, ${iso(a.started)} to ${Number.isFinite(a.ended) ? iso(a.ended) : "still held"})`;

export function checkFlow(
  attempts: FlowAttempt[],
  faults: FaultRecord[],
  queues: readonly FlowQueue[] = LIMITED_QUEUES,
): { violations: Violation[]; result: FlowResult } {
  const violations: Violation[] = [];
  const result: FlowResult = { limits: [], pauses: [], probes: { n: 0, slotBackMs: [], nextStartMs: [], notMeasured: [] } };
  const inQueue = (q: string) => attempts.filter((a) => a.queue === q);

  // 10. Limits, per queue and per key.
  for (const q of queues) {
    const mine = inQueue(q.name);
    const { concurrency, keyConcurrency, rate } = q.limits;
    if (concurrency) {
      const p = peakHeld(mine, concurrency);
      result.limits.push({ queue: q.name, limit: `concurrency ${concurrency}`, attempts: mine.length, peak: p.peak, max: concurrency });
      for (const o of p.over) {
        violations.push({
          invariant: "queue concurrency within its limit",
          detail: `${q.name}: ${o.holding.length} attempts held slots at ${iso(o.at)} (limit ${concurrency}): ${o.holding.map(who).join("; ")}`,
        });
      }
      if (p.overCount > p.over.length)
        violations.push({ invariant: "queue concurrency within its limit", detail: `${q.name}: ${p.overCount} instants over the limit in all` });
    }
    if (keyConcurrency) {
      const byKey = new Map<string, FlowAttempt[]>();
      for (const a of mine) if (a.key !== null) byKey.set(a.key, [...(byKey.get(a.key) ?? []), a]);
      let peak = 0;
      for (const [key, list] of byKey) {
        const p = peakHeld(list, keyConcurrency);
        peak = Math.max(peak, p.peak);
        for (const o of p.over) {
          violations.push({
            invariant: "key concurrency within its limit",
            detail: `${q.name} key ${key}: ${o.holding.length} attempts held slots at ${iso(o.at)} (limit ${keyConcurrency}): ${o.holding.map(who).join("; ")}`,
          });
        }
        if (p.overCount > p.over.length)
          violations.push({
            invariant: "key concurrency within its limit",
            detail: `${q.name} key ${key}: ${p.overCount} instants over the limit in all`,
          });
      }
      result.limits.push({
        queue: q.name,
        limit: `key concurrency ${keyConcurrency} (${byKey.size} keys)`,
        attempts: mine.length,
        peak,
        max: keyConcurrency,
      });
    }
    if (rate) {
      const p = peakStarts(mine, rate.windowMs, rate.limit);
      result.limits.push({
        queue: q.name,
        limit: `rate ${rate.limit} per ${rate.windowMs} ms`,
        attempts: mine.length,
        peak: p.peak,
        max: rate.limit,
      });
      for (const t of p.over) {
        const inWindow = mine.filter((a) => a.started > t - rate.windowMs * 1000 && a.started <= t);
        violations.push({
          invariant: "starts within the queue's rate",
          detail: `${q.name}: ${inWindow.length} starts in the ${rate.windowMs} ms up to ${iso(t)} (limit ${rate.limit}): ${inWindow.map(who).join("; ")}`,
        });
      }
      if (p.overCount > p.over.length)
        violations.push({ invariant: "starts within the queue's rate", detail: `${q.name}: ${p.overCount} windows over the rate in all` });
    }
  }

  // 11. Pauses.
  for (const f of faults) {
    const w = f.pause;
    if (f.kind !== "pause" || f.skipped || !w) continue;
    const until = w.resumeFromUs ?? Infinity;
    const mine = attempts.filter((a) => a.queue === w.queue);
    const inside = mine.filter((a) => a.started > w.confirmedUs && a.started < until);
    const raced = mine.filter((a) => a.started > w.pausedAtUs && a.started <= w.confirmedUs).length;
    result.pauses.push({
      queue: w.queue,
      durationMs: f.durationMs ?? 0,
      startsInside: inside.length,
      raced,
      waitingAtResume: w.waitingAtResume ?? null,
    });
    for (const a of inside.slice(0, MAX_LISTED)) {
      violations.push({
        invariant: "a paused queue starts nothing",
        job: a.job,
        detail: `${who(a)} started while ${w.queue} was paused (from ${iso(w.confirmedUs)}${Number.isFinite(until) ? ` to ${iso(until)}` : ", never resumed"})`,
      });
    }
    if (inside.length > MAX_LISTED)
      violations.push({ invariant: "a paused queue starts nothing", detail: `${inside.length} attempts started during one pause of ${w.queue}` });
  }

  // 12. A killed worker's slot.
  const slotFaults = faults.filter((f) => f.kind === "flow_kill" && !f.skipped && f.probe);
  for (const f of slotFaults) {
    const p = f.probe!;
    result.probes.n++;
    const blocker = attempts.find((a) => a.job === p.blocker.job && a.attempt === p.blocker.attempt);
    if (!blocker) {
      violations.push({
        invariant: "a crashed worker's slot comes back in time",
        job: p.blocker.job,
        detail: `attempt ${p.blocker.attempt} has no audit row`,
      });
      continue;
    }
    if (blocker.ended / 1000 < f.at) {
      result.probes.notMeasured.push(`${p.blocker.job}: ended ${blocker.outcome} before the kill`);
      continue;
    }
    const slotBack = blocker.ended / 1000 - f.at;
    const next = inQueue(p.queue)
      .filter((a) => a.started > blocker.started)
      .reduce((m, a) => Math.min(m, a.started), Infinity);
    const nextStart = next / 1000 - f.at;
    // Crash detection waits for killed watchdogs to come back, and calls no one lost in a
    // restarted database's start-up grace: such a fault before what was measured excuses it.
    const measuredBy = f.at + Math.min(NEXT_START_MS, Math.max(slotBack, nextStart));
    const restarted = faults.find(
      (g) =>
        (g.kind === "pg_restart" || g.kind === "watchdog_kill") &&
        !g.skipped &&
        g.at < measuredBy &&
        f.at - (g.at + (g.durationMs ?? 0)) < STARTUP_GRACE_MS,
    );
    if (restarted) {
      result.probes.notMeasured.push(`${p.blocker.job}: ${restarted.kind} ${Math.round(restarted.at - f.at)} ms from the kill`);
      continue;
    }
    result.probes.slotBackMs.push(slotBack);
    // The next start needs a worker that can claim: faults that took every connection, or the
    // other workers, before it measure those faults, not the freed slot.
    const inTheWay = faults.filter(
      (g) =>
        !g.skipped &&
        g.at >= f.at &&
        g.at < f.at + Math.min(nextStart, NEXT_START_MS) &&
        (EVERY_CONNECTION.has(g.kind) || (WORKER_DOWN.has(g.kind) && g.target !== f.target)),
    );
    const othersDown = new Set(inTheWay.filter((g) => WORKER_DOWN.has(g.kind)).map((g) => g.target));
    const startMeasured = !(inTheWay.some((g) => EVERY_CONNECTION.has(g.kind)) || othersDown.size >= 2);
    if (!startMeasured) {
      const what = inTheWay.map((g) => `${g.kind}${g.target ? ` on ${g.target}` : ""}`).join(", ");
      result.probes.notMeasured.push(`${p.blocked}: its start, after ${what}`);
    } else {
      result.probes.nextStartMs.push(nextStart);
    }
    if (slotBack > SLOT_BACK_MS) {
      violations.push({
        invariant: "a crashed worker's slot comes back in time",
        job: p.blocker.job,
        detail: `${f.target} killed holding ${p.queue}'s only slot; the attempt ended ${blocker.outcome} ${Math.round(slotBack)} ms later (bound ${SLOT_BACK_MS} ms)`,
      });
    }
    if (startMeasured && nextStart > NEXT_START_MS) {
      violations.push({
        invariant: "a crashed worker's slot comes back in time",
        job: p.blocked,
        detail: `${f.target} killed holding ${p.queue}'s only slot; the next attempt in the queue started ${Number.isFinite(nextStart) ? `${Math.round(nextStart)} ms later` : "never"} (bound ${NEXT_START_MS} ms)`,
      });
    }
  }
  return { violations, result };
}
