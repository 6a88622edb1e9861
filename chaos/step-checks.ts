/**
 * Invariants of durable jobs under faults (issue 27; the workload is chaos/durable-workload.ts),
 * read after the drain from job_steps, the step rows the handlers wrote and the audit trail:
 *
 * 17. **A recorded step is never executed again**: no plain step runs in an attempt after the
 *     one that recorded it, nor twice in one attempt, nor (by a stale attempt) after its record
 *     unless that attempt's worker was frozen until then; every recorded step ran in its
 *     recording attempt.
 * 18. **Every re-execution is explained**: each run of a plain step that was not recorded belongs
 *     to an attempt that ended without recording it (lease_expired, worker_lost, stalled,
 *     timed_out, released, failed); each is listed with that end.
 * 19. **Transactional steps exactly once**: every durable job has exactly one step_effects row,
 *     from the attempt that recorded its transactional step, by that attempt's worker.
 * 20. **Durable jobs end, waits get their events**: every durable job ends succeeded with all its
 *     places recorded; a job that slept or waited was not left suspended past its wake: no job of
 *     its queue enqueued more than a slack after the wake (so claimed after it, by run_at) started
 *     before it ran again; a wait
 *     timed out only if its event was sent after the timeout (or never), and a wait that
 *     received names its own event and returned the same data the handler's result holds.
 *
 * Times are ms since the epoch: `began` is the process's clock, the rest the database's (one
 * machine, one clock).
 */
import type pg from "pg";
import { STEP_EFFECTS_TABLE, STEP_RUNS_TABLE } from "./config.js";
import type { FaultRecord } from "./faults.js";
import { durablePlaces, type DurablePlan } from "./durable-workload.js";
import { QUEUE } from "./workload.js";

export interface DurableJob {
  id: string;
  state: string;
  attempt: number;
  plan: DurablePlan;
  /** The handler's result (what its wait returned is in `received`). */
  result: { received?: unknown } | null;
}
export interface StepRow {
  job: string;
  seq: number;
  name: string;
  kind: string;
  state: string;
  attempt: number;
  result: unknown;
  eventId: string | null;
  wake: number | null;
  recorded: number;
}
export interface StepRun {
  job: string;
  name: string;
  attempt: number;
  worker: string;
  began: number;
}
export interface StepAttempt {
  job: string;
  attempt: number;
  worker: string;
  started: number;
  ended: number;
  outcome: string;
  error: string | null;
}
export interface StepAudit {
  jobs: DurableJob[];
  steps: StepRow[];
  runs: StepRun[];
  effects: { job: string; attempt: number; worker: string }[];
  events: { id: string; name: string; sent: number }[];
  attempts: StepAttempt[];
  /** The main queue's jobs' first attempts (enqueued, started), by enqueue time: who passed a woken job. */
  firstStarts: { created: number; started: number }[];
}

/** One run of a plain step that was not recorded, and why: the end of its attempt. */
export interface ReExecution {
  job: string;
  step: string;
  attempt: number;
  worker: string;
  outcome: string;
  recordedBy: number;
  because: string;
}

export interface StepResult {
  durableJobs: number;
  /** Plain steps recorded, and their bodies run in all (at least once each). */
  stepsRecorded: number;
  runs: number;
  /** Runs not recorded (the steps ran again in a later attempt), by the end of their attempt. */
  reExecutions: ReExecution[];
  reExecutedBecause: Record<string, number>;
  /** Runs by a stale attempt that began after the record, its worker frozen until then. */
  frozenAfterRecord: number;
  /** Attempts that found a plain step recorded and did not run it. */
  replays: number;
  transactionalSteps: number;
  /** Suspensions: sleeps and waits, and how long after its wake each job ran again (ms). */
  suspensions: { sleeps: number; waits: number; wakeToStartMs: number[] };
  waits: { received: number; eventBeforeWait: number; timedOut: number; neverSent: number };
}

