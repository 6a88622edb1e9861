/**
 * Waiting jobs that no live worker can run (their task, in their queue, is taken by no worker
 * alive now), with the name the user probably meant: what `stats`, `jobs watch`, the
 * dashboard and `doctor` show.
 */
import type { Queryable } from "../store/db.js";
import { jobsWithoutHandler, knownTasks, type JobsWithoutHandler } from "../store/handlers.js";
import { RECENT_WORKER_MS } from "../jobs/known-tasks.js";
import { closestName } from "../jobs/validate.js";

/** A worker seen within this long is alive (it beats every few seconds, idle or not). */
export const HANDLER_ALIVE_MS = 60_000;

export interface HandlerGap extends JobsWithoutHandler {
  /** The closest task a worker announced (in the last 24 h, or ever declared), when this task is not one. */
  didYouMeanTask: string | null;
  /** The closest queue of this task's recent workers, when the task is known but not in this queue. */
  didYouMeanQueue: string | null;
}

export async function handlerGaps(db: Queryable): Promise<HandlerGap[]> {
  const gaps = await jobsWithoutHandler(db, { aliveMs: HANDLER_ALIVE_MS });
  if (gaps.length === 0) return [];
  const known = new Map((await knownTasks(db, { recentMs: RECENT_WORKER_MS })).map((t) => [t.task, t.queues]));
  return gaps.map((g) => {
    const queues = known.get(g.task);
    return {
      ...g,
      didYouMeanTask: queues === undefined ? (closestName(g.task, known.keys()) ?? null) : null,
      didYouMeanQueue: queues === undefined ? null : (closestName(g.queue, queues) ?? null),
    };
  });
}

/** One line for a terminal or a log: "3 waiting jobs of task "reszie" in queue "default": no live worker runs it (did you mean "resize"?)". */
export function describeGap(g: HandlerGap): string {
  const counts = [g.waiting > 0 && `${g.waiting} ready`, g.scheduled > 0 && `${g.scheduled} scheduled`].filter(Boolean).join(", ");
  const hint =
    g.didYouMeanTask !== null
      ? ` (did you mean task "${g.didYouMeanTask}"?)`
      : g.didYouMeanQueue !== null
        ? ` (did you mean queue "${g.didYouMeanQueue}"?)`
        : "";
  return `${counts} job(s) of task "${g.task}" in queue "${g.queue}": no live worker runs this task in this queue${hint}`;
}
