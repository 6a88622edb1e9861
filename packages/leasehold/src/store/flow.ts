/**
 * Flow control's settings, as rows of `queues` (migration 013, docs/flow-control.md): pause,
 * fleet-wide and per-key limits and rates, key weights. The claim enforces them (claim_flow());
 * this module reads and changes them. Every change notifies the workers (a trigger on queues).
 */
import type { Queryable } from "./db.js";
import { run, statement, type RowOf } from "./sql.js";

/** A rate: at most `limit` starts in any window of `windowMs`, fleet-wide. */
export interface RateLimit {
  limit: number;
  windowMs: number;
}

/** The limits of a queue; null: none. */
export interface QueueLimits {
  /** At most this many attempts hold leases in the queue at once, across every process. */
  concurrency: number | null;
  /** At most this many per key. 1: one at a time, in (priority, enqueue) order. */
  keyConcurrency: number | null;
  /** Starts of the whole queue. */
  rate: RateLimit | null;
  /** Starts per key. */
  keyRate: RateLimit | null;
  /** Round-robin weights of some keys (turns per round); the others weigh 1. */
  keyWeights: Record<string, number> | null;
  /** The longest hold a handler's RateLimitedError may set; a longer one is clamped (null: DEFAULT_MAX_HOLD_MS). */
  maxHoldMs: number | null;
  /** A handler may hold the whole queue (scope "queue", or a keyless job); otherwise only its key. */
  allowQueueHold: boolean;
}

/** The hold cap of a queue that sets none: long enough for a typical Retry-After, short enough that a mistake heals. */
export const DEFAULT_MAX_HOLD_MS = 300_000;

/** A handler's hold in force: its queue's (`key` null) or a key's, until when, and which job asked for it. */
export interface QueueHold {
  key: string | null;
  until: Date;
  jobId: string | null;
}

export interface QueueSettings extends QueueLimits {
  name: string;
  paused: boolean;
  pausedAt: Date | null;
  /** Keyed jobs were enqueued in it: its claims go round-robin between keys. */
  keyed: boolean;
  /** A handler asked the queue to hold back until then ("rate-limited, retry in X"); in force while in the future. */
  heldUntil: Date | null;
  /** The job whose RateLimitedError set that hold (null: unknown, or none). */
  heldByJob: string | null;
  /** Claimed through claim_flow() (paused, limited, keyed or held). */
  flow: boolean;
  /**
   * Succeeded jobs keep their record (job_history: result, last attempt, times). false: the
   * queue opted out (setQueueHistory); a job whose result someone needs keeps it anyway.
   */
  keepSucceeded: boolean;
  updatedAt: Date | null;
}

export interface QueueInfo extends QueueSettings {
  /** Jobs waiting (due or not) and holding leases (running or buffered by a worker). */
  waiting: number;
  running: number;
  /** The holds in force: the queue's first, then its keys' (the latest-ending MAX_LISTED_HOLDS). */
  holds: QueueHold[];
  /** Keys held now, listed or not. */
  heldKeys: number;
}

/** Key holds listed per queue; `heldKeys` counts them all. */
export const MAX_LISTED_HOLDS = 10;

const SETTINGS_COLUMNS = `name, paused, paused_at, concurrency, key_concurrency, rate_limit, rate_window_ms, key_rate_limit,
       key_rate_window_ms, key_weights, max_hold_ms, allow_queue_hold, keyed, held_until, held_by_job,
       flow OR coalesce(held_until > now(), false) AS flow, keep_succeeded, updated_at`;

const SETTINGS = {
  name: "text",
  paused: "bool",
  paused_at: "timestamptz?",
  concurrency: "int4?",
  key_concurrency: "int4?",
  rate_limit: "int4?",
  rate_window_ms: "int4?",
  key_rate_limit: "int4?",
  key_rate_window_ms: "int4?",
  key_weights: "jsonb?",
  max_hold_ms: "int4?",
  allow_queue_hold: "bool",
  keyed: "bool",
  held_until: "timestamptz?",
  held_by_job: "int8?",
  flow: "bool",
  keep_succeeded: "bool",
  updated_at: "timestamptz?",
} as const;

