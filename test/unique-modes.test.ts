/**
 * Debounce and replace on unique keys (`onDuplicate`, docs/flows.md#debounce-and-replace):
 * what an enqueue does to the unfinished job holding its key, through the library, in batches,
 * on the caller's client; and that no other job is touched.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import type { Leasehold } from "../packages/leasehold/src/client.js";
import type { JobAbortedError, JobContext } from "../packages/leasehold/src/worker/context.js";
import { Leasehold as LeaseholdClient } from "../packages/leasehold/src/client.js";
import { databaseUrl, freshLeasehold, eventually, rawClient, recordEvents, silent, uniqueSchema, waitForEvent } from "./helpers/db.js";
import { Registry } from "prom-client";
import { runCli } from "./helpers/cli.js";
import { api, startServe, TOKEN } from "./helpers/server.js";

const row = async (lh: Leasehold, id: string) =>
  (
    await lh.pool.query<{ payload: unknown; run_at: Date; state: string; unique_key: string | null; cancel_requested: boolean }>(
      "SELECT payload, run_at, state, unique_key, cancel_requested_at IS NOT NULL AS cancel_requested FROM jobs WHERE id = $1",
      [id],
    )
  ).rows[0];
const count = async (lh: Leasehold) => (await lh.pool.query("SELECT count(*)::int AS n FROM jobs")).rows[0].n as number;
/** Every column of every job but `ids`, hashed: any change to another job shows. */
const othersChecksum = async (lh: Leasehold, ids: string[]) =>
  (await lh.pool.query("SELECT md5(string_agg(j::text, '|' ORDER BY j.id)) AS h FROM jobs AS j WHERE NOT j.id = ANY($1::bigint[])", [ids])).rows[0]
    .h as string;
/** An enqueue's answer without its warnings (no worker runs these tasks, in most tests). */
const bare = <T extends { warnings?: unknown }>({ warnings: _, ...answer }: T) => answer;
const bareAll = <T extends { warnings?: unknown }>(answers: T[]) => answers.map(bare);
/** Fixed moments, whole seconds from the file's start. */
const START = Math.ceil(Date.now() / 1000) * 1000;
const inMinutes = (m: number) => new Date(START + m * 60_000);

test("debounce: ten enqueues with replace make one job, with the last payload and the last time", async (t) => {
  const lh = await freshLeasehold(t);
  const answers = [];
  for (let i = 0; i < 10; i++)
    answers.push(bare(await lh.enqueue("digest", { n: i }, { uniqueKey: "digest:7", onDuplicate: "replace", runAt: inMinutes(10 + i) })));
  assert.equal(await count(lh), 1);
  assert.equal(new Set(answers.map((a) => a.id)).size, 1);
  assert.deepEqual(answers[0], { id: answers[0]!.id, created: true });
  for (const a of answers.slice(1)) assert.deepEqual(a, { id: answers[0]!.id, created: false, replaced: true });
  const job = await row(lh, answers[0]!.id);
  assert.deepEqual(job!.payload, { n: 9 });
  assert.equal(job!.run_at.getTime(), inMinutes(19).getTime());

  // With a delay, each enqueue pushes the time by the database's clock.
  const first = await lh.enqueue("digest", { n: 0 }, { uniqueKey: "digest:8", onDuplicate: "replace", delayMs: 60_000 });
  const before = (await row(lh, first.id))!.run_at.getTime();
  await new Promise((r) => setTimeout(r, 20));
  await lh.enqueue("digest", { n: 1 }, { uniqueKey: "digest:8", onDuplicate: "replace", delayMs: 60_000 });
  assert.ok((await row(lh, first.id))!.run_at.getTime() > before, "the second enqueue pushed the run time");
  // "keep" (the default) still leaves the holder as it is.
  const kept = bare(await lh.enqueue("digest", { n: 2 }, { uniqueKey: "digest:8", delayMs: 1 }));
  assert.deepEqual(kept, { id: first.id, created: false });
  assert.deepEqual((await row(lh, first.id))!.payload, { n: 1 });
});

