/** What the chaos child processes share: their settings from the environment, and start-up. */
import type pg from "pg";
import type { BackoffPolicy } from "../packages/leasehold/src/index.js";

/** Short retries, so a job that failed or lost its lease runs again within a second or two. */
export const CHAOS_BACKOFF: BackoffPolicy = { baseMs: 200, factor: 2, maxMs: 2_000, jitter: 0.5 };

export function env(name: string): string {
  const value = process.env[name];
  if (!value) {
    process.stderr.write(`${name} is not set: this script is started by the chaos harness (chaos/run.ts)\n`);
    process.exit(2);
  }
  return value;
}

/** A process (re)started while the database is down or cut off waits for it, as a supervised one would. */
export async function waitForDatabase(pool: pg.Pool, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      await pool.query("SELECT 1");
      return;
    } catch (err) {
      if (Date.now() > deadline) throw err;
      await new Promise((r) => setTimeout(r, 200));
    }
  }
}
