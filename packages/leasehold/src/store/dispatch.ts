/**
 * NATS dispatch (docs/nats.md): the doorbells owed, kept in dispatch_outbox (migration 007),
 * and the switch that makes every producer owe them. PostgreSQL stays the arbiter: a doorbell
 * only tells a worker which job to claim by id; the claim decides.
 */
import type pg from "pg";
import type { Queryable } from "./db.js";
import { run, statement } from "./sql.js";

const ACTIVE_STATE = statement(
  "natsDispatchState",
  `SELECT coalesce(active_until > now(), false) AS active,
          coalesce(active_until < now() + $1::bigint * interval '1 millisecond' / 2, true) AS renew
     FROM dispatch_settings`,
  { active: "bool", renew: "bool" },
);

const RENEW_ACTIVE = statement(
  "renewNatsDispatch",
  `UPDATE dispatch_settings SET active_until = now() + $1::bigint * interval '1 millisecond'
    WHERE active_until > now()
   RETURNING active_until`,
  { active_until: "timestamptz?" },
);

const SET_ACTIVE = statement("activateNatsDispatch", `UPDATE dispatch_settings SET active_until = now() + $1::bigint * interval '1 millisecond'`, {});

/** Every job waiting now owes a doorbell (those that already owe one keep theirs). */
const BACKFILL_DOORBELLS = statement(
  "backfillDoorbells",
  `INSERT INTO dispatch_outbox (job_id, attempt, publish_at)
   SELECT id, attempt, run_at FROM jobs WHERE state = 'waiting'
   ON CONFLICT DO NOTHING`,
  {},
);

/** Waiting for open transactions on `jobs` at activation gives up after this, and is tried again later. */
export const ACTIVATION_LOCK_TIMEOUT_MS = 2_000;

/**
 * Keeps NATS dispatch active for the next `ttlMs` (renewed once half of it has passed).
 * Turning it on is exact: in one transaction that holds a SHARE lock on `jobs` (it waits
 * for every transaction writing jobs to end, and holds new writers for its few statements)
 * it switches dispatch on and owes a doorbell for every job already waiting. A job written
 * before sees no switch and is backfilled; one written after owes its own. Returns
 * "activated" when it had to turn dispatch on, "renewed" or "active" otherwise.
 */
export async function keepNatsDispatchActive(pool: pg.Pool, ttlMs: number): Promise<"active" | "renewed" | "activated"> {
  const [state] = await run(pool, ACTIVE_STATE, [ttlMs]);
  if (state?.active) {
    if (!state.renew) return "active";
    if ((await run(pool, RENEW_ACTIVE, [ttlMs])).length > 0) return "renewed";
  }
  const client = await pool.connect();
  let broken: unknown;
  try {
    await client.query("BEGIN");
    await client.query(`SET LOCAL lock_timeout = ${ACTIVATION_LOCK_TIMEOUT_MS}`);
    await client.query("LOCK TABLE jobs IN SHARE MODE");
    await run(client, SET_ACTIVE, [ttlMs]);
    await run(client, BACKFILL_DOORBELLS);
    await client.query("COMMIT");
    return "activated";
  } catch (err) {
    await client.query("ROLLBACK").catch((e: unknown) => (broken = e));
    throw err;
  } finally {
    client.release(broken instanceof Error ? broken : undefined);
  }
}

/** A doorbell to ring: the message for one waiting spell (job id and attempt) of a job. */
export interface Doorbell {
  id: string;
  attempt: number;
  queue: string;
  task: string;
  /** The job is back because recovery or a release ended its previous attempt. */
  recovery: boolean;
}

/**
 * Takes up to `limit` doorbells that are due, locking them (another dispatcher skips them)
 * and deleting them: run it in a transaction and commit only once their messages are
 * published, so a failed publish leaves them owed. Doorbells of jobs that no longer wait in
 * that spell (claimed, finished, cancelled meanwhile) are deleted and not returned. `taken`
 * counts both.
 */
const TAKE_DUE_DOORBELLS = statement(
  "takeDueDoorbells",
  `
WITH due AS (
  SELECT o.job_id, o.attempt, o.recovery, j.queue, j.task, j.id IS NOT NULL AS live
    FROM dispatch_outbox AS o
    LEFT JOIN jobs AS j ON j.id = o.job_id AND j.attempt = o.attempt AND j.state = 'waiting'
   WHERE o.publish_at <= now()
   ORDER BY o.publish_at
   LIMIT $1
     FOR UPDATE OF o SKIP LOCKED
), taken AS (
  DELETE FROM dispatch_outbox AS o USING due
   WHERE o.job_id = due.job_id AND o.attempt = due.attempt
)
SELECT job_id AS id, attempt, queue, task, recovery, live FROM due`,
  { id: "int8", attempt: "int4", queue: "text?", task: "text?", recovery: "bool", live: "bool" },
);

