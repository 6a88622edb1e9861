/**
 * The fault injectors. Each one acts on real processes, real connections or the real server,
 * and returns a record of what it did; for faults that take a worker away (kill, zombie,
 * partition, reset) the record lists the attempts that worker held at that moment, so the report
 * can measure how long each job took to run again.
 */
import pg from "pg";
import type { EmbeddedPostgres } from "../packages/cli/src/embedded/postgres.js";
import type { Leasehold } from "../packages/leasehold/src/index.js";
import { STARTUP_GRACE_MS } from "../packages/leasehold/src/maintenance/watchdog.js";
import type { NatsServer } from "../test/harness/nats-server.js";
import type { ChaosOptions, FaultKind } from "./config.js";
import type { Producer } from "./producer.js";
import type { TcpProxy } from "./proxy.js";
import type { Supervised } from "./supervisor.js";
import { QUEUE, probeJob } from "./workload.js";
import { PROBE_QUEUE } from "./flow-queues.js";

export interface HeldAttempt {
  job: string;
  attempt: number;
}

export interface FaultRecord {
  kind: FaultKind;
  target?: string;
  /** The target process (kill, zombie, partition, reset), as its JSONL log's hello line names it. */
  pid?: number;
  /** When the fault hit (ms since epoch, wall clock like every process log). */
  at: number;
  /** How long the fault lasted (stop to continue, cut to restore, down to up), when it has a length. */
  durationMs?: number;
  /** When it was lifted (SIGCONT sent, proxy restored), for faults that act on one process over a window. */
  endedAt?: number;
  detail?: string;
  held: HeldAttempt[];
  skipped?: string;
  /** The `pause` fault: its window on the database's clock (flow-checks.ts). */
  pause?: PauseWindow;
  /** The `flow_kill` fault: the job whose slot the killed worker held, and the job waiting for it. */
  probe?: SlotProbe;
}

/** Microseconds since the epoch on the database's clock, the clock of the audit trail. */
export interface PauseWindow {
  queue: string;
  /** The pause statement's now() (queues.paused_at): the pause committed after it. */
  pausedAtUs: number;
  /** now() of a statement sent once pauseQueue had returned: the pause had committed before it. */
  confirmedUs: number;
  /** now() of a statement sent before resumeQueue was called: the resume committed after it. Unset: never resumed. */
  resumeFromUs?: number;
  /** Jobs of the queue waiting then: what the pause held back. */
  waitingAtResume?: number;
}

export interface SlotProbe {
  queue: string;
  /** The attempt that held the queue's only slot on the killed worker. */
  blocker: HeldAttempt;
  /** The job enqueued while that slot was held: only that slot kept it from starting. */
  blocked: string;
}

