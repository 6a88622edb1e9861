/**
 * Durable jobs in the chaos workload (issue 27): a share of the producer's plain jobs run
 * through ctx.step, ctx.step.transaction, ctx.sleep and ctx.waitForEvent, so the faults land
 * between and inside steps, while suspended, and while waiting for an event.
 *
 * Each plain step writes an execution row (step_runs) on its own connection when its body
 * begins, before it can be recorded: the checker (chaos/step-checks.ts) compares those rows
 * with job_steps to prove that a recorded step never runs again, and to explain every run that
 * was not recorded. The transactional step writes its row (step_effects) inside its
 * transaction: exactly once per job. The event a job waits for is sent by the harness's
 * EventSender at a random time after the job was enqueued: before or after the wait begins.
 */
import type { FencedWriteDb, JobContext } from "../packages/leasehold/src/index.js";
import type { JsonValue } from "../packages/leasehold/src/jobs/types.js";
import { STEP_EFFECTS_TABLE, STEP_RUNS_TABLE } from "./config.js";

/** The share of the producer's plain jobs that are durable. */
export const DURABLE_SHARE = 0.15;
/** Durable jobs whose wait has a short timeout: their event comes late or never (the timeout path). */
const TIMEOUT_SHARE = 0.25;
/** The timeout path's wait: long enough to see an early event, short enough to time out before a late one. */
const WAIT_TIMEOUT_MS = 1_500;

/** What a durable job does, in its payload (the checker reads it back from finished_jobs). */
export interface DurablePlan {
  /** Plain steps before the transactional one, then one after the sleep and one after the wait. */
  steps: number;
  /** Work inside each plain step, ms: faults must be able to land inside a step. */
  stepMs: number[];
  sleepMs: number;
  /** The event the job waits for: its own, so no other job's event can wake it. */
  event: string;
  /** The wait's timeout; absent: no timeout (the event is always sent). */
  timeoutMs?: number;
  /**
   * When the harness sends the event (chaos/event-sender.ts): `after` ms from the enqueue landing
   * ("enqueued": mostly before the wait begins) or from the sender seeing the job suspended in its
   * wait ("suspended": after it began); null: never (timeout path only).
   */
  send: { from: "enqueued" | "suspended"; afterMs: number } | null;
}

export function makeDurablePlan(seq: number, random: () => number): DurablePlan {
  const steps = 2 + Math.floor(random() * 3);
  // Two of the plain steps come after the sleep and the wait: steps + 2 bodies in all.
  const stepMs = Array.from({ length: steps + 2 }, () => Math.round(random() < 0.9 ? 10 + random() * 150 : 500 + random() * 2_000));
  const timeout = random() < TIMEOUT_SHARE;
  const plan: DurablePlan = {
    steps,
    stepMs,
    sleepMs: Math.round(200 + random() * 1_300),
    event: `chaos-event-${seq}`,
    // Half before the wait begins (as a rule), half once the job is seen waiting.
    send: random() < 0.5 ? { from: "enqueued", afterMs: Math.round(random() * 2_000) } : { from: "suspended", afterMs: Math.round(random() * 1_000) },
  };
  if (timeout) {
    plan.timeoutMs = WAIT_TIMEOUT_MS;
    // A third never sent, a third early (received), a third well after the wait began: it times out first.
    const r = random();
    plan.send =
      r < 1 / 3
        ? null
        : r < 2 / 3
          ? { from: "enqueued", afterMs: Math.round(random() * 1_000) }
          : { from: "suspended", afterMs: WAIT_TIMEOUT_MS + 500 + Math.round(random() * 2_000) };
  }
  return plan;
}

/** The names of a durable job's places, in the order its handler takes them. */
export function durablePlaces(plan: DurablePlan): { name: string; kind: "step" | "transaction" | "sleep" | "event" }[] {
  return [
    ...Array.from({ length: plan.steps }, (_, i) => ({ name: `work-${i}`, kind: "step" as const })),
    { name: "effect", kind: "transaction" },
    { name: "nap", kind: "sleep" },
    { name: "after-nap", kind: "step" },
    { name: "signal", kind: "event" },
    { name: "finish", kind: "step" },
  ];
}

export interface DurableResult {
  /** What the wait returned: the event's data, or null if it timed out. */
  received: JsonValue | null;
}

/**
 * Runs a durable job's places in order. `work` sleeps (reporting progress); `schema`-qualified
 * tables, since ctx.step.transaction runs with the server's default search_path.
 */
export async function runDurable(
  plan: DurablePlan,
  ctx: JobContext,
  p: { db: FencedWriteDb; schema: string; worker: string; work: (ms: number) => Promise<void> },
): Promise<DurableResult> {
  const runs = `"${p.schema}".${STEP_RUNS_TABLE}`;
  const effects = `"${p.schema}".${STEP_EFFECTS_TABLE}`;
  let body = 0;
  const plain = (name: string) => {
    const ms = plan.stepMs[body++] ?? 50;
    return ctx.step(name, async () => {
      // The execution, on the process's clock (the moment the body began) and the database's
      // (when the row landed): durable before the step can be recorded.
      await p.db.query(`INSERT INTO ${runs} (job_id, name, attempt, worker_id, began) VALUES ($1, $2, $3, $4, to_timestamp($5::float8 / 1000))`, [
        ctx.jobId,
        name,
        ctx.attempt,
        p.worker,
        Date.now(),
      ]);
      await p.work(ms);
      return { name, attempt: ctx.attempt, worker: p.worker };
    });
  };
  for (let i = 0; i < plan.steps; i++) await plain(`work-${i}`);
  await ctx.step.transaction("effect", async (tx) => {
    await tx.query(`INSERT INTO ${effects} (job_id, attempt, worker_id) VALUES ($1, $2, $3)`, [ctx.jobId, ctx.attempt, p.worker]);
    return { attempt: ctx.attempt, worker: p.worker };
  });
  await ctx.sleep("nap", plan.sleepMs);
  await plain("after-nap");
  const received = await ctx.waitForEvent<JsonValue>("signal", {
    event: plan.event,
    ...(plan.timeoutMs !== undefined && { timeout: plan.timeoutMs }),
  });
  await plain("finish");
  return { received };
}
