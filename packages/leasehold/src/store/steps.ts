/**
 * Durable steps (docs/durable.md): a job's recorded steps, and the suspensions (a sleep, a wait
 * for an event) that end an attempt without spending its retry budget.
 *
 * Every write here is fenced like a completion: it names the attempt (id, attempt, worker) and
 * matches only while that attempt holds the job, so a zombie cannot record a step, and a step
 * recorded once is never replaced (a failed record gives way to a later success; nothing else
 * does). A step's place (`seq`) is the primary key, so two attempts that ran the same step at
 * once cannot both record it: the second finds the first's record.
 */
import { quoteIdent, type Queryable } from "./db.js";
import { ending, endAttempts, type Ended } from "./end-attempts.js";
import { TRANSACTION_MARKER } from "./finish.js";
import { run, statement, type RowOf } from "./sql.js";
import type { JsonValue } from "../jobs/types.js";
import type { StepKind, StepRecord, StepState } from "../jobs/steps.js";

const STEP_COLUMNS = {
  seq: "int4",
  name: "text",
  occurrence: "int4",
  kind: "text",
  state: "text",
  attempt: "int4",
  result_json: "text?",
  error: "text?",
  duration_ms: "int4?",
  wake_at: "timestamptz?",
  event: "text?",
  recorded_at: "timestamptz",
} as const;

const LOAD_STEPS = statement(
  "loadSteps",
  `SELECT seq, name, occurrence, kind, state, attempt, result::text AS result_json, error, duration_ms, wake_at, event, recorded_at
     FROM job_steps WHERE job_id = $1 ORDER BY seq`,
  STEP_COLUMNS,
);

/** A job's recorded steps in the order its handler called them (a replay reads them once per attempt). */
export async function loadSteps(db: Queryable, jobId: string): Promise<StepRecord[]> {
  return (await run(db, LOAD_STEPS, [jobId])).map(toStepRecord);
}

/** A page of a job's steps; `next` continues it (the last step's seq), null at the end. */
export interface StepsPage {
  steps: StepRecord[];
  next: number | null;
}

/**
 * A step's size in a page, in bytes: at least its JSON (jsonb's text has spaces JSON.stringify
 * leaves out; to_json escapes text as JSON does), and room for the other fields and their names.
 */
const STEP_BYTES = `(256 + octet_length(to_json(s.name)::text) + coalesce(octet_length(s.result::text), 0)
          + coalesce(octet_length(to_json(s.error)::text), 0) + coalesce(octet_length(to_json(s.event)::text), 0))::int8`;

/**
 * One page of a job's steps, in call order after place $2: a walk of the primary key, one step
 * at a time, summing their sizes, that stops at the first step past the byte budget $3 (a page
 * keeps its first step whatever its size). That step's result is never read out of the
 * database: it comes back without it, `kept` false, and says that the page has a next one.
 */
const LOAD_STEPS_PAGE = statement(
  "loadStepsPage",
  `
WITH RECURSIVE page AS (
  (SELECT s.seq, 1 AS n, ${STEP_BYTES} AS bytes_so_far
     FROM job_steps AS s
    WHERE s.job_id = $1 AND s.seq > $2
    ORDER BY s.seq
    LIMIT 1)
  UNION ALL
  SELECT nx.seq, p.n + 1, p.bytes_so_far + nx.bytes
    FROM page AS p
   CROSS JOIN LATERAL (
         SELECT s.seq, ${STEP_BYTES} AS bytes
           FROM job_steps AS s
          WHERE s.job_id = $1 AND s.seq > p.seq
          ORDER BY s.seq
          LIMIT 1) AS nx
   WHERE p.bytes_so_far <= $3 OR p.n = 1
)
SELECT s.seq, s.name, s.occurrence, s.kind, s.state, s.attempt, CASE WHEN p.kept THEN s.result::text END AS result_json,
       CASE WHEN p.kept THEN s.error END AS error, s.duration_ms, s.wake_at, s.event, s.recorded_at, p.kept
  FROM (SELECT seq, bytes_so_far <= $3 OR n = 1 AS kept FROM page) AS p
  JOIN job_steps AS s ON s.job_id = $1 AND s.seq = p.seq
 ORDER BY p.seq`,
  { ...STEP_COLUMNS, kept: "bool" },
);

