/**
 * The invariant checker: after a run has drained, compares the database (jobs, finished_jobs,
 * job_attempts, the downstream table and its write log) with what every worker process
 * logged about its own reports. Every broken invariant becomes a violation naming the job
 * and what was seen; the run fails if there is any.
 */
import type pg from "pg";
import { RESULTS_TABLE, TX_EFFECTS_TABLE } from "./config.js";
import type { ChaosOptions } from "./config.js";
import type { FaultRecord } from "./faults.js";
import { RECONNECT_MAX_MS } from "../packages/leasehold/src/worker/listener.js";
import type { LogLine } from "./process-log.js";
import { findOverlaps, type Overlap, type OverlapResult } from "./overlaps.js";
import { NEXT_START_MS, SLOT_BACK_MS, checkFlow, loadFlowAttempts, type FlowResult } from "./flow-checks.js";
import { LIMITED_QUEUES } from "./flow-queues.js";
import { checkGraphs, loadGraphAudit } from "./graph-checks.js";
import { checkSteps, loadStepAudit, type ReExecution } from "./step-checks.js";
import type { ProcessEnd, UnexpectedExit } from "./supervisor.js";

export interface Violation {
  invariant: string;
  job?: string;
  detail: string;
}

export interface AttemptRow {
  job: string;
  attempt: number;
  worker: string;
  started: number;
  ended: number;
  outcome: string;
}

export interface HistoryRow {
  id: string;
  state: string;
  attempt: number;
  spent: number;
  max: number;
  seq: number;
  write: boolean;
  tx: boolean;
  /** A graph node, batch member or callback: a failed parent may cancel it (graph-checks.ts says whether rightly). */
  graph: boolean;
  /** false: it left no record (--record off) and the run's ledger stands for it (chaos/record-off.ts). */
  kept: boolean;
  /** The worker that held its last attempt. */
  worker: string | null;
}

export interface CheckInput {
  admin: pg.Pool;
  /** Sequence numbers the producer enqueued: 0 .. jobs-1. */
  jobs: number;
  logs: LogLine[];
  faults: FaultRecord[];
  unexpectedExits: UnexpectedExit[];
  /** When each worker process ended (killed, crashed, stopped): its attempts end there. */
  processEnds?: ProcessEnd[];
  /** The run's timings, for the hang invariant (a hung handler ends within its progress timeout and a watchdog tick). */
  options?: Pick<ChaosOptions, "progressTimeoutMs" | "watchdogIntervalMs" | "leaseMs">;
  /** Every succeeded job must hold a result: its handlers returned one (the run's do; a hand-made history has none). */
  resultsRequired?: boolean;
}

export interface Percentiles {
  p50: number | null;
  p99: number | null;
  max: number | null;
}

export interface Recovery {
  n: number;
  /** Fault to the lease given back (reaped by a watchdog, or released by the restarted worker). */
  toLeaseEnded: Percentiles;
  /** Fault to the job's next attempt claimed: the number users ask about (includes retry backoff and any backlog). */
  toRunningAgain: Percentiles;
  /** Attempts the fault caught that were not recovered by a new claim: a report in flight landed, or the job went dead. */
  finishedAnyway: number;
}