function toSettings(r: RowOf<typeof SETTINGS>): QueueSettings {
  const rate = (limit: number | null, windowMs: number | null) => (limit === null || windowMs === null ? null : { limit, windowMs });
  return {
    name: r.name,
    paused: r.paused,
    pausedAt: r.paused_at,
    concurrency: r.concurrency,
    keyConcurrency: r.key_concurrency,
    rate: rate(r.rate_limit, r.rate_window_ms),
    keyRate: rate(r.key_rate_limit, r.key_rate_window_ms),
    keyWeights: r.key_weights as Record<string, number> | null,
    maxHoldMs: r.max_hold_ms,
    allowQueueHold: r.allow_queue_hold,
    keyed: r.keyed,
    heldUntil: r.held_until,
    heldByJob: r.held_by_job,
    flow: r.flow,
    keepSucceeded: r.keep_succeeded,
    updatedAt: r.updated_at,
  };
}

const FLOW_SETTINGS = statement("queueSettings", `SELECT ${SETTINGS_COLUMNS} FROM queues ORDER BY name`, SETTINGS);

/** Every queue with settings (a worker's view of flow control). */
export async function queueSettings(db: Queryable): Promise<QueueSettings[]> {
  return (await run(db, FLOW_SETTINGS, [])).map(toSettings);
}

/**
 * Every queue anyone can name: with settings, with unfinished jobs, served by a worker seen in
 * the last day, or with jobs finished in the retention window, with its counts.
 */
const LIST_QUEUES = statement(
  "listQueues",
  `WITH names AS (
  SELECT name FROM queues
  UNION SELECT DISTINCT queue FROM jobs
  UNION SELECT DISTINCT unnest(queues) FROM workers WHERE kind = 'worker' AND last_seen_at > now() - interval '1 day'
), counts AS (
  SELECT queue, count(*) FILTER (WHERE state = 'waiting')::int AS waiting, count(*) FILTER (WHERE state = 'running')::int AS running
    FROM jobs GROUP BY queue
), key_holds AS (
  SELECT ks.queue, count(*)::int AS held_keys,
         (array_agg(jsonb_build_object('key', ks.flow_key, 'until', ks.held_until, 'jobId', ks.held_by_job::text)
                    ORDER BY ks.held_until DESC, ks.flow_key))[1:$1] AS listed
    FROM flow_key_state AS ks WHERE ks.held_until > now() GROUP BY ks.queue
)
SELECT n.name, coalesce(q.paused, false) AS paused, q.paused_at, q.concurrency, q.key_concurrency, q.rate_limit,
       q.rate_window_ms, q.key_rate_limit, q.key_rate_window_ms, q.key_weights, q.max_hold_ms,
       coalesce(q.allow_queue_hold, false) AS allow_queue_hold, coalesce(q.keyed, false) AS keyed,
       q.held_until, q.held_by_job, coalesce(q.flow OR q.held_until > now(), q.flow, false) AS flow,
       coalesce(q.keep_succeeded, true) AS keep_succeeded, q.updated_at,
       coalesce(c.waiting, 0) AS waiting, coalesce(c.running, 0) AS running,
       to_jsonb(CASE WHEN q.held_until > now()
                     THEN ARRAY[jsonb_build_object('key', NULL, 'until', q.held_until, 'jobId', q.held_by_job::text)]
                     ELSE '{}' END || coalesce(k.listed, '{}')) AS holds,
       coalesce(k.held_keys, 0) AS held_keys
  FROM names AS n
  LEFT JOIN queues AS q ON q.name = n.name
  LEFT JOIN counts AS c ON c.queue = n.name
  LEFT JOIN key_holds AS k ON k.queue = n.name
 ORDER BY n.name`,
  { ...SETTINGS, waiting: "int4", running: "int4", holds: "jsonb", held_keys: "int4" },
);

export async function listQueues(db: Queryable): Promise<QueueInfo[]> {
  return (await run(db, LIST_QUEUES, [MAX_LISTED_HOLDS])).map((r) => ({
    ...toSettings(r),
    waiting: r.waiting,
    running: r.running,
    holds: (r.holds as { key: string | null; until: string; jobId: string | null }[]).map((h) => ({ ...h, until: new Date(h.until) })),
    heldKeys: r.held_keys,
  }));
}

