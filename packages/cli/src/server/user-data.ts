/**
 * What a read-only credential is not shown unless the operator chooses to (`--show-payloads`):
 * the values handlers and enqueuers choose, which may carry anyone's personal data (payloads,
 * results, checkpoints, progress) and error messages, which often quote them. Applied to every
 * answer by the field's name, so a route added later cannot forget it; the rest of a record
 * (ids, states, times, queues, tasks) stays as it is.
 */

/** What a hidden value reads as, in place of the value. */
export const HIDDEN = "[hidden]";

/** Fields holding any JSON value a user chose. */
const USER_VALUES = new Set(["payload", "result", "checkpoint", "progress"]);
/** Fields holding an error's message (a job's last error, an attempt's error); an error answer's own `error` is an object and stays. */
const ERROR_MESSAGES = new Set(["lastError", "error"]);

/** A copy of `value` with every user-chosen value and error message replaced by HIDDEN (null and absent ones stay: they show nothing). */
export function hideUserData(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(hideUserData);
  if (value === null || typeof value !== "object" || value instanceof Date) return value;
  const copy: Record<string, unknown> = {};
  for (const [key, v] of Object.entries(value)) {
    if (v === null || v === undefined) copy[key] = v;
    else if (USER_VALUES.has(key) || (ERROR_MESSAGES.has(key) && typeof v === "string")) copy[key] = HIDDEN;
    else copy[key] = hideUserData(v);
  }
  return copy;
}
