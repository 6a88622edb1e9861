/**
 * Unique keys are matched within the task by default (`uniqueScope`, docs/api.md#unique-keys):
 * an enqueue of one task never answers, replaces nor cancels a job of another task that holds
 * the same key; it is refused, naming that job, and writes nothing. Through the library (one
 * job, batches, the caller's client), HTTP with a real token, and the CLI. (SQL: in
 * sql-enqueue-role.test.ts.)
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { UniqueKeyConflictError, ValidationError } from "../packages/leasehold/src/errors.js";
import { freshLeasehold, rawClient } from "./helpers/db.js";
import { runCli } from "./helpers/cli.js";
import { api, startServe, TOKEN } from "./helpers/server.js";

type Lh = Awaited<ReturnType<typeof freshLeasehold>>;

/** Every job, every column: any change to any job shows. */
const snapshot = async (lh: Lh) => (await lh.pool.query("SELECT j::text AS row FROM jobs AS j ORDER BY id")).rows.map((r) => r.row as string);
const runningNow = (lh: Lh, id: string) =>
  lh.pool.query("UPDATE jobs SET state = 'running', lease_until = now() + interval '1 hour', locked_by = 'w', attempt = 1 WHERE id = $1", [id]);
const refusedFor =
  (holder: string, scope = "task") =>
  (err: unknown) =>
    err instanceof UniqueKeyConflictError &&
    err.code === "unique_key_conflict" &&
    err.heldBy.id === holder &&
    err.message.includes(`is held by unfinished job ${holder} of task "refund"`) &&
    err.message.includes(`matched within the ${scope} (uniqueScope)`);

test("a newsletter enqueue never answers, rewrites nor cancels a refund job holding its key: refused, nothing written", async (t) => {
  const lh = await freshLeasehold(t);
  const refund = await lh.enqueue("refund", { cents: 500 }, { uniqueKey: "user-42", delayMs: 60_000 });
  const before = await snapshot(lh);
  for (const onDuplicate of ["keep", "replace", "replace_payload", "cancel_running"] as const) {
    await assert.rejects(lh.enqueue("newsletter", { issue: 9 }, { uniqueKey: "user-42", onDuplicate }), refusedFor(refund.id), onDuplicate);
  }
  assert.deepEqual(await snapshot(lh), before, "the refund job untouched, no job added");

  await runningNow(lh, refund.id);
  const running = await snapshot(lh);
  for (const onDuplicate of ["keep", "replace", "cancel_running"] as const) {
    await assert.rejects(lh.enqueue("newsletter", {}, { uniqueKey: "user-42", onDuplicate }), refusedFor(refund.id), onDuplicate);
  }
  assert.deepEqual(await snapshot(lh), running, "the running refund job keeps its key, and no cancel is requested");

  // The same task is a duplicate as always.
  assert.equal((await lh.enqueue("refund", {}, { uniqueKey: "user-42" })).id, refund.id);
});

test("uniqueScope: queue matches any task in the queue, global any job; a bad scope is refused naming it", async (t) => {
  const lh = await freshLeasehold(t);
  const refund = await lh.enqueue("refund", { v: 1 }, { uniqueKey: "user-42", queue: "billing", delayMs: 60_000 });
  const audit = await lh.enqueue("audit", { v: 2 }, { uniqueKey: "user-42", queue: "billing", uniqueScope: "queue", onDuplicate: "replace_payload" });
  assert.deepEqual([audit.id, audit.created, audit.replaced], [refund.id, false, true]);
  await assert.rejects(
    lh.enqueue("refund", {}, { uniqueKey: "user-42", queue: "other", uniqueScope: "queue" }),
    (err) => err instanceof UniqueKeyConflictError && /in queue "billing": unique keys are matched within the queue/.test(err.message),
  );
  const global = await lh.enqueue("newsletter", { v: 3 }, { uniqueKey: "user-42", uniqueScope: "global" });
  assert.deepEqual([global.id, global.created], [refund.id, false]);
  const count = (await snapshot(lh)).length;
  for (const [options, message] of [
    [{ uniqueKey: "k", uniqueScope: "tasks" }, /job 0: uniqueScope must be one of "task", "queue", "global" \(got "tasks"\).*"task"/],
    [{ uniqueKey: "k", uniqueScope: 1 }, /job 0: uniqueScope must be one of/],
    [{ uniqueScope: "global" }, /job 0: uniqueScope "global" needs a uniqueKey/],
  ] as const) {
    await assert.rejects(
      lh.enqueue("t", {}, options as never),
      (err) => err instanceof ValidationError && message.test(err.message),
      JSON.stringify(options),
    );
  }
  assert.equal((await snapshot(lh)).length, count, "nothing written");
});