/** Whether a queue is known: it has settings or jobs (waiting, running or finished) or a worker. */
const QUEUE_KNOWN = statement(
  "queueKnown",
  `SELECT EXISTS (SELECT 1 FROM queues WHERE name = $1)
       OR EXISTS (SELECT 1 FROM jobs WHERE queue = $1)
       OR EXISTS (SELECT 1 FROM workers WHERE kind = 'worker' AND $1 = ANY(queues) AND last_seen_at > now() - interval '1 day')
       OR EXISTS (SELECT 1 FROM finished_jobs WHERE queue = $1) AS known`,
  { known: "bool" },
);

export async function queueKnown(db: Queryable, name: string): Promise<boolean> {
  return (await run(db, QUEUE_KNOWN, [name]))[0]!.known;
}

const SET_PAUSED = statement(
  "setQueuePaused",
  `INSERT INTO queues AS q (name, paused, paused_at) VALUES ($1, $2, CASE WHEN $2 THEN now() END)
   ON CONFLICT (name) DO UPDATE
      SET paused = EXCLUDED.paused,
          paused_at = CASE WHEN EXCLUDED.paused THEN coalesce(q.paused_at, now()) END,
          updated_at = now()
   RETURNING ${SETTINGS_COLUMNS}`,
  SETTINGS,
);

export async function setQueuePaused(db: Queryable, name: string, paused: boolean): Promise<QueueSettings> {
  return toSettings((await run(db, SET_PAUSED, [name, paused]))[0]!);
}

/** What a queue keeps of its finished jobs (migration 032). */
export interface QueueHistory {
  /** false: a succeeded job leaves no record, unless someone needs its result (store/finish.ts). */
  keepSucceeded: boolean;
}

/** Takes effect for the completions that start after it commits; nothing already recorded changes. */
const SET_HISTORY = statement(
  "setQueueHistory",
  `INSERT INTO queues AS q (name, keep_succeeded) VALUES ($1, $2)
   ON CONFLICT (name) DO UPDATE SET keep_succeeded = EXCLUDED.keep_succeeded, updated_at = now()
   RETURNING ${SETTINGS_COLUMNS}`,
  SETTINGS,
);

export async function setQueueHistory(db: Queryable, name: string, history: QueueHistory): Promise<QueueSettings> {
  return toSettings((await run(db, SET_HISTORY, [name, history.keepSucceeded]))[0]!);
}

/**
 * Lifts the holds handlers set on a queue (RateLimitedError): its own and its keys', and makes
 * its rate-limited jobs due now (a keyed job not yet due blocks its key's line, so the key would
 * stay stopped without it). Its next claim starts jobs again (the update of queues wakes every
 * worker); if what they call still refuses them, a handler may hold it again.
 */
const CLEAR_HOLDS = statement(
  "clearQueueHolds",
  `WITH key_holds AS (
  UPDATE flow_key_state SET held_until = NULL, held_by_job = NULL WHERE queue = $1 AND held_until > now() RETURNING 1
), queue_hold AS (
  UPDATE queues SET held_until = NULL, held_by_job = NULL, updated_at = now() WHERE name = $1 AND held_until > now() RETURNING 1
), due AS (
  UPDATE jobs SET run_at = now()
   WHERE queue = $1 AND state = 'waiting' AND run_at > now() AND last_outcome = 'rate_limited'
  RETURNING 1
)
SELECT (SELECT count(*) FROM queue_hold)::int AS queue, (SELECT count(*) FROM key_holds)::int AS keys,
       (SELECT count(*) FROM due)::int AS jobs`,
  { queue: "int4", keys: "int4", jobs: "int4" },
);

/** What clearing a queue's holds lifted: its own hold, how many keys' holds, and how many rate-limited jobs it made due. */
export interface ClearedHolds {
  queue: boolean;
  keys: number;
  jobs: number;
}

export async function clearQueueHolds(db: Queryable, name: string): Promise<ClearedHolds> {
  const r = (await run(db, CLEAR_HOLDS, [name]))[0]!;
  return { queue: r.queue > 0, keys: r.keys, jobs: r.jobs };
}

/**
 * Forgets per-key flow state no claim needs: no hold in force and no start inside any rate
 * window (a window is at most a day) in its log of the old form (version 26 keeps starts in
 * flow_starts). A key's row comes back with its next hold.
 */
