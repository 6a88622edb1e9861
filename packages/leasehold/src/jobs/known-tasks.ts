/**
 * Enqueue's check that some worker runs a job's task in its queue: a typo'd task name would
 * otherwise be accepted and wait forever. The client's `unknownTasks` says what to do about
 * it: "warn" (the default: the returned job carries `warnings`; nothing is logged), "refuse"
 * (NoWorkerForTaskError, nothing enqueued) or "allow" (no check at all).
 *
 * The known tasks are read from the database at most every REFRESH_MS and kept, so an
 * enqueue of known tasks costs no round trip. A task not found is looked up again (a worker
 * may have just started), at most every MISS_REFRESH_MS, so a stream of enqueues of a task
 * no worker runs costs one extra statement a second, not one each.
 */
import { ConfigError, NoWorkerForTaskError } from "../errors.js";
import type { Queryable } from "../store/db.js";
import { knownTasks } from "../store/handlers.js";
import type { EnqueueWarning } from "./types.js";
import { closestName } from "./validate.js";

export type UnknownTasksMode = "warn" | "refuse" | "allow";
export const UNKNOWN_TASKS_MODES: readonly UnknownTasksMode[] = ["warn", "refuse", "allow"];

/** A task announced by a worker seen within this long counts as handled ("recent"). */
export const RECENT_WORKER_MS = 24 * 3600_000;
/** How long the known tasks are kept before they are read again. */
export const REFRESH_MS = 30_000;
/** A task not among the kept ones is looked up again at most this often. */
export const MISS_REFRESH_MS = 1_000;

/** The mode given (an option or LEASEHOLD_UNKNOWN_TASKS), checked; default "warn". */
export function unknownTasksMode(value: unknown, where: string): UnknownTasksMode {
  if (value === undefined || value === "") return "warn";
  if (!UNKNOWN_TASKS_MODES.includes(value as UnknownTasksMode)) {
    throw new ConfigError(`${where} must be one of ${UNKNOWN_TASKS_MODES.join(", ")} (got ${JSON.stringify(value)})`);
  }
  return value as UnknownTasksMode;
}

interface Snapshot {
  /** Task → queues of the recent workers that announced it (empty: known from task_policies only). */
  queues: Map<string, Set<string>>;
  readAt: number;
}

/** The warnings of one check, by queue and task. */
export type Warnings = Map<string, EnqueueWarning[]>;

const key = (queue: string, task: string) => `${queue}\u0000${task}`;

export class KnownTasks {
  private snapshot?: Snapshot;
  private loading?: Promise<Snapshot>;
  private lastMissRead = -Infinity;

  constructor(
    private readonly db: Queryable,
    readonly mode: UnknownTasksMode,
    private readonly clock: () => number = () => performance.now(),
  ) {}

  /**
   * Checks the jobs' (queue, task) pairs: the warnings by pair (empty when every task is
   * handled, and always in "allow" mode). In "refuse" mode, throws NoWorkerForTaskError for
   * the first unhandled job (`where` names it, e.g. "job 3") instead.
   */
  async check(jobs: readonly { queue: string; task: string }[], where: (index: number) => string): Promise<Warnings> {
    if (this.mode === "allow" || jobs.length === 0) return new Map();
    let warnings: Warnings;
    try {
      const kept = this.snapshot && this.clock() - this.snapshot.readAt < REFRESH_MS ? this.snapshot : undefined;
      warnings = judge(kept ?? (await this.read()), jobs);
      if (warnings.size > 0 && kept && this.clock() - this.lastMissRead >= MISS_REFRESH_MS) {
        this.lastMissRead = this.clock();
        warnings = judge(await this.read(), jobs);
      }
    } catch (err) {
      // In "warn" mode the check is advice: a failure to read it must not fail the enqueue
      // (which meets the same database and says what is wrong with it).
      if (this.mode === "refuse") throw err;
      return new Map();
    }
    if (this.mode === "refuse" && warnings.size > 0) {
      const i = jobs.findIndex((j) => warnings.has(key(j.queue, j.task)));
      const w = warnings.get(key(jobs[i]!.queue, jobs[i]!.task))![0]!;
      const prefix = jobs.length > 1 ? `${where(i)}: ` : "";
      throw new NoWorkerForTaskError(w.task, w.queue, `${prefix}refused: ${w.message}; nothing was enqueued (unknownTasks: "refuse")`);
    }
    return warnings;
  }

  private read(): Promise<Snapshot> {
    this.loading ??= (async () => {
      try {
        const rows = await knownTasks(this.db, { recentMs: RECENT_WORKER_MS });
        const queues = new Map(rows.map((r) => [r.task, new Set(r.queues)]));
        this.snapshot = { queues, readAt: this.clock() };
        return this.snapshot;
      } finally {
        this.loading = undefined;
      }
    })();
    return this.loading;
  }
}

/** The warnings for the distinct pairs of `jobs` against a snapshot. */
function judge(snap: Snapshot, jobs: readonly { queue: string; task: string }[]): Warnings {
  const warnings: Warnings = new Map();
  let lastQueue: string | undefined;
  let lastTask: string | undefined;
  for (const { queue, task } of jobs) {
    // Batches are mostly one task in one queue: skip the repeats without a lookup.
    if (queue === lastQueue && task === lastTask) continue;
    lastQueue = queue;
    lastTask = task;
    const queues = snap.queues.get(task);
    if (queues !== undefined && (queues.size === 0 || queues.has(queue))) continue;
    const k = key(queue, task);
    if (warnings.has(k)) continue;
    warnings.set(k, [queues === undefined ? unknownTask(snap, queue, task) : notInQueue(queues, queue, task)]);
  }
  return warnings;
}

function unknownTask(snap: Snapshot, queue: string, task: string): EnqueueWarning {
  const didYouMean = closestName(task, snap.queues.keys());
  const none = snap.queues.size === 0 ? " (no worker has announced any task yet)" : "";
  return {
    code: "unknown_task",
    queue,
    task,
    message:
      `no worker seen in the last 24 h handles task "${task}"${none}: its jobs wait until one that does starts` +
      (didYouMean ? ` (did you mean "${didYouMean}"?)` : ""),
    ...(didYouMean && { didYouMean }),
  };
}

function notInQueue(queues: Set<string>, queue: string, task: string): EnqueueWarning {
  const didYouMean = closestName(queue, queues);
  const listed = [...queues].sort().map((q) => `"${q}"`);
  return {
    code: "task_not_in_queue",
    queue,
    task,
    message:
      `no worker seen in the last 24 h runs task "${task}" in queue "${queue}" (its workers take ${listed.join(", ")}): ` +
      "its jobs wait until one that does starts" +
      (didYouMean ? ` (did you mean queue "${didYouMean}"?)` : ""),
    ...(didYouMean && { didYouMean }),
  };
}

/** Attaches each job's warnings (by input index; the same array for every job of a pair). */
export function attachWarnings<J extends { warnings?: EnqueueWarning[] }>(
  enqueued: J[],
  jobs: readonly { queue: string; task: string }[],
  warnings: Warnings,
): J[] {
  if (warnings.size === 0) return enqueued;
  return enqueued.map((job, i) => {
    const w = warnings.get(key(jobs[i]!.queue, jobs[i]!.task));
    return w ? { ...job, warnings: w } : job;
  });
}