export interface StepViolation {
  invariant: string;
  job?: string;
  detail: string;
}

const NEVER_AGAIN = "a recorded step is never executed again";
const EXPLAINED = "every step re-execution is explained";
const ONCE = "transactional steps exactly once";
const ENDS = "durable jobs end and receive their events";
/** Attempt ends by which a step's run was left unrecorded and run again. */
const UNRECORDED_ENDS = ["lease_expired", "worker_lost", "stalled", "timed_out", "released", "failed"];
/** The processes' clock against the database's (one machine), and a statement's start against its commit. */
const CLOCK_TOLERANCE_MS = 50;
const COMMIT_TOLERANCE_MS = 1_000;
/** How long a frozen worker's event loop may take after SIGCONT to run what it was about to. */
const THAW_MS = 3_000;
/**
 * A woken job is claimable within this of its wake: watchdog ticks (0.5 s), every watchdog
 * killed (restarted within 3 s), a database restart, a reconnect. Claims go by run_at, and a woken
 * job's is its wake: a job enqueued later than this after the wake must not start before it.
 */
export const WAKE_SLACK_MS = 10_000;
const MAX_LISTED = 20;

const ms = (column: string) => `(extract(epoch FROM ${column}) * 1000)::float8`;

export async function loadStepAudit(db: pg.Pool): Promise<StepAudit> {
  const durable = "SELECT id FROM finished_jobs WHERE payload ? 'durable'";
  const [jobs, steps, runs, effects, events, attempts, firstStarts] = await Promise.all([
    db.query<DurableJob>(`SELECT id::text, state, attempt, payload->'durable' AS plan, result FROM finished_jobs WHERE payload ? 'durable'`),
    db.query<StepRow>(
      `SELECT job_id::text AS job, seq, name, kind, state, attempt, result, event_id::text AS "eventId",
              ${ms("wake_at")} AS wake, ${ms("recorded_at")} AS recorded
         FROM job_steps ORDER BY job_id, seq`,
    ),
    db.query<StepRun>(
      `SELECT job_id::text AS job, name, attempt, worker_id AS worker, ${ms("began")} AS began FROM ${STEP_RUNS_TABLE} ORDER BY job_id, began`,
    ),
    db.query<{ job: string; attempt: number; worker: string }>(`SELECT job_id::text AS job, attempt, worker_id AS worker FROM ${STEP_EFFECTS_TABLE}`),
    db.query<{ id: string; name: string; sent: number }>(`SELECT id::text, name, ${ms("sent_at")} AS sent FROM events ORDER BY id`),
    db.query<StepAttempt>(
      `SELECT job_id::text AS job, attempt, worker_id AS worker, ${ms("started_at")} AS started, ${ms("ended_at")} AS ended, outcome, error
         FROM all_attempts WHERE job_id IN (${durable}) ORDER BY job_id, attempt`,
    ),
    db.query<{ created: number; started: number }>(
      `SELECT ${ms("j.created_at")} AS created, ${ms("a.started_at")} AS started
         FROM finished_jobs AS j JOIN all_attempts AS a ON a.job_id = j.id AND a.attempt = 1
        WHERE j.queue = '${QUEUE}' ORDER BY j.created_at`,
    ),
  ]);
  return {
    jobs: jobs.rows,
    steps: steps.rows,
    runs: runs.rows,
    effects: effects.rows,
    events: events.rows,
    attempts: attempts.rows,
    firstStarts: firstStarts.rows,
  };
}

function group<T>(rows: T[], key: (r: T) => string): Map<string, T[]> {
  const map = new Map<string, T[]>();
  for (const r of rows) {
    const list = map.get(key(r));
    if (list) list.push(r);
    else map.set(key(r), [r]);
  }
  return map;
}