/** One page of a job's steps, at most about `maxBytes` of them (always at least one, if any are left). */
export async function loadStepsPage(db: Queryable, jobId: string, p: { after: number | null; maxBytes: number }): Promise<StepsPage> {
  const rows = await run(db, LOAD_STEPS_PAGE, [jobId, p.after ?? -1, p.maxBytes]);
  const kept = rows.filter((r) => r.kept);
  return { steps: kept.map(toStepRecord), next: kept.length < rows.length ? kept.at(-1)!.seq : null };
}

function toStepRecord(r: RowOf<typeof STEP_COLUMNS>): StepRecord {
  return {
    seq: r.seq,
    name: r.name,
    occurrence: r.occurrence,
    kind: r.kind as StepKind,
    state: r.state as StepState,
    attempt: r.attempt,
    // SQL NULL: the step returned undefined; 'null': it returned null.
    result: r.result_json === null ? undefined : (JSON.parse(r.result_json) as JsonValue),
    error: r.error,
    durationMs: r.duration_ms,
    wakeAt: r.wake_at,
    event: r.event,
    recordedAt: r.recorded_at,
  };
}

/** A step's outcome to record for an attempt: its result as JSON (validated), or its error. */
export interface StepOutcome {
  id: string;
  attempt: number;
  seq: number;
  name: string;
  occurrence: number;
  kind: "step" | "children" | "callback";
  state: "succeeded" | "failed";
  resultJson?: string;
  error?: string;
  durationMs: number;
}

/**
 * Records steps of several attempts in one statement (the worker batches what its handlers
 * finished meanwhile). The attempt is checked per row through the jobs primary key: a semi-join,
 * so the planner never rescans the arrays for every job (see finish.ts).
 */
const RECORD_STEPS = statement(
  "recordSteps",
  `
INSERT INTO job_steps AS s (job_id, seq, name, occurrence, kind, state, attempt, result, error, duration_ms)
SELECT r.id, r.seq, r.name, r.occurrence, r.kind, r.state, r.attempt, r.result, r.error, r.duration_ms
  FROM unnest($1::bigint[], $2::int[], $3::int[], $4::text[], $5::int[], $6::text[], $7::text[], $8::jsonb[], $9::text[], $10::int[])
       AS r(id, attempt, seq, name, occurrence, kind, state, result, error, duration_ms)
 WHERE EXISTS (SELECT 1 FROM jobs AS j WHERE j.id = r.id AND j.attempt = r.attempt AND j.locked_by = $11 AND j.state = 'running')
ON CONFLICT (job_id, seq) DO UPDATE
   SET name = EXCLUDED.name, occurrence = EXCLUDED.occurrence, kind = EXCLUDED.kind, state = EXCLUDED.state,
       attempt = EXCLUDED.attempt, result = EXCLUDED.result, error = EXCLUDED.error, duration_ms = EXCLUDED.duration_ms,
       recorded_at = now()
 WHERE s.state = 'failed'
RETURNING s.job_id AS id, s.seq`,
  { id: "int8", seq: "int4" },
);

/** The keys ("id:seq") of the outcomes recorded; one left out was refused (see stepFate). */
export async function recordSteps(db: Queryable, p: { workerId: string; steps: StepOutcome[] }): Promise<Set<string>> {
  if (p.steps.length === 0) return new Set();
  const s = p.steps;
  const rows = await run(db, RECORD_STEPS, [
    s.map((x) => x.id),
    s.map((x) => x.attempt),
    s.map((x) => x.seq),
    s.map((x) => x.name),
    s.map((x) => x.occurrence),
    s.map((x) => x.kind),
    s.map((x) => x.state),
    s.map((x) => x.resultJson ?? null),
    s.map((x) => x.error ?? null),
    s.map((x) => x.durationMs),
    p.workerId,
  ]);
  return new Set(rows.map((r) => `${r.id}:${r.seq}`));
}

