/**
 * Periodic jobs against the real server: patterns checked at the boundary, exactly one job per
 * tick however many schedulers run, no burst of missed ticks unless asked (backfill), time
 * zones, a redeploy that keeps a schedule's place, a worker running scheduled jobs, and the CLI.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { ValidationError } from "../packages/leasehold/src/errors.js";
import type { JobContext } from "../packages/leasehold/src/worker/context.js";
import { eventually, freshLeasehold } from "./helpers/db.js";
import { runCli } from "./helpers/cli.js";

type Lh = Awaited<ReturnType<typeof freshLeasehold>>;

const scheduledKeys = async (lh: Lh, name: string) =>
  (await lh.pool.query<{ k: string }>("SELECT unique_key AS k FROM jobs WHERE unique_key LIKE $1 ORDER BY run_at", [`schedule:${name}:%`])).rows.map(
    (r) => r.k,
  );

test("a schedule is checked when saved: pattern, time zone, options and the jobs' own options", async (t) => {
  const lh = await freshLeasehold(t);
  const bad: [object, RegExp][] = [
    [{ name: "a", cron: "61 * * * *", task: "t" }, /cron .*not a valid cron pattern/],
    [{ name: "a", cron: "", task: "t" }, /cron must be a cron pattern/],
    [{ name: "a", cron: "* * * * *", task: "t", timezone: "Mars/Olympus" }, /timezone must be an IANA time zone/],
    [{ name: "a", cron: "* * * * *", task: "t", backfil: true }, /unknown option "backfil".*backfill/],
    [{ name: "a b", cron: "* * * * *", task: "t" }, /schedule name must be/],
    [{ name: "a", cron: "* * * * *", task: "bad task" }, /task must be/],
    [{ name: "a", cron: "* * * * *", task: "t", maxAttempts: 0 }, /maxAttempts must be an integer/],
    [{ name: "a", cron: "* * * * *", task: "t", payload: { s: "\ud83d" } }, /not well-formed Unicode/],
    [{ name: "a", cron: "* * * * *", task: "t", uniqueKey: "k" }, /unknown option "uniqueKey"/],
  ];
  for (const [def, message] of bad) {
    await assert.rejects(lh.schedule(def as never), (err: Error) => err instanceof ValidationError && message.test(err.message), JSON.stringify(def));
  }
  assert.deepEqual(await lh.listSchedules(), [], "nothing saved");
});

test("many schedulers at once enqueue exactly one job per tick", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.schedule({ name: "every-second", cron: "* * * * * *", task: "t", backfill: true });
  // Five seconds of ticks are due now; eight schedulers race for them, twice.
  await lh.pool.query("UPDATE schedules SET next_run_at = date_trunc('second', now()) - interval '5 seconds'");
  const schedulers = Array.from({ length: 8 }, () => lh.scheduler());
  const made = (await Promise.all([...schedulers, ...schedulers].map((s) => s.runOnce()))).reduce((a, b) => a + b, 0);
  const keys = await scheduledKeys(lh, "every-second");
  assert.equal(made, keys.length);
  assert.equal(new Set(keys).size, keys.length, "no tick twice");
  assert.ok(keys.length >= 6, `ticks from 5 s ago to now: ${keys.length}`);
  const seconds = keys.map((k) => Date.parse(k.split(":").slice(2).join(":")) / 1000);
  assert.deepEqual(
    seconds.slice(1).map((s, i) => s - seconds[i]!),
    Array(seconds.length - 1).fill(1),
    "consecutive seconds, none skipped",
  );
  const [s] = await lh.listSchedules();
  assert.ok(s!.nextRunAt.getTime() > Date.now() - 1_000 && s!.lastJobId !== null);
});

test("after downtime a schedule enqueues only its latest missed tick, unless it backfills", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.schedule({ name: "minutely", cron: "* * * * *", task: "t" });
  await lh.schedule({ name: "minutely-backfill", cron: "* * * * *", task: "t", backfill: true });
  // Down for an hour.
  await lh.pool.query("UPDATE schedules SET next_run_at = date_trunc('minute', now()) - interval '60 minutes'");
  await lh.scheduler().runOnce();
  const latest = await scheduledKeys(lh, "minutely");
  assert.equal(latest.length, 1, "one job, not sixty");
  const { rows } = await lh.pool.query<{ latest: boolean }>(
    "SELECT run_at = date_trunc('minute', now()) AS latest FROM jobs WHERE unique_key LIKE 'schedule:minutely:%'",
  );
  assert.deepEqual(rows, [{ latest: true }], "the latest missed tick (this minute's)");
  assert.equal((await scheduledKeys(lh, "minutely-backfill")).length, 61, "every minute from an hour ago to now");
  assert.equal(await lh.scheduler().runOnce(), 0, "nothing more is due");
});

test("a backfill after a long outage is capped: the latest 100 ticks by default, or the schedule's own limit up to 1000", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.schedule({ name: "per-second", cron: "* * * * * *", task: "t", backfill: true });
  await lh.schedule({ name: "per-second-5", cron: "* * * * * *", task: "t", backfill: 5 });
  await lh.schedule({ name: "per-second-max", cron: "* * * * * *", task: "t", backfill: 1000 });
  assert.deepEqual(
    (await lh.listSchedules()).map((s) => [s.name, s.backfill, s.backfillLimit]),
    [
      ["per-second", true, 100],
      ["per-second-5", true, 5],
      ["per-second-max", true, 1000],
    ],
  );
  // Down for a day: 86,400 missed ticks each.
  await lh.pool.query("UPDATE schedules SET next_run_at = date_trunc('second', now()) - interval '1 day'");
  const made = await lh.scheduler().runOnce();
  const ticks = async (name: string) =>
    (
      await lh.pool.query<{ n: number; latest: boolean }>(
        "SELECT count(*)::int AS n, max(run_at) >= date_trunc('second', now()) - interval '2 seconds' AS latest FROM jobs WHERE unique_key LIKE $1",
        [`schedule:${name}:%`],
      )
    ).rows[0]!;
  assert.deepEqual(await ticks("per-second"), { n: 100, latest: true }, "the latest 100, not 86,400");
  assert.deepEqual(await ticks("per-second-5"), { n: 5, latest: true });
  assert.deepEqual(await ticks("per-second-max"), { n: 1000, latest: true });
  assert.equal(made, 1105);
  // A schedule saved before the limit existed (backfill on, no limit stored) takes the default.
  await lh.pool.query("DELETE FROM jobs");
  await lh.pool.query("UPDATE schedules SET backfill_limit = NULL, next_run_at = date_trunc('second', now()) - interval '1 day'");
  await lh.scheduler().runOnce();
  assert.equal((await ticks("per-second-max")).n, 100);

  // The CLI: --backfill N (checked as lh.schedule checks it).
  const cli = (...args: string[]) => runCli(["schedules", "add", ...args], { schema: lh.schema });
  const added = await cli("cli-5", "--cron", "* * * * * *", "--task", "t", "--backfill", "5", "--json");
  assert.equal(added.code, 0, added.stderr);
  assert.equal((await lh.listSchedules()).find((s) => s.name === "cli-5")?.backfillLimit, 5);
  const tooMany = await cli("cli-big", "--cron", "* * * * * *", "--task", "t", "--backfill", "5000");
  assert.notEqual(tooMany.code, 0);
  assert.match(tooMany.stderr, /backfill must be true \(at most 100 missed ticks\), false, or .* from 1 to 1000 \(got 5000\)/);

  for (const backfill of [0, 1001, 2.5, "yes", -1]) {
    await assert.rejects(
      lh.schedule({ name: "bad", cron: "* * * * *", task: "t", backfill: backfill as never }),
      (err: Error) =>
        err instanceof ValidationError &&
        /schedule bad: backfill must be true \(at most 100 missed ticks\), false, or .* from 1 to 1000/.test(err.message),
      String(backfill),
    );
  }
});

test("time zones: a daily 09:00 in New York is 09:00 there, summer or winter", async (t) => {
  const lh = await freshLeasehold(t);
  const saved = await lh.schedule({ name: "morning", cron: "0 9 * * *", timezone: "America/New_York", task: "t" });
  const local = new Intl.DateTimeFormat("en-US", { timeZone: "America/New_York", hour: "2-digit", minute: "2-digit", hour12: false });
  assert.equal(local.format(saved.nextRunAt), "09:00");
  assert.ok(saved.nextRunAt.getTime() > Date.now() && saved.nextRunAt.getTime() <= Date.now() + 86_400_000);
  // Walk the next year's ticks through both DST changes: always 09:00 local.
  await lh.pool.query("UPDATE schedules SET next_run_at = now() - interval '366 days', backfill = true, backfill_limit = 1000");
  await lh.scheduler().runOnce();
  const ticks = (await lh.pool.query<{ run_at: Date }>("SELECT run_at FROM jobs ORDER BY run_at")).rows.map((r) => r.run_at);
  assert.ok(ticks.length >= 365, `${ticks.length} ticks`);
  assert.deepEqual([...new Set(ticks.map((d) => local.format(d)))], ["09:00"]);
});

test("saving a schedule again keeps its place unless its pattern changed", async (t) => {
  const lh = await freshLeasehold(t);
  const first = await lh.schedule({ name: "s", cron: "0 * * * *", task: "t" });
  assert.equal(first.created, true);
  await lh.pool.query("UPDATE schedules SET next_run_at = next_run_at - interval '1 hour'");
  const kept = await lh.schedule({ name: "s", cron: "0 * * * *", task: "t2", payload: { v: 2 } });
  assert.equal(kept.created, false);
  assert.equal(kept.nextRunAt.getTime(), first.nextRunAt.getTime() - 3_600_000, "same pattern: same place");
  assert.equal(kept.task, "t2");
  const moved = await lh.schedule({ name: "s", cron: "30 * * * *", task: "t2" });
  assert.equal(moved.nextRunAt.getUTCMinutes(), 30);
  assert.equal(await lh.unschedule("s"), true);
  assert.equal(await lh.unschedule("s"), false);
});

test("a worker's scheduler enqueues and runs the ticks; `leasehold schedules` adds, lists and removes", async (t) => {
  const lh = await freshLeasehold(t);
  const cli = (...args: string[]) => runCli(args, { schema: lh.schema });
  const added = await cli("schedules", "add", "heartbeat", "--cron", "*/1 * * * * *", "--task", "tick", "--payload", '{"from":"cli"}', "--json");
  assert.equal(added.code, 0, added.stderr);
  assert.equal(JSON.parse(added.stdout).created, true);
  const runs: { payload: unknown; at: number }[] = [];
  const worker = lh.worker({ handlers: { tick: (payload: unknown, _ctx: JobContext) => void runs.push({ payload, at: Date.now() }) } });
  await worker.start();
  t.after(() => worker.stop(0));
  await eventually(async () => runs.length >= 2, "two ticks ran", 10_000);
  assert.deepEqual(runs[0]!.payload, { from: "cli" });
  const listed = await cli("schedules", "list");
  assert.equal(listed.code, 0, listed.stderr);
  assert.match(listed.stdout, /heartbeat\s+\*\/1 \* \* \* \* \*\s+UTC\s+tick\s+default/);
  const bad = await cli("schedules", "add", "x", "--cron", "every day", "--task", "t");
  assert.equal(bad.code, 2);
  assert.match(bad.stderr, /not a valid cron pattern/);
  assert.equal((await cli("schedules", "remove", "heartbeat")).code, 0);
  const gone = await cli("schedules", "remove", "heartbeat");
  assert.equal(gone.code, 3);
  assert.match(gone.stderr, /no schedule named "heartbeat"/);
});
