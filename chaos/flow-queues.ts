/**
 * The run's flow-controlled queues (docs/flow-control.md): part of the workload goes to queues
 * with limits — fleet-wide concurrency, per-key concurrency 1 over a few dozen keys, per-key
 * concurrency 3 under a fleet-wide cap, a rate — so the checker (flow-checks.ts) can show
 * from the audit trail that no limit was exceeded while workers were killed, frozen and cut
 * off. The `pause` fault pauses the main queue; the `flow_kill` fault uses the probe queue.
 */
import type { QueueLimits } from "../packages/leasehold/src/store/flow.js";

export interface FlowQueue {
  name: string;
  /** The share of the producer's jobs enqueued here. */
  share: number;
  /** Keyed queues: their jobs take keys k00, k01, ... at random. */
  keys?: number;
  limits: Partial<QueueLimits>;
}

export const FLOW_QUEUES: readonly FlowQueue[] = [
  // 32 slots across the fleet by default: 6 binds whenever the queue has a backlog.
  { name: "chaos_fleet", share: 0.08, limits: { concurrency: 6 } },
  // One at a time per key, in order: the strictest per-key limit, over 36 keys.
  { name: "chaos_keys", share: 0.1, keys: 36, limits: { keyConcurrency: 1 } },
  // Three per key over few keys, and a fleet-wide cap below what the keys would allow (6 x 3).
  { name: "chaos_keys3", share: 0.06, keys: 6, limits: { keyConcurrency: 3, concurrency: 12 } },
  // 6 starts per second: bursts and retries hit it.
  { name: "chaos_rate", share: 0.06, limits: { rate: { limit: 6, windowMs: 1_000 } } },
];

/**
 * The `flow_kill` fault's queue: one slot, so a job enqueued while another holds it is blocked
 * by that slot alone. Only the fault enqueues here.
 */
export const PROBE_QUEUE: FlowQueue = { name: "chaos_probe", share: 0, limits: { concurrency: 1 } };

/** Every queue with limits, as the checker reads them. */
export const LIMITED_QUEUES: readonly FlowQueue[] = [...FLOW_QUEUES, PROBE_QUEUE];

/** The queue and key of the next job, from one draw of the run's generator (and one more for a key). */
export function pickFlowQueue(random: () => number): { queue?: string; key?: string } {
  let r = random();
  for (const q of FLOW_QUEUES) {
    if (r < q.share) {
      return q.keys ? { queue: q.name, key: `k${String(Math.floor(random() * q.keys)).padStart(2, "0")}` } : { queue: q.name };
    }
    r -= q.share;
  }
  return {};
}
