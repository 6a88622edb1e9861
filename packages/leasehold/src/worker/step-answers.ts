/**
 * What a sleep or a wait for an event comes to for the attempt that asked, from the store's
 * statements: the one reading of them that a worker on the database (DatabaseTransport) and
 * `leasehold serve` answering a remote worker share, so both give the same answer.
 */
import type pg from "pg";
import * as store from "../store/index.js";
import type { JsonValue } from "../jobs/types.js";
import type { SuspensionAnswer } from "./transport.js";

/** ctx.sleep: suspended (or cancelled on the way); "due": its end had passed; "stale": the attempt had lost its job. */
export async function sleepAnswer(
  db: store.Queryable,
  p: store.SuspendingStep & ({ until: Date } | { ms: number }),
): Promise<SuspensionAnswer | "due"> {
  const ended = await store.suspendForSleep(db, p);
  const state = ended.get(p.id);
  if (state === "suspended" || state === "cancelled") return state;
  // Nothing ended: the sleep's end had passed (recorded, the handler goes on), or the attempt had lost its job.
  const fate = await store.stepFate(db, p);
  return fate.held && fate.recorded?.name === p.name ? "due" : "stale";
}

/** ctx.waitForEvent: the event (or the timeout's null) if the wait is over, else how the suspension ended the attempt. */
export async function eventWaitAnswer(pool: pg.Pool, p: store.EventWait): Promise<{ received: boolean; data: JsonValue | null } | SuspensionAnswer> {
  const { client, release } = await store.checkOut(pool);
  let broken: unknown;
  try {
    const answer = await store.waitForEvent(client, p);
    if (!answer.held) return "stale";
    if ("suspended" in answer) {
      const state = answer.suspended.get(p.id);
      return state === "suspended" || state === "cancelled" ? state : "stale";
    }
    return answer.recorded ? { received: answer.received, data: answer.data } : "stale";
  } catch (err) {
    broken = err;
    throw err;
  } finally {
    release(broken);
  }
}

/** ctx.children: the children's ends once all have ended, else how the suspension ended the attempt. */
export async function childrenAnswer(pool: pg.Pool, p: store.ChildrenStep): Promise<{ ends: store.ChildEndRecord[] } | SuspensionAnswer> {
  const answer = await store.withTransaction(pool, (client) => store.startOrAwaitChildren(client, p));
  if (answer === "stale" || "ends" in answer) return answer;
  return answer.ended === "suspended" || answer.ended === "cancelled" ? answer.ended : "stale";
}