export interface FaultContext {
  options: ChaosOptions;
  /** The harness's own client (pause and resume, the probe's jobs). */
  lh: Leasehold;
  /** The faults injected so far. */
  faults: FaultRecord[];
  /** flow_kill faults so far: numbers their probe jobs. */
  probes: number;
  random: () => number;
  workers: Supervised[];
  watchdogs: Supervised[];
  proxies: Map<string, TcpProxy>;
  server: EmbeddedPostgres;
  /** --dispatch nats: the nats-server, and each worker's proxy to it. */
  nats?: NatsServer;
  natsProxies: Map<string, TcpProxy>;
  /** A direct pool for the harness (application_name chaos-harness), search_path on the chaos schema. */
  admin: pg.Pool;
  databaseUrl: string;
  schema: string;
  producer: Producer;
  /** No new idle transaction before this moment. */
  idleTxnFreeAt: number;
  /** Restores and background parts of faults still under way; awaited before the drain. */
  pending: Promise<unknown>[];
  log: (line: string) => void;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function between(random: () => number, lo: number, hi: number): number {
  return Math.round(lo + random() * (hi - lo));
}

function pickFree(ctx: FaultContext, from: Supervised[]): Supervised | undefined {
  const free = from.filter((s) => s.ready && !s.busy);
  return free.length ? free[Math.floor(ctx.random() * free.length)] : undefined;
}

/** The attempts a worker holds now, read directly (not through its proxy). */
async function heldBy(ctx: FaultContext, workerId: string | undefined): Promise<HeldAttempt[]> {
  if (!workerId) return [];
  try {
    const { rows } = await ctx.admin.query<{ id: string; attempt: number }>(
      "SELECT id::text, attempt FROM jobs WHERE state = 'running' AND locked_by = $1",
      [workerId],
    );
    return rows.map((r) => ({ job: r.id, attempt: r.attempt }));
  } catch {
    return []; // the database is down (a restart under way): this fault goes unmeasured
  }
}

/**
 * Longer than the lease, so the watchdog reaps what the worker held: sometimes the worker
 * comes back before the new attempt has written downstream, sometimes after (then the
 * downstream fence must refuse its late write).
 */
const pastTheLease = (ctx: FaultContext) => between(ctx.random, ctx.options.leaseMs * 1.3, ctx.options.leaseMs * 4);

async function kill(ctx: FaultContext): Promise<FaultRecord> {
  const w = pickFree(ctx, ctx.workers);
  if (!w) return { kind: "kill", at: Date.now(), held: [], skipped: "no worker free" };
  const restartAfter = between(ctx.random, 300, 3_000);
  const pid = w.pid;
  const at = Date.now();
  const workerId = w.workerId;
  w.kill9(restartAfter);
  return { kind: "kill", target: w.spec.name, pid, at, detail: `restart after ${restartAfter} ms`, held: await heldBy(ctx, workerId) };
}

async function zombie(ctx: FaultContext): Promise<FaultRecord> {
  const w = pickFree(ctx, ctx.workers);
  if (!w) return { kind: "zombie", at: Date.now(), held: [], skipped: "no worker free" };
  const durationMs = pastTheLease(ctx);
  w.busy = true;
  const pid = w.pid;
  const at = Date.now();
  w.signal("SIGSTOP");
  const record: FaultRecord = { kind: "zombie", target: w.spec.name, pid, at, durationMs, held: await heldBy(ctx, w.workerId) };
  ctx.pending.push(
    sleep(durationMs).then(() => {
      w.signal("SIGCONT");
      record.endedAt = Date.now();
      w.busy = false;
    }),
  );
  return record;
}

async function partition(ctx: FaultContext): Promise<FaultRecord> {
  const w = pickFree(ctx, ctx.workers);
  if (!w) return { kind: "partition", at: Date.now(), held: [], skipped: "no worker free" };
  const proxy = ctx.proxies.get(w.spec.name)!;
  const durationMs = pastTheLease(ctx);
  const modes = ["cut", "stall", "half_open"] as const;
  const mode = modes[Math.floor(ctx.random() * modes.length)]!;
  w.busy = true;
  const pid = w.pid;
  const at = Date.now();
  if (mode === "cut") proxy.cut();
  else if (mode === "stall") proxy.stall();
  else proxy.stallExisting();
  const record: FaultRecord = { kind: "partition", target: w.spec.name, pid, at, durationMs, detail: mode, held: await heldBy(ctx, w.workerId) };
  ctx.pending.push(
    sleep(durationMs).then(() => {
      proxy.restore();
      record.endedAt = Date.now();
      w.busy = false;
    }),
  );
  return record;
}

/**
 * A connection blip: every connection the worker has (its pool, its listener and liveness
 * session, and its NATS connection with --dispatch nats) is reset, and none is accepted for
 * 2-5 s, then the network heals. Shorter than a partition: the watchdog sees the liveness
 * session end and recovers the worker's jobs after its grace, often before the lease would
 * run out, while the worker is alive and may still be running them.
 */
async function reset(ctx: FaultContext): Promise<FaultRecord> {
  const w = pickFree(ctx, ctx.workers);
  if (!w) return { kind: "reset", at: Date.now(), held: [], skipped: "no worker free" };
  const proxies = [ctx.proxies.get(w.spec.name), ctx.natsProxies.get(w.spec.name)].filter((p): p is TcpProxy => !!p);
  const durationMs = between(ctx.random, 2_000, 5_000);
  w.busy = true;
  const pid = w.pid;
  const at = Date.now();
  for (const p of proxies) p.cut();
  const record: FaultRecord = { kind: "reset", target: w.spec.name, pid, at, durationMs, held: await heldBy(ctx, w.workerId) };
  ctx.pending.push(
    sleep(Math.max(0, at + durationMs - Date.now())).then(() => {
      for (const p of proxies) p.restore();
      record.endedAt = Date.now();
      w.busy = false;
    }),
  );
  return record;
}

async function pgRestart(ctx: FaultContext): Promise<FaultRecord> {
  const at = Date.now();
  await ctx.server.stop(); // fast shutdown: open transactions roll back
  await sleep(between(ctx.random, 300, 1_500));
  await ctx.server.start(); // same data directory, same port
  return { kind: "pg_restart", at, durationMs: Date.now() - at, held: [] };
}

/** Terminates the backends of the library's connections (workers, listeners, watchdogs), several rounds. */
async function terminateStorm(ctx: FaultContext): Promise<FaultRecord> {
  const at = Date.now();
  let terminated = 0;
  const rounds = between(ctx.random, 3, 6);
  for (let i = 0; i < rounds; i++) {
    try {
      const { rows } = await ctx.admin.query<{ n: number }>(
        `SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity
          WHERE datname = current_database() AND pid <> pg_backend_pid()
            AND application_name IN ('leasehold', 'leasehold-listen', 'leasehold-worker')`,
      );
      terminated += rows[0]!.n;
    } catch {
      // the server is restarting; the storm goes on
    }
    await sleep(between(ctx.random, 50, 400));
  }
  return { kind: "terminate_storm", at, durationMs: Date.now() - at, detail: `${terminated} backends in ${rounds} rounds`, held: [] };
}

/** One handler on a live worker stops making progress and never settles; the worker beats on. */
async function hang(ctx: FaultContext): Promise<FaultRecord> {
  const w = pickFree(ctx, ctx.workers);
  if (!w || !w.message({ type: "hang" })) return { kind: "hang", at: Date.now(), held: [], skipped: "no worker free" };
  return { kind: "hang", target: w.spec.name, at: Date.now(), detail: "the next handler it starts hangs", held: [] };
}

async function watchdogKill(ctx: FaultContext): Promise<FaultRecord> {
  // Now and then every watchdog at once: expired leases then wait for the restarts.
  const all = ctx.random() < 0.25;
  const targets = all ? ctx.watchdogs.filter((w) => w.ready && !w.busy) : [pickFree(ctx, ctx.watchdogs)].filter((w): w is Supervised => !!w);
  if (targets.length === 0) return { kind: "watchdog_kill", at: Date.now(), held: [], skipped: "no watchdog free" };
  const at = Date.now();
  for (const w of targets) w.kill9(between(ctx.random, 500, 3_000));
  return { kind: "watchdog_kill", target: targets.map((t) => t.spec.name).join(","), at, held: [] };
}

/** An idle transaction with a snapshot: vacuum cannot remove anything newer while it lives. */
async function idleTransaction(ctx: FaultContext): Promise<FaultRecord> {
  const at = Date.now();
  const durationMs = ctx.options.idleTxnMs;
  // One at a time, with as long a gap after each, so the report can compare throughput with and without.
  if (at < ctx.idleTxnFreeAt) return { kind: "idle_txn", at, held: [], skipped: "an idle transaction was open recently" };
  ctx.idleTxnFreeAt = at + 2 * durationMs;
  const client = new pg.Client({ connectionString: ctx.databaseUrl, application_name: "chaos-idle-txn" });
  client.on("error", () => {});
  const held = (async () => {
    try {
      await client.connect();
      await client.query("BEGIN ISOLATION LEVEL REPEATABLE READ");
      await client.query(`SELECT count(*) FROM ${ctx.schema}.jobs`);
      await sleep(durationMs);
      await client.query("COMMIT");
    } catch {
      // a restart or a storm ended it early; the run goes on
    } finally {
      await client.end().catch(() => {});
    }
  })();
  ctx.pending.push(held);
  return { kind: "idle_txn", at, durationMs, held: [] };
}

async function burst(ctx: FaultContext): Promise<FaultRecord> {
  const at = Date.now();
  const drainRate = await ctx.producer.drainRate(ctx.admin);
  const rate = drainRate * 1.5;
  // 4-8 s at that rate, or shorter if this burst's share of the jobs runs out first.
  const { jobs, durationMs } = ctx.producer.boost(rate, between(ctx.random, 4_000, 8_000));
  return { kind: "burst", at, durationMs, detail: `${jobs} jobs at ${rate.toFixed(0)}/s (1.5x drain ${drainRate.toFixed(0)}/s)`, held: [] };
}

/** nats-server stopped (a crash, or a clean stop) and started again on the same store. */
async function natsRestart(ctx: FaultContext): Promise<FaultRecord> {
  if (!ctx.nats) return { kind: "nats_restart", at: Date.now(), held: [], skipped: "no NATS in this run" };
  const at = Date.now();
  const crash = ctx.random() < 0.5;
  await ctx.nats.stop(crash);
  await sleep(between(ctx.random, 300, 3_000));
  await ctx.nats.resume();
  return { kind: "nats_restart", at, durationMs: Date.now() - at, detail: crash ? "SIGKILL" : "SIGTERM", held: [] };
}

/**
 * One worker cut off from NATS only (its database connections stay up): it must fall back to
 * polling, and the messages it held unacknowledged are redelivered after ack_wait.
 */
async function natsPartition(ctx: FaultContext): Promise<FaultRecord> {
  const w = pickFree(ctx, ctx.workers);
  if (!w) return { kind: "nats_partition", at: Date.now(), held: [], skipped: "no worker free" };
  const proxy = ctx.natsProxies.get(w.spec.name);
  if (!proxy) return { kind: "nats_partition", at: Date.now(), held: [], skipped: "no NATS in this run" };
  const durationMs = between(ctx.random, 2_000, 12_000);
  const mode = ctx.random() < 0.5 ? "cut" : "stall";
  w.busy = true;
  const at = Date.now();
  if (mode === "cut") proxy.cut();
  else proxy.stall();
  ctx.pending.push(
    sleep(durationMs).then(() => {
      proxy.restore();
      w.busy = false;
    }),
  );
  return { kind: "nats_partition", target: w.spec.name, at, durationMs, detail: mode, held: [] };
}

/** Retries `fn` through restarts and storms, for up to `ms`. */
async function retrying<T>(fn: () => Promise<T>, ms = 60_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    try {
      return await fn();
    } catch (err) {
      if (Date.now() > deadline) throw err;
      await sleep(200);
    }
  }
}