export interface CheckResult {
  violations: Violation[];
  /** The producer's jobs by end state (the flow_kill fault's probe jobs are counted in `flow`). */
  finished: Record<string, number>;
  /** --record off: succeeded jobs that left no record, each shown completed by the run's own audit (invariant 1b). */
  notKept: number;
  /** Finished jobs that ended inside ctx.transaction (their rows checked by invariant 4b). */
  transactional: number;
  attempts: number;
  /** Jobs whose handler ran again after an execution whose lease was reaped or released. */
  duplicates: { total: number; afterLeaseExpired: number; afterWorkerLost: number; afterLimit: number; afterRelease: number; overlapping: number };
  staleRefused: { claim: number; heartbeat: number; complete: number; fail: number; release: number; supersede: number; downstream: number };
  /** Writes that came after their attempt had ended, accepted only because no newer attempt had written yet; all overwritten later. */
  lateWritesOverwritten: number;
  recovery: Record<"kill" | "zombie" | "partition" | "reset", Recovery>;
  /**
   * Half-open partitions (open connections silent, new ones fine): how long until the worker
   * next got an answer from the database, next to how long the fault lasted. Equal means the
   * worker sat on its dead connections until the network came back.
   */
  halfOpen: { n: number; backAfter: Percentiles; faultLasted: Percentiles };
  producerDuplicates: number;
  /** Hung handlers (the hang fault), and how long after they stopped making progress their attempts ended. */
  hangs: { n: number; endedAfter: Percentiles };
  /** Attempts of a job running at once, unsignalled (invariant 9 in docs/chaos.md, overlaps.ts). */
  overlaps: {
    avoidable: number;
    /** By cause: frozen (SIGSTOP over the window), killed (its process had ended: not running in fact). */
    unavoidable: { frozen: number; killed: number };
    /** Avoidable ones by the faults on the older attempt's worker around them ("none"). */
    avoidableAround: Record<string, number>;
    timeline: OverlapResult["timeline"];
  };
  /**
   * Jobs that build on jobs (invariants 13-16, graph-checks.ts): the dependent jobs by end
   * state, batches, jobs that ran past failed parents, stored results checked, and the step
   * from a job's last parent's end to its first start (ms).
   */
  graphs: { dependents: Record<string, number>; batches: number; runOnFailure: number; results: number; step: Percentiles };
  /**
   * Durable jobs (invariants 17-20, step-checks.ts): steps recorded and run, every run left
   * unrecorded (a re-execution) with the end of its attempt, transactional steps, suspensions
   * and their wake to the next start, waits received or timed out.
   */
  steps: {
    durableJobs: number;
    stepsRecorded: number;
    runs: number;
    reExecutions: ReExecution[];
    reExecutedBecause: Record<string, number>;
    frozenAfterRecord: number;
    replays: number;
    transactionalSteps: number;
    suspensions: { sleeps: number; waits: number; wakeToStart: Percentiles };
    waits: { received: number; eventBeforeWait: number; timedOut: number; neverSent: number };
  };
  /** Flow control (invariants 10-12, flow-checks.ts): each limit's peak, the pauses, the killed workers' slots. */
  flow: Omit<FlowResult, "probes"> & {
    probes: {
      n: number;
      probeJobs: number;
      slotBack: Percentiles;
      nextStart: Percentiles;
      bounds: { slotBackMs: number; nextStartMs: number };
      notMeasured: string[];
    };
  };
}

/** Clocks: worker and database run on one machine; this absorbs statement-start vs commit order. */
const CLOCK_TOLERANCE_MS = 50;
/** How long after its now() an ending statement may commit on a loaded machine (seen: 53 ms; allowed: 1 s). */
const END_COMMIT_TOLERANCE_MS = 1_000;
/** Faults that keep one worker from the database for their duration. */
const BLOCKING_FAULTS = new Set<FaultRecord["kind"]>(["reset", "partition", "zombie"]);
/** Outcomes that spend the retry budget: every end but a success, a graceful release and a cancel. */
const SPENDING = ["failed", "lease_expired", "worker_lost", "stalled", "timed_out"];
/** Outcomes by which recovery gave a held job back to run again. */
const RECOVERED = ["lease_expired", "worker_lost", "released", "stalled", "timed_out"];
const MAX_LISTED = 20;

/**
 * Times come as float8 (ms since epoch): extract() returns numeric, which node-postgres reads
 * as a string, and `ended + tolerance` then concatenated instead of adding.
 */
export async function loadRows(admin: pg.Pool) {
  const [unfinished, history, attempts, results, writes, effects] = await Promise.all([
    admin.query<{ id: string; state: string; attempt: number }>("SELECT id::text, state, attempt FROM jobs ORDER BY id"),
    admin.query<HistoryRow>(
      `SELECT id::text, state, attempt, spent_attempts AS spent, max_attempts AS max,
              (payload->>'seq')::int AS seq, coalesce((payload->>'write')::boolean, false) AS write,
              coalesce((payload->>'tx')::boolean, false) AS tx, payload ? 'graph' AS graph, kept, worker_id AS worker
         FROM audit_finished`,
    ),
    admin.query<AttemptRow>(
      `SELECT job_id::text AS job, attempt, worker_id AS worker, outcome,
              (extract(epoch FROM started_at) * 1000)::float8 AS started, (extract(epoch FROM ended_at) * 1000)::float8 AS ended
         FROM audit_attempts ORDER BY job_id, attempt`,
    ),
    admin.query<{ job: string; token: number; worker: string }>(`SELECT job_id::text AS job, token, worker_id AS worker FROM ${RESULTS_TABLE}`),
    admin.query<{ job: string; token: number; worker: string; at: number }>(
      "SELECT job_id::text AS job, token, worker_id AS worker, (extract(epoch FROM at) * 1000)::float8 AS at FROM downstream_log ORDER BY n",
    ),
    admin.query<{ job: string; attempt: number; worker: string }>(
      `SELECT job_id::text AS job, attempt, worker_id AS worker FROM ${TX_EFFECTS_TABLE} ORDER BY job_id, attempt`,
    ),
  ]);
  return {
    unfinished: unfinished.rows,
    history: history.rows,
    attempts: attempts.rows,
    results: results.rows,
    writes: writes.rows,
    effects: effects.rows,
  };
}

