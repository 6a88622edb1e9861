import { test } from "node:test";
import assert from "node:assert/strict";
import { Leasehold } from "../packages/leasehold/src/client.js";
import { normalizeJob } from "../packages/leasehold/src/jobs/validate.js";
import * as store from "../packages/leasehold/src/store/index.js";
import { freshLeasehold, databaseUrl, silent } from "./helpers/db.js";

const countJobs = async (lh: Leasehold) => (await lh.pool.query("SELECT count(*)::int AS n FROM jobs")).rows[0].n as number;

test("10,000 jobs go in with one call, in order, each with its own id", async (t) => {
  const lh = await freshLeasehold(t);
  const jobs = await lh.enqueueMany(Array.from({ length: 10_000 }, (_, i) => ({ task: "t", payload: { i } })));
  assert.equal(jobs.length, 10_000);
  assert.equal(new Set(jobs.map((j) => j.id)).size, 10_000);
  const { rows } = await lh.pool.query("SELECT id::text, (payload->>'i')::int AS i FROM jobs WHERE id = ANY($1::bigint[])", [
    [jobs[0]!.id, jobs[9_999]!.id],
  ]);
  const byId = new Map(rows.map((r) => [r.id, r.i]));
  assert.equal(byId.get(jobs[0]!.id), 0);
  assert.equal(byId.get(jobs[9_999]!.id), 9_999);
});

test("options are stored: queue, priority, delay, max attempts, lease", async (t) => {
  const lh = await freshLeasehold(t);
  const runAt = new Date(Date.now() + 3_600_000);
  const a = await lh.enqueue("t", { x: [1, "two", null, true] }, { queue: "mail", priority: 7, maxAttempts: 4, leaseMs: 120_000 });
  const b = await lh.enqueue("t", null, { runAt });
  const { job } = await lh.getJob(a.id);
  assert.deepEqual([job.queue, job.priority, job.maxAttempts, job.payload], ["mail", 7, 4, { x: [1, "two", null, true] }]);
  const { rows } = await lh.pool.query("SELECT lease_ms FROM jobs WHERE id = $1", [a.id]);
  assert.equal(rows[0].lease_ms, 120_000);
  const later = await lh.getJob(b.id);
  assert.equal(later.job.runAt!.getTime(), runAt.getTime());
  assert.equal(later.job.payload, null);
});

test("a unique key returns the unfinished job instead of a duplicate, also when enqueued concurrently", async (t) => {
  const lh = await freshLeasehold(t);
  const first = await lh.enqueue("t", {}, { uniqueKey: "user-42-welcome" });
  const again = await lh.enqueue("t", {}, { uniqueKey: "user-42-welcome" });
  assert.deepEqual({ id: again.id, created: again.created }, { id: first.id, created: false });
  // The same key twice in one batch: one job.
  const batch = await lh.enqueueMany([{ task: "t", uniqueKey: "k2" }, { task: "t", uniqueKey: "k2" }, { task: "t" }]);
  assert.equal(batch[0]!.id, batch[1]!.id);
  assert.deepEqual([batch[0]!.created, batch[1]!.created, batch[2]!.created], [true, false, true]);
  // Racing clients on separate connections: exactly one job, and everyone gets its id.
  const clients = await Promise.all(
    Array.from({ length: 8 }, () => Leasehold.connect({ databaseUrl: databaseUrl(), schema: lh.schema, logger: silent, migrate: false })),
  );
  t.after(() => Promise.all(clients.map((c) => c.close())).then(() => {}));
  for (let round = 0; round < 5; round++) {
    const results = await Promise.all(clients.map((c) => c.enqueue("t", {}, { uniqueKey: `race-${round}` })));
    assert.equal(new Set(results.map((r) => r.id)).size, 1, `round ${round}: everyone gets the winner's job`);
    assert.equal(results.filter((r) => r.created).length, 1);
  }
  // Once the job has finished, the key is free again.
  await lh.cancel(first.id);
  assert.equal((await lh.enqueue("t", {}, { uniqueKey: "user-42-welcome" })).created, true);
});