const US = (col: string) => `(extract(epoch FROM ${col}) * 1000000)::bigint::text`;

/**
 * Pauses `queue` and reads its window's start on the database's clock, the audit trail's:
 * `pausedAtUs` (the pause statement's now()) and `confirmedUs` (a statement sent after
 * pauseQueue returned) bracket the pause's commit.
 */
export async function pauseWindow(lh: Leasehold, admin: pg.Pool, queue: string, retryMs = 60_000): Promise<PauseWindow> {
  await retrying(() => lh.pauseQueue(queue, { create: true }), retryMs);
  const { rows } = await retrying(
    () =>
      admin.query<{ paused_us: string; now_us: string }>(
        `SELECT ${US("paused_at")} AS paused_us, ${US("now()")} AS now_us FROM queues WHERE name = $1`,
        [queue],
      ),
    retryMs,
  );
  return { queue, pausedAtUs: Number(rows[0]!.paused_us), confirmedUs: Number(rows[0]!.now_us) };
}

/** Resumes the window's queue; `resumeFromUs` is read before (the resume commits after it). */
export async function resumeWindow(lh: Leasehold, admin: pg.Pool, window: PauseWindow, retryMs = 60_000): Promise<void> {
  const { rows } = await retrying(
    () =>
      admin.query<{ now_us: string; waiting: number }>(
        `SELECT ${US("now()")} AS now_us, (SELECT count(*)::int FROM jobs WHERE queue = $1 AND state = 'waiting') AS waiting`,
        [window.queue],
      ),
    retryMs,
  );
  window.resumeFromUs = Number(rows[0]!.now_us);
  window.waitingAtResume = rows[0]!.waiting;
  await retrying(() => lh.resumeQueue(window.queue), retryMs);
}

