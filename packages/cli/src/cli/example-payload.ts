/**
 * A payload for the enqueue command `leasehold dev` suggests, that the task's schema accepts:
 * a suggested command whose job is dead at once (its payload refused) teaches the wrong thing.
 *
 * `{}` when the schema takes it (or the task has none). Otherwise each required top-level field
 * the schema names gets the first of a few plain values it accepts, and the whole payload is
 * checked again. No payload when that fails: the banner then names the fields instead.
 */
import type { JsonValue } from "leasehold/internal/jobs/types";
import type { AnyTask } from "leasehold/internal/tasks/define";
import { checkPayload, type PayloadIssue } from "leasehold/internal/tasks/validate";

/** Tried in this order, so a field takes the plainest value it accepts. */
const CANDIDATES: JsonValue[] = ["example", "ada@example.com", "https://example.com", "2026-01-01T00:00:00Z", 1, true];

export type Suggestion = { ok: true; payload: JsonValue } | { ok: false; issues: PayloadIssue[] };

export async function examplePayload(task: AnyTask | undefined): Promise<Suggestion> {
  if (!task) return { ok: true, payload: {} };
  const first = await checkPayload(task.schema, {});
  if (first.ok) return { ok: true, payload: {} };
  const payload: Record<string, JsonValue> = {};
  for (const field of new Set(first.issues.map((i) => topLevelField(i.path)))) {
    if (field === undefined) return { ok: false, issues: first.issues };
    for (const value of CANDIDATES) {
      const checked = await checkPayload(task.schema, { ...payload, [field]: value });
      if (checked.ok || !checked.issues.some((i) => topLevelField(i.path) === field)) {
        payload[field] = value;
        break;
      }
    }
  }
  const last = await checkPayload(task.schema, payload);
  return last.ok ? { ok: true, payload } : { ok: false, issues: first.issues };
}

/** `payload.to` → "to"; a nested or whole-payload issue → undefined. */
function topLevelField(path: string): string | undefined {
  return /^payload\.([A-Za-z_$][\w$]*)$/.exec(path)?.[1];
}
