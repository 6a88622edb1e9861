/**
 * The error for a job id no table holds: JobNotKeptError when the id was issued (the job
 * existed and finished, and its record is not kept), else JobNotFoundError. Asked only once a
 * job was not found, so a found job pays nothing.
 */
import { JobNotFoundError, JobNotKeptError } from "../errors.js";
import type { Queryable } from "../store/db.js";
import { jobIdIssued } from "../store/admin.js";

export async function missingJobError(db: Queryable, id: string): Promise<JobNotFoundError> {
  return (await jobIdIssued(db, id)) ? new JobNotKeptError(id) : new JobNotFoundError(id);
}