/**
 * The main queue paused for 3-6 s (flow control): no claim anywhere may start one of its jobs
 * from the moment the pause has committed until the resume commits.
 */
async function pause(ctx: FaultContext): Promise<FaultRecord> {
  const queue = QUEUE;
  const durationMs = between(ctx.random, 3_000, 6_000);
  const at = Date.now();
  const window = await pauseWindow(ctx.lh, ctx.admin, queue);
  const record: FaultRecord = { kind: "pause", target: queue, at, durationMs, held: [], pause: window };
  ctx.pending.push(
    (async () => {
      await sleep(Math.max(0, at + durationMs - Date.now()));
      // A queue left paused would never drain: keep trying for as long as a drain may take.
      await resumeWindow(ctx.lh, ctx.admin, window, ctx.options.drainTimeoutMs);
      record.endedAt = Date.now();
      record.detail = `${window.waitingAtResume} jobs waiting at the resume`;
    })(),
  );
  return record;
}

/** How long the probe's blocker runs: well past the crash-detection bound, far inside its own lease. */
const PROBE_BLOCKER_MS = 6_000;
/** The blocker's lease: only crash detection, not the lease running out, can free its slot in seconds. */
const PROBE_LEASE_MS = 30_000;

async function until<T>(what: () => Promise<T | undefined>, ms: number): Promise<T | undefined> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    const v = await what().catch(() => undefined);
    if (v !== undefined) return v;
    await sleep(50);
  }
  return undefined;
}

