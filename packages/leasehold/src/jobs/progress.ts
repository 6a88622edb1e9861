/**
 * How far along a running job is, when its progress says so. `ctx.progress()` takes any JSON
 * value; these shapes are read as a fraction (views draw a bar for them):
 *   - a number from 0 to 1: `ctx.progress(0.4)`;
 *   - `{ fraction: 0.4 }`, or `{ percent: 40 }`;
 *   - a count and a total: `{ done: 4, of: 10 }` (also `step`, `current`, `completed` with
 *     `of` or `total`).
 * Anything else has no fraction (null): it is shown as it is.
 */
const COUNTS = ["done", "step", "current", "completed"] as const;
const TOTALS = ["of", "total"] as const;

export function progressFraction(progress: unknown): number | null {
  if (typeof progress === "number") return progress >= 0 && progress <= 1 ? progress : null;
  if (progress === null || typeof progress !== "object" || Array.isArray(progress)) return null;
  const p = progress as Record<string, unknown>;
  const finite = (v: unknown): v is number => typeof v === "number" && Number.isFinite(v);
  if (finite(p.fraction)) return clamp(p.fraction);
  if (finite(p.percent)) return clamp(p.percent / 100);
  const count = COUNTS.map((k) => p[k]).find(finite);
  const total = TOTALS.map((k) => p[k]).find(finite);
  if (count === undefined || total === undefined || total <= 0) return null;
  return clamp(count / total);
}

const clamp = (x: number) => Math.min(1, Math.max(0, x));
