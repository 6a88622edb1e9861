/** What `leasehold doctor` and `stats` read about the fleet: processes, their beats, unreaped leases. */
import type { Queryable } from "./db.js";
import { run, statement } from "./sql.js";

const FLEET = statement(
  "fleetHealth",
  `
SELECT id, kind, queues, lease_ms, heartbeat_ms, beat_gaps, last_seen_at, lost_at, stopped_at,
       extract(epoch FROM now() - last_seen_at)::float8 AS seen_s_ago
  FROM workers
 WHERE last_seen_at > now() - $1::bigint * interval '1 millisecond'
 ORDER BY kind, id`,
  {
    id: "text",
    kind: "text",
    queues: "_text",
    lease_ms: "int4?",
    heartbeat_ms: "int4?",
    beat_gaps: "_int4?",
    last_seen_at: "timestamptz",
    lost_at: "timestamptz?",
    stopped_at: "timestamptz?",
    seen_s_ago: "float8",
  },
);

const UNREAPED = statement(
  "unreapedLeases",
  `
SELECT count(*)::int AS expired,
       extract(epoch FROM now() - min(lease_until))::float8 AS oldest_s
  FROM jobs
 WHERE state = 'running' AND lease_until < now()`,
  { expired: "int4", oldest_s: "float8?" },
);

export interface FleetProcess {
  id: string;
  kind: "worker" | "watchdog";
  queues: string[];
  leaseMs: number | null;
  heartbeatMs: number | null;
  /** Beat delay histogram (counts per bucket of BEAT_DELAY_BUCKETS_MS), if it beat. */
  beatDelays: number[] | null;
  secondsSinceSeen: number;
  live: boolean;
}

export interface FleetHealth {
  processes: FleetProcess[];
  expiredLeases: number;
  oldestExpiredSeconds: number | null;
}

/**
 * Processes seen within `withinMs` (live: not stopped, not lost, seen within `aliveMs`), and
 * leases that ran out but are not reaped yet.
 */
export async function fleetHealth(db: Queryable, p: { withinMs: number; aliveMs: number }): Promise<FleetHealth> {
  const [rows, [unreaped]] = await Promise.all([run(db, FLEET, [p.withinMs]), run(db, UNREAPED)]);
  return {
    processes: rows.map((r) => ({
      id: r.id,
      kind: r.kind as FleetProcess["kind"],
      queues: r.queues,
      leaseMs: r.lease_ms,
      heartbeatMs: r.heartbeat_ms,
      beatDelays: r.beat_gaps,
      secondsSinceSeen: r.seen_s_ago,
      live: r.stopped_at === null && r.lost_at === null && r.seen_s_ago * 1000 < p.aliveMs,
    })),
    expiredLeases: unreaped!.expired,
    oldestExpiredSeconds: unreaped!.oldest_s,
  };
}
