/**
 * Live processes: workers announce themselves (and their tasks' policies) and hold a
 * session-level advisory lock while they live; a stable worker name is held the same way.
 * The database learns of a process's death when its session ends (a kill -9 closes its
 * sockets at once), long before a lease would run out.
 *
 * Lock keys are 64-bit hashes of "leasehold:<schema>:worker:<id>" and "...:name:<name>", so
 * two schemas (or databases) never share one.
 */
import type { Queryable } from "./db.js";
import { run, statement } from "./sql.js";
import type { BackoffPolicy } from "./end-attempts.js";

const KEY = (kind: string) => `hashtextextended('leasehold:' || current_schema() || ':${kind}:' || $1, 0)`;

const LOCK_WORKER = statement("lockWorkerLiveness", `SELECT pg_try_advisory_lock(k) AS acquired, k AS key FROM (SELECT ${KEY("worker")} AS k) AS s`, {
  acquired: "bool",
  key: "int8",
});

const TAKE_OVER_WORKER_LOCK = statement(
  "takeOverWorkerLiveness",
  `
SELECT pg_terminate_backend(l.pid) AS ended
  FROM pg_locks AS l
 WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.pid <> pg_backend_pid()
   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND ((l.classid::bigint << 32) | l.objid::bigint) = $1::bigint`,
  { ended: "bool" },
);

const TRY_WORKER_LOCK = statement("retryWorkerLiveness", `SELECT pg_try_advisory_lock($1::bigint) AS acquired`, { acquired: "bool" });

/** How long a new session waits for its earlier session's lock to go, once that one was ended. */
const TAKE_OVER_WAIT_MS = 5_000;

const LOCK_NAME = statement("lockWorkerName", `SELECT pg_try_advisory_lock(${KEY("name")}) AS acquired`, { acquired: "bool" });
const WAIT_FOR_NAME = statement("waitForWorkerName", `SELECT true AS acquired FROM pg_advisory_lock(${KEY("name")})`, { acquired: "bool" });
const UNLOCK_WORKER = statement("unlockWorkerLiveness", `SELECT pg_advisory_unlock($1::bigint) AS released`, { released: "bool" });

/**
 * Takes the lock of worker `id` on this session, held until the session ends: the liveness the
 * watchdog checks (with `liveness: false`, a worker recovered by lease expiry only, it is held
 * but not announced) and the mark of this process's session. Then, with a name, the name's lock:
 * waited for with `waitForName`, else tried once. Returns the liveness key (null without
 * liveness), or `nameTaken` if another live session holds the name (then nothing is held).
 *
 * The worker's own lock comes first: a worker id is unique per process, so a session holding it
 * is this process's earlier one, gone silent (a proxy stopped forwarding) while its backend
 * lives on. That backend is ended, and with it the name's lock it held, which would otherwise
 * make this process find its own name taken and stop.
 */