const STEP_FATE = statement(
  "stepFate",
  `SELECT EXISTS (SELECT 1 FROM jobs AS j WHERE j.id = $1 AND j.attempt = $2 AND j.locked_by = $3 AND j.state = 'running') AS held,
          s.name, s.occurrence, s.state, s.result::text AS result_json
     FROM (SELECT 1) AS one LEFT JOIN job_steps AS s ON s.job_id = $1 AND s.seq = $4`,
  { held: "bool", name: "text?", occurrence: "int4?", state: "text?", result_json: "text?" },
);

export interface StepFate {
  held: boolean;
  recorded?: { name: string; occurrence: number; state: StepState; result: JsonValue | undefined };
}

/**
 * Why a record was refused: the attempt no longer holds its job (`held` false), or another
 * attempt recorded this place first (`recorded`: what it recorded there).
 */
export async function stepFate(db: Queryable, p: { workerId: string; id: string; attempt: number; seq: number }): Promise<StepFate> {
  const [row] = await run(db, STEP_FATE, [p.id, p.attempt, p.workerId, p.seq]);
  const r = row!;
  const recorded =
    r.name === null
      ? undefined
      : {
          name: r.name,
          occurrence: r.occurrence!,
          state: r.state as StepState,
          result: r.result_json === null ? undefined : (JSON.parse(r.result_json) as JsonValue),
        };
  return { held: row!.held, ...(recorded && { recorded }) };
}

const recordWithinText = (s: string) => `
WITH recorded AS (
  INSERT INTO ${s}job_steps AS s (job_id, seq, name, occurrence, kind, state, attempt, result, duration_ms)
  SELECT j.id, $4, $5, $6, 'transaction', 'succeeded', j.attempt, $7::jsonb, $8
    FROM ${s}jobs AS j
   WHERE j.id = $1 AND j.attempt = $2 AND j.locked_by = $3 AND j.state = 'running'
     AND current_setting('${TRANSACTION_MARKER}', true) = $9::text
  ON CONFLICT (job_id, seq) DO UPDATE
     SET name = EXCLUDED.name, occurrence = EXCLUDED.occurrence, kind = EXCLUDED.kind, state = EXCLUDED.state,
         attempt = EXCLUDED.attempt, result = EXCLUDED.result, error = NULL, duration_ms = EXCLUDED.duration_ms, recorded_at = now()
   WHERE s.state = 'failed'
  RETURNING 1
)
SELECT (SELECT count(*) FROM recorded)::int AS recorded,
       coalesce(current_setting('${TRANSACTION_MARKER}', true) = $9::text, false) AS ours`;

const RECORD_WITHIN = statement("recordStepWithin", recordWithinText(""), { recorded: "int4", ours: "bool" });
const qualifiedRecordWithin = new Map<string, typeof RECORD_WITHIN>();

/**
 * ctx.step.transaction: records the step in the handler's own transaction (begun with
 * beginWithin), so its writes and its record commit together. On a connection with the
 * application's search_path, hence the schema-qualified names. "refused": the attempt no longer
 * holds its job, or the place is recorded already (see stepFate); "not_ours": the handler ended
 * the transaction it was given.
 */
export async function recordStepWithin(
  db: Queryable,
  schema: string,
  p: {
    workerId: string;
    id: string;
    attempt: number;
    seq: number;
    name: string;
    occurrence: number;
    resultJson: string | null;
    durationMs: number;
    marker: string;
  },
): Promise<"recorded" | "refused" | "not_ours"> {
  let st = qualifiedRecordWithin.get(schema);
  if (!st) qualifiedRecordWithin.set(schema, (st = { ...RECORD_WITHIN, text: recordWithinText(`${quoteIdent(schema)}.`) }));
  const [row] = await run(db, st, [p.id, p.attempt, p.workerId, p.seq, p.name, p.occurrence, p.resultJson, p.durationMs, p.marker]);
  if (!row!.ours) return "not_ours";
  return row!.recorded === 1 ? "recorded" : "refused";
}