test("replace_payload replaces the payload and keeps the time; cancel_running on a waiting holder acts as replace", async (t) => {
  const lh = await freshLeasehold(t);
  const a = await lh.enqueue("t", { v: 1 }, { uniqueKey: "k", runAt: inMinutes(30) });
  const b = bare(await lh.enqueue("t", { v: 2 }, { uniqueKey: "k", runAt: inMinutes(90), onDuplicate: "replace_payload" }));
  assert.deepEqual(b, { id: a.id, created: false, replaced: true });
  let job = await row(lh, a.id);
  assert.deepEqual([job!.payload, job!.run_at.getTime()], [{ v: 2 }, inMinutes(30).getTime()]);
  const c = bare(await lh.enqueue("t", { v: 3 }, { uniqueKey: "k", runAt: inMinutes(60), onDuplicate: "cancel_running" }));
  assert.deepEqual(c, { id: a.id, created: false, replaced: true });
  job = await row(lh, a.id);
  assert.deepEqual([job!.payload, job!.run_at.getTime(), job!.state], [{ v: 3 }, inMinutes(60).getTime(), "waiting"]);
  assert.equal(await count(lh), 1);
});

/** A handler that holds its job until released or aborted, and records aborts. */
function holding() {
  const aborted: unknown[] = [];
  const releases = new Map<number, () => void>();
  const payloads: unknown[] = [];
  const handler = (payload: { n: number }, ctx: JobContext) =>
    new Promise<void>((resolve, reject) => {
      payloads.push(payload);
      if (payload.n > 1) return resolve();
      releases.set(payload.n, resolve);
      ctx.signal.addEventListener("abort", () => {
        aborted.push((ctx.signal.reason as JobAbortedError).reason);
        reject(ctx.signal.reason);
      });
    });
  return { aborted, releases, payloads, handler };
}

test("cancel_running aborts the running holder's handler, frees its key and enqueues the new job, which runs", async (t) => {
  const lh = await freshLeasehold(t);
  const h = holding();
  const worker = lh.worker({ handlers: { sync: h.handler }, pollIntervalMs: 50 });
  await worker.start();
  t.after(() => worker.stop());
  const starts = recordEvents(worker, "job:start");
  const old = await lh.enqueue("sync", { n: 1 }, { uniqueKey: "sync:acct-1" });
  await starts.waitFor((job: { id: string }) => job.id === old.id);
  const other = await lh.enqueue("other", {}, { uniqueKey: "other", runAt: inMinutes(60) });
  // Another keyed job running (elsewhere): its key and its cancel stay its own.
  const otherRunning = await lh.enqueue("other", {}, { uniqueKey: "other-running", runAt: inMinutes(60) });
  await lh.pool.query(
    "UPDATE jobs SET state = 'running', lease_until = now() + interval '1 hour', locked_by = 'elsewhere', attempt = 1 WHERE id = $1",
    [otherRunning.id],
  );
  const sum = await othersChecksum(lh, [old.id]);

  const ended = waitForEvent<[{ id: string }, { state: string }]>(worker, "job:end", (job) => job.id === old.id, 30_000);
  const fresh = bare(await lh.enqueue("sync", { n: 2 }, { uniqueKey: "sync:acct-1", onDuplicate: "cancel_running" }));
  assert.notEqual(fresh.id, old.id);
  assert.deepEqual(fresh, { id: fresh.id, created: true, cancelled: old.id });
  // The old job's signal fires (at once with the cancel notification, or at its next heartbeat).
  const [, outcome] = await ended;
  assert.deepEqual(h.aborted, ["cancelled"]);
  assert.equal(outcome.state, "cancelled");
  assert.equal((await lh.getJob(old.id)).job.state, "cancelled");
  await eventually(async () => (await lh.getJob(fresh.id)).job.state === "succeeded", "the new job ran");
  assert.deepEqual(h.payloads, [{ n: 1 }, { n: 2 }]);
  assert.equal(await othersChecksum(lh, [old.id, fresh.id]), sum, "no other job was touched");
  assert.ok(await row(lh, other.id));
  assert.equal((await row(lh, otherRunning.id))!.unique_key, "other-running");
});

