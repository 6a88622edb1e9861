import type pg from "pg";
import { quoteIdent, withTransaction, type Queryable } from "./db.js";
import { run, statement } from "./sql.js";

/**
 * Retention. Succeeded and cancelled jobs live in eight generations of job_history (list
 * partitions, by when they finished); a generation all of whose jobs are past retention is
 * emptied whole with TRUNCATE, its jobs' audit rows and dependency edges (those whose child
 * it holds) and recorded durable steps deleted with it: no row deletes and no
 * dead rows on the hot path of a busy queue (row-by-row retention measured ~10% of the
 * database's work at 40,000 jobs/s). The dead letter (dead_jobs) is kept longer and pruned
 * row by row, in bounded batches: it is small.
 */
export const GENERATIONS = 8;

const PRUNE_DEAD_JOBS = statement(
  "pruneDeadJobs",
  `
WITH gone AS (
  DELETE FROM dead_jobs
   WHERE id IN (SELECT id FROM dead_jobs WHERE finished_at < now() - $1::bigint * interval '1 millisecond' LIMIT $2)
  RETURNING id
), audit AS (
  DELETE FROM job_attempts AS a USING gone WHERE a.job_id = gone.id
), edges AS (
  -- a dependent job's edges go with it (a parent's stay: its dependents read it as forgotten)
  DELETE FROM job_dependencies AS d USING gone WHERE d.child_id = gone.id
), steps AS (
  DELETE FROM job_steps AS s USING gone WHERE s.job_id = gone.id
)
SELECT count(*)::int AS deleted FROM gone`,
  { deleted: "int4" },
);

export async function pruneDeadJobs(db: Queryable, p: { retainDeadMs: number; limit: number }): Promise<number> {
  const [row] = await run(db, PRUNE_DEAD_JOBS, [p.retainDeadMs, p.limit]);
  return row!.deleted;
}

/**
 * Events older than the window (docs/durable.md#events-and-the-race-with-a-wait), oldest first, at most $2: a wait that
 * begins after its event was sent finds it only within the window. Events only grow in id and
 * time, so the oldest ids are the oldest events.
 */
const PRUNE_EVENTS = statement(
  "pruneEvents",
  `
WITH gone AS (
  DELETE FROM events
   WHERE id IN (SELECT id FROM events WHERE sent_at < now() - $1::bigint * interval '1 millisecond' ORDER BY id LIMIT $2)
  RETURNING id
)
SELECT count(*)::int AS deleted FROM gone`,
  { deleted: "int4" },
);

export async function pruneEvents(db: Queryable, p: { retainEventsMs: number; limit: number }): Promise<number> {
  const [row] = await run(db, PRUNE_EVENTS, [p.retainEventsMs, p.limit]);
  return row!.deleted;
}

const SET_GENERATION_WIDTH = statement("setGenerationWidth", `UPDATE history_settings SET generation_ms = $1 WHERE generation_ms <> $1`, {});

/**
 * Each generation lasts a sixth of the retention time (at least a second): then the seven
 * most recent cover it, and the eighth, next to be reused, holds only jobs past retention.
 * Finished jobs are kept between `retainMs` and about 1.25 times that (a generation
 * and half a run interval more).
 */
export async function setGenerationWidth(db: Queryable, retainMs: number): Promise<void> {
  await run(db, SET_GENERATION_WIDTH, [Math.max(1_000, Math.ceil(retainMs / (GENERATIONS - 2)))]);
}

