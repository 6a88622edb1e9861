/**
 * GET /v1/jobs answers one bounded page: at most `limit` jobs and about `maxBytes` of JSON
 * (always at least one job), with `next`, the cursor that continues it, or null when the
 * list has ended. Rows are read in chunks sized from the rows seen so far, so a page of
 * large jobs does not read far more than it can send.
 */
import type { Leasehold, ListJobsOptions } from "leasehold/internal/client";
import type { ListedJob } from "leasehold/internal/jobs/types";

/** Rows read by the first statement: a payload may be 1 MiB, so few when payloads are asked for. */
const FIRST_CHUNK_ROWS = { withPayload: 10, without: 200 };
const MAX_CHUNK_ROWS = 1_000;

export interface Page {
  jobs: ListedJob[];
  next: string | null;
}

export async function listPage(lh: Leasehold, query: ListJobsOptions & { limit: number; includePayload: boolean }, maxBytes: number): Promise<Page> {
  const jobs: ListedJob[] = [];
  let bytes = 0;
  let before = query.before;
  let chunk = Math.min(query.limit, query.includePayload ? FIRST_CHUNK_ROWS.withPayload : FIRST_CHUNK_ROWS.without);
  for (;;) {
    const rows = await lh.listJobs({ ...query, limit: chunk, before });
    for (const row of rows) {
      const size = Buffer.byteLength(JSON.stringify(row)) + 1;
      if (jobs.length > 0 && bytes + size > maxBytes) return { jobs, next: jobs.at(-1)!.id };
      jobs.push(row);
      bytes += size;
    }
    if (rows.length < chunk) return { jobs, next: null };
    if (jobs.length >= query.limit) return { jobs, next: jobs.at(-1)!.id };
    before = rows.at(-1)!.id;
    const perRow = bytes / jobs.length;
    chunk = Math.max(1, Math.min(query.limit - jobs.length, MAX_CHUNK_ROWS, Math.ceil((maxBytes - bytes) / perRow)));
  }
}