test("bad input is a clear typed error and writes nothing", async (t) => {
  const lh = await freshLeasehold(t);
  const circular: Record<string, unknown> = {};
  circular.self = circular;
  const cases: [string, () => Promise<unknown>, RegExp][] = [
    ["function payload", () => lh.enqueue("t", { f: () => 1 }), /payload\.f is a function, which is not JSON/],
    ["undefined inside", () => lh.enqueue("t", { a: undefined }), /payload\.a is undefined/],
    ["NaN", () => lh.enqueue("t", { n: NaN }), /payload\.n is NaN/],
    ["Infinity", () => lh.enqueue("t", [Infinity]), /payload\[0\] is Infinity/],
    ["BigInt", () => lh.enqueue("t", { b: 1n }), /payload\.b is a bigint/],
    ["circular", () => lh.enqueue("t", circular), /payload\.self is circular/],
    ["Date object", () => lh.enqueue("t", { when: new Date() }), /payload\.when is a Date object/],
    ["NUL character", () => lh.enqueue("t", { s: "a\u0000b" }), /NUL character/],
    ["unknown option", () => lh.enqueue("t", {}, { priorty: 1 } as never), /unknown option "priorty" \(did you mean "priority"\?\)/],
    ["priority range", () => lh.enqueue("t", {}, { priority: 40_000 }), /priority must be an integer from -32768 to 32767/],
    ["fractional attempts", () => lh.enqueue("t", {}, { maxAttempts: 2.5 }), /maxAttempts must be an integer from 1 to 1000/],
    ["zero attempts", () => lh.enqueue("t", {}, { maxAttempts: 0 }), /maxAttempts/],
    ["negative delay", () => lh.enqueue("t", {}, { delayMs: -1 }), /delayMs/],
    ["invalid date", () => lh.enqueue("t", {}, { runAt: new Date("nope") }), /runAt must be a valid Date/],
    ["both times", () => lh.enqueue("t", {}, { runAt: new Date(), delayMs: 5 }), /runAt or delayMs, not both/],
    ["short lease", () => lh.enqueue("t", {}, { leaseMs: 10 }), /leaseMs must be an integer from 1000/],
    ["empty task", () => lh.enqueue("", {}), /task must be 1-128 characters/],
    ["bad queue", () => lh.enqueue("t", {}, { queue: "has space" }), /queue must be 1-128 characters/],
    ["empty unique key", () => lh.enqueue("t", {}, { uniqueKey: "" }), /uniqueKey must be a non-empty string/],
    ["huge payload", () => lh.enqueue("t", { s: "x".repeat(1024 * 1024) }), /larger than 1048576 bytes/],
    // What PostgreSQL would refuse (or, through the driver, silently change) is refused here.
    ["lone surrogate in a payload string", () => lh.enqueue("t", { s: "😀".slice(0, 1) }), /payload\.s is not well-formed Unicode/],
    ["lone surrogate in a payload key", () => lh.enqueue("t", { ["\udc00"]: 1 }), /payload has a key that is not well-formed Unicode/],
    ["NUL in a payload key", () => lh.enqueue("t", { ["a\u0000b"]: 1 }), /payload has a key that contains a NUL character/],
    ["nesting too deep", () => lh.enqueue("t", nested(300)), /nested deeper than 256 levels/],
    ["NUL in a unique key", () => lh.enqueue("t", {}, { uniqueKey: "k\u0000" }), /uniqueKey contains a NUL character/],
    ["lone surrogate in a unique key", () => lh.enqueue("t", {}, { uniqueKey: "\ud83d" }), /uniqueKey is not well-formed Unicode/],
    ["long unique key", () => lh.enqueue("t", {}, { uniqueKey: "k".repeat(513) }), /uniqueKey must be a non-empty string of at most 512/],
  ];
  for (const [name, run, message] of cases) {
    await assert.rejects(run, (err: Error & { code?: string }) => {
      assert.equal(err.name, "ValidationError", name);
      assert.equal(err.code, "invalid_input", name);
      assert.match(err.message, message, name);
      return true;
    });
  }
  // One bad job fails the whole batch, naming it; the good ones are not written either.
  await assert.rejects(lh.enqueueMany([{ task: "t" }, { task: "t", payload: { n: NaN } }]), /job 1: payload\.n is NaN/);
  assert.equal(await countJobs(lh), 0);
});

