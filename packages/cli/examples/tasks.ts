/**
 * Example tasks, run by `leasehold dev` when it is given no --tasks module. A tasks module's
 * default export maps task names to handlers: `async (payload, ctx) => ...`.
 *
 * DELIVERY IS AT-LEAST-ONCE: a handler can run more than once for the same job (after a
 * crash, a hang or a network cut, another worker runs it again). Make handlers idempotent and
 * use (ctx.jobId, ctx.attempt) as the dedup key / fencing token for writes elsewhere. Stop
 * when ctx.signal aborts: the lease is gone (or the job was cancelled, or the worker stops).
 */
import type { JobContext, TaskHandlers } from "leasehold";

/** Waits `ms`, or rejects with the abort reason as soon as the signal fires. */
const sleep = (ms: number, signal: AbortSignal) =>
  new Promise<void>((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal.reason);
    };
    const timer = setTimeout(() => {
      signal.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal.addEventListener("abort", onAbort, { once: true });
  });

export default {
  /** Reports progress; it is stored with the next heartbeat (see `leasehold jobs show <id>`). */
  "example.progress": async (payload: { steps?: number }, ctx: JobContext) => {
    const steps = payload.steps ?? 5;
    for (let step = 1; step <= steps; step++) {
      await sleep(600, ctx.signal);
      ctx.progress({ step, of: steps });
      ctx.logger.info(`step ${step} of ${steps}`);
    }
  },

  /**
   * Fails its first `failTimes` attempts, then succeeds: each failure is retried after a
   * backoff (short here: 1 s, then 2 s), and the attempt history shows every try.
   */
  "example.flaky": {
    backoff: { baseMs: 1_000, factor: 2, maxMs: 10_000, jitter: 0 },
    handler: async (payload: { failTimes?: number }, ctx: JobContext) => {
      const failTimes = payload.failTimes ?? 2;
      if (ctx.spentAttempts < failTimes) {
        throw new Error(`simulated failure ${ctx.spentAttempts + 1} of ${failTimes} (it will be retried)`);
      }
      ctx.logger.info(`succeeded on attempt ${ctx.spentAttempts + 1} after ${failTimes} failures`);
    },
  },

  /**
   * A job longer than its lease: heartbeats (every third of the lease) keep it alive, and a
   * checkpoint lets a retry resume where a crashed attempt stopped.
   */
  "example.long": async (payload: { seconds?: number }, ctx: JobContext) => {
    const seconds = payload.seconds ?? 15;
    const from = (ctx.previousCheckpoint as { done?: number } | null)?.done ?? 0;
    if (from > 0) ctx.logger.info(`resuming from the checkpoint at ${from}s`);
    for (let done = from + 1; done <= seconds; done++) {
      await sleep(1_000, ctx.signal);
      ctx.checkpoint({ done });
      ctx.progress({ done, of: seconds });
      if (done % 5 === 0) ctx.logger.info(`${done}s of ${seconds}s done; heartbeats keep the lease alive`);
    }
  },
} satisfies TaskHandlers;