export async function checkInvariants(input: CheckInput): Promise<CheckResult> {
  const rows = await loadRows(input.admin);
  const violations: Violation[] = [];
  const add = (invariant: string, detail: string, job?: string) => violations.push({ invariant, detail, job });

  // 1. Drained: nothing left waiting or running; every enqueued job ended exactly once.
  for (const j of rows.unfinished.slice(0, MAX_LISTED)) add("no job lost or stuck", `still ${j.state} (attempt ${j.attempt})`, j.id);
  if (rows.unfinished.length > MAX_LISTED) add("no job lost or stuck", `${rows.unfinished.length} jobs unfinished in all`);
  const finished: Record<string, number> = {};
  const seqs = new Map<number, number>();
  let probeJobs = 0;
  for (const h of rows.history) {
    if (h.seq < 0) probeJobs++;
    else finished[h.state] = (finished[h.state] ?? 0) + 1;
    seqs.set(h.seq, (seqs.get(h.seq) ?? 0) + 1);
    // The run cancels nothing itself; only a graph job's failed parent does (checked by invariant 14).
    if (!["succeeded", "dead"].includes(h.state) && !(h.state === "cancelled" && h.graph))
      add("one terminal state", `ended ${h.state}; the run cancels nothing`, h.id);
  }
  // 1b. --record off: a job that left no record ended by the success of the attempt that held
  //     it (the ledger's attempt and worker): that handler settled ok (its own log), or its
  //     ctx.transaction row committed with the completion. Anything else would be a job lost.
  const settledOk = new Set<string>();
  for (const line of input.logs) if (line.ev === "settled" && line.ok) settledOk.add(`${line.job}/${line.attempt}/${line.w}`);
  const txEffect = new Set(rows.effects.map((e) => `${e.job}/${e.attempt}/${e.worker}`));
  let notKept = 0;
  for (const h of rows.history) {
    if (h.kept) continue;
    notKept++;
    const key = `${h.id}/${h.attempt}/${h.worker}`;
    if (!settledOk.has(key) && !txEffect.has(key))
      add(
        "no job lost or stuck",
        `left jobs without a record, but attempt ${h.attempt} by ${h.worker} neither settled ok nor committed its transaction`,
        h.id,
      );
  }
  const missing = [...Array(input.jobs).keys()].filter((s) => !seqs.has(s));
  if (missing.length) add("no job lost or stuck", `${missing.length} enqueued jobs never finished, e.g. seq ${missing.slice(0, 10).join(", ")}`);
  const producerDuplicates = [...seqs.values()].reduce((n, c) => n + c - 1, 0);

  // 2. Audit rows: one closed row per claim, 1..attempt, the last one matching the end state;
  //    no attempt but the last succeeded; the budget counts exactly the failed and expired ones.
  const byJob = new Map<string, AttemptRow[]>();
  for (const a of rows.attempts) byJob.set(a.job, [...(byJob.get(a.job) ?? []), a]);
  const attemptOf = (job: string, n: number) => byJob.get(job)?.[n - 1];
  for (const h of rows.history) {
    const list = byJob.get(h.id) ?? [];
    const numbers = list.map((a) => a.attempt).join(",");
    const expected = Array.from({ length: h.attempt }, (_, i) => i + 1).join(",");
    if (numbers !== expected) {
      add("every attempt's audit row closed", `audit rows for attempts [${numbers}], expected [${expected}]`, h.id);
      continue;
    }
    if (list.length === 0) continue; // a graph job cancelled while blocked: never claimed
    const last = list[list.length - 1]!;
    const lastOk = h.state === "succeeded" ? last.outcome === "succeeded" : SPENDING.includes(last.outcome);
    if (!lastOk) add("one terminal state", `job ${h.state} but its last attempt ${last.attempt} ended ${last.outcome}`, h.id);
    const successes = list.filter((a) => a.outcome === "succeeded");
    if (successes.length > 1)
      add("no stale report applied", `${successes.length} attempts succeeded: ${successes.map((a) => a.attempt).join(", ")}`, h.id);
    if (successes.some((a) => a !== last))
      add("no stale report applied", `attempt ${successes[0]!.attempt} succeeded but attempt ${last.attempt} ran after it`, h.id);
    const spent = list.filter((a) => SPENDING.includes(a.outcome)).length;
    if (spent !== h.spent) add("attempts within the budget", `${spent} failed or expired attempts, spent_attempts says ${h.spent}`, h.id);
    if (spent > h.max) add("attempts within the budget", `${spent} failed or expired attempts, budget ${h.max}`, h.id);
  }

  // 3. Every report the database accepted came from the attempt that held the lease then.
  const staleRefused = { claim: 0, heartbeat: 0, complete: 0, fail: 0, release: 0, supersede: 0, downstream: 0 };
  const landedAs: Record<string, string[]> = {
    complete: ["succeeded", "cancelled"],
    fail: ["failed", "stalled", "timed_out", "cancelled"],
    release: ["released", "cancelled"],
    supersede: ["superseded", "cancelled"],
  };
  // When a worker's report ended an attempt, its answer came back after the end committed:
  // a beat sent after that answer and accepted is stale for sure, while one sent before it may
  // have run before the commit, however long after its now() the ending statement committed.
  const reportedEndAt = new Map<string, number>();
  for (const line of input.logs) {
    if (line.ev !== "report" || line.kind === "claim" || line.kind === "heartbeat" || line.accepted === null) continue;
    const accepted = new Set(line.accepted);
    for (const [job, attempt] of line.sent) if (accepted.has(job)) reportedEndAt.set(`${job}:${attempt}`, line.t);
  }
  for (const line of input.logs) {
    if (line.ev !== "report" || line.kind === "claim" || line.accepted === null) continue;
    const accepted = new Set(line.accepted);
    for (const [job, attempt] of line.sent) {
      if (!accepted.has(job)) {
        staleRefused[line.kind]++;
        continue;
      }
      const a = attemptOf(job, attempt);
      const what = `${line.kind} from attempt ${attempt} by ${line.w}`;
      if (!a || a.attempt !== attempt) {
        add("no stale report applied", `${what} accepted, but the attempt has no audit row`, job);
        continue;
      }
      if (a.worker !== line.w) add("no stale report applied", `${what} accepted, but attempt ${attempt} belonged to ${a.worker}`, job);
      if (line.kind === "heartbeat") {
        // ended_at is the ending statement's now(), its transaction's start: under load it
        // commits well after that, and a beat may land in between. The next claim is tighter:
        // it can only see the job once the end has committed.
        const committedBy = Math.max(a.ended + END_COMMIT_TOLERANCE_MS, reportedEndAt.get(`${job}:${attempt}`) ?? -Infinity);
        if (line.sentAt > committedBy) {
          add(
            "no stale report applied",
            `${what} sent ${Math.round(line.sentAt - a.ended)} ms after the attempt ended ${a.outcome} was accepted`,
            job,
          );
        }
        const next = attemptOf(job, attempt + 1);
        if (next && next.started < line.sentAt - CLOCK_TOLERANCE_MS) {
          add("no stale report applied", `${what} accepted after attempt ${attempt + 1} had claimed the job`, job);
        }
      } else if (!landedAs[line.kind]!.includes(a.outcome)) {
        add("no stale report applied", `${what} accepted, but the attempt ended ${a.outcome}`, job);
      }
    }
  }

  // 4. Downstream: no write accepted after a newer attempt's; the surviving value is the
  //    succeeded attempt's; the processes' view of their writes matches the table's log.
  const lastToken = new Map<string, number>();
  let lateWritesOverwritten = 0;
  const acceptedWrites = new Set<string>();
  for (const w of rows.writes) {
    const prev = lastToken.get(w.job) ?? 0;
    if (w.token < prev) add("no stale downstream write accepted", `write from attempt ${w.token} accepted after attempt ${prev} had written`, w.job);
    lastToken.set(w.job, Math.max(prev, w.token));
    acceptedWrites.add(`${w.job}/${w.token}`);
    const a = attemptOf(w.job, w.token);
    if (a && a.ended < w.at - CLOCK_TOLERANCE_MS) lateWritesOverwritten++;
  }
  const results = new Map(rows.results.map((r) => [r.job, r]));
  for (const h of rows.history) {
    if (h.state !== "succeeded" || !h.write) continue;
    const r = results.get(h.id);
    const winner = attemptOf(h.id, h.attempt);
    if (!r) add("no stale downstream write accepted", `succeeded with attempt ${h.attempt} but no downstream row`, h.id);
    else if (r.token !== h.attempt || r.worker !== winner?.worker) {
      add(
        "no stale downstream write accepted",
        `downstream holds attempt ${r.token} by ${r.worker}; attempt ${h.attempt} by ${winner?.worker} succeeded`,
        h.id,
      );
    }
  }
  for (const line of input.logs) {
    if (line.ev !== "write" || line.accepted === null) continue;
    const inTable = acceptedWrites.has(`${line.job}/${line.attempt}`);
    if (!line.accepted) staleRefused.downstream++;
    if (line.accepted && !inTable)
      add("no stale downstream write accepted", `attempt ${line.attempt} was told its write landed; the table has no such write`, line.job);
  }

  // 4b. ctx.transaction: the handler's row committed with the completion, so a succeeded job
  //     has exactly one, from its succeeding attempt, and a dead one none, however many
  //     attempts wrote one before their lease was lost or their transaction failed.
  const effectsOf = new Map<string, { attempt: number; worker: string }[]>();
  for (const e of rows.effects) effectsOf.set(e.job, [...(effectsOf.get(e.job) ?? []), e]);
  let transactional = 0;
  for (const h of rows.history) {
    const effects = effectsOf.get(h.id) ?? [];
    effectsOf.delete(h.id);
    if (!h.tx) continue;
    transactional++;
    const what = effects.map((e) => `attempt ${e.attempt} by ${e.worker}`).join(", ") || "none";
    if (h.state !== "succeeded") {
      if (effects.length > 0) add("transactional writes exactly once", `ended ${h.state} but its transaction's rows stayed: ${what}`, h.id);
      continue;
    }
    const winner = attemptOf(h.id, h.attempt);
    if (effects.length !== 1 || effects[0]!.attempt !== h.attempt || effects[0]!.worker !== winner?.worker) {
      add("transactional writes exactly once", `succeeded with attempt ${h.attempt} by ${winner?.worker}; rows: ${what}`, h.id);
    }
  }
  for (const [job, effects] of effectsOf)
    add("transactional writes exactly once", `${effects.length} rows for a job that is not a finished transactional one`, job);

  // 5. Duplicate executions: each explained by a reaped (or released) lease of the run before.
  const starts = new Map<string, { t: number; w: string }>();
  const lastSeen = new Map<string, number>();
  for (const line of input.logs) {
    if (line.ev === "start") starts.set(`${line.job}/${line.attempt}`, { t: line.t, w: line.w });
    if (line.ev === "start" || line.ev === "write" || line.ev === "end") {
      const key = `${line.job}/${line.attempt}`;
      lastSeen.set(key, Math.max(lastSeen.get(key) ?? 0, line.t));
    }
  }
  const duplicates = { total: 0, afterLeaseExpired: 0, afterWorkerLost: 0, afterLimit: 0, afterRelease: 0, overlapping: 0 };
  for (const [key, start] of starts) {
    const [job, n] = [key.split("/")[0]!, Number(key.split("/")[1])];
    // The execution before this one: claims whose process died before the handler started do not count.
    let m = n - 1;
    while (m >= 1 && !starts.has(`${job}/${m}`)) m--;
    if (m < 1) continue;
    const before = attemptOf(job, m);
    if (!before) {
      add("duplicates explained", `attempt ${n} ran but attempt ${m} has no audit row`, job);
      continue;
    }
    if (before.outcome === "failed") continue; // a retry, not a duplicate
    if (before.outcome === "suspended") continue; // a durable job resuming after a sleep or a wait
    duplicates.total++;
    if (before.outcome === "lease_expired") duplicates.afterLeaseExpired++;
    else if (before.outcome === "worker_lost") duplicates.afterWorkerLost++;
    else if (before.outcome === "stalled" || before.outcome === "timed_out") duplicates.afterLimit++;
    else if (before.outcome === "released") duplicates.afterRelease++;
    else add("duplicates explained", `attempt ${n} ran after attempt ${m} ended ${before.outcome}`, job);
    if ((lastSeen.get(`${job}/${m}`) ?? 0) > start.t) duplicates.overlapping++;
  }

  // 6. A handler that hangs while its process lives is ended: as stalled within its progress
  //    timeout and one watchdog tick; if its worker died meanwhile, through that recovery.
  const hangs = input.logs.filter((l): l is Extract<LogLine, { ev: "hang" }> => l.ev === "hang");
  const hangTimes: number[] = [];
  for (const h of hangs) {
    const a = attemptOf(h.job, h.attempt);
    if (!a) {
      add("hung handlers end", `attempt ${h.attempt} hung and has no audit row: it never ended`, h.job);
      continue;
    }
    const o = input.options;
    const took = a.ended - h.t;
    hangTimes.push(took);
    if (!o) continue;
    // A fault that kept its worker from the database while the attempt was being ended (the
    // database restarting, the worker's connections reset or cut, the worker frozen) delays
    // the end by as long, and a reconnect (at most a second, packages/leasehold/src/worker/listener.ts).
    const worker = h.w.split("/")[0];
    const unreachable = input.faults
      .filter((f) => f.kind === "pg_restart" || (BLOCKING_FAULTS.has(f.kind) && f.target === worker))
      .filter((f) => f.at < a.ended && (f.endedAt ?? f.at + (f.durationMs ?? 0)) > h.t)
      .reduce((ms, f) => ms + (f.endedAt ?? f.at + (f.durationMs ?? 0)) - f.at + RECONNECT_MAX_MS, 0);
    const bound = o.progressTimeoutMs + o.watchdogIntervalMs + END_COMMIT_TOLERANCE_MS + unreachable + (a.outcome === "stalled" ? 0 : o.leaseMs);
    if (took > bound)
      add("hung handlers end", `attempt ${h.attempt} hung and ended ${a.outcome} after ${Math.round(took)} ms (bound ${bound} ms)`, h.job);
  }

  // 9. No attempt starts while another attempt of its job runs with its signal not fired,
  //    unless its worker could not have known (frozen) or was not running it (killed).
  const split = findOverlaps(input.logs, input.faults, input.processEnds ?? []);
  const avoidable = split.overlaps.filter((o) => o.cause === "avoidable");
  for (const o of avoidable.slice(0, MAX_OVERLAPS_LISTED)) add(NO_OVERLAP, describeOverlap(o), o.job);
  if (avoidable.length > MAX_OVERLAPS_LISTED) add(NO_OVERLAP, `${avoidable.length} avoidable overlaps in all`);
  const avoidableAround: Record<string, number> = {};
  for (const o of avoidable) {
    const kinds = new Set(o.faults.map((f) => f.kind));
    for (const k of kinds.size ? kinds : ["none"]) avoidableAround[k] = (avoidableAround[k] ?? 0) + 1;
  }

  // 10-12. Flow control: no limit exceeded, a paused queue starts nothing, a killed worker's slot comes back.
  // The limited queues, and the paused ones (the main queue has no limit).
  const flowQueues = new Set([...LIMITED_QUEUES.map((q) => q.name), ...input.faults.flatMap((f) => (f.pause ? [f.pause.queue] : []))]);
  const flow = checkFlow(await loadFlowAttempts(input.admin, [...flowQueues]), input.faults);
  violations.push(...flow.violations);

  // 13-16. Jobs that build on jobs: dependencies, releases, batch callbacks, results.
  const graphs = checkGraphs(await loadGraphAudit(input.admin), { resultsRequired: input.resultsRequired ?? false });
  violations.push(...graphs.violations);

  // 17-20. Durable jobs: no recorded step runs again, every re-execution explained, transactional
  // steps once, every durable job ends and every wait gets its event or times out rightly.
  const steps = checkSteps(await loadStepAudit(input.admin), input.faults);
  violations.push(...steps.violations);

  // 7. Workers survive what they can survive.
  for (const e of input.unexpectedExits) {
    if (e.duringStartup) continue;
    add("workers survive faults", `${e.name} (pid ${e.pid}) exited by itself (code ${e.code}, signal ${e.signal}): ${e.stderrTail.slice(-500)}`);
  }

  return {
    violations,
    finished,
    notKept,
    transactional,
    attempts: rows.attempts.length,
    duplicates,
    staleRefused,
    lateWritesOverwritten,
    recovery: {
      kill: recoveryFor(input.faults, "kill", attemptOf),
      zombie: recoveryFor(input.faults, "zombie", attemptOf),
      partition: recoveryFor(input.faults, "partition", attemptOf),
      reset: recoveryFor(input.faults, "reset", attemptOf),
    },
    producerDuplicates,
    hangs: { n: hangs.length, endedAfter: percentiles(hangTimes) },
    halfOpen: halfOpenLiveness(input.faults, input.logs),
    overlaps: {
      avoidable: split.counts.avoidable,
      unavoidable: { frozen: split.counts.frozen, killed: split.counts.killed },
      avoidableAround,
      timeline: split.timeline,
    },
    graphs: {
      dependents: graphs.result.dependents,
      batches: graphs.result.batches,
      runOnFailure: graphs.result.runOnFailure,
      results: graphs.result.results,
      step: percentiles(graphs.result.stepMs),
    },
    steps: {
      ...steps.result,
      suspensions: {
        sleeps: steps.result.suspensions.sleeps,
        waits: steps.result.suspensions.waits,
        wakeToStart: percentiles(steps.result.suspensions.wakeToStartMs),
      },
    },
    flow: {
      ...flow.result,
      probes: {
        n: flow.result.probes.n,
        probeJobs,
        slotBack: percentiles(flow.result.probes.slotBackMs),
        nextStart: percentiles(flow.result.probes.nextStartMs),
        bounds: { slotBackMs: SLOT_BACK_MS, nextStartMs: NEXT_START_MS },
        notMeasured: flow.result.probes.notMeasured,
      },
    },
  };
}