/** The attempt that suspends, and the step that suspends it. */
export interface SuspendingStep {
  workerId: string;
  id: string;
  attempt: number;
  seq: number;
  name: string;
  occurrence: number;
}

/** A wait without a timeout still has a deadline: the longest delay a job may have (3650 days). */
export const NO_TIMEOUT_MS = 3650 * 86_400_000;

/** The `ending` columns of a suspension (store/end-attempts.ts): no budget spent. */
export const ATTEMPT_ENDING = `SELECT j.id, j.attempt, j.locked_by AS worker_id, j.started_at, NULL::text AS error,
         false AS spend, false AS give_up, 'suspended' AS outcome, j.cancel_requested_at IS NOT NULL AS cancelled,
         j.spent_attempts, j.max_attempts, j.heartbeat_at AS last_beat_at, false AS recovery`;

/** The suspending attempt's job, locked: $1-$3 are its id, attempt and worker. */
const HELD_ATTEMPT = `held AS (
  SELECT j.id FROM jobs AS j
   WHERE j.id = $1 AND j.attempt = $2 AND j.locked_by = $3 AND j.state = 'running'
     FOR UPDATE
)`;

/**
 * ctx.sleep: records the sleep (its end, on the database's clock: `until`, or now + `ms`) and
 * suspends the job until then, in one statement. A sleep whose end has passed is recorded and
 * does not suspend (the answer is then empty: see stepFate).
 */
const SUSPEND_FOR_SLEEP = ending(
  "suspendForSleep",
  `WITH ${HELD_ATTEMPT}, wake AS (
  SELECT coalesce($7::timestamptz, now() + $8::float8 * interval '1 millisecond') AS at
), recorded AS (
  INSERT INTO job_steps (job_id, seq, name, occurrence, kind, state, attempt, wake_at)
  SELECT h.id, $4, $5, $6, 'sleep', 'succeeded', $2, w.at FROM held AS h, wake AS w
  ON CONFLICT (job_id, seq) DO NOTHING
  RETURNING job_id
), ending AS (
  ${ATTEMPT_ENDING},
         (extract(epoch FROM w.at - now()) * 1000)::float8 AS retry_delay_ms,
         jsonb_build_object('kind', 'sleep', 'step', $5::text, 'until', w.at) AS wait
    FROM jobs AS j, wake AS w
   WHERE j.id = (SELECT id FROM held) AND w.at > now() AND EXISTS (SELECT 1 FROM recorded)
)`,
  "d.wait",
);

export async function suspendForSleep(db: Queryable, p: SuspendingStep & { until?: Date; ms?: number }): Promise<Ended> {
  return endAttempts(db, SUSPEND_FOR_SLEEP, [p.id, p.attempt, p.workerId, p.seq, p.name, p.occurrence, p.until ?? null, p.ms ?? null]);
}

/** A wait for an event: the event, what its data must contain, and the kind of step it records. */
export interface EventWait extends SuspendingStep {
  kind: "event" | "callback" | "children";
  event: string;
  /** JSON the event's data must contain (jsonb @>); null: any. */
  matchJson: string | null;
  /** Null: no timeout. */
  timeoutMs: number | null;
}

/**
 * A wait's look for its event, fenced: the first matching event sent since the job was enqueued
 * and after any event of that name this job received before. Found, or past the wait's deadline
 * (set when the wait first began, kept across suspensions), the wait is recorded as received
 * (its data) or timed out (null). Otherwise nothing is written, and `deadline` says when the
 * wait times out.
 */
