/**
 * GET /v1/jobs answers one bounded page: at most `limit` jobs and about `maxBytes` of JSON
 * (always at least one job), with `next`, the cursor that continues it, or null when the
 * list has ended. Rows are read in chunks sized from the rows seen so far, so a page of
 * large jobs does not size far more than it can send; each chunk's statement stops at the
 * bytes left of the page, so the columns of jobs past it never reach this process.
 */
import type { Leasehold } from "leasehold/internal/client";
import type { ListedJob } from "leasehold/internal/jobs/types";
import * as store from "leasehold/internal/store/index";

/** Rows read by the first statement: a payload may be 1 MiB, so few when payloads are asked for. */
const FIRST_CHUNK_ROWS = { withPayload: 10, without: 200 };
const MAX_CHUNK_ROWS = 1_000;

export interface Page {
  jobs: ListedJob[];
  next: string | null;
}

/** `query` was checked at the route (its schema and limit). */
export async function listPage(lh: Leasehold, query: Omit<store.ListJobsFilter, "before"> & { before?: string }, maxBytes: number): Promise<Page> {
  const jobs: ListedJob[] = [];
  let bytes = 0;
  let before = query.before;
  let chunk = Math.min(query.limit, query.includePayload ? FIRST_CHUNK_ROWS.withPayload : FIRST_CHUNK_ROWS.without);
  for (;;) {
    const read = await store.listJobsWithin(
      lh.pool,
      { ...query, limit: chunk, before },
      { maxBytes: maxBytes - bytes, atLeastOne: jobs.length === 0 },
    );
    jobs.push(...read.jobs);
    bytes += read.bytes;
    if (read.cut) return { jobs, next: jobs.at(-1)!.id };
    if (read.jobs.length < chunk) return { jobs, next: null };
    if (jobs.length >= query.limit) return { jobs, next: jobs.at(-1)!.id };
    before = jobs.at(-1)!.id;
    const perRow = bytes / jobs.length;
    chunk = Math.max(1, Math.min(query.limit - jobs.length, MAX_CHUNK_ROWS, Math.ceil((maxBytes - bytes) / perRow)));
  }
}