export async function lockLiveness(
  db: Queryable,
  p: { workerId: string; name?: string; liveness?: boolean; waitForName?: boolean },
): Promise<{ key: string | null } | { nameTaken: true }> {
  const [worker] = await run(db, LOCK_WORKER, [p.workerId]);
  if (!worker!.acquired) {
    // This session must hold the lock itself, or the old backend's end would later look like
    // this worker's death: end that backend, then wait (briefly) for its lock.
    await run(db, TAKE_OVER_WORKER_LOCK, [worker!.key]);
    for (let waited = 0; !(await run(db, TRY_WORKER_LOCK, [worker!.key]))[0]!.acquired; waited += 50) {
      if (waited >= TAKE_OVER_WAIT_MS) throw new Error(`this worker's earlier session still holds its liveness lock after ${TAKE_OVER_WAIT_MS} ms`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  if (p.name !== undefined) {
    if (p.waitForName) {
      await run(db, WAIT_FOR_NAME, [p.name]);
    } else if (!(await run(db, LOCK_NAME, [p.name]))[0]!.acquired) {
      await run(db, UNLOCK_WORKER, [worker!.key]);
      return { nameTaken: true };
    }
  }
  return { key: p.liveness === false ? null : worker!.key };
}

const ANNOUNCE_WORKER = statement(
  "announceWorker",
  `
INSERT INTO workers (id, name, kind, host, pid, queues, tasks, concurrency, liveness_key, lease_ms, heartbeat_ms, liveness_grace_ms)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
ON CONFLICT (id) DO UPDATE
   SET last_seen_at = now(), lost_at = NULL, stopped_at = NULL, liveness_key = EXCLUDED.liveness_key,
       liveness_grace_ms = EXCLUDED.liveness_grace_ms,
       queues = EXCLUDED.queues, tasks = EXCLUDED.tasks, concurrency = EXCLUDED.concurrency,
       lease_ms = EXCLUDED.lease_ms, heartbeat_ms = EXCLUDED.heartbeat_ms`,
  {},
);

export interface TaskPolicy {
  task: string;
  backoff: BackoffPolicy;
  progressTimeoutMs: number | null;
  maxRunMs: number | null;
}

const ANNOUNCE_TASK_POLICIES = statement(
  "announceTaskPolicies",
  `
INSERT INTO task_policies AS t (task, backoff_base_ms, backoff_factor, backoff_max_ms, backoff_jitter,
                                progress_timeout_ms, max_run_ms, updated_by)
SELECT * FROM unnest($1::text[], $2::bigint[], $3::float8[], $4::bigint[], $5::float8[], $6::int[], $7::int[])
       CROSS JOIN (VALUES ($8::text)) AS w(id)
ON CONFLICT (task) DO UPDATE
   SET backoff_base_ms = EXCLUDED.backoff_base_ms, backoff_factor = EXCLUDED.backoff_factor,
       backoff_max_ms = EXCLUDED.backoff_max_ms, backoff_jitter = EXCLUDED.backoff_jitter,
       progress_timeout_ms = EXCLUDED.progress_timeout_ms, max_run_ms = EXCLUDED.max_run_ms,
       updated_at = now(), updated_by = EXCLUDED.updated_by`,
  {},
);

export interface WorkerAnnouncement {
  workerId: string;
  name?: string;
  kind: "worker" | "watchdog";
  host: string;
  pid: number;
  queues: string[];
  concurrency?: number;
  leaseMs?: number;
  heartbeatMs?: number;
  /** Null for a process that holds no liveness lock (a remote worker, or liveness recovery off). */
  livenessKey: string | null;
  /** How long its liveness lock may be gone before its jobs are recovered (null: the watchdog's grace). */
  livenessGraceMs?: number | null;
  policies: TaskPolicy[];
}

/**
 * Records (or refreshes) a live process on the database and the policies of the tasks it
 * runs, for the whole fleet (a remote worker's are its own: attachRemoteWorker).
 */
export async function announceWorker(db: Queryable, a: WorkerAnnouncement): Promise<void> {
  await run(db, ANNOUNCE_WORKER, [
    a.workerId,
    a.name ?? null,
    a.kind,
    a.host,
    a.pid,
    a.queues,
    a.policies.map((t) => t.task),
    a.concurrency ?? null,
    a.livenessKey,
    a.leaseMs ?? null,
    a.heartbeatMs ?? null,
    a.livenessGraceMs ?? null,
  ]);
  if (a.policies.length === 0) return;
  const ps = a.policies;
  await run(db, ANNOUNCE_TASK_POLICIES, [
    ps.map((t) => t.task),
    ps.map((t) => t.backoff.baseMs),
    ps.map((t) => t.backoff.factor),
    ps.map((t) => t.backoff.maxMs),
    ps.map((t) => t.backoff.jitter),
    ps.map((t) => t.progressTimeoutMs),
    ps.map((t) => t.maxRunMs),
    a.workerId,
  ]);
}

const ATTACH_REMOTE_WORKER = statement(
  "attachRemoteWorker",
  `
WITH attached AS (
  INSERT INTO workers (id, name, kind, host, pid, queues, tasks, concurrency, liveness_key, lease_ms, heartbeat_ms)
  VALUES ($1, $2, 'worker', $3, 0, $4, $5, $6, NULL, $7, $8)
  ON CONFLICT (id) DO NOTHING
  RETURNING id
), declared AS (
  INSERT INTO worker_task_policies (worker_id, task, backoff_base_ms, backoff_factor, backoff_max_ms, backoff_jitter,
                                    progress_timeout_ms, max_run_ms)
  SELECT a.id, p.* FROM attached AS a
   CROSS JOIN unnest($5::text[], $9::bigint[], $10::float8[], $11::bigint[], $12::float8[], $13::int[], $14::int[]) AS p
)
SELECT EXISTS (SELECT 1 FROM attached) AS attached`,
  { attached: "bool" },
);

export type RemoteAttachment = Omit<WorkerAnnouncement, "kind" | "pid" | "livenessKey" | "livenessGraceMs">;

/**
 * A remote worker (no database session) attaches under a worker id no process used before,
 * and its policies are recorded as its own: they apply to the jobs it holds, never to the
 * fleet's (a worker token is shared, so its holder speaks for itself only). Returns false,
 * recording nothing, when the id is already known. Each task appears once in `policies`.
 */
export async function attachRemoteWorker(db: Queryable, a: RemoteAttachment): Promise<boolean> {
  const ps = a.policies;
  const [row] = await run(db, ATTACH_REMOTE_WORKER, [
    a.workerId,
    a.name ?? null,
    a.host,
    a.queues,
    ps.map((t) => t.task),
    a.concurrency ?? null,
    a.leaseMs ?? null,
    a.heartbeatMs ?? null,
    ps.map((t) => t.backoff.baseMs),
    ps.map((t) => t.backoff.factor),
    ps.map((t) => t.backoff.maxMs),
    ps.map((t) => t.backoff.jitter),
    ps.map((t) => t.progressTimeoutMs),
    ps.map((t) => t.maxRunMs),
  ]);
  return row!.attached;
}

const MARK_STOPPED = statement("markWorkerStopped", `UPDATE workers SET stopped_at = now(), in_flight = 0 WHERE id = $1`, {});

/** A graceful stop: the process released its jobs and is going away on purpose. */
export async function markWorkerStopped(db: Queryable, workerId: string): Promise<void> {
  await run(db, MARK_STOPPED, [workerId]);
}

const MARK_LOST_WORKERS = statement(
  "markLostWorkers",
  `
WITH held AS (
  SELECT (l.classid::bigint << 32) | l.objid::bigint AS key
    FROM pg_locks AS l
   WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
), changed AS (
  UPDATE workers AS w
     SET lost_at = CASE WHEN w.lost_at IS NULL THEN now() END
   WHERE w.liveness_key IS NOT NULL AND w.stopped_at IS NULL
     AND (w.lost_at IS NULL) = NOT EXISTS (SELECT 1 FROM held WHERE held.key = w.liveness_key)
     -- Right after the server (re)started, every session is new: give workers time to
     -- reconnect before calling any of them lost. A worker that first announced itself to
     -- this server already had its session here: its lock gone is a crash like any other.
     AND (w.lost_at IS NOT NULL OR w.started_at > pg_postmaster_start_time()
          OR now() - pg_postmaster_start_time() > $1::bigint * interval '1 millisecond')
  RETURNING w.id, w.lost_at IS NOT NULL AS lost, w.liveness_grace_ms
)
SELECT coalesce(array_agg(id) FILTER (WHERE lost), '{}') AS lost,
       coalesce(array_agg(coalesce(liveness_grace_ms, $2::int)) FILTER (WHERE lost), '{}') AS lost_graces,
       coalesce(array_agg(id) FILTER (WHERE NOT lost), '{}') AS back,
       -- The hot table's row counts ride along: the watchdog vacuums it when dead rows pile
       -- up, without a statement of its own every tick.
       pg_stat_get_live_tuples('jobs'::regclass) AS jobs_live,
       pg_stat_get_dead_tuples('jobs'::regclass) AS jobs_dead
  FROM changed`,
  { lost: "_text", lost_graces: "_int4", back: "_text", jobs_live: "int8", jobs_dead: "int8" },
);

/**
 * Compares the workers that should be alive with the liveness locks held now: a worker whose
 * lock is gone is marked lost (the time is kept, so recovery can wait a grace for a
 * reconnect); one whose lock is back is unmarked. Returns the changes (with each newly lost
 * worker's grace: its own, else `defaultGraceMs`), and the hot table's live and dead row
 * counts (as the statistics last saw them).
 */
export async function markLostWorkers(
  db: Queryable,
  p: { startupGraceMs: number; defaultGraceMs: number },
): Promise<{ lost: { id: string; graceMs: number }[]; back: string[]; jobsLive: number; jobsDead: number }> {
  const [row] = await run(db, MARK_LOST_WORKERS, [p.startupGraceMs, p.defaultGraceMs]);
  const lost = row!.lost.map((id, i) => ({ id, graceMs: row!.lost_graces[i]! }));
  return { lost, back: row!.back, jobsLive: Number(row!.jobs_live), jobsDead: Number(row!.jobs_dead) };
}

const NAME_HELD_ELSEWHERE = statement(
  "workerNameHeldElsewhere",
  `
SELECT EXISTS (
  SELECT 1 FROM workers
   WHERE name = $1 AND id <> $2 AND stopped_at IS NULL AND lost_at IS NULL
     AND last_seen_at > now() - $3::bigint * interval '1 millisecond'
) AS held`,
  { held: "bool" },
);

/**
 * Whether another process announced with `name` (not stopped, not lost) was seen within
 * `withinMs` by the database's clock: for workers without a database session, whose
 * liveness is their beats.
 */
export async function workerNameHeldElsewhere(db: Queryable, p: { name: string; workerId: string; withinMs: number }): Promise<boolean> {
  const [row] = await run(db, NAME_HELD_ELSEWHERE, [p.name, p.workerId, p.withinMs]);
  return row!.held;
}

const PRUNE_WORKERS = statement(
  "pruneWorkers",
  `
WITH gone AS (
  DELETE FROM workers
   WHERE coalesce(stopped_at, lost_at, last_seen_at) < now() - $1::bigint * interval '1 millisecond'
  RETURNING 1
)
SELECT count(*)::int AS deleted FROM gone`,
  { deleted: "int4" },
);

/** Forgets processes stopped, lost or silent for longer than `retainMs`. */
export async function pruneWorkers(db: Queryable, p: { retainMs: number }): Promise<number> {
  const [row] = await run(db, PRUNE_WORKERS, [p.retainMs]);
  return row!.deleted;
}