const CURRENT_GENERATION = statement("currentGeneration", `SELECT history_generation(now()) AS generation`, { generation: "int2" });
const GENERATION_HAS_RECENT = statement(
  "generationHasRecentJobs",
  `
SELECT EXISTS (SELECT 1 FROM job_history WHERE generation = $1 AND finished_at >= now() - $2::bigint * interval '1 millisecond') AS recent,
       EXISTS (SELECT 1 FROM job_history WHERE generation = $1) AS any`,
  { recent: "bool", any: "bool" },
);
const DELETE_GENERATION_AUDIT = statement(
  "deleteGenerationAudit",
  `
WITH gone AS (DELETE FROM job_attempts AS a USING job_history AS h WHERE h.generation = $1 AND a.job_id = h.id),
     edges AS (DELETE FROM job_dependencies AS d USING job_history AS h WHERE h.generation = $1 AND d.child_id = h.id),
     steps AS (DELETE FROM job_steps AS s USING job_history AS h WHERE h.generation = $1 AND s.job_id = h.id)
SELECT count(*)::int AS jobs FROM job_history WHERE generation = $1`,
  { jobs: "int4" },
);

/**
 * Empties every generation (but the current one) whose jobs all finished more than
 * `retainMs` ago. Each is checked and emptied under an exclusive lock taken without waiting
 * (NOWAIT): no job can land in it meanwhile, and a busy one is left for the next run.
 * Returns the jobs removed.
 */
export async function truncateOldGenerations(pool: pg.Pool, p: { retainMs: number }): Promise<number> {
  const [{ generation: current }] = (await run(pool, CURRENT_GENERATION)) as [{ generation: number }];
  let removed = 0;
  for (let g = 0; g < GENERATIONS; g++) {
    if (g === current) continue;
    const [probe] = await run(pool, GENERATION_HAS_RECENT, [g, p.retainMs]);
    if (!probe!.any || probe!.recent) continue;
    removed += await withTransaction(pool, async (client) => {
      try {
        await client.query(`LOCK TABLE ${quoteIdent(`job_history_${g}`)} IN ACCESS EXCLUSIVE MODE NOWAIT`);
      } catch (err) {
        if ((err as { code?: string }).code === "55P03") return 0; // lock_not_available: next run
        throw err;
      }
      const [again] = await run(client, GENERATION_HAS_RECENT, [g, p.retainMs]);
      if (again!.recent) return 0;
      const [gone] = await run(client, DELETE_GENERATION_AUDIT, [g]);
      await client.query(`TRUNCATE ${quoteIdent(`job_history_${g}`)}`);
      return gone!.jobs;
    });
  }
  return removed;
}

const DEAD_ROWS = statement(
  "deadRows",
  `
SELECT t.name, pg_stat_get_live_tuples(c.oid) AS live, pg_stat_get_dead_tuples(c.oid) AS dead
  FROM unnest($1::text[]) AS t(name)
  JOIN pg_class AS c ON c.relname = t.name AND c.relnamespace = current_schema()::regnamespace`,
  { name: "text", live: "int8", dead: "int8" },
);

/**
 * Vacuums those of `tables` whose dead rows outnumber their live ones (and at least
 * `minDead`); SKIP_LOCKED passes over a table another vacuum holds, so many processes may
 * ask at once. Returns the tables vacuumed.
 *
 * Why not leave it to autovacuum: it visits a database at most once per autovacuum_naptime
 * (a minute by default), whatever a table's thresholds say. A queue turns its hot table over
 * every few seconds, and every claim walks the dead index entries that pile up meanwhile from
 * the jobs claimed before: measured over 1,000,000 jobs, the drain fell to 65% of its start.
 */
export async function vacuumIfBloated(db: Queryable, p: { tables: string[]; minDead: number }): Promise<string[]> {
  const rows = await run(db, DEAD_ROWS, [p.tables]);
  const bloated = rows.filter((r) => isBloated(Number(r.live), Number(r.dead), p.minDead)).map((r) => r.name);
  for (const table of bloated) await vacuumTable(db, table);
  return bloated;
}

/** Dead rows outnumber live ones, and there are at least `minDead` of them. */
export function isBloated(live: number, dead: number, minDead: number): boolean {
  return dead >= minDead && dead > live;
}

/** `table`: one of our own table names, never input (it is quoted into the statement). */
export async function vacuumTable(db: Queryable, table: string): Promise<void> {
  await db.query(`VACUUM (SKIP_LOCKED) ${quoteIdent(table)}`);
}