const RECEIVE_EVENT = statement(
  "receiveEvent",
  `
WITH held AS (
  SELECT j.id, j.created_at FROM jobs AS j
   WHERE j.id = $1 AND j.attempt = $2 AND j.locked_by = $3 AND j.state = 'running'
), begun AS (
  SELECT s.wake_at FROM job_steps AS s WHERE s.job_id = $1 AND s.seq = $4 AND s.state = 'waiting'
), received AS (
  SELECT e.id, e.data FROM events AS e, held AS h
   WHERE e.name = $8 AND e.sent_at >= h.created_at
     AND ($9::jsonb IS NULL OR coalesce(e.data, 'null'::jsonb) @> $9::jsonb)
     AND e.id > coalesce((SELECT max(p.event_id) FROM job_steps AS p WHERE p.job_id = $1 AND p.event = $8 AND p.state = 'succeeded'), 0)
   ORDER BY e.id LIMIT 1
), deadline AS (
  SELECT CASE WHEN EXISTS (SELECT 1 FROM begun) THEN (SELECT wake_at FROM begun)
              ELSE now() + coalesce($10::float8, ${NO_TIMEOUT_MS}) * interval '1 millisecond' END AS at
), recorded AS (
  INSERT INTO job_steps AS s (job_id, seq, name, occurrence, kind, state, attempt, result, event, event_id, wake_at)
  SELECT h.id, $4, $5, $6, $7, 'succeeded', $2, r.data, $8, r.id, d.at
    FROM held AS h CROSS JOIN deadline AS d LEFT JOIN received AS r ON true
   WHERE r.id IS NOT NULL OR d.at <= now()
  ON CONFLICT (job_id, seq) DO UPDATE
     SET state = 'succeeded', attempt = EXCLUDED.attempt, result = EXCLUDED.result, event_id = EXCLUDED.event_id, recorded_at = now()
   WHERE s.state = 'waiting'
  RETURNING s.event_id, s.result
)
SELECT EXISTS (SELECT 1 FROM held) AS held,
       EXISTS (SELECT 1 FROM recorded) AS recorded,
       coalesce((SELECT event_id IS NOT NULL FROM recorded), false) AS received,
       (SELECT result FROM recorded) AS data,
       (SELECT at FROM deadline) AS deadline`,
  { held: "bool", recorded: "bool", received: "bool", data: "jsonb?", deadline: "timestamptz" },
);

export type ReceiveResult =
  { held: false } | { held: true; recorded: true; received: boolean; data: JsonValue | null } | { held: true; recorded: false; deadline: Date };

export async function receiveEvent(db: Queryable, p: EventWait): Promise<ReceiveResult> {
  const [r] = await run(db, RECEIVE_EVENT, [p.id, p.attempt, p.workerId, p.seq, p.name, p.occurrence, p.kind, p.event, p.matchJson, p.timeoutMs]);
  if (!r!.held) return { held: false };
  return r!.recorded ? { held: true, recorded: true, received: r!.received, data: r!.data } : { held: true, recorded: false, deadline: r!.deadline };
}

/** The event's lock, exclusive: no send of it commits between a wait's last look and its suspension. */
const LOCK_EVENT = statement("lockEvent", "SELECT true AS locked FROM pg_advisory_xact_lock(event_lock_key($1))", { locked: "bool" });

/**
 * Suspends the job until its event comes or its deadline passes: the wait's place is recorded as
 * waiting (with the deadline, so a later attempt keeps it), and the job's `wait` names the event
 * for send_event() to find.
 */
const SUSPEND_FOR_EVENT = ending(
  "suspendForEvent",
  `WITH ${HELD_ATTEMPT}, begun AS (
  INSERT INTO job_steps (job_id, seq, name, occurrence, kind, state, attempt, event, wake_at)
  SELECT h.id, $4, $5, $6, $7, 'waiting', $2, $8, $10::timestamptz FROM held AS h
  ON CONFLICT (job_id, seq) DO NOTHING
), ending AS (
  ${ATTEMPT_ENDING},
         greatest(0, extract(epoch FROM $10::timestamptz - now()) * 1000)::float8 AS retry_delay_ms,
         jsonb_build_object('kind', $7::text, 'step', $5::text, 'event', $8::text, 'until', $10::timestamptz)
           || CASE WHEN $9::jsonb IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('match', $9::jsonb) END AS wait
    FROM jobs AS j
   WHERE j.id = (SELECT id FROM held)
)`,
  "d.wait",
);

