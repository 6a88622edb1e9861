/** Small statistics helpers for benchmark results. */

export function median(values: number[]): number {
  return percentile(values, 50);
}

/** Nearest-rank percentile (p in 0..100); NaN for an empty list. */
export function percentile(values: number[], p: number): number {
  if (values.length === 0) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(sorted.length - 1, Math.max(0, rank - 1))]!;
}

export function round(value: number, digits = 1): number {
  if (!Number.isFinite(value)) return value;
  const f = 10 ** digits;
  return Math.round(value * f) / f;
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** Wall-clock milliseconds with sub-millisecond precision, comparable across processes. */
export function nowMs(): number {
  return performance.timeOrigin + performance.now();
}

/** Polls `check` until it returns true or the timeout passes; returns whether it did. */
export async function waitUntil(check: () => boolean | Promise<boolean>, timeoutMs: number, everyMs = 20): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check()) return true;
    await sleep(everyMs);
  }
  return check();
}