/**
 * A crashed worker's slot in a limited queue comes back with crash detection: a long job (the
 * blocker) takes the probe queue's only slot; a second job (the blocked) is enqueued, which only
 * that slot keeps waiting; the worker holding the blocker is killed (and restarted only after the
 * crash-detection bound, so its start-up reconciliation cannot be what frees the slot). The
 * checker bounds the time from the kill to the slot's end and to the next start in the queue.
 * Injected where crash detection works at its pace: every watchdog up, no database restart in
 * its start-up grace (the watchdogs call no one lost then).
 */
async function flowKill(ctx: FaultContext): Promise<FaultRecord> {
  const skip = (why: string): FaultRecord => ({ kind: "flow_kill", at: Date.now(), held: [], skipped: why });
  const lastRestart = Math.max(0, ...ctx.faults.filter((f) => f.kind === "pg_restart").map((f) => f.at + (f.durationMs ?? 0)));
  await sleep(Math.max(0, lastRestart + STARTUP_GRACE_MS + 1_000 - Date.now()));
  // A restarted process takes its time to start on a loaded machine (tens of seconds seen).
  if (!(await until(async () => ctx.watchdogs.every((w) => w.ready) || undefined, 30_000))) return skip("a watchdog is down");
  const empty = await until(async () => {
    const { rows } = await ctx.admin.query<{ n: number }>("SELECT count(*)::int AS n FROM jobs WHERE queue = $1", [PROBE_QUEUE.name]);
    return rows[0]!.n === 0 || undefined;
  }, 15_000);
  if (!empty) return skip("the probe queue is still busy");
  const n = ++ctx.probes;
  const [blocker] = await retrying(
    () => ctx.lh.enqueueMany([probeJob(-2 * n + 1, PROBE_BLOCKER_MS, ctx.options.maxAttempts, PROBE_LEASE_MS)]),
    10_000,
  );
  // Held by a worker no other fault has (a frozen or cut-off holder may be waited out: its
  // lease holds, or its job moves on to another worker).
  const holder = await until(async () => {
    const { rows } = await ctx.admin.query<{ locked_by: string; attempt: number }>(
      "SELECT locked_by, attempt FROM jobs WHERE id = $1 AND state = 'running'",
      [blocker!.id],
    );
    const w = rows[0] && ctx.workers.find((s) => s.workerId === rows[0]!.locked_by);
    return w && w.ready && !w.busy ? { ...rows[0]!, w } : undefined;
  }, 20_000);
  if (!holder) return skip(`the blocker job ${blocker!.id} was not held by a free worker`);
  const w = holder.w;
  const [blocked] = await retrying(() => ctx.lh.enqueueMany([probeJob(-2 * n, 50, ctx.options.maxAttempts)]), 10_000);
  // Let the workers ask for it and be held back by the limit.
  await sleep(300);
  const held = await heldBy(ctx, w.workerId);
  const pid = w.pid;
  const at = Date.now();
  w.kill9(between(ctx.random, 5_000, 6_000));
  await until(async () => {
    const { rows } = await ctx.admin.query("SELECT 1 FROM jobs WHERE id = $1 AND state = 'waiting'", [blocked!.id]);
    return rows.length === 0 || undefined;
  }, 15_000);
  return {
    kind: "flow_kill",
    target: w.spec.name,
    pid,
    at,
    detail: `blocker ${blocker!.id}, blocked ${blocked!.id}`,
    held,
    probe: { queue: PROBE_QUEUE.name, blocker: { job: blocker!.id, attempt: holder.attempt }, blocked: blocked!.id },
  };
}

