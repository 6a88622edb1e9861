/**
 * A rate-limited job must not hold a queue hostage (issue 29): a handler's hold is clamped to its
 * queue's cap and, unless the queue allows more, covers only the job's own key; an operator sees
 * every hold (what, until when, set by which job) in `queues list` and GET /v1/queues, and lifts
 * it with `queues clear-hold`, DELETE /v1/queues/:name/hold or `queues resume`. Through the
 * surfaces an attacker (the worker token) and an operator (the CLI, the operator token) use.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import type { FastifyInstance } from "fastify";
import { createServer } from "../packages/cli/src/server/app.js";
import { freshLeasehold } from "./helpers/db.js";
import { runCli } from "./helpers/cli.js";
import { api as apiAt, TOKEN } from "./helpers/server.js";

const WORKER_TOKEN = "worker-token-0123456789abcdef";
const asWorker = { authorization: `Bearer ${WORKER_TOKEN}` };
const DAY_MS = 86_400_000;

let lh: Awaited<ReturnType<typeof freshLeasehold>>;
let app: FastifyInstance;
let base: string;
const api = (method: string, path: string, body?: unknown, headers?: Record<string, string>) => apiAt(base, method, path, body, headers);

before(async () => {
  lh = await freshLeasehold();
  app = createServer({ leasehold: lh, token: TOKEN, workerToken: WORKER_TOKEN });
  await app.listen({ host: "127.0.0.1", port: 0 });
  base = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
});

after(async () => {
  await app.close();
  await lh.dispose();
});

/** A claim by a remote worker with the worker token; the queue is named as a flow queue, as a worker that read the settings would. */
async function claim(queue: string) {
  const r = await api(
    "POST",
    "/v1/worker/claim",
    { workerId: "w-hold", queues: [queue], flowQueues: [queue], tasks: ["call"], limit: 1, leaseMs: 60_000 },
    asWorker,
  );
  assert.equal(r.status, 200, r.text);
  return r.json.jobs as { id: string; attempt: number; receipt: string }[];
}

/** What a handler that got a 429 with `Retry-After: 86400` reports, asking to hold its whole queue for a day. */
async function rateLimited(job: { id: string; attempt: number; receipt: string }, scope: "key" | "queue") {
  const r = await api(
    "POST",
    "/v1/worker/rate-limited",
    { workerId: "w-hold", jobs: [{ id: job.id, attempt: job.attempt, receipt: job.receipt, delayMs: DAY_MS, scope }] },
    asWorker,
  );
  assert.equal(r.status, 200, r.text);
  assert.deepEqual(r.json.applied, [{ id: job.id, state: "waiting" }]);
}

/** Enqueues one job and has the worker claim it and report it rate-limited for a day. */
async function holdWith(queue: string, scope: "key" | "queue", key?: string): Promise<string> {
  const { id } = await lh.enqueue("call", {}, { queue, ...(key !== undefined && { key }) });
  const [job] = await claim(queue);
  assert.equal(job?.id, id);
  await rateLimited(job!, scope);
  return id;
}

/**
 * Whether a job of the queue (of the key) is claimed now: a new one is enqueued, and whatever
 * is claimed is given back; both are then cancelled, so the queue's next check starts clean.
 */
async function claimsAgain(queue: string, key?: string): Promise<boolean> {
  const { id } = await lh.enqueue("call", {}, { queue, ...(key !== undefined && { key }) });
  const jobs = await claim(queue);
  if (jobs.length > 0) await api("POST", "/v1/worker/release", { workerId: "w-hold", jobs, reason: "test" }, asWorker);
  for (const job of [{ id }, ...jobs]) await lh.cancel(job.id);
  return jobs.length > 0;
}

async function dbNow(): Promise<number> {
  return (await lh.pool.query<{ now: Date }>("SELECT now()")).rows[0]!.now.getTime();
}

async function listed(name: string) {
  const r = await api("GET", "/v1/queues");
  assert.equal(r.status, 200, r.text);
  return r.json.queues.find((q: { name: string }) => q.name === name) as {
    holds: { key: string | null; until: string; jobId: string | null }[];
    heldKeys: number;
    heldUntil: string | null;
    heldByJob: string | null;
    maxHoldMs: number | null;
    allowQueueHold: boolean;
  };
}

