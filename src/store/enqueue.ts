import { quoteIdent, type Queryable } from "./db.js";
import { run, statement, type Statement } from "./sql.js";
import type { NormalizedJob } from "../jobs/validate.js";
import type { EnqueuedJob } from "../jobs/types.js";

/**
 * One INSERT for the whole batch (measured: 10,000 jobs in ~0.1 s). A statement trigger
 * sends one NOTIFY per queue, at commit. A batch with unique keys is inserted with
 * ON CONFLICT: a row whose key belongs to an unfinished job is skipped and answered with that
 * job's id. A batch without keys skips the arbiter check (ON CONFLICT makes every row a
 * speculative insertion, paid even when the key is null).
 *
 * The text is built for a table name so that enqueue can run on a caller's own client, whose
 * search_path need not include Leasehold's schema: there the table is schema-qualified.
 */
const insertJobsText = (jobs: string, onConflict: string) => `
INSERT INTO ${jobs} (queue, task, payload, priority, run_at, max_attempts, unique_key, lease_ms,
                     progress_timeout_ms, max_run_ms)
SELECT queue, task, payload, priority,
       coalesce(run_at, now() + delay_ms * interval '1 millisecond'),
       max_attempts, unique_key, lease_ms, progress_timeout_ms, max_run_ms
  FROM unnest($1::text[], $2::text[], $3::jsonb[], $4::smallint[], $5::timestamptz[],
              $6::bigint[], $7::int[], $8::text[], $9::int[], $10::int[], $11::int[])
       AS j(queue, task, payload, priority, run_at, delay_ms, max_attempts, unique_key, lease_ms,
            progress_timeout_ms, max_run_ms)${onConflict}
RETURNING id, unique_key`;

const ON_KEY_CONFLICT = "\nON CONFLICT (unique_key) WHERE unique_key IS NOT NULL DO NOTHING";
const findByKeyText = (jobs: string) => `
SELECT id, unique_key FROM ${jobs} WHERE unique_key = ANY($1::text[])`;

const INSERTED = { id: "int8", unique_key: "text?" } as const;
const INSERT_JOBS = statement("enqueueJobs", insertJobsText("jobs", ""), INSERTED);
const INSERT_KEYED_JOBS = statement("enqueueJobs (unique keys)", insertJobsText("jobs", ON_KEY_CONFLICT), INSERTED);
const FIND_UNFINISHED_BY_KEY = statement("enqueueJobs (existing keys)", findByKeyText("jobs"), { id: "int8", unique_key: "text" });

interface EnqueueStatements {
  insert: typeof INSERT_JOBS;
  insertKeyed: typeof INSERT_KEYED_JOBS;
  findByKey: typeof FIND_UNFINISHED_BY_KEY;
}

const UNQUALIFIED: EnqueueStatements = { insert: INSERT_JOBS, insertKeyed: INSERT_KEYED_JOBS, findByKey: FIND_UNFINISHED_BY_KEY };
const qualified = new Map<string, EnqueueStatements>();

/** The statements with the schema named, for a client whose search_path is not ours. */
function statementsFor(schema: string | undefined): EnqueueStatements {
  if (schema === undefined) return UNQUALIFIED;
  let s = qualified.get(schema);
  if (!s) {
    const jobs = `${quoteIdent(schema)}.jobs`;
    const as = <C extends Statement>(st: C, text: string): C => ({ ...st, text });
    s = {
      insert: as(INSERT_JOBS, insertJobsText(jobs, "")),
      insertKeyed: as(INSERT_KEYED_JOBS, insertJobsText(jobs, ON_KEY_CONFLICT)),
      findByKey: as(FIND_UNFINISHED_BY_KEY, findByKeyText(jobs)),
    };
    qualified.set(schema, s);
  }
  return s;
}

/**
 * Rounds of "the unfinished job holding this key finished before we could read it": each
 * round means another job with the key ran to its end meanwhile, so a few are plenty; the
 * bound turns a key that can never match (the database stores something other than what was
 * sent) into an error instead of an endless loop.
 */
const MAX_KEY_ROUNDS = 5;

/**
 * Returns one entry per input job, in input order. `schema`: qualify the table (for a
 * caller's client); leave it out on Leasehold's own connections.
 */
export async function enqueueJobs(db: Queryable, jobs: NormalizedJob[], schema?: string, round = 1): Promise<EnqueuedJob[]> {
  if (jobs.length === 0) return [];
  const st = statementsFor(schema);
  const keyed = jobs.some((j) => j.uniqueKey !== null);
  const inserted = await run(db, keyed ? st.insertKeyed : st.insert, [
    jobs.map((j) => j.queue),
    jobs.map((j) => j.task),
    jobs.map((j) => j.payloadJson),
    jobs.map((j) => j.priority),
    jobs.map((j) => j.runAt),
    jobs.map((j) => j.delayMs),
    jobs.map((j) => j.maxAttempts),
    jobs.map((j) => j.uniqueKey),
    jobs.map((j) => j.leaseMs),
    jobs.map((j) => j.progressTimeoutMs),
    jobs.map((j) => j.maxRunMs),
  ]);
  if (!keyed) return inserted.map((r) => ({ id: r.id, created: true }));
  // INSERT ... SELECT returns rows in the order it inserted them, which is input order;
  // only keyed rows can be skipped, so walk both lists together.
  const byKey = new Map<string, EnqueuedJob>();
  const result: (EnqueuedJob | undefined)[] = [];
  let next = 0;
  for (const job of jobs) {
    const row = inserted[next];
    if (job.uniqueKey === null || (row && row.unique_key === job.uniqueKey && !byKey.has(job.uniqueKey))) {
      next++;
      const entry = { id: row!.id, created: true };
      if (job.uniqueKey !== null) byKey.set(job.uniqueKey, entry);
      result.push(entry);
    } else {
      result.push(undefined);
    }
  }
  const missing = [...new Set(jobs.filter((j, i) => !result[i]).map((j) => j.uniqueKey!))].filter((k) => !byKey.has(k));
  if (missing.length > 0) {
    // The conflicting jobs are committed (ON CONFLICT waited for them), so a new
    // statement sees them, unless one finished in between: then enqueue that key again.
    const existing = await run(db, st.findByKey, [missing]);
    for (const row of existing) byKey.set(row.unique_key, { id: row.id, created: false });
    const finishedMeanwhile = dedupeByKey(jobs.filter((j, i) => !result[i] && !byKey.has(j.uniqueKey!)));
    if (finishedMeanwhile.length > 0) {
      if (round >= MAX_KEY_ROUNDS) {
        throw new Error(
          `unique key ${JSON.stringify(finishedMeanwhile[0]!.uniqueKey)} neither inserted nor found after ${round} rounds; nothing more was written for it`,
        );
      }
      const again = await enqueueJobs(db, finishedMeanwhile, schema, round + 1);
      finishedMeanwhile.forEach((j, i) => byKey.set(j.uniqueKey!, again[i]!));
    }
  }
  return result.map((r, i) => r ?? { ...byKey.get(jobs[i]!.uniqueKey!)!, created: false });
}

function dedupeByKey(jobs: NormalizedJob[]): NormalizedJob[] {
  const seen = new Set<string>();
  return jobs.filter((j) => !seen.has(j.uniqueKey!) && seen.add(j.uniqueKey!));
}
