/**
 * drain(): runs the queue's jobs with the registered handlers, through a real worker (the
 * library's own claim, heartbeat, retry and report paths), until no job it can run is ready.
 *
 * Rounds: enqueue what schedules have due, start a worker on the queues that have ready jobs,
 * let it run until none of its jobs is ready, running or unreported, stop it; repeat while a
 * round finds work (a handler may enqueue into another queue). Jobs whose run time is still
 * ahead (a delay, a retry's backoff) wait, unless `advanceClock` moves the queue's clock to
 * them. Each round reads the queue's state from the database, so what counts as "ready" is
 * exactly what a claim would take.
 *
 * Durable jobs (docs/durable.md) run for real: a sleep or a wait suspends its job; the drain
 * wakes suspended jobs whose time came (the watchdog's work on a real deployment) and, with
 * `advanceClock`, moves the clock to a sleep's end or a wait's timeout. An event sent meanwhile
 * (`queue.sendEvent`) wakes its waiters at once. A job still suspended at the end is in `left`.
 *
 * Dependent jobs (docs/flows.md) need nothing of their own: a parent's success releases its
 * blocked children in the same transaction, so they are ready (and found by this round or the
 * next) as soon as it is reported. A blocked job whose parents cannot run is reported in `left`
 * with the unfinished parents it waits for.
 */
import { AssertionError } from "node:assert";
import type pg from "pg";
import type { Handler, JobContext, JobOutcome, JsonValue, Leasehold, TaskDefinition, TaskHandlers, Worker } from "../index.js";
import type { TestClock } from "./clock.js";
import { handlerOf } from "./inline.js";
import { wakeSuspendedJobs } from "../store/steps.js";

export interface DrainOptions {
  /**
   * Also run jobs that are not due yet (a delay, a retry's backoff): when nothing is ready, move
   * the queue's clock to the earliest such job and go on. Schedule ticks on the way are enqueued
   * at their times and run too, but the clock is never moved to a schedule's next tick only, so
   * a drain ends. Sleeps and waits with a timeout end on the way; a wait without a timeout
   * waits for its event. Needs the fake clock (a superuser). Default false: only what is due now runs.
   */
  advanceClock?: boolean;
  /** Queues to run; default every queue. */
  queues?: string[];
  /** Handlers running at once; default 1, so jobs run one by one in claim order (priority, run time, id). */
  concurrency?: number;
  /** Stop with an error after this many attempts (a job that enqueues itself forever); default 1,000. */
  maxJobs?: number;
  /** Stop with an error (naming the running jobs) after this long; default 30,000 ms. */
  timeoutMs?: number;
  /**
   * Tasks the test means to have no handler. A due job of any other task without a handler
   * makes drain() throw an AssertionError naming the tasks (a forgotten handler must fail the
   * test); jobs of these tasks are left, in `left` with `why: "no_handler"`. Default none.
   */
  leaveUnhandled?: string[];
}

/** One attempt the drain ran, and how it ended. */
export interface DrainedJob {
  id: string;
  task: string;
  queue: string;
  payload: JsonValue;
  attempt: number;
  /** The worker's outcome: `succeeded`, `superseded`, `waiting` (failed, will retry), `dead`, `cancelled`, `suspended` (a sleep or a wait), ... */
  state: JobOutcome["state"];
  /** What the handler threw, if it threw. */
  error?: unknown;
}

/**
 * An unfinished job the drain left: not due yet, no handler registered for its task, outside
 * `queues`, due but held back by its queue's flow control (paused, or a limit the drain cannot
 * wait out), blocked: waiting for parents that were left too, or suspended: sleeping, or waiting
 * for an event.
 */
export interface LeftJob {
  id: string;
  task: string;
  queue: string;
  runAt: Date;
  why: "not_due" | "no_handler" | "other_queue" | "flow_control" | "blocked" | "suspended";
  /** A blocked job's parents that have not ended (each is itself in `left`, or running elsewhere). */
  waitingFor?: string[];
  /** A suspended job's sleep or wait: its step, its kind, the event it waits for, when it wakes (`runAt`). */
  suspended?: { step: string; kind: string; event?: string };
}