/**
 * ctx.waitForEvent: the event if it was sent (recorded, and returned), else the job suspends
 * until it comes or the wait times out. The look and the suspension run in one transaction
 * holding the event's lock, so an event sent meanwhile is either seen or wakes the suspended job.
 * The first look runs without the lock: most waits that find their event need nothing more.
 */
export async function waitForEvent(
  db: Queryable & { query(text: string): Promise<unknown> },
  p: EventWait,
): Promise<ReceiveResult | { held: true; suspended: Ended }> {
  const first = await receiveEvent(db, p);
  if (!first.held || first.recorded) return first;
  await db.query("BEGIN");
  try {
    await run(db, LOCK_EVENT, [p.event]);
    const again = await receiveEvent(db, p);
    if (!again.held || again.recorded) {
      await db.query("COMMIT");
      return again;
    }
    const suspended = await endAttempts(db, SUSPEND_FOR_EVENT, [
      p.id,
      p.attempt,
      p.workerId,
      p.seq,
      p.name,
      p.occurrence,
      p.kind,
      p.event,
      p.matchJson,
      again.deadline,
    ]);
    await db.query("COMMIT");
    return { held: true, suspended };
  } catch (err) {
    await db.query("ROLLBACK").catch(() => {});
    throw err;
  }
}

/** Sends events (send_event(), migration 027): stored, and their waiting jobs woken. Returns the events' ids. */
const SEND_EVENTS = statement(
  "sendEvents",
  `SELECT send_event(e.name, e.data) AS id FROM unnest($1::text[], $2::jsonb[]) WITH ORDINALITY AS e(name, data, n) ORDER BY e.n`,
  { id: "int8" },
);

export async function sendEvents(db: Queryable, events: { name: string; dataJson: string | null }[], schema?: string): Promise<string[]> {
  const st =
    schema === undefined ? SEND_EVENTS : { ...SEND_EVENTS, text: SEND_EVENTS.text.replace("send_event(", `${quoteIdent(schema)}.send_event(`) };
  const rows = await run(db, st, [events.map((e) => e.name), events.map((e) => e.dataJson)]);
  return rows.map((r) => r.id);
}

/**
 * The watchdog's wake: suspended jobs whose time came (a sleep's end, a wait's deadline) go back
 * to waiting, in wake order, and their queues' workers are told. Returns how many per queue.
 */
const WAKE_SUSPENDED = statement(
  "wakeSuspendedJobs",
  `
WITH due AS (
  SELECT id FROM jobs WHERE state = 'suspended' AND run_at <= now() ORDER BY run_at LIMIT $1 FOR UPDATE SKIP LOCKED
), woken AS (
  UPDATE jobs AS j SET state = 'waiting' FROM due WHERE j.id = due.id RETURNING j.id, j.queue, j.attempt
), doorbells AS (
  INSERT INTO dispatch_outbox (job_id, attempt, publish_at, recovery)
  SELECT w.id, w.attempt, now(), false FROM woken AS w WHERE nats_dispatch_active()
  ON CONFLICT DO NOTHING
)
SELECT q.queue, q.n,
       concat(pg_notify('leasehold:' || current_schema(), q.queue),
              CASE WHEN nats_dispatch_active() THEN pg_notify('leasehold:' || current_schema() || ':dispatch', '') END) AS woke
  FROM (SELECT w.queue, count(*)::int AS n FROM woken AS w GROUP BY w.queue) AS q`,
  { queue: "text", n: "int4", woke: "text?" },
);

export async function wakeSuspendedJobs(db: Queryable, p: { limit: number }): Promise<Map<string, number>> {
  const rows = await run(db, WAKE_SUSPENDED, [p.limit]);
  return new Map(rows.map((r) => [r.queue, r.n]));
}
