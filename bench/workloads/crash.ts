/**
 * Workload 4b: crash detection at the default settings, measured over many kills. A fleet of
 * worker processes exactly as `lh.worker({ handlers })` gives them (lease 30 s, heartbeat 10 s,
 * a watchdog in each, default backoff); each round enqueues one long job, kills -9 the process
 * running it, measures until its next attempt starts in another process, and replaces the
 * dead process. Every stage is timed on the database's clock:
 *
 *   kill → liveness lock free (the victim's session ended; polled from pg_locks)
 *        → lost_at (a watchdog saw the lock gone: workers.lost_at)
 *        → recovered (the attempt ended as worker_lost: its audit row's ended_at)
 *        → restarted (the next attempt's started_at)
 *
 * The kill's own time is the database's clock_timestamp() read just before the SIGKILL.
 */
import { percentile, sleep, waitUntil, nowMs } from "../lib/stats.js";
import { WorkerGroup } from "../lib/workers.js";
import type { BenchSystem, WorkerSpec } from "../systems/types.js";
import { urlOf, withClient, type BenchContext, type Metrics } from "./context.js";

const LONG_JOB_MS = 30 * 60_000;
/** How often the victim's liveness lock is polled after the kill. */
const LOCK_POLL_MS = 5;
/**
 * A new process's watchdog counts the fleet on its second reap (~2 s) and a dead one drops
 * out of the count 7 s after its last touch: each kill waits this long after the fleet last
 * changed, so it hits a fleet in its steady state, as a crash in production does.
 */
const SETTLE_MS = 8_000;

const HELD = `
SELECT clock_timestamp()::text AS at,
       EXISTS (SELECT 1 FROM pg_locks AS l
                WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
                  AND ((l.classid::bigint << 32) | l.objid::bigint) = $1::bigint) AS held`;

/** Seconds from the kill to each stage, on the database's clock. */
const STAGES = `
WITH attempts AS (
  SELECT id AS job_id, attempt, started_at FROM jobs
  UNION ALL
  SELECT job_id, attempt, started_at FROM all_attempts
)
SELECT extract(epoch FROM $3::timestamptz - $2::timestamptz)::float8 AS lock_free_s,
       extract(epoch FROM w.lost_at - $2::timestamptz)::float8 AS lost_s,
       extract(epoch FROM a.ended_at - $2::timestamptz)::float8 AS recovered_s,
       a.outcome,
       (SELECT extract(epoch FROM min(n.started_at) - $2::timestamptz)::float8
          FROM attempts AS n WHERE n.job_id = $1 AND n.attempt = $4 + 1) AS restarted_s,
       extract(epoch FROM $2::timestamptz - pg_postmaster_start_time())::float8 AS server_age_s
  FROM job_attempts AS a
  JOIN workers AS w ON w.id = a.worker_id
 WHERE a.job_id = $1 AND a.attempt = $4`;

interface Kill {
  total: number;
  lockFree: number;
  detect: number;
  grace: number;
  claim: number;
  harness: number;
}