export interface DrainResult {
  /** Every attempt run, in the order they ended. */
  ran: DrainedJob[];
  /** The attempts among `ran` that did not succeed (failed and will retry, dead, cancelled, ...); a suspension is not a failure. */
  failed: DrainedJob[];
  /** Waiting, blocked and suspended jobs left behind (at most 100), oldest first. */
  left: LeftJob[];
}

export const DRAIN_DEFAULTS = { concurrency: 1, maxJobs: 1_000, timeoutMs: 30_000 };
type DrainSettings = typeof DRAIN_DEFAULTS & DrainOptions;
/** How often a round re-reads the queue besides the worker's events (a backstop, not the pace). */
const CHECK_INTERVAL_MS = 25;
const LEFT_SHOWN = 100;

const READY_QUEUES = `
SELECT DISTINCT queue FROM jobs
 WHERE state = 'waiting' AND run_at <= now() AND task = ANY($1::text[]) AND ($2::text[] IS NULL OR queue = ANY($2::text[]))`;

/**
 * A round is over when none of its jobs is ready or held by its worker in the database. A ready
 * job of a queue under flow control (paused, limited, keyed) may be one no claim can take yet
 * (its key's earlier job is delayed, a rate window is full): there the worker's own word that its
 * last claim came back short decides.
 */
const ROUND_BUSY = `
SELECT EXISTS (
  SELECT 1 FROM jobs
   WHERE (state = 'waiting' AND run_at <= now() AND task = ANY($1::text[]) AND queue = ANY($2::text[])
          AND NOT EXISTS (SELECT 1 FROM queues AS fq WHERE fq.name = jobs.queue AND (fq.flow OR fq.held_until > now())))
      OR (state = 'running' AND locked_by = $3)) AS busy`;

/**
 * The next time something becomes due: a waiting job's run time, a sleep's end, a wait's
 * timeout. A wait without a timeout has a deadline 3650 days (the longest delay) after it
 * began, so at least that long after its job was made: that is no time to move the clock to,
 * only its event wakes it.
 */
const NEXT_DUE = `
SELECT min(run_at) AS at FROM jobs
 WHERE (state = 'waiting' OR (state = 'suspended' AND (wait->>'kind' = 'sleep' OR run_at < created_at + interval '3649 days')))
   AND run_at > now() AND task = ANY($1::text[]) AND ($2::text[] IS NULL OR queue = ANY($2::text[]))`;

const LEFT = `
SELECT id::text, task, queue, run_at, run_at > now() AS later,
       EXISTS (SELECT 1 FROM queues AS fq WHERE fq.name = jobs.queue AND (fq.flow OR fq.held_until > now())) AS held,
       CASE WHEN state = 'blocked' THEN ARRAY(
         SELECT d.parent_id::text FROM job_dependencies AS d JOIN jobs AS p ON p.id = d.parent_id
          WHERE d.child_id = jobs.id ORDER BY d.parent_id) END AS waiting_for,
       CASE WHEN state = 'suspended' THEN wait END AS wait
  FROM jobs WHERE state IN ('waiting', 'blocked', 'suspended') ORDER BY run_at, id LIMIT $1`;

/** Due jobs of tasks with no handler, by task (within the drained queues). */
const UNHANDLED = `
SELECT task, count(*)::int AS jobs FROM jobs
 WHERE state = 'waiting' AND run_at <= now() AND NOT task = ANY($1::text[]) AND ($2::text[] IS NULL OR queue = ANY($2::text[]))
 GROUP BY task ORDER BY task`;

export interface DrainHost {
  lh: Leasehold;
  /** A pool on the Leasehold schema of the test database. */
  pool: pg.Pool;
  clock: TestClock;
  handlers: TaskHandlers;
}