export const INJECTORS: Record<FaultKind, (ctx: FaultContext) => Promise<FaultRecord>> = {
  nats_restart: natsRestart,
  nats_partition: natsPartition,
  kill,
  zombie,
  partition,
  reset,
  pg_restart: pgRestart,
  terminate_storm: terminateStorm,
  watchdog_kill: watchdogKill,
  idle_txn: idleTransaction,
  burst,
  hang,
  pause,
  flow_kill: flowKill,
};

/** Each kind at least this often in a short run; longer runs repeat the mix. */
const MIX: Record<FaultKind, number> = {
  kill: 4,
  zombie: 4,
  partition: 4,
  reset: 4,
  pg_restart: 2,
  terminate_storm: 3,
  watchdog_kill: 3,
  idle_txn: 1,
  burst: 2,
  hang: 3,
  pause: 1,
  flow_kill: 3, // skipped when its blocker lands on a worker under another fault
  nats_restart: 3,
  nats_partition: 4,
};

/** The kinds of a run: the NATS faults only with --dispatch nats. */
function mixOf(options: ChaosOptions): [FaultKind, number][] {
  return (Object.entries(MIX) as [FaultKind, number][]).filter(([k]) => options.dispatch === "nats" || !k.startsWith("nats_"));
}

/** One round of the mix: every kind as often as MIX says. */
export function faultsPerRound(options: ChaosOptions): number {
  return mixOf(options).reduce((a, [, n]) => a + n, 0);
}

/** The order of faults for a run: the mix, shuffled, repeated until the window is full. */
export function faultPlan(options: ChaosOptions, random: () => number): FaultKind[] {
  const count = Math.max(1, Math.floor(options.faultWindowMs / options.faultEveryMs));
  const round = mixOf(options).flatMap(([k, n]) => Array<FaultKind>(n).fill(k));
  const plan: FaultKind[] = [];
  while (plan.length < count) {
    const r = [...round];
    for (let i = r.length - 1; i > 0; i--) {
      const j = Math.floor(random() * (i + 1));
      [r[i], r[j]] = [r[j]!, r[i]!];
    }
    plan.push(...r);
  }
  return plan.slice(0, Math.max(count, round.length));
}

/**
 * Faults the harness injects by the clock, evenly through the window and alongside the others,
 * not in the plan's order: a pause in the drain's tail (the plan may run past the window) would
 * hold nothing back.
 */
export const TIMED_FAULTS: ReadonlySet<FaultKind> = new Set(["pause"]);