export async function takeDueDoorbells(db: Queryable, limit: number): Promise<{ taken: number; due: Doorbell[] }> {
  const rows = await run(db, TAKE_DUE_DOORBELLS, [limit]);
  return {
    taken: rows.length,
    due: rows.filter((r) => r.live).map((r) => ({ id: r.id, attempt: r.attempt, queue: r.queue!, task: r.task!, recovery: r.recovery })),
  };
}

const NEXT_DOORBELL_IN = statement(
  "nextDoorbellIn",
  `SELECT greatest(0, extract(epoch FROM min(publish_at) - now()) * 1000)::float8 AS ms FROM dispatch_outbox`,
  { ms: "float8?" },
);

/** Milliseconds until the next doorbell is due (0: one is due now), or null when none is owed. */
export async function nextDoorbellIn(db: Queryable): Promise<number | null> {
  const [row] = await run(db, NEXT_DOORBELL_IN);
  return row?.ms ?? null;
}

const DELETE_PUBLISHED = statement("deletePublishedDoorbells", `DELETE FROM dispatch_outbox WHERE job_id = ANY($1::bigint[]) AND attempt = 0`, {});

/** The enqueuer published its new jobs' doorbells itself: they are owed no more. */
export async function deletePublishedDoorbells(db: Queryable, ids: string[]): Promise<void> {
  if (ids.length === 0) return;
  await run(db, DELETE_PUBLISHED, [ids]);
}

const MISSED_SPELLS = statement(
  "missedSpells",
  `SELECT id, NOT (queue = $3 AND task = $4) AS foreign,
          id::text || ':' || attempt = ANY($2::text[]) AND state = 'waiting' AND run_at <= now() AS waiting
     FROM jobs
    WHERE id = ANY($1::bigint[])`,
  { id: "int8", foreign: "bool", waiting: "bool" },
);

/**
 * Of spells a claim by id for one queue and task did not take: `waiting`, those of that queue
 * and task still waiting and due (a row another session held for a moment), whose messages
 * are delivered again instead of being dropped; `foreign`, those whose job is of another
 * queue or task (a message no Leasehold publisher sent there), which are refused for good.
 */
export async function missedSpells(
  db: Queryable,
  p: { spells: { id: string; attempt: number }[]; queue: string; task: string },
): Promise<{ waiting: Set<string>; foreign: Set<string> }> {
  const waiting = new Set<string>();
  const foreign = new Set<string>();
  if (p.spells.length === 0) return { waiting, foreign };
  const rows = await run(db, MISSED_SPELLS, [p.spells.map((s) => s.id), p.spells.map((s) => `${s.id}:${s.attempt}`), p.queue, p.task]);
  for (const r of rows) {
    if (r.foreign) foreign.add(r.id);
    else if (r.waiting) waiting.add(r.id);
  }
  return { waiting, foreign };
}

const READY_WITHOUT_MESSAGE = statement(
  "readySpellsOf",
  `SELECT id, attempt FROM jobs
    WHERE state = 'waiting' AND queue = $1 AND task = $2 AND run_at <= now() - $3::bigint * interval '1 millisecond'
    ORDER BY priority, run_at, id
    LIMIT $4`,
  { id: "int8", attempt: "int4" },
);

/**
 * Jobs of one queue and task ready for longer than `olderThanMs`: when their JetStream
 * consumer has nothing left to deliver, their doorbells were lost (a stream purged, a
 * message past its limits) and are owed again.
 */
export async function readySpellsOf(
  db: Queryable,
  p: { queue: string; task: string; olderThanMs: number; limit: number },
): Promise<{ id: string; attempt: number }[]> {
  return run(db, READY_WITHOUT_MESSAGE, [p.queue, p.task, p.olderThanMs, p.limit]);
}

/**
 * A row already owed for the spell but due later is stale (the job is ready now): it is made
 * due now, or it would hold the job back until its old time.
 */
const OWE_AGAIN = statement(
  "oweDoorbellsAgain",
  `INSERT INTO dispatch_outbox AS o (job_id, attempt, publish_at, recovery)
   SELECT id, attempt, now(), false FROM unnest($1::bigint[], $2::int[]) AS s(id, attempt)
   ON CONFLICT (job_id, attempt) DO UPDATE SET publish_at = excluded.publish_at WHERE o.publish_at > excluded.publish_at`,
  {},
);

export async function oweDoorbellsAgain(db: Queryable, spells: { id: string; attempt: number }[]): Promise<void> {
  if (spells.length === 0) return;
  await run(db, OWE_AGAIN, [spells.map((s) => s.id), spells.map((s) => s.attempt)]);
}

/** The NOTIFY channel on which dispatchers are told doorbells are due now. */
export function dispatchChannel(schema: string): string {
  return `leasehold:${schema}:dispatch`;
}