test("replace and replace_payload with a running holder: it loses the key and finishes untouched; the new job is enqueued", async (t) => {
  const lh = await freshLeasehold(t);
  const h = holding();
  const worker = lh.worker({ handlers: { sync: h.handler }, pollIntervalMs: 50, concurrency: 4 });
  await worker.start();
  t.after(() => worker.stop());
  const starts = recordEvents(worker, "job:start");
  for (const mode of ["replace", "replace_payload"] as const) {
    const key = `sync:${mode}`;
    h.aborted.length = 0;
    const old = await lh.enqueue("sync", { n: 1 }, { uniqueKey: key });
    await starts.waitFor((job: { id: string }) => job.id === old.id);
    const fresh = bare(await lh.enqueue("sync", { n: 2 }, { uniqueKey: key, onDuplicate: mode, runAt: inMinutes(60) }));
    assert.deepEqual(fresh, { id: fresh.id, created: true }, mode);
    const running = await row(lh, old.id);
    assert.deepEqual([running!.state, running!.unique_key, running!.cancel_requested], ["running", null, false], mode);
    assert.equal((await row(lh, fresh.id))!.unique_key, key);
    // The same key again now finds the new (waiting) job.
    assert.deepEqual(bare(await lh.enqueue("sync", { n: 3 }, { uniqueKey: key })), { id: fresh.id, created: false });
    h.releases.get(1)!();
    await eventually(async () => (await lh.getJob(old.id)).job.state === "succeeded", `${mode}: the running job finished`);
    assert.deepEqual(h.aborted, [], `${mode}: not aborted`);
    assert.equal((await lh.getJob(fresh.id)).job.state, "waiting");
  }
});

test("a batch with the same key several times: one job per key, each input job answered", async (t) => {
  const lh = await freshLeasehold(t);
  const batch = bareAll(
    await lh.enqueueMany([
      { task: "t", payload: { v: 1 }, uniqueKey: "a", onDuplicate: "replace", runAt: inMinutes(5) },
      { task: "t", payload: { v: 2 }, uniqueKey: "a", onDuplicate: "replace", runAt: inMinutes(7) },
      { task: "t", payload: { v: 1 }, uniqueKey: "b" },
      { task: "t", payload: { v: 3 }, uniqueKey: "a", onDuplicate: "replace_payload", runAt: inMinutes(9) },
      { task: "t", payload: { v: 2 }, uniqueKey: "b" },
      { task: "t", payload: { free: true } },
    ]),
  );
  const [a1, a2, b1, a3, b2, free] = batch;
  assert.deepEqual(a1, { id: a1!.id, created: true });
  assert.deepEqual(a2, { id: a1!.id, created: false, replaced: true });
  assert.deepEqual(a3, { id: a1!.id, created: false, replaced: true });
  assert.deepEqual([b1!.created, b2, free!.created], [true, { id: b1!.id, created: false }, true]);
  const a = await row(lh, a1!.id);
  assert.deepEqual([a!.payload, a!.run_at.getTime()], [{ v: 3 }, inMinutes(7).getTime()], "last payload, last moved time");
  assert.deepEqual((await row(lh, b1!.id))!.payload, { v: 1 });
  assert.equal(await count(lh), 3);

  // Against a waiting holder: a "keep" first answers it as is, the replacing one after it replaces.
  const again = bareAll(
    await lh.enqueueMany([
      { task: "t", payload: { v: 4 }, uniqueKey: "a" },
      { task: "t", payload: { v: 5 }, uniqueKey: "a", onDuplicate: "replace" },
    ]),
  );
  assert.deepEqual(again, [
    { id: a1!.id, created: false },
    { id: a1!.id, created: false, replaced: true },
  ]);
  assert.deepEqual((await row(lh, a1!.id))!.payload, { v: 5 });

  // Against a running holder: a "keep" first answers the running job; the first replacing one
  // makes the new job (cancelling the holder), later ones replace into it.
  await lh.pool.query("UPDATE jobs SET state = 'running', lease_until = now() + interval '1 hour', locked_by = 'w', attempt = 1 WHERE id = $1", [
    b1!.id,
  ]);
  const past = bareAll(
    await lh.enqueueMany([
      { task: "t", payload: { v: 6 }, uniqueKey: "b" },
      { task: "t", payload: { v: 7 }, uniqueKey: "b", onDuplicate: "cancel_running", runAt: inMinutes(3) },
      { task: "t", payload: { v: 8 }, uniqueKey: "b", onDuplicate: "replace_payload", runAt: inMinutes(4) },
    ]),
  );
  const made = past[1]!.id;
  assert.deepEqual(past, [
    { id: b1!.id, created: false },
    { id: made, created: true, cancelled: b1!.id },
    { id: made, created: false, replaced: true },
  ]);
  const holder = await row(lh, b1!.id);
  assert.deepEqual([holder!.unique_key, holder!.cancel_requested], [null, true]);
  const b = await row(lh, made);
  assert.deepEqual([b!.payload, b!.run_at.getTime(), b!.unique_key], [{ v: 8 }, inMinutes(3).getTime(), "b"]);
});