test("batches: jobs sharing a key across tasks are refused up front; a conflict with a stored job writes none of the batch", async (t) => {
  const lh = await freshLeasehold(t);
  await assert.rejects(
    lh.enqueueMany([
      { task: "refund", uniqueKey: "k" },
      { task: "newsletter", uniqueKey: "k" },
    ]),
    (err) =>
      err instanceof ValidationError &&
      /job 1: uniqueKey "k" is shared with job 0 of task "refund", outside this job's uniqueScope "task"/.test(err.message),
  );
  assert.deepEqual(await snapshot(lh), []);
  // Within a scope that takes both, one job answers both, as before.
  const both = await lh.enqueueMany([
    { task: "refund", uniqueKey: "k" },
    { task: "newsletter", uniqueKey: "k", uniqueScope: "global" },
  ]);
  assert.equal(both[1]!.id, both[0]!.id);

  const before = await snapshot(lh);
  for (const onDuplicate of ["keep", "replace"] as const) {
    await assert.rejects(
      lh.enqueueMany([
        { task: "newsletter", payload: { fresh: true } },
        { task: "newsletter", uniqueKey: "k", onDuplicate },
      ]),
      refusedFor(both[0]!.id),
      onDuplicate,
    );
  }
  assert.deepEqual(await snapshot(lh), before, "not even the batch's keyless job");

  // On the caller's client: refused in its transaction, which it may roll back.
  const app = await rawClient(lh.schema);
  t.after(() => app.end());
  await app.query("BEGIN");
  await assert.rejects(lh.enqueue("newsletter", {}, { uniqueKey: "k", onDuplicate: "replace", db: app }), refusedFor(both[0]!.id));
  await app.query("ROLLBACK");
  assert.deepEqual(await snapshot(lh), before);
});

test("HTTP and CLI: a key held by another task's job is 409 unique_key_conflict naming it; a bad uniqueScope is 400", async (t) => {
  const lh = await freshLeasehold(t);
  const serve = await startServe(lh.schema);
  t.after(async () => void (await serve.stop("SIGTERM")));
  const base = serve.match[1]!;
  const refund = await api(base, "POST", "/v1/jobs", { task: "refund", payload: { cents: 500 }, uniqueKey: "user-42" });
  assert.equal(refund.status, 201, refund.text);
  const before = await snapshot(lh);
  for (const onDuplicate of ["keep", "replace", "cancel_running"]) {
    const res = await api(base, "POST", "/v1/jobs", { task: "newsletter", uniqueKey: "user-42", onDuplicate });
    assert.deepEqual([res.status, res.json.error.code], [409, "unique_key_conflict"], res.text);
    assert.match(res.json.error.message, new RegExp(`held by unfinished job ${refund.json.id} of task "refund"`));
  }
  const batch = await api(base, "POST", "/v1/jobs/batch", { jobs: [{ task: "newsletter" }, { task: "newsletter", uniqueKey: "user-42" }] });
  assert.deepEqual([batch.status, batch.json.error.code], [409, "unique_key_conflict"], batch.text);
  const bad = await api(base, "POST", "/v1/jobs", { task: "newsletter", uniqueKey: "user-42", uniqueScope: "everything" });
  assert.deepEqual([bad.status, bad.json.error.code], [400, "invalid_input"], bad.text);
  assert.match(bad.json.error.message, /uniqueScope must be one of "task", "queue", "global" \(got "everything"\)/);
  const global = await api(base, "POST", "/v1/jobs", { task: "newsletter", uniqueKey: "user-42", uniqueScope: "global" });
  assert.deepEqual([global.status, global.json.id, global.json.created], [201, refund.json.id, false]);
  assert.deepEqual(await snapshot(lh), before, "nothing written, the refund job untouched");

  const viaServer = (...args: string[]) => runCli(["--server", base, ...args], { schema: lh.schema, env: { LEASEHOLD_TOKEN: TOKEN } });
  const onDb = (...args: string[]) => runCli(args, { schema: lh.schema });
  for (const [where, cli] of [
    ["server", viaServer],
    ["database", onDb],
  ] as const) {
    const conflict = await cli("enqueue", "newsletter", "--unique-key", "user-42", "--on-duplicate", "replace");
    assert.notEqual(conflict.code, 0, where);
    assert.match(conflict.stderr, /held by unfinished job \d+ of task "refund"/, where);
    const scoped = await cli("enqueue", "newsletter", "--unique-key", "user-42", "--unique-scope", "global", "--json");
    assert.equal(scoped.code, 0, `${where}: ${scoped.stderr}`);
    assert.equal(JSON.parse(scoped.stdout).id, refund.json.id);
    const badScope = await cli("enqueue", "newsletter", "--unique-key", "user-42", "--unique-scope", "all");
    assert.match(badScope.stderr, /--unique-scope must be one of task, queue, global \(got "all"\)/, where);
    const keyless = await cli("enqueue", "newsletter", "--unique-scope", "queue");
    assert.match(keyless.stderr, /--unique-scope needs --unique-key/, where);
  }
  assert.deepEqual(await snapshot(lh), before, "nothing written by the CLI either");
});