const NO_OVERLAP = "no attempt starts while another runs unsignalled";
const MAX_OVERLAPS_LISTED = 100;

function describeOverlap(o: Overlap): string {
  const r = o.running;
  const who = `attempt ${o.started.attempt} (${o.started.w}) started ${o.started.t - r.t} ms after attempt ${r.attempt} (${r.w})`;
  const what = o.order === "stale" ? "a stale start: the newer attempt was running" : "whose signal had not fired";
  const after = r.until === null ? "it was never seen to stop" : `it stopped ${r.until - o.started.t} ms later by ${r.by}`;
  return `${who}, ${what}; ${after}; faults on the older attempt's worker meanwhile (from its start): ${o.faults.map((f) => f.text).join(", ") || "none"}`;
}

function halfOpenLiveness(faults: FaultRecord[], logs: LogLine[]): CheckResult["halfOpen"] {
  const back: number[] = [];
  const lasted: number[] = [];
  for (const f of faults.filter((f) => f.kind === "partition" && f.detail === "half_open")) {
    const answered = logs
      .filter(
        (l): l is Extract<LogLine, { ev: "report" }> =>
          l.ev === "report" && l.accepted !== null && l.sentAt >= f.at && l.w.startsWith(`${f.target}/`),
      )
      .map((l) => l.t);
    lasted.push(f.durationMs ?? 0);
    back.push(answered.length ? Math.min(...answered) - f.at : (f.durationMs ?? 0));
  }
  return { n: back.length, backAfter: percentiles(back), faultLasted: percentiles(lasted) };
}

/** Time from the fault to the next attempt's claim, for each attempt the worker held. */
function recoveryFor(faults: FaultRecord[], kind: FaultRecord["kind"], attemptOf: (job: string, n: number) => AttemptRow | undefined): Recovery {
  const ended: number[] = [];
  const running: number[] = [];
  let finishedAnyway = 0;
  for (const f of faults.filter((f) => f.kind === kind)) {
    for (const h of f.held) {
      const a = attemptOf(h.job, h.attempt);
      const next = attemptOf(h.job, h.attempt + 1);
      if (a && RECOVERED.includes(a.outcome) && next) {
        ended.push(Math.max(0, a.ended - f.at));
        running.push(Math.max(0, next.started - f.at));
      } else finishedAnyway++;
    }
  }
  return { n: running.length, toLeaseEnded: percentiles(ended), toRunningAgain: percentiles(running), finishedAnyway };
}

function percentiles(values: number[]): Percentiles {
  const v = [...values].sort((x, y) => x - y);
  const q = (p: number) => (v.length ? Math.round(v[Math.min(v.length - 1, Math.ceil(p * v.length) - 1)]!) : null);
  return { p50: q(0.5), p99: q(0.99), max: v.length ? Math.round(v[v.length - 1]!) : null };
}