test("racing clients replacing the same key: one job, everyone answered with it; past a running holder, one new job", async (t) => {
  const lh = await freshLeasehold(t);
  const clients = await Promise.all(
    Array.from({ length: 8 }, () => LeaseholdClient.connect({ databaseUrl: databaseUrl(), schema: lh.schema, logger: silent, migrate: false })),
  );
  t.after(() => Promise.all(clients.map((c) => c.close())).then(() => {}));
  for (let round = 0; round < 5; round++) {
    const key = `race-${round}`;
    const answers = await Promise.all(clients.map((c, i) => c.enqueue("t", { i }, { uniqueKey: key, onDuplicate: "replace", delayMs: 60_000 })));
    assert.equal(new Set(answers.map((a) => a.id)).size, 1, `round ${round}: one job`);
    assert.equal(answers.filter((a) => a.created).length, 1);
    assert.equal(answers.filter((a) => a.replaced).length, 7);
    const { payload } = (await row(lh, answers[0]!.id))!;
    assert.ok(typeof (payload as { i: number }).i === "number");

    // The job is running now: the racers cancel it once, and make one new job between them.
    await lh.pool.query("UPDATE jobs SET state = 'running', lease_until = now() + interval '1 hour', locked_by = 'w', attempt = 1 WHERE id = $1", [
      answers[0]!.id,
    ]);
    const past = await Promise.all(clients.map((c, i) => c.enqueue("t", { i }, { uniqueKey: key, onDuplicate: "cancel_running" })));
    const made = past.filter((a) => a.created);
    assert.equal(made.length, 1, `round ${round}: one new job`);
    assert.deepEqual(bare(made[0]!), { id: made[0]!.id, created: true, cancelled: answers[0]!.id });
    assert.ok(past.every((a) => a.id === made[0]!.id && (a.created || a.replaced)));
    assert.equal((await row(lh, answers[0]!.id))!.cancel_requested, true);
  }
  assert.equal(await count(lh), 10);
});