export async function drain(host: DrainHost, options: DrainOptions = {}): Promise<DrainResult> {
  const settings: DrainSettings = {
    ...options,
    concurrency: options.concurrency ?? DRAIN_DEFAULTS.concurrency,
    maxJobs: options.maxJobs ?? DRAIN_DEFAULTS.maxJobs,
    timeoutMs: options.timeoutMs ?? DRAIN_DEFAULTS.timeoutMs,
  };
  const tasks = Object.keys(host.handlers);
  if (tasks.length === 0) throw new Error("drain() has no handlers to run: pass them to createTestQueue({ handlers }) or queue.register()");
  const queues = options.queues ?? null;
  const deadline = Date.now() + settings.timeoutMs;
  const ran: DrainedJob[] = [];
  const errors = new Map<string, unknown>();
  const handlers = recordingErrors(host.handlers, errors);
  const scheduler = host.lh.scheduler();
  for (;;) {
    await scheduler.runOnce();
    // The watchdog's turn, which a drain's worker runs without: sleeps and waits whose time came.
    await wakeSuspendedJobs(host.pool, { limit: settings.maxJobs });
    const ready = (await host.pool.query<{ queue: string }>(READY_QUEUES, [tasks, queues])).rows.map((r) => r.queue);
    if (ready.length > 0) {
      const before = ran.length;
      await runRound(host, handlers, ready, tasks, settings, deadline, ran, errors);
      // A round that ran nothing found only jobs flow control holds back: let time move them.
      if (ran.length > before) continue;
    }
    if (!options.advanceClock) break;
    const { rows } = await host.pool.query<{ at: Date | null }>(NEXT_DUE, [tasks, queues]);
    if (rows[0]!.at === null) break;
    // A millisecond past it: a Date drops the microseconds of run_at, and a clock moved to the
    // millisecond before it would find nothing due (then nothing left to move to).
    await host.clock.advanceTo(new Date(rows[0]!.at.getTime() + 1));
  }
  await checkUnhandled(host.pool, tasks, queues, options.leaveUnhandled ?? []);
  const handled = new Set(tasks);
  const left = (
    await host.pool.query<{
      id: string;
      task: string;
      queue: string;
      run_at: Date;
      later: boolean;
      held: boolean;
      waiting_for: string[] | null;
      wait: { kind: string; step: string; event?: string } | null;
    }>(LEFT, [LEFT_SHOWN])
  ).rows.map((r): LeftJob =>
    r.wait !== null
      ? { id: r.id, task: r.task, queue: r.queue, runAt: r.run_at, why: "suspended", suspended: suspensionOf(r.wait) }
      : r.waiting_for !== null
        ? { id: r.id, task: r.task, queue: r.queue, runAt: r.run_at, why: "blocked", waitingFor: r.waiting_for }
        : {
            id: r.id,
            task: r.task,
            queue: r.queue,
            runAt: r.run_at,
            why: !handled.has(r.task)
              ? "no_handler"
              : queues && !queues.includes(r.queue)
                ? "other_queue"
                : !r.later && r.held
                  ? "flow_control"
                  : "not_due",
          },
  );
  return { ran, failed: ran.filter((j) => j.state !== "succeeded" && j.state !== "superseded" && j.state !== "suspended"), left };
}

function suspensionOf(wait: { kind: string; step: string; event?: string }): NonNullable<LeftJob["suspended"]> {
  return { step: wait.step, kind: wait.kind, ...(typeof wait.event === "string" ? { event: wait.event } : {}) };
}

/** Throws an AssertionError naming the tasks of due jobs that have no handler and were not expected to be left. */
async function checkUnhandled(pool: pg.Pool, tasks: string[], queues: string[] | null, expected: string[]): Promise<void> {
  const { rows } = await pool.query<{ task: string; jobs: number }>(UNHANDLED, [tasks, queues]);
  const missing = rows.filter((r) => !expected.includes(r.task));
  if (missing.length === 0) return;
  const names = missing.map((r) => r.task);
  throw new AssertionError({
    message:
      `drain() found due jobs of tasks with no handler: ${missing.map((r) => `${r.task} (${r.jobs} job${r.jobs === 1 ? "" : "s"})`).join(", ")}. ` +
      `Register their handlers, or pass drain({ leaveUnhandled: ${JSON.stringify(names)} }) if the test means to leave them`,
    actual: names,
    expected: [],
    operator: "drain",
  });
}

