import type { BackoffPolicy } from "../store/end-attempts.js";

export type { BackoffPolicy };

/**
 * 1 s, 2 s, 4 s … capped at one hour, each drawn from the upper half of its step. The delay
 * itself is computed in the database (its retry_delay_ms function) from the task's policy,
 * for a handler's failure and for every recovery alike.
 */
export const DEFAULT_BACKOFF: BackoffPolicy = { baseMs: 1_000, factor: 2, maxMs: 3_600_000, jitter: 0.5 };