test("bad input is refused with an error that names it, and nothing is written", async (t) => {
  const lh = await freshLeasehold(t);
  await assert.rejects(lh.enqueue("t", {}, { onDuplicate: "replace" }), {
    code: "invalid_input",
    message: /job 0: onDuplicate "replace" needs a uniqueKey/,
  });
  await assert.rejects(lh.enqueue("t", {}, { uniqueKey: "k", onDuplicate: "replce" as never }), {
    code: "invalid_input",
    message: /onDuplicate must be one of "keep", "replace", "replace_payload", "cancel_running" \(got "replce"\) \(did you mean "replace"\?\)/,
  });
  await assert.rejects(lh.enqueue("t", {}, { uniqueKey: "k", onDuplicate: 3 as never }), { message: /onDuplicate must be one of .*\(got 3\)$/ });
  await assert.rejects(
    lh.enqueueMany([
      { task: "t", uniqueKey: "k", onDuplicate: "replace" },
      { task: "t", onDuplicate: "keep" },
    ]),
    { message: /^job 1: onDuplicate "keep" needs a uniqueKey/ },
  );
  assert.equal(await count(lh), 0);
});

test("a blocked job holding the key is replaced like a waiting one, and stays blocked", async (t) => {
  const lh = await freshLeasehold(t);
  const held = await lh.enqueue("t", { v: 1 }, { uniqueKey: "k", runAt: inMinutes(5) });
  await lh.pool.query("UPDATE jobs SET state = 'blocked', parents_pending = 1 WHERE id = $1", [held.id]);
  const again = bare(await lh.enqueue("t", { v: 2 }, { uniqueKey: "k", onDuplicate: "cancel_running", runAt: inMinutes(8) }));
  assert.deepEqual(again, { id: held.id, created: false, replaced: true });
  const job = await row(lh, held.id);
  assert.deepEqual([job!.state, job!.payload, job!.run_at.getTime()], ["blocked", { v: 2 }, inMinutes(8).getTime()]);
});

test("on the caller's client: in its transaction (rolled back: nothing changed), and with a search_path without Leasehold's schema", async (t) => {
  const lh = await freshLeasehold(t);
  const held = await lh.enqueue("t", { v: 1 }, { uniqueKey: "k", runAt: inMinutes(5) });
  const client = await rawClient("public");
  t.after(() => client.end());
  await client.query("BEGIN");
  const inTx = bare(await lh.enqueue("t", { v: 2 }, { uniqueKey: "k", onDuplicate: "replace", db: client }));
  assert.deepEqual(inTx, { id: held.id, created: false, replaced: true });
  await client.query("ROLLBACK");
  assert.deepEqual((await row(lh, held.id))!.payload, { v: 1 });
  // Without a transaction of its own, the enqueue makes one (freeing a key and its successor commit together).
  await lh.pool.query("UPDATE jobs SET state = 'running', lease_until = now() + interval '1 hour', locked_by = 'w', attempt = 1 WHERE id = $1", [
    held.id,
  ]);
  const fresh = bare(await lh.enqueue("t", { v: 3 }, { uniqueKey: "k", onDuplicate: "cancel_running", db: client }));
  assert.deepEqual(fresh, { id: fresh.id, created: true, cancelled: held.id });
  assert.deepEqual((await row(lh, held.id))!.cancel_requested, true);
  assert.deepEqual((await row(lh, fresh.id))!.payload, { v: 3 });
});