/** `faults`: a stale run after its record is allowed only if its worker was frozen (a zombie) until just before. */
export function checkSteps(audit: StepAudit, faults: FaultRecord[] = []): { violations: StepViolation[]; result: StepResult } {
  const violations: StepViolation[] = [];
  const add = (invariant: string, detail: string, job?: string) => violations.push({ invariant, detail, job });
  const result: StepResult = {
    durableJobs: audit.jobs.length,
    stepsRecorded: 0,
    runs: 0,
    reExecutions: [],
    reExecutedBecause: {},
    frozenAfterRecord: 0,
    replays: 0,
    transactionalSteps: 0,
    suspensions: { sleeps: 0, waits: 0, wakeToStartMs: [] },
    waits: { received: 0, eventBeforeWait: 0, timedOut: 0, neverSent: 0 },
  };
  const stepsOf = group(audit.steps, (s) => s.job);
  const runsOf = group(audit.runs, (r) => `${r.job}/${r.name}`);
  const effectsOf = group(audit.effects, (e) => e.job);
  const attemptsOf = group(audit.attempts, (a) => a.job);
  const eventsByName = group(audit.events, (e) => e.name);
  const eventsById = new Map(audit.events.map((e) => [e.id, e]));
  const durableIds = new Set(audit.jobs.map((j) => j.id));
  // The earliest first start among the jobs enqueued at or after each index (sorted by enqueue).
  const later = audit.firstStarts;
  const earliestFrom = new Array<number>(later.length + 1).fill(Infinity);
  for (let i = later.length - 1; i >= 0; i--) earliestFrom[i] = Math.min(earliestFrom[i + 1]!, later[i]!.started);
  /** The first start of a job enqueued more than the slack after `woke`, if one came before `ranAt`. */
  const passedBy = (woke: number, ranAt: number): number | undefined => {
    let lo = 0;
    let hi = later.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (later[mid]!.created > woke + WAKE_SLACK_MS) hi = mid;
      else lo = mid + 1;
    }
    return earliestFrom[lo]! < ranAt - CLOCK_TOLERANCE_MS ? earliestFrom[lo] : undefined;
  };
  const frozen = (worker: string, at: number) =>
    faults.some(
      (f) => f.kind === "zombie" && f.target === worker.split("/")[0] && f.at <= at && (f.endedAt ?? f.at + (f.durationMs ?? 0)) >= at - THAW_MS,
    );

  for (const job of audit.jobs) {
    const attempts = attemptsOf.get(job.id) ?? [];
    const attempt = (n: number) => attempts.find((a) => a.attempt === n);
    const records = new Map((stepsOf.get(job.id) ?? []).map((s) => [s.name, s]));
    if (job.state !== "succeeded") add(ENDS, `a durable job ended ${job.state} (attempt ${job.attempt})`, job.id);

    for (const place of durablePlaces(job.plan)) {
      const rec = records.get(place.name);
      if (job.state === "succeeded" && (!rec || rec.state !== "succeeded" || rec.kind !== place.kind)) {
        add(ENDS, `succeeded, but its ${place.kind} "${place.name}" is ${rec ? `recorded ${rec.kind} ${rec.state}` : "not recorded"}`, job.id);
        continue;
      }
      if (place.kind === "step") checkPlainStep(job, place.name, rec, runsOf.get(`${job.id}/${place.name}`) ?? []);
      if (!rec || rec.state !== "succeeded") continue;
      // The attempt before the one that went on from a sleep or a wait: suspended, it ran again after its wake.
      if (place.kind === "sleep" || place.kind === "event") {
        const woke = place.kind === "sleep" ? rec.wake : waitWake(rec);
        const suspended = place.kind === "sleep" ? attempt(rec.attempt) : waitSuspender(rec);
        const next = suspended && attempt(suspended.attempt + 1);
        if (suspended?.outcome === "suspended" && woke !== null) {
          if (place.kind === "sleep") result.suspensions.sleeps++;
          else result.suspensions.waits++;
          if (next) {
            result.suspensions.wakeToStartMs.push(Math.max(0, next.started - woke));
            const passed = passedBy(woke, next.started);
            if (passed !== undefined)
              add(
                ENDS,
                `suspended in its ${place.kind} "${place.name}", ran again ${Math.round(next.started - woke)} ms after its wake, ` +
                  `though a job enqueued over ${WAKE_SLACK_MS} ms after that wake started ${Math.round(next.started - passed)} ms before it`,
                job.id,
              );
          } else if (job.state === "succeeded") add(ENDS, `suspended in attempt ${suspended.attempt} and never ran again, yet succeeded`, job.id);
        }
      }
      if (place.kind === "event") checkWait(job, rec);
    }

    // 19. The transactional step's row: once, from its recording attempt, by that attempt's worker.
    const effects = effectsOf.get(job.id) ?? [];
    effectsOf.delete(job.id);
    const effect = records.get("effect");
    if (effect?.state === "succeeded") result.transactionalSteps++;
    const recorder = effect && attempt(effect.attempt);
    const rows = effects.map((e) => `attempt ${e.attempt} by ${e.worker}`).join(", ") || "none";
    if (job.state === "succeeded" && (effects.length !== 1 || effects[0]!.attempt !== effect?.attempt || effects[0]!.worker !== recorder?.worker)) {
      add(ONCE, `the transactional step was recorded by attempt ${effect?.attempt} (${recorder?.worker}); its rows: ${rows}`, job.id);
    } else if (job.state !== "succeeded" && effect?.state !== "succeeded" && effects.length > 0) {
      add(ONCE, `the transactional step was never recorded, yet its rows stayed: ${rows}`, job.id);
    }

    function checkPlainStep(job: DurableJob, name: string, rec: StepRow | undefined, runs: StepRun[]) {
      result.runs += runs.length;
      if (!rec || rec.state !== "succeeded") {
        // The job did not succeed (reported above): its unrecorded runs still need their explanation.
        for (const run of runs) unrecorded(run, undefined);
        return;
      }
      result.stepsRecorded++;
      const byRecorder = runs.filter((r) => r.attempt === rec.attempt);
      if (byRecorder.length === 0) add(NEVER_AGAIN, `step "${name}" recorded by attempt ${rec.attempt}, which has no run of it`, job.id);
      if (byRecorder.length > 1)
        add(NEVER_AGAIN, `step "${name}" ran ${byRecorder.length} times in attempt ${rec.attempt}, which recorded it`, job.id);
      result.replays += attempts.filter((a) => a.attempt > rec.attempt).length;
      for (const run of runs) {
        if (run.attempt === rec.attempt) continue;
        const what = `step "${name}" recorded by attempt ${rec.attempt} at ${iso(rec.recorded)} ran in attempt ${run.attempt} (${run.worker}) at ${iso(run.began)}`;
        if (run.attempt > rec.attempt) add(NEVER_AGAIN, `${what}: a later attempt ran it instead of replaying it`, job.id);
        else if (run.began > rec.recorded + CLOCK_TOLERANCE_MS) {
          if (frozen(run.worker, run.began)) result.frozenAfterRecord++;
          else add(NEVER_AGAIN, `${what}: a stale attempt ran it after the record, its worker not frozen`, job.id);
        }
        unrecorded(run, rec);
      }
    }

    // 18. A run that was not recorded: its attempt must have ended without recording.
    function unrecorded(run: StepRun, rec: StepRow | undefined) {
      const a = attempt(run.attempt);
      const outcome = a?.outcome ?? "never ended";
      const because = a
        ? `attempt ${a.attempt} on ${a.worker} ended ${a.outcome} ${Math.round(a.ended - run.began)} ms after the step began${a.error ? `: ${a.error.split("\n")[0]!.slice(0, 120)}` : ""}`
        : `attempt ${run.attempt} has no audit row`;
      result.reExecutions.push({
        job: job.id,
        step: run.name,
        attempt: run.attempt,
        worker: run.worker,
        outcome,
        recordedBy: rec?.attempt ?? 0,
        because,
      });
      result.reExecutedBecause[outcome] = (result.reExecutedBecause[outcome] ?? 0) + 1;
      // A run that began after its attempt had ended: only a frozen worker could not know.
      const afterEnd = a !== undefined && a.ended < run.began - CLOCK_TOLERANCE_MS - COMMIT_TOLERANCE_MS && !frozen(run.worker, run.began);
      if (!a || !UNRECORDED_ENDS.includes(a.outcome) || afterEnd) {
        add(EXPLAINED, `step "${run.name}" ran in attempt ${run.attempt} and was not recorded by it, yet ${because}`, job.id);
      }
    }

    // 20. A wait received its own event, or timed out only when the event came after the timeout.
    function checkWait(job: DurableJob, rec: StepRow) {
      const sent = eventsByName.get(job.plan.event) ?? [];
      const first = sent[0];
      if (rec.eventId === null) {
        result.waits.timedOut++;
        if (!first) result.waits.neverSent++;
        if (job.plan.timeoutMs === undefined) add(ENDS, `its wait for "${job.plan.event}" (no timeout) returned null`, job.id);
        else if (first && rec.wake !== null && first.sent < rec.wake - COMMIT_TOLERANCE_MS)
          add(ENDS, `its wait timed out at ${iso(rec.wake)} though "${job.plan.event}" was sent at ${iso(first.sent)}: an event lost`, job.id);
      } else {
        result.waits.received++;
        const event = eventsById.get(rec.eventId);
        if (event?.name !== job.plan.event) add(ENDS, `its wait for "${job.plan.event}" received event ${rec.eventId} (${event?.name})`, job.id);
        const began = waitSuspender(rec) ? undefined : attempt(rec.attempt)?.started;
        if (event && began !== undefined && event.sent < began) result.waits.eventBeforeWait++;
      }
      if (job.state === "succeeded" && JSON.stringify(job.result?.received ?? null) !== JSON.stringify(rec.result ?? null))
        add(ENDS, `its wait recorded ${JSON.stringify(rec.result)} but the handler returned ${JSON.stringify(job.result?.received)}`, job.id);
    }

    /**
     * The attempt that suspended in the wait, if one did: the one before the attempt that
     * recorded it, suspended, unless that suspension was the sleep's (the sleep's record names it).
     */
    function waitSuspender(rec: StepRow): StepAttempt | undefined {
      const before = attempt(rec.attempt - 1);
      return before?.outcome === "suspended" && before.attempt !== records.get("nap")?.attempt ? before : undefined;
    }

    /** When a recorded wait could go on: its event's first send, or its deadline. */
    function waitWake(rec: StepRow): number | null {
      if (rec.eventId === null) return rec.wake;
      return eventsById.get(rec.eventId)?.sent ?? null;
    }
  }
  for (const [job, effects] of effectsOf)
    if (!durableIds.has(job)) add(ONCE, `${effects.length} transactional step rows for a job that is not a finished durable one`, job);
  for (const job of new Set(audit.runs.map((r) => r.job)))
    if (!durableIds.has(job)) add(NEVER_AGAIN, "step runs of a job that is not a finished durable one", job);
  return { violations: trim(violations), result };
}

function iso(t: number): string {
  return new Date(t).toISOString().slice(11, 23);
}

/** At most MAX_LISTED of each invariant, and how many in all. */
function trim(violations: StepViolation[]): StepViolation[] {
  const out: StepViolation[] = [];
  for (const invariant of new Set(violations.map((v) => v.invariant))) {
    const all = violations.filter((v) => v.invariant === invariant);
    out.push(...all.slice(0, MAX_LISTED));
    if (all.length > MAX_LISTED) out.push({ invariant, detail: `${all.length} violations in all` });
  }
  return out;
}
