/**
 * The events durable jobs wait for (chaos/durable-workload.ts): each is sent after the delay its
 * plan chose, counted from its job's enqueue landing (so it comes, as a rule, before the job's
 * wait begins) or from the sender seeing the job suspended in its wait (after it began; a wait
 * that timed out before it was seen gets its event then, after the timeout). A send that fails (the database restarting, a terminated connection) is sent again
 * until it lands; one that landed although its answer was lost lands twice, which a wait must
 * bear (it takes the first). Runs in the harness beside the producer, through its own client.
 */
import type { Leasehold, NewJob } from "../packages/leasehold/src/index.js";
import type { ChaosPayload } from "./workload.js";

const TICK_MS = 50;

interface Due {
  event: string;
  seq: number;
  at: number;
  tries: number;
}

export class EventSender {
  private due: Due[] = [];
  /** Events to send once their job is seen suspended in its wait: the delay, by event. */
  private watching = new Map<string, { seq: number; afterMs: number }>();
  private stopped = false;
  private loop?: Promise<void>;
  private lastLook = 0;
  /** Events sent (answered), sends retried, and planned never to be sent (timeout path). */
  sent = 0;
  retries = 0;
  neverSent = 0;

  constructor(
    private readonly lh: Leasehold,
    private readonly log: (line: string) => void,
  ) {}

  /** The producer's jobs that landed: their events are due after each plan's delay. */
  schedule(jobs: NewJob[]): void {
    const now = Date.now();
    for (const job of jobs) {
      const { durable: plan, seq } = job.payload as ChaosPayload;
      if (!plan) continue;
      if (plan.send === null) this.neverSent++;
      else if (plan.send.from === "suspended") this.watching.set(plan.event, { seq, afterMs: plan.send.afterMs });
      else this.due.push({ event: plan.event, seq, at: now + plan.send.afterMs, tries: 0 });
    }
  }

  /** Events not sent yet: due, or waiting for their job to suspend. */
  get pending(): number {
    return this.due.length + this.watching.size;
  }

  start(): void {
    this.loop = this.run();
  }

  /** Stops (after the drain: every job that needed its event has ended). */
  async stop(): Promise<void> {
    this.stopped = true;
    await this.loop;
  }

  private async run(): Promise<void> {
    while (!this.stopped) {
      if (this.watching.size > 0 && Date.now() - this.lastLook >= LOOK_EVERY_MS) await this.look();
      const now = Date.now();
      const ready = this.due.filter((d) => d.at <= now);
      this.due = this.due.filter((d) => d.at > now);
      for (const d of ready) {
        try {
          await this.lh.sendEvent(d.event, { seq: d.seq });
          this.sent++;
        } catch (err) {
          this.retries++;
          if (this.retries % 10 === 1) this.log(`events: send failed, retrying: ${String(err)}`);
          this.due.push({ ...d, tries: d.tries + 1, at: Date.now() + Math.min(100 * 2 ** d.tries, 2_000) });
        }
      }
      await new Promise((r) => setTimeout(r, TICK_MS));
    }
  }

  /** Which watched jobs are suspended in their wait, or past it (timed out unseen): their events are then due. */
  private async look(): Promise<void> {
    this.lastLook = Date.now();
    const names = [...this.watching.keys()];
    try {
      const { rows } = await this.lh.pool.query<{ event: string }>(
        `SELECT wait ->> 'event' AS event FROM jobs WHERE state = 'suspended' AND wait ->> 'event' = ANY($1::text[])
         UNION
         SELECT event FROM job_steps WHERE state = 'succeeded' AND event = ANY($1::text[])`,
        [names],
      );
      const now = Date.now();
      for (const { event } of rows) {
        const w = this.watching.get(event);
        if (!w) continue;
        this.watching.delete(event);
        this.due.push({ event, seq: w.seq, at: now + w.afterMs, tries: 0 });
      }
    } catch {
      // the database may be restarting: look again next time
    }
  }
}

/** How often the sender looks for the jobs it watches (suspended in their wait). */
const LOOK_EVERY_MS = 250;