test("a moved run time: workers are woken when it becomes due, and a NATS doorbell follows it", async (t) => {
  const lh = await freshLeasehold(t);
  const listener = await rawClient(lh.schema);
  t.after(() => listener.end());
  const heard: string[] = [];
  listener.on("notification", (n) => heard.push(`${n.channel}|${n.payload}`));
  await listener.query(`LISTEN "leasehold:${lh.schema}"`);
  await listener.query(`LISTEN "leasehold:${lh.schema}:dispatch"`);
  // NATS dispatch active, as a NATS worker would keep it.
  await lh.pool.query("UPDATE dispatch_settings SET active_until = now() + interval '1 hour'");
  const held = await lh.enqueue("t", {}, { queue: "q", uniqueKey: "k", delayMs: 3_600_000 });
  const owed = async () =>
    (await lh.pool.query<{ publish_at: Date }>("SELECT publish_at FROM dispatch_outbox WHERE job_id = $1", [held.id])).rows.map((r) => r.publish_at);
  const runAt = async () => (await row(lh, held.id))!.run_at;
  assert.deepEqual(await owed(), [await runAt()]);

  // The time moves later: the owed doorbell moves with it.
  await lh.enqueue("t", {}, { queue: "q", uniqueKey: "k", delayMs: 7_200_000, onDuplicate: "replace" });
  assert.deepEqual(await owed(), [await runAt()]);
  // Published meanwhile (the row is gone), and the time moves to now: owed again, due now, and
  // the workers of the queue and the dispatchers are told.
  await lh.pool.query("DELETE FROM dispatch_outbox");
  heard.length = 0;
  await lh.enqueue("t", {}, { queue: "q", uniqueKey: "k", onDuplicate: "replace" });
  const [publishAt] = await owed();
  assert.ok(publishAt && publishAt.getTime() <= (await lh.pool.query("SELECT now() AS n")).rows[0].n.getTime());
  await eventually(async () => heard.includes(`leasehold:${lh.schema}|q`) && heard.includes(`leasehold:${lh.schema}:dispatch|`), "both notified");
  // replace_payload does not move the time: the doorbell stays as it is.
  await lh.pool.query("UPDATE dispatch_outbox SET publish_at = now() + interval '5 minutes'");
  const kept = await owed();
  await lh.enqueue("t", { v: 2 }, { queue: "q", uniqueKey: "k", onDuplicate: "replace_payload" });
  assert.deepEqual(await owed(), kept);
});

test("CLI: enqueue --on-duplicate, on the database and through a server; bad input named, nothing written", async (t) => {
  const lh = await freshLeasehold(t);
  const serve = await startServe(lh.schema);
  t.after(async () => void (await serve.stop("SIGTERM")));
  const onDb = (...args: string[]) => runCli(args, { schema: lh.schema });
  const viaServer = (...args: string[]) => runCli(["--server", serve.match[1]!, ...args], { schema: lh.schema, env: { LEASEHOLD_TOKEN: TOKEN } });
  for (const [where, cli] of [
    ["database", onDb],
    ["server", viaServer],
  ] as const) {
    const key = `cli-${where}`;
    const first = await cli("enqueue", "t", "--payload", '{"v":1}', "--unique-key", key, "--delay", "1h", "--json");
    assert.equal(first.code, 0, first.stderr);
    const { id } = JSON.parse(first.stdout) as { id: string };
    const replaced = await cli("enqueue", "t", "--payload", '{"v":2}', "--unique-key", key, "--delay", "2h", "--on-duplicate", "replace");
    assert.equal(replaced.code, 0, replaced.stderr);
    assert.match(replaced.stdout, new RegExp(`^job ${id} with unique key "${key}" is unfinished; its payload and run time replaced\n$`), where);
    const asJson = await cli("enqueue", "t", "--payload", '{"v":3}', "--unique-key", key, "--on-duplicate", "replace_payload", "--json");
    assert.deepEqual(JSON.parse(asJson.stdout), { id, created: false, replaced: true, warnings: JSON.parse(asJson.stdout).warnings }, where);
    const job = await row(lh, id);
    assert.deepEqual(job!.payload, { v: 3 }, where);
    // A running holder: cancelled, and the new job enqueued.
    await lh.pool.query("UPDATE jobs SET state = 'running', lease_until = now() + interval '1 hour', locked_by = 'w', attempt = 1 WHERE id = $1", [
      id,
    ]);
    const cancelled = await cli("enqueue", "t", "--payload", '{"v":4}', "--unique-key", key, "--on-duplicate", "cancel_running");
    assert.equal(cancelled.code, 0, cancelled.stderr);
    assert.match(
      cancelled.stdout,
      new RegExp(`^enqueued job \\d+ \\(t\\); cancel requested for running job ${id}, which held unique key "${key}"\n$`),
      where,
    );
    assert.equal((await row(lh, id))!.cancel_requested, true);

    const before = await count(lh);
    const unknown = await cli("enqueue", "t", "--unique-key", key, "--on-duplicate", "replce");
    assert.equal(unknown.code, 2, where);
    assert.match(unknown.stderr, /--on-duplicate must be one of keep, replace, replace_payload, cancel_running \(got "replce"\)/);
    const keyless = await cli("enqueue", "t", "--on-duplicate", "replace");
    assert.equal(keyless.code, 2, where);
    assert.match(keyless.stderr, /--on-duplicate needs --unique-key/);
    assert.equal(await count(lh), before, `${where}: nothing written`);
  }
});