/** One worker, on the queues that have ready jobs, until none of its jobs is ready or in its hands. */
async function runRound(
  host: DrainHost,
  handlers: TaskHandlers,
  queues: string[],
  tasks: string[],
  settings: DrainSettings,
  deadline: number,
  ran: DrainedJob[],
  errors: Map<string, unknown>,
): Promise<void> {
  const worker: Worker = host.lh.worker({
    handlers,
    queues,
    concurrency: settings.concurrency,
    // The drain does the scheduler's work itself, and no lease runs out within a test.
    watchdog: false,
    scheduler: false,
    pollIntervalMs: 50,
  });
  let started = ran.length;
  let failure: Error | undefined;
  let settle!: () => void;
  const over = new Promise<void>((resolve) => (settle = resolve));
  worker.on("job:start", () => {
    if (++started > settings.maxJobs && !failure) {
      failure = new Error(
        `drain() ran ${settings.maxJobs} jobs and the queue is still not empty: does a job enqueue another forever? (raise maxJobs if not)`,
      );
      settle();
    }
  });
  worker.on("job:end", (job: { id: string; task: string; queue: string; payload: JsonValue; attempt: number }, outcome: JobOutcome) => {
    const key = `${job.id}:${job.attempt}`;
    const entry: DrainedJob = { id: job.id, task: job.task, queue: job.queue, payload: job.payload, attempt: job.attempt, state: outcome.state };
    if (errors.has(key)) entry.error = errors.get(key);
    errors.delete(key);
    ran.push(entry);
    check();
  });
  // The worker's last claim came back short (nothing more it could take), since its last start.
  let idle = false;
  worker.on("job:start", () => (idle = false));
  worker.on("idle", () => {
    idle = true;
    check();
  });
  let checking = false;
  // Over when the worker holds nothing and the database agrees that nothing of its is ready.
  async function settled(): Promise<boolean> {
    if (worker.inFlightCount > 0 || !idle) return false;
    const { rows } = await host.pool.query<{ busy: boolean }>(ROUND_BUSY, [tasks, queues, worker.id]);
    return !rows[0]!.busy && worker.inFlightCount === 0;
  }
  function check(): void {
    if (checking || failure) return;
    checking = true;
    settled().then(
      (done) => {
        checking = false;
        if (done) settle();
      },
      (err: unknown) => {
        checking = false;
        failure = err instanceof Error ? err : new Error(String(err));
        settle();
      },
    );
  }
  const backstop = setInterval(check, CHECK_INTERVAL_MS);
  const timer = setTimeout(
    () => {
      const running = [...worker.inFlight.values()].map((e) => `job ${e.job.id} (${e.job.task})`);
      failure ??= new Error(
        `drain() timed out after ${settings.timeoutMs} ms` + (running.length > 0 ? `; still running: ${running.join(", ")}` : "") + " (timeoutMs)",
      );
      settle();
    },
    Math.max(0, deadline - Date.now()),
  );
  try {
    await worker.start();
    check();
    await over;
  } finally {
    clearInterval(backstop);
    clearTimeout(timer);
    // A timed-out handler is aborted (reason "shutdown") and its job released, not left running.
    await worker.stop(failure ? 1_000 : undefined);
  }
  if (failure) throw failure;
}

/** The same handlers, each keeping what it threw, so the drain can return the error itself. */
function recordingErrors(handlers: TaskHandlers, errors: Map<string, unknown>): TaskHandlers {
  const wrapped: TaskHandlers = {};
  for (const [task, registration] of Object.entries(handlers)) {
    const handler = handlerOf(registration);
    const recording: Handler = async (payload: unknown, ctx: JobContext) => {
      try {
        return await handler(payload, ctx);
      } catch (err) {
        errors.set(`${ctx.jobId}:${ctx.attempt}`, err);
        throw err;
      }
    };
    wrapped[task] = typeof registration === "function" ? recording : ({ ...registration, handler: recording } satisfies TaskDefinition);
  }
  return wrapped;
}
