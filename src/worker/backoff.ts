import type { BackoffPolicy } from "../store/end-attempts.js";

export type { BackoffPolicy };

/** 1 s, 2 s, 4 s … capped at one hour, each drawn from the upper half of its step. */
export const DEFAULT_BACKOFF: BackoffPolicy = { baseMs: 1_000, factor: 2, maxMs: 3_600_000, jitter: 0.5 };

/**
 * Delay before retrying a job that has already spent `spentAttempts` of its budget. The
 * watchdog computes the same formula in SQL (reapExpiredLeases).
 */
export function retryDelayMs(policy: BackoffPolicy, spentAttempts: number, random = Math.random): number {
  const capped = Math.min(policy.maxMs, policy.baseMs * Math.pow(policy.factor, spentAttempts));
  return Math.round(capped * (1 - policy.jitter * random()));
}