test("HTTP: onDuplicate in POST /v1/jobs and /v1/jobs/batch; answers say replaced and cancelled; bad input is 400", async (t) => {
  const lh = await freshLeasehold(t);
  const serve = await startServe(lh.schema);
  t.after(async () => void (await serve.stop("SIGTERM")));
  const base = serve.match[1]!;
  const first = await api(base, "POST", "/v1/jobs", { task: "t", payload: { v: 1 }, uniqueKey: "h", runAt: inMinutes(5).toISOString() });
  assert.equal(first.status, 201, first.text);
  const id = first.json.id as string;
  const second = await api(base, "POST", "/v1/jobs", {
    task: "t",
    payload: { v: 2 },
    uniqueKey: "h",
    runAt: inMinutes(6).toISOString(),
    onDuplicate: "replace",
  });
  assert.deepEqual([second.status, bare(second.json)], [201, { id, created: false, replaced: true }]);
  assert.deepEqual([(await row(lh, id))!.payload, (await row(lh, id))!.run_at.getTime()], [{ v: 2 }, inMinutes(6).getTime()]);

  await lh.pool.query("UPDATE jobs SET state = 'running', lease_until = now() + interval '1 hour', locked_by = 'w', attempt = 1 WHERE id = $1", [id]);
  const batch = await api(base, "POST", "/v1/jobs/batch", {
    jobs: [
      { task: "t", payload: { v: 3 }, uniqueKey: "h", onDuplicate: "cancel_running" },
      { task: "t", payload: { v: 4 }, uniqueKey: "h", onDuplicate: "replace_payload" },
    ],
  });
  assert.equal(batch.status, 201, batch.text);
  const made = batch.json.jobs[0].id as string;
  assert.deepEqual(bareAll(batch.json.jobs), [
    { id: made, created: true, cancelled: id },
    { id: made, created: false, replaced: true },
  ]);
  assert.equal((await row(lh, id))!.cancel_requested, true);
  assert.deepEqual((await row(lh, made))!.payload, { v: 4 });

  const before = await count(lh);
  const unknown = await api(base, "POST", "/v1/jobs", { task: "t", uniqueKey: "h", onDuplicate: "cancel" });
  assert.deepEqual([unknown.status, unknown.json.error.code], [400, "invalid_input"]);
  assert.match(
    unknown.json.error.message,
    /job 0: onDuplicate must be one of "keep", "replace", "replace_payload", "cancel_running" \(got "cancel"\)/,
  );
  const keyless = await api(base, "POST", "/v1/jobs/batch", { jobs: [{ task: "t", onDuplicate: "replace" }] });
  assert.deepEqual([keyless.status, keyless.json.error.code], [400, "invalid_input"]);
  assert.match(keyless.json.error.message, /job 0: onDuplicate "replace" needs a uniqueKey/);
  assert.equal(await count(lh), before, "nothing written");
});

