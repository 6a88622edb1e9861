/**
 * Instant cancel for remote workers. A remote worker has no database session to LISTEN on,
 * so while it holds jobs it keeps one cancel poll open (POST /v1/worker/cancels); the server's
 * own LISTEN session (the one long-polling claims share, claim-waiter.ts) hears the cancel
 * notices of migration 014 ("id:attempt:worker id") and answers the poll of that worker at
 * once. A notice for a worker with no poll open here is dropped: the poll's first check, or
 * the worker's next heartbeat, finds the cancel in the database.
 */
import { parseCancelNotice, type CancelNotice } from "leasehold/internal/store/cancels";
import type { AttemptRef } from "leasehold/internal/store/finish";

/** Why a cancel poll's wait ended. "recheck": notices may have been lost (the LISTEN session reconnected). */
export type CancelWaitResult = "noticed" | "recheck" | "timeout" | "aborted" | "closed";

export interface CancelWatch {
  /** Cancels of this worker's attempts heard since the watch began. */
  readonly noticed: AttemptRef[];
  /** Resolves at the first notice (or one already heard), after `ms`, on abort, or when the server closes. */
  wait(ms: number, signal: AbortSignal): Promise<CancelWaitResult>;
  stop(): void;
}

interface Watcher {
  noticed: AttemptRef[];
  wake(why: "noticed" | "recheck" | "closed"): void;
  pending?: "noticed" | "recheck" | "closed";
}

export class CancelWaiter {
  /** Worker id → its open cancel polls (usually one). */
  private readonly watchers = new Map<string, Set<Watcher>>();
  private closed = false;

  /** A notice on the cancel channel; undefined after the LISTEN session (re)connected. */
  notice(payload: string | undefined): void {
    if (payload === undefined) {
      for (const set of this.watchers.values()) for (const w of set) w.wake("recheck");
      return;
    }
    const notice: CancelNotice | undefined = parseCancelNotice(payload);
    if (!notice) return;
    for (const w of this.watchers.get(notice.workerId) ?? []) {
      w.noticed.push({ id: notice.id, attempt: notice.attempt });
      w.wake("noticed");
    }
  }

  /**
   * Starts hearing the cancels of `workerId`'s attempts; made before the poll's first check of
   * the database, so that a cancel landing between that check and the wait is not missed.
   */
  watch(workerId: string): CancelWatch {
    let resolveWait: ((why: CancelWaitResult) => void) | undefined;
    const watcher: Watcher = {
      noticed: [],
      wake: (why) => {
        if (resolveWait) resolveWait(why);
        else watcher.pending ??= why;
      },
    };
    if (this.closed) watcher.pending = "closed";
    let set = this.watchers.get(workerId);
    if (!set) this.watchers.set(workerId, (set = new Set()));
    set.add(watcher);
    const stop = () => {
      set.delete(watcher);
      if (set.size === 0 && this.watchers.get(workerId) === set) this.watchers.delete(workerId);
    };
    return {
      noticed: watcher.noticed,
      stop,
      wait: (ms, signal) => {
        if (watcher.pending) return Promise.resolve(watcher.pending);
        if (signal.aborted) return Promise.resolve("aborted");
        return new Promise<CancelWaitResult>((resolve) => {
          const timer = setTimeout(() => done("timeout"), Math.max(0, ms));
          const onAbort = () => done("aborted");
          const done = (why: CancelWaitResult) => {
            clearTimeout(timer);
            signal.removeEventListener("abort", onAbort);
            resolveWait = undefined;
            resolve(why);
          };
          resolveWait = done;
          signal.addEventListener("abort", onAbort);
        });
      },
    };
  }

  /** The server stops: open cancel polls answer at once. */
  close(): void {
    this.closed = true;
    for (const set of this.watchers.values()) for (const w of set) w.wake("closed");
  }
}