const PRUNE_KEY_STATE = statement(
  "pruneFlowKeyState",
  `WITH gone AS (
  DELETE FROM flow_key_state AS ks
   WHERE (ks.queue, ks.flow_key) IN (
         SELECT queue, flow_key FROM flow_key_state
          WHERE coalesce(held_until < now(), true)
            AND coalesce(start_times[cardinality(start_times)] < now() - interval '1 day', true)
          LIMIT $1)
  RETURNING 1
)
SELECT count(*)::int AS deleted FROM gone`,
  { deleted: "int4" },
);

export async function pruneFlowKeyState(db: Queryable, p: { limit: number }): Promise<number> {
  return (await run(db, PRUNE_KEY_STATE, [p.limit]))[0]!.deleted;
}

/**
 * Forgets rate starts outside every window: a claim deletes its queue's (or key's) rows that left
 * the window, so this finds the rows of queues and keys no longer claimed. A window is at most a
 * day; the hour more leaves alone a row a claim that began a while ago may still count.
 */
const PRUNE_FLOW_STARTS = statement(
  "pruneFlowStarts",
  `WITH gone AS (
  DELETE FROM flow_starts AS f
   WHERE (f.queue, f.flow_key, f.total) IN (
         SELECT queue, flow_key, total FROM flow_starts WHERE started_at < now() - interval '25 hours' LIMIT $1)
  RETURNING 1
)
SELECT count(*)::int AS deleted FROM gone`,
  { deleted: "int4" },
);

export async function pruneFlowStarts(db: Queryable, p: { limit: number }): Promise<number> {
  return (await run(db, PRUNE_FLOW_STARTS, [p.limit]))[0]!.deleted;
}

/**
 * Changes the given limits (each: a value, or null for none); the others stay. The statement
 * names every column and a flag per column saying whether to take the new value.
 */
const SET_LIMITS = statement(
  "setQueueLimits",
  `INSERT INTO queues AS q (name, concurrency, key_concurrency, rate_limit, rate_window_ms, key_rate_limit, key_rate_window_ms, key_weights,
                           max_hold_ms, allow_queue_hold)
   VALUES ($1, $3, $5, $7, $8, $10, $11, $13, $15, coalesce($17, false))
   ON CONFLICT (name) DO UPDATE
      SET concurrency = CASE WHEN $2 THEN EXCLUDED.concurrency ELSE q.concurrency END,
          key_concurrency = CASE WHEN $4 THEN EXCLUDED.key_concurrency ELSE q.key_concurrency END,
          rate_limit = CASE WHEN $6 THEN EXCLUDED.rate_limit ELSE q.rate_limit END,
          rate_window_ms = CASE WHEN $6 THEN EXCLUDED.rate_window_ms ELSE q.rate_window_ms END,
          key_rate_limit = CASE WHEN $9 THEN EXCLUDED.key_rate_limit ELSE q.key_rate_limit END,
          key_rate_window_ms = CASE WHEN $9 THEN EXCLUDED.key_rate_window_ms ELSE q.key_rate_window_ms END,
          key_weights = CASE WHEN $12 THEN EXCLUDED.key_weights ELSE q.key_weights END,
          max_hold_ms = CASE WHEN $14 THEN EXCLUDED.max_hold_ms ELSE q.max_hold_ms END,
          allow_queue_hold = CASE WHEN $16 THEN EXCLUDED.allow_queue_hold ELSE q.allow_queue_hold END,
          updated_at = now()
   RETURNING ${SETTINGS_COLUMNS}`,
  SETTINGS,
);

export async function setQueueLimits(db: Queryable, name: string, limits: Partial<QueueLimits>): Promise<QueueSettings> {
  const given = (k: keyof QueueLimits) => limits[k] !== undefined;
  return toSettings(
    (
      await run(db, SET_LIMITS, [
        name,
        given("concurrency"),
        limits.concurrency ?? null,
        given("keyConcurrency"),
        limits.keyConcurrency ?? null,
        given("rate"),
        limits.rate?.limit ?? null,
        limits.rate?.windowMs ?? null,
        given("keyRate"),
        limits.keyRate?.limit ?? null,
        limits.keyRate?.windowMs ?? null,
        given("keyWeights"),
        limits.keyWeights ? JSON.stringify(limits.keyWeights) : null,
        given("maxHoldMs"),
        limits.maxHoldMs ?? null,
        given("allowQueueHold"),
        limits.allowQueueHold ?? null,
      ])
    )[0]!,
  );
}