test("SQL: leasehold.enqueue(task, payload, options) takes onDuplicate; bad input raises 22023 naming it", async (t) => {
  const lh = await freshLeasehold(t);
  const sql = async (payload: unknown, options: unknown) =>
    (await lh.pool.query<{ id: string }>("SELECT enqueue('t', $1::jsonb, $2::jsonb)::text AS id", [JSON.stringify(payload), JSON.stringify(options)]))
      .rows[0]!.id;
  const id = await sql({ v: 1 }, { uniqueKey: "s", runAt: inMinutes(5).toISOString() });
  assert.equal(await sql({ v: 2 }, { uniqueKey: "s", runAt: inMinutes(6).toISOString() }), id, "keep");
  assert.deepEqual((await row(lh, id))!.payload, { v: 1 });
  assert.equal(await sql({ v: 3 }, { uniqueKey: "s", runAt: inMinutes(7).toISOString(), onDuplicate: "replace" }), id);
  assert.deepEqual([(await row(lh, id))!.payload, (await row(lh, id))!.run_at.getTime()], [{ v: 3 }, inMinutes(7).getTime()]);
  assert.equal(await sql({ v: 4 }, { uniqueKey: "s", runAt: inMinutes(8).toISOString(), onDuplicate: "replace_payload" }), id);
  assert.deepEqual([(await row(lh, id))!.payload, (await row(lh, id))!.run_at.getTime()], [{ v: 4 }, inMinutes(7).getTime()]);

  for (const [mode, cancels] of [
    ["replace", false],
    ["cancel_running", true],
  ] as const) {
    const [holder] = (await lh.pool.query<{ id: string }>("SELECT id::text FROM jobs WHERE unique_key = 's'")).rows;
    await lh.pool.query("UPDATE jobs SET state = 'running', lease_until = now() + interval '1 hour', locked_by = 'w', attempt = 1 WHERE id = $1", [
      holder!.id,
    ]);
    const made = await sql({ v: mode }, { uniqueKey: "s", onDuplicate: mode });
    assert.notEqual(made, holder!.id, mode);
    const old = await row(lh, holder!.id);
    assert.deepEqual([old!.state, old!.unique_key, old!.cancel_requested], ["running", null, cancels], mode);
    assert.deepEqual([(await row(lh, made))!.payload, (await row(lh, made))!.unique_key], [{ v: mode }, "s"], mode);
  }

  const before = await count(lh);
  await assert.rejects(sql({}, { uniqueKey: "s", onDuplicate: "replce" }), {
    code: "22023",
    message: /onDuplicate must be one of "keep", "replace", "replace_payload", "cancel_running" \(got "replce"\)/,
  });
  await assert.rejects(sql({}, { onDuplicate: "replace" }), { code: "22023", message: /onDuplicate "replace" needs a uniqueKey/ });
  assert.equal(await count(lh), before, "nothing written");
});

test("a client publishing its own doorbells (NATS): a job made by a replacing enqueue owes its doorbell at once, also after an earlier chunk", async (t) => {
  const natsUrl = process.env.LEASEHOLD_TEST_NATS_URL;
  if (!natsUrl) return t.skip("no nats-server (LEASEHOLD_TEST_NATS_URL)");
  const schema = uniqueSchema("um");
  const lh = await LeaseholdClient.connect({ databaseUrl: databaseUrl(), schema, logger: silent, metricsRegistry: new Registry(), nats: natsUrl });
  t.after(async () => {
    await lh.pool.query(`DROP SCHEMA ${schema} CASCADE`).catch(() => {});
    await lh.close();
  });
  await lh.pool.query("UPDATE dispatch_settings SET active_until = now() + interval '1 hour'");
  // 5,000 plain jobs fill the first chunk (whose doorbells the client publishes itself); the
  // replacing job comes in the second chunk of the same transaction.
  const jobs = await lh.enqueueMany([
    ...Array.from({ length: 5_000 }, (_, i) => ({ task: "plain", payload: { i } })),
    { task: "t", uniqueKey: "n", onDuplicate: "replace" as const },
  ]);
  const last = jobs.at(-1)!;
  assert.equal(last.created, true);
  const { rows } = await lh.pool.query<{ late: boolean }>(
    "SELECT publish_at > now() + interval '1 second' AS late FROM dispatch_outbox WHERE job_id = $1",
    [last.id],
  );
  assert.deepEqual(rows, [{ late: false }], "owed at once, for the dispatchers (not held back as if the client published it)");
});