export async function crashWorkload(ctx: BenchContext, system: BenchSystem): Promise<Metrics> {
  const url = urlOf(ctx, system);
  const { kills, crashProcesses } = ctx.options;
  const timeoutMs = ctx.options.recoveryTimeoutSeconds * 1000;
  await system.reset(url, "recovery");
  const producer = await system.producer(url, "recovery");
  const spec: WorkerSpec = { profile: "recovery", defaults: true };
  const group = await WorkerGroup.start(system.name, url, spec, crashProcesses);
  const starts = new Map<string, { pid: number; at: number }[]>();
  group.on("tracked", (m: { track: string; pid: number; at: number }) => starts.set(m.track, [...(starts.get(m.track) ?? []), m]));
  try {
    return await withClient(url, async (db) => {
      await db.query(`SET search_path TO ${system.schema}`);
      const done: Kill[] = [];
      for (let i = 1; i <= kills; i++) {
        await sleep(SETTLE_MS);
        const track = `kill-${i}`;
        await producer.enqueue([{ sleepMs: LONG_JOB_MS, track, firstAttemptOnly: true }]);
        if (!(await waitUntil(() => (starts.get(track)?.length ?? 0) > 0, 30_000))) throw new Error(`kill ${i}: the job never started`);
        const victim = starts.get(track)![0]!.pid;
        // Into the job at a random point, so kills land at every phase of the watchdogs' ticks.
        await sleep(300 + Math.random() * 1_000);
        const { rows: held } = await db.query<{ id: string; attempt: number; key: string }>(
          `SELECT j.id, j.attempt, w.liveness_key AS key FROM jobs AS j JOIN workers AS w ON w.id = j.locked_by
            WHERE j.payload->>'track' = $1 AND j.state = 'running'`,
          [track],
        );
        if (held.length !== 1) throw new Error(`kill ${i}: the job is not running`);
        const job = held[0]!;
        const { rows: clock } = await db.query<{ at: string }>("SELECT clock_timestamp()::text AS at");
        const killedAt = clock[0]!.at;
        const killedAtMs = nowMs();
        group.kill9(victim);
        let lockFreeAt: string | undefined;
        const lockDeadline = performance.now() + timeoutMs;
        while (performance.now() < lockDeadline) {
          const { rows } = await db.query<{ at: string; held: boolean }>(HELD, [job.key]);
          if (!rows[0]!.held) {
            lockFreeAt = rows[0]!.at;
            break;
          }
          await sleep(LOCK_POLL_MS);
        }
        const again = () => starts.get(track)!.find((s) => s.pid !== victim);
        if (!lockFreeAt || !(await waitUntil(() => again() !== undefined, timeoutMs, 5))) {
          throw new Error(`kill ${i}: not running again within ${ctx.options.recoveryTimeoutSeconds} s`);
        }
        const harness = (again()!.at - killedAtMs) / 1000;
        const { rows } = await db.query<{
          lock_free_s: number;
          lost_s: number | null;
          recovered_s: number;
          outcome: string;
          restarted_s: number;
          server_age_s: number;
        }>(STAGES, [job.id, killedAt, lockFreeAt, job.attempt]);
        const r = rows[0];
        if (!r || r.restarted_s === null) throw new Error(`kill ${i}: no audit row for attempt ${job.attempt} or no next attempt`);
        const lost = r.lost_s ?? NaN;
        const k: Kill = {
          total: r.restarted_s,
          lockFree: r.lock_free_s,
          detect: lost - r.lock_free_s,
          grace: r.recovered_s - lost,
          claim: r.restarted_s - r.recovered_s,
          harness,
        };
        done.push(k);
        const s = (v: number) => v.toFixed(3);
        ctx.log(
          `  kill ${i}/${kills}: ${s(k.total)} s = lock free ${s(k.lockFree)} + seen lost ${s(k.detect)} + grace ${s(k.grace)} + claim ${s(k.claim)}` +
            ` (${r.outcome}; harness clock ${s(harness)} s; server up ${r.server_age_s.toFixed(1)} s)`,
        );
        // The fleet stays the same size: the dead process is replaced before the next kill.
        await group.add(system.name, url, spec);
      }
      const stat = (key: keyof Kill) => {
        const v = done.map((k) => k[key]);
        return { p50: percentile(v, 50), p99: percentile(v, 99), max: Math.max(...v) };
      };
      const total = stat("total");
      const m: Metrics = { kills: done.length, p50Seconds: total.p50, p99Seconds: total.p99, maxSeconds: total.max };
      for (const key of ["lockFree", "detect", "grace", "claim", "harness"] as const) {
        const st = stat(key);
        m[`${key}P50Seconds`] = st.p50;
        m[`${key}MaxSeconds`] = st.max;
      }
      return m;
    });
  } finally {
    group.killAll();
    await producer.close();
  }
}
