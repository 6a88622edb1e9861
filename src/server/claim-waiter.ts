/**
 * Long polls: a claim that finds nothing waits until a job may be ready in one of its queues
 * (a NOTIFY on the schema's channel), the poll interval passes, the wait ends or the client
 * goes away. One LISTEN connection serves every waiting request of this server process; the
 * server keeps no job state, so any number of replicas can serve the same database.
 */
import { Listener } from "../worker/listener.js";

/** Re-check at least this often: a job whose run_at passes sends no notification. */
export const LONG_POLL_RECHECK_MS = 1_000;

interface Waiter {
  queues: Set<string>;
  wake: () => void;
}

export class ClaimWaiter {
  private readonly waiters = new Set<Waiter>();
  private listener?: Listener;
  private starting?: Promise<void>;
  /** Set when the server stops: long polls answer at once with what they have. */
  closed = false;

  constructor(
    private readonly connectionString: string,
    private readonly channel: string,
  ) {}

  /** Resolves after `ms`, on a notification for one of `queues`, or when `signal` aborts. */
  async wait(queues: string[], ms: number, signal: AbortSignal): Promise<void> {
    await this.ensureListening();
    if (signal.aborted || this.closed) return;
    await new Promise<void>((resolve) => {
      const waiter: Waiter = { queues: new Set(queues), wake: () => done() };
      const timer = setTimeout(() => done(), Math.min(ms, LONG_POLL_RECHECK_MS));
      const done = () => {
        clearTimeout(timer);
        signal.removeEventListener("abort", done);
        this.waiters.delete(waiter);
        resolve();
      };
      signal.addEventListener("abort", done);
      this.waiters.add(waiter);
    });
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const w of this.waiters) w.wake();
    await this.listener?.stop();
  }

  private ensureListening(): Promise<void> {
    this.starting ??= (async () => {
      this.listener = new Listener(this.connectionString, this.channel, (queue) => {
        for (const w of this.waiters) if (queue === undefined || w.queues.has(queue)) w.wake();
      });
      await this.listener.start();
    })();
    return this.starting;
  }
}
