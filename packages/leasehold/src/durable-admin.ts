/**
 * The client's operations on durable jobs from outside them (docs/durable-callbacks.md):
 * completing a callback, and re-running a finished job from a named step. Inputs are checked
 * here, once; the store's answer becomes the typed error a caller branches on.
 */
import { CallbackRefusedError, JobNotFoundError, JobStateError, ValidationError } from "./errors.js";
import { checkCallbackToken } from "./jobs/callbacks.js";
import { checkJobId } from "./jobs/ids.js";
import { checkStepName, serializeEventData } from "./jobs/steps.js";
import type { Queryable } from "./store/db.js";
import * as store from "./store/index.js";

export async function completeCallback(db: Queryable, token: string, data: unknown): Promise<void> {
  checkCallbackToken(token, "completeCallback");
  const dataJson = serializeEventData(data, "completeCallback");
  const outcome = await store.completeCallback(db, token, dataJson);
  if (outcome !== "completed") throw new CallbackRefusedError(outcome);
}

export interface RerunOptions {
  /** Which call of that name, from 0 (a step in a loop); default 0. */
  occurrence?: number;
  /** Who asked, for the audit trail (the server puts its caller's token name here). */
  requestedBy?: string;
}

export type Rerun = Omit<store.JobRerun, "stepsDropped"> & { stepsDropped: number };

export async function rerunFromStep(db: Queryable, id: string, step: string, options: RerunOptions = {}): Promise<Rerun> {
  checkJobId(id);
  checkStepName(step, "rerunFromStep");
  const occurrence = options.occurrence ?? 0;
  if (!Number.isInteger(occurrence) || occurrence < 0 || occurrence > 100_000) {
    throw new ValidationError(`rerunFromStep: occurrence must be an integer from 0, got ${String(occurrence)}`);
  }
  const requestedBy = options.requestedBy ?? null;
  if (requestedBy !== null && (typeof requestedBy !== "string" || requestedBy.length > 200)) {
    throw new ValidationError("rerunFromStep: requestedBy must be a string of at most 200 characters");
  }
  let result: store.RerunResult;
  try {
    result = await store.rerunFromStep(db, { id, step, occurrence, requestedBy });
  } catch (err) {
    if ((err as { code?: string }).code === "23505") throw new JobStateError(`job ${id} cannot be re-run: an unfinished job holds its unique key`);
    throw err;
  }
  if (result === "not_found") throw new JobNotFoundError(id);
  if (result === "job_not_finished") throw new JobStateError(`job ${id} has not finished; only a succeeded, cancelled or dead job can be re-run`);
  if (result === "step_not_recorded") {
    const steps = await store.recordedStepNames(db, id);
    const named = steps.map((s) => (s.occurrence > 0 ? `"${s.name}" (occurrence ${s.occurrence})` : `"${s.name}"`));
    throw new ValidationError(
      `job ${id} recorded no step "${step}"${occurrence > 0 ? ` (occurrence ${occurrence})` : ""}; ` +
        (named.length > 0 ? `its recorded steps are ${named.join(", ")}` : "it recorded no steps"),
    );
  }
  return result.rerun;
}
