/**
 * Fake time for a test database.
 *
 * Leasehold's only clock is the database's `now()`: run times, backoff, leases, schedules and
 * retention are all compared with it. So the fake clock is `now()` itself: in the test
 * database (never anywhere else) `pg_catalog.now()` is replaced by the real transaction time
 * plus an offset kept in a one-row table, and moving time forward is raising the offset. Every
 * statement, column default, view and SQL function in that database then sees the same moved
 * clock, the application's own SQL included; nothing in the library has to know.
 *
 * How it takes: PostgreSQL calls a built-in function by its OID without reading pg_proc, but
 * the planner inlines an SQL-language function body before that happens, and every statement is
 * planned. Plans cached before the replacement would keep the real clock, so it is installed in
 * the template, before any session exists. Replacing a pg_catalog function needs a superuser;
 * without one the template has no fake clock and `advance` says so.
 *
 * Time only moves forward: a clock moved back would make leases and schedules run backwards.
 */
import type pg from "pg";
import type { Leasehold } from "../index.js";

export const CLOCK_SQL = `
CREATE SCHEMA leasehold_testkit;
CREATE TABLE leasehold_testkit.clock (
  only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
  offset_by interval NOT NULL DEFAULT '0'
);
INSERT INTO leasehold_testkit.clock DEFAULT VALUES;
-- Reads the table, so it is not inlined: the offset is read when a statement runs, not planned.
CREATE FUNCTION leasehold_testkit.clock_offset() RETURNS interval
  LANGUAGE sql STABLE PARALLEL SAFE AS $$ SELECT offset_by FROM leasehold_testkit.clock $$;
CREATE OR REPLACE FUNCTION pg_catalog.now() RETURNS timestamptz
  LANGUAGE sql STABLE PARALLEL SAFE
  AS $$ SELECT pg_catalog.transaction_timestamp() + leasehold_testkit.clock_offset() $$;
`;

/** The most schedule ticks `advance` steps through before it gives up (a pattern firing every second for days). */
export const MAX_ADVANCE_STEPS = 10_000;

export interface TestClock {
  /** The queue's time: the test database's `now()`. */
  now(): Promise<Date>;
  /**
   * Moves the queue's time forward by `ms`, as if that time had passed with a scheduler
   * running: every schedule tick on the way is enqueued at its own time (the jobs are not
   * run; `drain()` runs them). Jobs whose run time falls inside become ready. Returns the new now.
   */
  advance(ms: number): Promise<Date>;
  /** Moves the queue's time forward to `at` (no change if it is already past), like `advance`. */
  advanceTo(at: Date): Promise<Date>;
  /** How far the queue's time is ahead of the real time, in ms. */
  offsetMs(): Promise<number>;
}

export class DatabaseClock implements TestClock {
  constructor(
    private readonly pool: pg.Pool,
    private readonly lh: Leasehold,
    /** False when the template could not get the fake clock (not a superuser). */
    private readonly available: boolean,
  ) {}

  async now(): Promise<Date> {
    const { rows } = await this.pool.query<{ now: Date }>("SELECT now() AS now");
    return rows[0]!.now;
  }

  async offsetMs(): Promise<number> {
    if (!this.available) return 0;
    const { rows } = await this.pool.query<{ ms: number }>(
      "SELECT (extract(epoch FROM offset_by) * 1000)::float8 AS ms FROM leasehold_testkit.clock",
    );
    return rows[0]!.ms;
  }

  async advance(ms: number): Promise<Date> {
    if (typeof ms !== "number" || !Number.isFinite(ms) || ms < 0) {
      throw new RangeError(`clock.advance takes a number of milliseconds, 0 or more (got ${String(ms)})`);
    }
    return this.advanceTo(new Date((await this.now()).getTime() + ms));
  }

  async advanceTo(at: Date): Promise<Date> {
    if (!(at instanceof Date) || !Number.isFinite(at.getTime())) throw new RangeError("clock.advanceTo takes a valid Date");
    this.assertAvailable();
    // Step to each schedule tick on the way and let the scheduler enqueue it there, so a
    // daily schedule moved three days on gets its three ticks, as a scheduler running all
    // along would have made (a jump straight there would look like downtime: one tick).
    const scheduler = this.lh.scheduler();
    for (let step = 0; ; step++) {
      const { rows } = await this.pool.query<{ due: Date | null }>("SELECT min(next_run_at) AS due FROM schedules WHERE next_run_at <= $1", [at]);
      const due = rows[0]!.due;
      if (due === null) break;
      if (step >= MAX_ADVANCE_STEPS) {
        throw new Error(`clock.advanceTo stopped after ${MAX_ADVANCE_STEPS} schedule ticks; advance by less at a time`);
      }
      await this.moveTo(due);
      await scheduler.runOnce();
    }
    await this.moveTo(at);
    return this.now();
  }

  /** Raises the offset so that now() is at least `at` from the next statement on. */
  private async moveTo(at: Date): Promise<void> {
    await this.pool.query(
      "UPDATE leasehold_testkit.clock SET offset_by = greatest(offset_by, $1::timestamptz - pg_catalog.transaction_timestamp())",
      [at],
    );
  }

  private assertAvailable(): void {
    if (!this.available) {
      throw new Error(
        "fake time needs the test database's now() replaced, which only a superuser can do: " +
          "connect leasehold/testing with a superuser's DATABASE_URL (the PostgreSQL Docker image's `postgres`, or Leasehold's embedded one)",
      );
    }
  }
}
