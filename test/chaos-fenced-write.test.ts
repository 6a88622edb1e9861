/**
 * fencedWrite, the downstream fence handlers copy: a stale attempt's write is refused by the
 * table itself. And ctx.fencedWrite's order of writes, with the real worker: a write a newer
 * job overtook ends its attempt as superseded instead of retrying into overwriting the newer value.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import {
  fencedWrite,
  fencedWriteSql,
  RetrySupersededError,
  ValidationError,
  type JobContext,
  type JobOutcome,
} from "../packages/leasehold/src/index.js";
import type { ClaimedJob } from "../packages/leasehold/src/jobs/types.js";
import { eventually, freshLeasehold, NO_BACKOFF } from "./helpers/db.js";

async function withTable() {
  const lh = await freshLeasehold();
  await lh.pool.query("CREATE TABLE results (job_id bigint PRIMARY KEY, token integer NOT NULL, value text NOT NULL)");
  const write = (token: number, value: string) => fencedWrite(lh.pool, { table: "results", key: { job_id: "7" }, token, values: { value } });
  const row = async () => (await lh.pool.query("SELECT token, value FROM results WHERE job_id = 7")).rows[0];
  return { lh, write, row };
}

test("a newer attempt overwrites, the same attempt may write again, an older one is refused", async () => {
  const { lh, write, row } = await withTable();
  assert.equal(await write(2, "first by 2"), true);
  assert.equal(await write(2, "again by 2"), true, "the same attempt retrying its write is not stale");
  assert.equal(await write(1, "stale 1"), false);
  assert.deepEqual(await row(), { token: 2, value: "again by 2" });
  assert.equal(await write(3, "by 3"), true);
  assert.equal(await write(2, "late 2"), false);
  assert.deepEqual(await row(), { token: 3, value: "by 3" });
  await lh.dispose();
});

test("concurrent writers from many attempts leave the newest attempt's value", async () => {
  const { lh, write, row } = await withTable();
  const tokens = [5, 1, 9, 3, 8, 2, 7, 4, 6, 10].sort(() => Math.random() - 0.5);
  await Promise.all(tokens.map((t) => write(t, `by ${t}`)));
  assert.deepEqual(await row(), { token: 10, value: "by 10" });
  await lh.dispose();
});

test("bad identifiers and tokens are refused with a ValidationError before any SQL runs", async () => {
  const db = { query: async () => assert.fail("no statement should run") };
  await assert.rejects(fencedWrite(db, { table: "results; DROP TABLE x", key: { id: 1 }, token: 1, values: {} }), ValidationError);
  await assert.rejects(fencedWrite(db, { table: "results", key: { 'id"': 1 }, token: 1, values: {} }), ValidationError);
  await assert.rejects(fencedWrite(db, { table: "results", key: {}, token: 1, values: {} }), /at least one key column/);
  await assert.rejects(fencedWrite(db, { table: "results", key: { id: 1 }, token: 0, values: {} }), /positive integer/);
  assert.match(fencedWriteSql({ table: "app.results", key: { job_id: 1 }, values: { v: 1 } }), /WHERE "results"\."token" <= EXCLUDED\."token"/);
});

/**
 * Two jobs write one shared row with ctx.fencedWrite. Job A is claimed first (the smaller
 * fence) and waits; job B is claimed after it and writes first. Then A writes: refused.
 * `then` is what A's handler does after the refusal.
 */