test("a worker token's 24 h queue hold is clamped to 5 minutes and holds only its job's key; a keyless job holds nothing but itself", async () => {
  const asked = await dbNow();
  const keyed = await holdWith("api", "queue", "acme");
  const keyless = await holdWith("plain", "queue");

  const { rows: queues } = await lh.pool.query("SELECT name, held_until FROM queues WHERE name IN ('api', 'plain') AND held_until IS NOT NULL");
  assert.deepEqual(queues, [], "neither queue is held");
  const { rows: keys } = await lh.pool.query("SELECT queue, flow_key, held_until, held_by_job FROM flow_key_state WHERE held_until IS NOT NULL");
  assert.deepEqual(
    keys.map((k) => [k.queue, k.flow_key, k.held_by_job]),
    [["api", "acme", keyed]],
  );
  const heldFor = keys[0].held_until.getTime() - asked;
  assert.ok(heldFor > 240_000 && heldFor <= 300_000 + 5_000, `the key is held for the default cap of 5 minutes, not a day (${heldFor} ms)`);
  const { rows: jobs } = await lh.pool.query("SELECT id, run_at, last_error FROM jobs WHERE id = ANY($1::bigint[])", [[keyed, keyless]]);
  assert.equal(jobs.length, 2);
  for (const j of jobs) {
    const waits = j.run_at.getTime() - asked;
    assert.ok(waits > 240_000 && waits <= 305_000, `the job itself waits the cap, not the day it asked for (${waits} ms)`);
    assert.match(j.last_error, /rate-limited: retry in 300000 ms \(asked 86400000 ms: the queue's longest hold\)/);
  }

  // The queues go on: another key of the first, any job of the second; the held key waits.
  assert.equal(await claimsAgain("api", "globex"), true, "another key's job is claimed");
  assert.equal(await claimsAgain("api", "acme"), false, "the held key's job waits");
  assert.equal(await claimsAgain("plain"), true, "the keyless job's queue is not held");

  // The operator sees the key's hold over HTTP and lifts it.
  const api1 = await listed("api");
  assert.deepEqual(
    api1.holds.map((h) => [h.key, h.jobId, Date.parse(h.until)]),
    [["acme", keyed, keys[0].held_until.getTime()]],
  );
  assert.equal(api1.heldKeys, 1);
  assert.deepEqual((await listed("plain")).holds, []);
  const cleared = await api("DELETE", "/v1/queues/api/hold");
  assert.equal(cleared.status, 200, cleared.text);
  assert.deepEqual(cleared.json.cleared, { queue: false, keys: 1, jobs: 1 });
  const [again] = await claim("api");
  assert.equal(again?.id, keyed, "the rate-limited job is due again, first in its key's line");
});

test("where the queue allows it, a queue hold is clamped to its cap; the operator sees it and lifts it over the CLI, HTTP and resume", async () => {
  await lh.enqueue("call", {}, { queue: "vendor", delayMs: DAY_MS });
  // The settings are refused by name when bad, and change nothing.
  for (const [body, field] of [
    [{ maxHoldMs: 500 }, /maxHoldMs/],
    [{ maxHoldMs: DAY_MS + 1 }, /maxHoldMs/],
    [{ allowQueueHold: "yes" }, /allowQueueHold/],
  ] as const) {
    const bad = await api("PATCH", "/v1/queues/vendor/limits", body);
    assert.equal(bad.status, 400, bad.text);
    assert.match(bad.json.error.message, field);
  }
  const set = await api("PATCH", "/v1/queues/vendor/limits", { maxHoldMs: 600_000, allowQueueHold: true });
  assert.equal(set.status, 200, set.text);
  assert.deepEqual([set.json.queue.maxHoldMs, set.json.queue.allowQueueHold], [600_000, true]);

  const cli = (...args: string[]) => runCli(args, { schema: lh.schema });
  const remote = (...args: string[]) =>
    runCli(["--server", base, ...args], { schema: lh.schema, env: { DATABASE_URL: "postgres://nobody@127.0.0.1:1/none", LEASEHOLD_TOKEN: TOKEN } });

  // 1. A keyless job holds the queue, for its cap of 10 minutes; `queues list` shows it; `clear-hold` lifts it.
  let asked = await dbNow();
  let holder = await holdWith("vendor", "key");
  const q = await listed("vendor");
  assert.equal(q.holds.length, 1);
  assert.deepEqual([q.holds[0]!.key, q.holds[0]!.jobId, q.heldByJob], [null, holder, holder]);
  const heldFor = Date.parse(q.holds[0]!.until) - asked;
  assert.ok(heldFor > 540_000 && heldFor <= 600_000 + 5_000, `held for the queue's cap of 10 minutes (${heldFor} ms)`);
  assert.equal(await claimsAgain("vendor"), false, "nothing of the queue is claimed while it is held");

  const table = await cli("queues", "list");
  assert.equal(table.code, 0, table.stderr);
  const line = table.stdout.split("\n").find((l) => l.startsWith("vendor "));
  assert.match(line ?? "", new RegExp(`queue until ${q.holds[0]!.until.replace(/[.]/g, "\\.")} \\(job ${holder}\\)\\s+all$`), table.stdout);
  const json = JSON.parse((await remote("queues", "list", "--json")).stdout) as { name: string; holds: unknown[] }[];
  assert.deepEqual(json.find((x) => x.name === "vendor")!.holds, [{ key: null, until: q.holds[0]!.until, jobId: holder }]);

  const lifted = await cli("queues", "clear-hold", "vendor");
  assert.equal(lifted.code, 0, lifted.stderr);
  assert.match(lifted.stdout, /^queue vendor: lifted the queue's hold; 1 rate-limited job due now$/m);
  assert.deepEqual((await listed("vendor")).holds, []);
  assert.equal(await claimsAgain("vendor"), true, "the queue claims again");
  assert.match((await cli("queues", "clear-hold", "vendor")).stdout, /no hold in force/);

  // 2. Over HTTP: the worker token may not lift it; the operator token does.
  holder = await holdWith("vendor", "queue");
  assert.deepEqual(
    (await listed("vendor")).holds.map((h) => [h.key, h.jobId]),
    [[null, holder]],
  );
  const forbidden = await api("DELETE", "/v1/queues/vendor/hold", undefined, asWorker);
  assert.equal(forbidden.status, 403, forbidden.text);
  assert.equal(await claimsAgain("vendor"), false, "still held");
  const deleted = await api("DELETE", "/v1/queues/vendor/hold");
  assert.equal(deleted.status, 200, deleted.text);
  assert.deepEqual(deleted.json.cleared, { queue: true, keys: 0, jobs: 1 });
  assert.equal(await claimsAgain("vendor"), true);
  const unknown = await api("DELETE", "/v1/queues/vendr/hold");
  assert.equal(unknown.status, 404, unknown.text);
  assert.match(unknown.json.error.message, /did you mean "vendor"/);

  // 3. Resume (here through the server, by the CLI) lifts it too: "resume" means the queue runs again.
  await holdWith("vendor", "queue");
  assert.equal(await claimsAgain("vendor"), false);
  const resumed = await remote("queues", "resume", "vendor");
  assert.equal(resumed.code, 0, resumed.stderr);
  assert.deepEqual((await listed("vendor")).holds, []);
  assert.equal(await claimsAgain("vendor"), true);

  // The operator's lower cap applies to the next hold.
  assert.equal((await cli("queues", "limit", "vendor", "--max-hold", "30s")).code, 0);
  asked = await dbNow();
  await holdWith("vendor", "queue");
  const short = Date.parse((await listed("vendor")).holds[0]!.until) - asked;
  assert.ok(short > 20_000 && short <= 35_000, `held for 30 s (${short} ms)`);
  const badCap = await cli("queues", "limit", "vendor", "--max-hold", "500ms");
  assert.equal(badCap.code, 2, badCap.stderr);
  assert.match(badCap.stderr, /--max-hold must be a duration from 1s to 1d/);
});
