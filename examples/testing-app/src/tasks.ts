/**
 * The app's job handlers. Delivery is at-least-once: a handler may run more than once for a
 * job, so each one is idempotent (the mailer dedups on an idempotency key).
 */
import { defineTask } from "leasehold";
import { z } from "zod";

export interface Mail {
  to: string;
  subject: string;
  /** The same key twice is the same mail: a provider sends it once. */
  idempotencyKey: string;
}

export interface Mailer {
  send(mail: Mail, signal: AbortSignal): Promise<void>;
}

export interface ImportProgress {
  done: number;
  of: number;
}

/** The app's tasks, typed by their schemas: the worker and the tests run them behind them. */
export function createTasks(mailer: Mailer) {
  return [
    defineTask({
      name: "send-welcome-email",
      schema: z.object({ to: z.email() }),
      handler: async (payload, ctx) => {
        await mailer.send({ to: payload.to, subject: "Welcome!", idempotencyKey: `welcome:${ctx.jobId}` }, ctx.signal);
      },
      // A mail provider that is down for a minute should not cost the whole budget.
      backoff: { baseMs: 30_000, factor: 2, maxMs: 3600_000, jitter: 0 },
    }),
    defineTask({
      name: "send-digest",
      schema: z.object({ to: z.email() }),
      handler: async (payload, ctx) => {
        await mailer.send({ to: payload.to, subject: "Your daily digest", idempotencyKey: `digest:${ctx.jobId}` }, ctx.signal);
      },
    }),
    defineTask({
      name: "import-contacts",
      schema: z.object({ contacts: z.array(z.email()) }),
      handler: async (payload, ctx) => {
        // Resume where an earlier attempt stopped.
        const from = (ctx.previousCheckpoint as { next: number } | null)?.next ?? 0;
        for (let i = from; i < payload.contacts.length; i++) {
          ctx.signal.throwIfAborted();
          await mailer.send({ to: payload.contacts[i]!, subject: "You were invited", idempotencyKey: `invite:${ctx.jobId}:${i}` }, ctx.signal);
          ctx.progress({ done: i + 1, of: payload.contacts.length } satisfies ImportProgress);
          ctx.checkpoint({ next: i + 1 });
        }
        return { imported: payload.contacts.length - from };
      },
    }),
  ] as const;
}
