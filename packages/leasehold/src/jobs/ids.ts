/**
 * Job ids are PostgreSQL bigints, carried as decimal strings (exact beyond 2^53). A string of
 * up to 19 digits can still exceed bigint, which the database would refuse with an error; so
 * ids are checked against the maximum here, where the input arrives. A well-formed id beyond
 * bigint names no job: looking one up is "not found", as for any id that does not exist.
 */
import { JobNotFoundError, ValidationError } from "../errors.js";

export const MAX_JOB_ID = "9223372036854775807";
const DIGITS = /^[1-9][0-9]{0,18}$/;

export function isJobId(id: unknown): id is string {
  if (typeof id !== "string" || !DIGITS.test(id)) return false;
  // Equal-length decimal strings without leading zeros compare like the numbers.
  return id.length < MAX_JOB_ID.length || id <= MAX_JOB_ID;
}

/**
 * `what` names the value in the error. A job id (the default) beyond bigint is a
 * JobNotFoundError; any other id-shaped value (a cursor) beyond it is a ValidationError.
 */
export function checkJobId(id: unknown, what = "job id"): asserts id is string {
  if (isJobId(id)) return;
  if (what === "job id" && typeof id === "string" && /^[1-9][0-9]*$/.test(id)) throw new JobNotFoundError(id);
  throw new ValidationError(`${what} must be a positive integer no larger than ${MAX_JOB_ID} (got ${JSON.stringify(id)})`);
}