async function overtaken(t: { after(fn: () => Promise<void>): void }, then: "return" | "throw" | "retry") {
  const lh = await freshLeasehold(t);
  await lh.pool.query("CREATE TABLE plan (customer text PRIMARY KEY, token bigint NOT NULL, plan text NOT NULL)");
  // Every accepted write, in order: the row's value must never go back to an older claim's.
  await lh.pool.query("CREATE TABLE plan_log (n bigserial, token bigint NOT NULL, plan text NOT NULL)");
  await lh.pool.query(`CREATE FUNCTION log_plan() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN INSERT INTO plan_log (token, plan) VALUES (NEW.token, NEW.plan); RETURN NULL; END $$`);
  await lh.pool.query("CREATE TRIGGER plan_log AFTER INSERT OR UPDATE ON plan FOR EACH ROW EXECUTE FUNCTION log_plan()");
  const fences = new Map<string, string>();
  const accepted: [string, number, boolean][] = [];
  let releaseA!: () => void;
  const aWaits = new Promise<void>((r) => (releaseA = r));
  const worker = lh.worker({
    concurrency: 2,
    backoff: NO_BACKOFF, // a retry, if any, runs at once: the test would see it overwrite B
    handlers: {
      "sync-plan": async (p: { plan: string; waitFirst: boolean }, ctx: JobContext) => {
        fences.set(p.plan, ctx.fence);
        if (p.waitFirst && ctx.attempt === 1) await aWaits;
        const ok = await ctx.fencedWrite(lh.pool, { table: "plan", key: { customer: "c1" }, values: { plan: p.plan } });
        accepted.push([p.plan, ctx.attempt, ok]);
        if (ok) return;
        if (then === "throw") ctx.signal.throwIfAborted(); // throws the abort reason (fence_refused)
        if (then === "retry") throw new RetrySupersededError("this plan must land even after a newer one");
      },
    },
  });
  const ends: [string, JobOutcome["state"]][] = [];
  worker.on("job:end", (job: ClaimedJob, outcome: JobOutcome) => ends.push([job.id, outcome.state]));
  await worker.start();
  t.after(() => worker.stop(0));
  const a = await lh.enqueue("sync-plan", { plan: "A", waitFirst: true }, { maxAttempts: 3 });
  await eventually(async () => fences.has("A"), "A claimed");
  const b = await lh.enqueue("sync-plan", { plan: "B", waitFirst: false }, { maxAttempts: 3 });
  await eventually(async () => (await lh.getJob(b.id)).job.state === "succeeded", "B wrote and succeeded");
  assert.ok(BigInt(fences.get("B")!) > BigInt(fences.get("A")!), "A was claimed first: B holds the greater fence");
  releaseA();
  await eventually(async () => ends.some(([id]) => id === a.id) && (await lh.getJob(a.id)).job.state !== "waiting", "A's attempt ended");
  // Long enough for a retry with no backoff to have been claimed and run, if there were one.
  await new Promise((r) => setTimeout(r, 300));
  await eventually(async () => !["waiting", "running"].includes((await lh.getJob(a.id)).job.state), "A finished");
  const row = (await lh.pool.query("SELECT plan, token::text FROM plan")).rows[0];
  const log = (await lh.pool.query("SELECT plan, token::text FROM plan_log ORDER BY n")).rows;
  const ended = (await lh.metrics.jobsEnded.get()).values;
  return { lh, a, b, fences, accepted, ends, row, log, ended };
}

for (const then of ["return", "throw"] as const) {
  test(`A claimed first, B writes first: A's refused write ends A as superseded (handler ${then}s), no budget spent, not retried, B's value stays`, async (t) => {
    const { lh, a, fences, accepted, ends, row, log, ended } = await overtaken(t, then);
    assert.deepEqual(accepted, [
      ["B", 1, true],
      ["A", 1, false],
    ]);
    assert.deepEqual(row, { plan: "B", token: fences.get("B") }, "the newer job's value stays");
    assert.deepEqual(log, [{ plan: "B", token: fences.get("B") }], "no write after B's was accepted");
    const { job, attempts } = await lh.getJob(a.id);
    assert.equal(job.state, "succeeded", "a superseded job is finished: nothing is left for it to do");
    assert.equal(job.spentAttempts, 0, "a supersession spends no retry budget");
    assert.equal(job.attempt, 1, "not retried");
    assert.match(job.lastError ?? "", /^superseded: a newer claim already wrote plan \(this attempt's fenced write, fence \d+, was refused\)/);
    assert.deepEqual(
      attempts.map((x) => [x.attempt, x.outcome]),
      [[1, "superseded"]],
    );
    assert.match(attempts[0]!.error ?? "", /^superseded: /, "the attempt's audit row says why");
    assert.deepEqual(
      ends.filter(([id]) => id === a.id),
      [[a.id, "superseded"]],
      "the worker's job:end event says superseded",
    );
    assert.equal(ended.find((v) => v.labels.outcome === "superseded")?.value, 1, "counted in job_attempts_ended_total{outcome=superseded}");
    assert.equal(
      ended.find((v) => v.labels.outcome === "retry"),
      undefined,
      "nothing was retried",
    );
  });
}

test("RetrySupersededError: a handler that asks for a retry after the refusal fails normally and is retried, spending budget", async (t) => {
  const { lh, a, fences, accepted, ends, row } = await overtaken(t, "retry");
  const { job, attempts } = await lh.getJob(a.id);
  assert.equal(job.state, "succeeded");
  assert.deepEqual(
    attempts.map((x) => [x.attempt, x.outcome]),
    [
      [1, "failed"],
      [2, "succeeded"],
    ],
  );
  assert.match(attempts[0]!.error ?? "", /RetrySupersededError: this plan must land/);
  assert.equal(job.spentAttempts, 1, "the failed attempt spent budget like any failure");
  assert.deepEqual(accepted, [
    ["B", 1, true],
    ["A", 1, false],
    ["A", 2, true],
  ]);
  assert.deepEqual(row, { plan: "A", token: fences.get("A") }, "the retry's newer fence wrote over B, as asked");
  assert.deepEqual(
    ends.filter(([id]) => id === a.id).map(([, s]) => s),
    ["waiting", "succeeded"],
  );
});
