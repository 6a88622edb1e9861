/**
 * A durable task for crash tests ("trip"), run by a worker process that is killed (-9) on the
 * way and by the worker that finishes the job: the same code in both. Every step body writes a
 * side-effect row (app.effects: job, step, attempt) in its own statement, the transactional step
 * writes app.ledger in its transaction, so a test counts how often each ran.
 *
 * The payload's `hold` stops the first worker at one point (`mark` tells the test it is there):
 *   after-reserve  the "reserve" step is recorded; the handler waits forever after it
 *   record-charge  the "charge" body has run; its record is never sent (the child's transport holds it)
 *   in-book        inside the "book" transaction, its write made, before its commit
 *   after-book     the "book" transaction has committed with its record
 * `sleep` and `wait` add a ctx.sleep and a ctx.waitForEvent("trip.approved", { trip }) after "book".
 */
import type pg from "pg";
import type { Duration } from "../../packages/leasehold/src/jobs/steps.js";
import type { JobContext } from "../../packages/leasehold/src/worker/context.js";

export type HoldPoint = "after-reserve" | "record-charge" | "in-book" | "after-book";
export interface TripPayload {
  trip: string;
  hold?: HoldPoint;
  sleep?: Duration;
  wait?: boolean;
}

export const APP_TABLES = (app: string) => `
  CREATE TABLE ${app}.effects (job_id bigint NOT NULL, step text NOT NULL, attempt int NOT NULL);
  CREATE TABLE ${app}.ledger (job_id bigint NOT NULL, attempt int NOT NULL);`;

const forever = () => new Promise<never>(() => {});

/**
 * The trip handler. `holding`: honour `hold` (the first worker; the one that finishes does not).
 * `holdRecord(jobId)`: asks the transport to keep this job's "charge" record from being sent.
 */
export function tripTask(
  pool: pg.Pool,
  app: string,
  o: { holding: boolean; mark?: (point: string, jobId: string) => void; holdRecord?: (jobId: string) => void },
) {
  const effect = (ctx: JobContext, step: string) =>
    pool.query(`INSERT INTO ${app}.effects VALUES ($1, $2, $3)`, [ctx.jobId, step, ctx.attempt]).then(() => step);
  return async (p: TripPayload, ctx: JobContext) => {
    const hold = o.holding ? p.hold : undefined;
    await ctx.step("reserve", () => effect(ctx, "reserve"));
    if (hold === "after-reserve") {
      o.mark?.("after-reserve", ctx.jobId);
      return forever();
    }
    if (hold === "record-charge") o.holdRecord?.(ctx.jobId);
    await ctx.step("charge", () => effect(ctx, "charge"));
    await ctx.step.transaction("book", async (tx) => {
      await tx.query(`INSERT INTO ${app}.ledger VALUES ($1, $2)`, [ctx.jobId, ctx.attempt]);
      if (hold === "in-book") {
        o.mark?.("in-book", ctx.jobId);
        return forever();
      }
      return "booked";
    });
    if (hold === "after-book") {
      o.mark?.("after-book", ctx.jobId);
      return forever();
    }
    if (p.sleep) await ctx.sleep("cool off", p.sleep);
    const approval = p.wait ? await ctx.waitForEvent<{ by: string }>("approval", { event: "trip.approved", match: { trip: p.trip } }) : null;
    await ctx.step("notify", () => effect(ctx, "notify"));
    return { trip: p.trip, approvedBy: approval?.by ?? null };
  };
}