/** An array nested `depth` levels deep. */
function nested(depth: number): unknown {
  let v: unknown = [];
  for (let i = 1; i < depth; i++) v = [v];
  return v;
}

test("well-formed values the database accepts go in and come back unchanged: emoji, deep nesting within the limit, escapes", async (t) => {
  const lh = await freshLeasehold(t);
  // deep: 256 levels counting the payload object itself, the most jsonb is asked to take.
  const payload = { emoji: "😀 ✓ 中文", escaped: "a\\u0000b", deep: nested(255), "key with ✓": [1, "two", null, true] };
  const { id } = await lh.enqueue("t", payload, { uniqueKey: "emoji-😀-key" });
  const { job } = await lh.getJob(id);
  assert.deepEqual(job.payload, payload);
  assert.equal(job.uniqueKey, "emoji-😀-key");
  const same = await lh.enqueue("t", {}, { uniqueKey: "emoji-😀-key" });
  assert.deepEqual({ id: same.id, created: same.created }, { id, created: false }, "the key matches itself");
});

test("a malformed unique key is refused at once instead of looping (it used to re-enqueue forever)", async (t) => {
  const lh = await freshLeasehold(t);
  const started = Date.now();
  await assert.rejects(
    Promise.race([
      lh.enqueue("t", {}, { uniqueKey: "\ud83d" }),
      new Promise((_, reject) => setTimeout(() => reject(new Error("enqueue did not return")), 3_000)),
    ]),
    /uniqueKey is not well-formed Unicode/,
  );
  assert.ok(Date.now() - started < 1_000);
  assert.equal(await countJobs(lh), 0, "no job ids were burnt into rows");
});

test("the store bounds its unique-key retry even for a key that can never match what it stored", async (t) => {
  const lh = await freshLeasehold(t);
  // Bypasses validation on purpose: the driver stores a lone surrogate as U+FFFD, so the key
  // read back never equals the one sent. Every round conflicts with the first job and finds
  // nothing under the sent key.
  await lh.enqueue("t", {}, { uniqueKey: "\ufffd" });
  const job = { ...normalizeJob({ task: "t" }), uniqueKey: "\ud83d" };
  await assert.rejects(
    Promise.race([store.enqueueJobs(lh.pool, [job]), new Promise((_, reject) => setTimeout(() => reject(new Error("looped")), 3_000))]),
    /neither inserted nor found after 5 rounds/,
  );
  assert.equal(await countJobs(lh), 1);
});

test("a batch larger than one INSERT is written all or nothing", async (t) => {
  const lh = await freshLeasehold(t);
  const jobs = Array.from({ length: 12_000 }, (_, i) => ({ task: "t", payload: { i } }));
  const ok = await lh.enqueueMany(jobs);
  assert.equal(ok.length, 12_000);
  await lh.pool.query("DELETE FROM jobs");
  // Validation passes; the database refuses job 7,000, which is in the second INSERT.
  await lh.pool.query(`CREATE FUNCTION refuse_7000() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN IF (NEW.payload->>'i')::int = 7000 THEN RAISE EXCEPTION 'refused'; END IF; RETURN NEW; END $$`);
  await lh.pool.query("CREATE TRIGGER refuse BEFORE INSERT ON jobs FOR EACH ROW EXECUTE FUNCTION refuse_7000()");
  await assert.rejects(lh.enqueueMany(jobs), /refused/);
  assert.equal(await countJobs(lh), 0, "the first chunk was rolled back with the second");
});
