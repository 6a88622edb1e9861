/**
 * `leasehold serve` as a real process: auth, validation, fencing over HTTP, the remote worker
 * (the same Worker runtime over RemoteTransport), a claim whose response is lost, and two
 * replicas on one database.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { CLOSE_GRACE_MS, createServer } from "../packages/cli/src/server/app.js";
import type { JobContext } from "../packages/leasehold/src/worker/context.js";
import { RemoteTransport } from "../packages/leasehold/src/worker/remote-transport.js";
import * as store from "../packages/leasehold/src/store/index.js";
import { databaseUrl, eventually, freshLeasehold, rawClient, waitForEvent } from "./helpers/db.js";
import { isOneLineError, runCli, startCli } from "./helpers/cli.js";
import {
  api as apiAt,
  claimDroppingProxy,
  postAnnouncing as postAnnouncingAt,
  rawConnection,
  remoteWorker,
  startServe as startServeOn,
  statementCountingProxy,
  TOKEN,
} from "./helpers/server.js";

let lh: Awaited<ReturnType<typeof freshLeasehold>>;
let serve: Awaited<ReturnType<typeof startCli>>;
let base: string;

const api = (method: string, path: string, body?: unknown, headers?: Record<string, string>) => apiAt(base, method, path, body, headers);
const postAnnouncing = (path: string, bytes: number) => postAnnouncingAt(base, path, bytes);
const startServe = (extra: string[] = [], env: Record<string, string | undefined> = {}) => startServeOn(lh.schema, extra, env);

before(async () => {
  lh = await freshLeasehold();
  serve = await startServe();
  base = serve.match[1]!;
});

after(async () => {
  const stopped = await serve.stop("SIGTERM");
  assert.equal(stopped.code, 0, stopped.stderr);
  await lh.dispose();
});

test("every call but /healthz needs the bearer token: missing or wrong is 401 with a typed body", async () => {
  const attempts: Record<string, string>[] = [
    {},
    { authorization: "Bearer wrong-token-0123456789abc" },
    { authorization: `Basic ${TOKEN}` },
    { authorization: `Bearer ${TOKEN}x` },
  ];
  for (const headers of attempts) {
    for (const [method, path] of [
      ["GET", "/v1/stats"],
      ["POST", "/v1/worker/claim"],
      ["GET", "/metrics"],
      ["GET", "/openapi.json"],
      ["GET", "/v1/jobs/1"],
    ] as const) {
      const r = await api(method, path, method === "POST" ? {} : undefined, headers);
      assert.equal(r.status, 401, `${method} ${path} with ${JSON.stringify(headers)}`);
      assert.equal(r.json.error.code, "unauthorized");
    }
  }
  assert.equal((await api("GET", "/healthz", undefined, {})).status, 200);
  const metrics = await api("GET", "/metrics");
  assert.equal(metrics.status, 200);
  assert.match(metrics.text, /leasehold_jobs_claimed_total/);
  assert.match(metrics.text, /leasehold_http_requests_total\{route="\/v1\/stats",method="GET",status="401"\} [1-9]/);
});

test("bad inputs: schema-invalid bodies are 400 naming the problem, oversized bodies 413, unknown jobs 404; nothing leaks", async () => {
  const cases: [string, string, unknown, number, RegExp][] = [
    ["POST", "/v1/jobs", { payload: {} }, 400, /must have required property 'task'/],
    ["POST", "/v1/jobs", { task: "t", colour: "red" }, 400, /must NOT have additional properties/],
    ["POST", "/v1/jobs", { task: "t", priority: "high" }, 400, /priority must be integer/],
    ["POST", "/v1/jobs", "{not json", 400, /not valid JSON/],
    ["POST", "/v1/jobs", { task: "t", payload: "\u0000" }, 400, /NUL character/],
    ["POST", "/v1/jobs/batch", { jobs: [] }, 400, /must NOT have fewer than 1 items/],
    ["POST", "/v1/worker/claim", { workerId: "w", queues: ["default"], tasks: ["t"], limit: 5000, leaseMs: 5000 }, 400, /limit must be <= 500/],
    ["POST", "/v1/worker/heartbeat", { workerId: "w", leaseMs: 5000, beats: [{ id: "1; DROP TABLE jobs", attempt: 1 }] }, 400, /must match pattern/],
    ["GET", "/v1/jobs?limit=lots", undefined, 400, /limit must match pattern/],
    ["GET", "/v1/jobs?limit=0", undefined, 400, /limit must be an integer from 1 to 10000/],
    ["GET", "/v1/jobs/99999999", undefined, 404, /job 99999999 does not exist/],
    ["GET", "/v1/nothing", undefined, 404, /no route GET \/v1\/nothing/],
  ];
  for (const [method, path, body, status, message] of cases) {
    const r = await api(method, path, body);
    assert.equal(r.status, status, `${method} ${path}: ${r.text.slice(0, 300)}`);
    assert.match(r.json.error.message, message, `${method} ${path}`);
    assert.equal(typeof r.json.error.code, "string");
    assert.doesNotMatch(r.text, /SELECT|UPDATE |INSERT|\n\s+at |node_modules/, `${method} ${path} leaks internals`);
  }
  // Over the body limit (4 MiB by default): 413 before the body is read.
  const tooBig = await postAnnouncing("/v1/jobs", 5 * 1024 * 1024);
  assert.equal(tooBig.status, 413);
  assert.equal(JSON.parse(tooBig.text).error.code, "payload_too_large");
  // Nothing was enqueued by any of the refused requests.
  assert.deepEqual((await api("GET", "/v1/stats")).json.counts, []);
});

test("the OpenAPI document describes every route the server has, with its methods", async () => {
  const probe = await freshLeasehold();
  const app = createServer({ leasehold: probe, token: TOKEN });
  const registered: string[] = [];
  app.addHook("onRoute", (route) => {
    for (const method of [route.method].flat()) if (method !== "HEAD") registered.push(`${method} ${route.url.replace(/:(\w+)/g, "{$1}")}`);
  });
  await app.ready();
  const doc = app.swagger() as { paths: Record<string, Record<string, unknown>> };
  const described = Object.entries(doc.paths).flatMap(([path, ops]) => Object.keys(ops).map((m) => `${m.toUpperCase()} ${path}`));
  assert.ok(registered.length >= 15, `routes: ${registered.join(", ")}`);
  assert.deepEqual([...described].sort(), [...registered].sort());
  await app.close();
  await probe.dispose();
  // The running server serves the same document.
  const served = await api("GET", "/openapi.json");
  assert.deepEqual(Object.keys(served.json.paths).sort(), Object.keys(doc.paths).sort());
  assert.ok(served.json.components.securitySchemes.bearerAuth);
});

test("a remote worker's name stands for one live worker: a second attach with it is 409 name_in_use until the first detaches", async () => {
  const attach = (workerId: string) =>
    api("POST", "/v1/worker/attach", { workerId, name: "remote-pod", queues: ["default"], concurrency: 1, leaseMs: 5_000, policies: [] });
  const first = await attach("remote-pod/first");
  assert.equal(first.status, 200);
  const again = await attach("remote-pod/first");
  assert.equal(again.status, 409, "a worker id stands for one process: it attaches once");
  assert.equal(again.json.error.code, "worker_id_in_use");
  const second = await attach("remote-pod/second");
  assert.equal(second.status, 409);
  assert.equal(second.json.error.code, "name_in_use");
  assert.match(second.json.error.message, /remote-pod/);
  const detach = (workerId: string, identity: string) => api("POST", "/v1/worker/detach", { workerId, graceful: true, identity });
  assert.equal((await detach("remote-pod/first", first.json.identity)).status, 200);
  const third = await attach("remote-pod/third");
  assert.equal(third.status, 200, "a name given back is free");
  await detach("remote-pod/third", third.json.identity);
});

test("a stale heartbeat or report, even with its receipt, is 409 stale_lease and changes nothing", async () => {
  const { json: job } = await api("POST", "/v1/jobs", { task: "fenced", payload: { n: 1 } });
  const claimOnce = async () => {
    const claim = await api("POST", "/v1/worker/claim", { workerId: "w-a", queues: ["default"], tasks: ["fenced"], limit: 1, leaseMs: 60_000 });
    assert.equal(claim.status, 200);
    assert.equal(claim.json.jobs[0].id, job.id);
    return { id: job.id as string, attempt: claim.json.jobs[0].attempt as number, receipt: claim.json.jobs[0].receipt as string };
  };
  // The first attempt is given back and the job claimed again: the first is stale, its receipt still valid.
  const first = await claimOnce();
  assert.equal((await api("POST", "/v1/worker/release", { workerId: "w-a", jobs: [first], reason: "test" })).status, 200);
  const second = await claimOnce();
  assert.equal(second.attempt, first.attempt + 1);
  const db = await rawClient(lh.schema);
  const row = async () => (await db.query("SELECT state, attempt, lease_until, progress, locked_by FROM jobs WHERE id = $1", [job.id])).rows[0];
  try {
    const before = await row();
    const beat = await api("POST", "/v1/worker/heartbeat", { workerId: "w-a", leaseMs: 60_000, beats: [{ ...first, progress: { evil: true } }] });
    assert.equal(beat.status, 409);
    assert.equal(beat.json.error.code, "stale_lease");
    assert.deepEqual(beat.json.error.jobs, [{ id: job.id, attempt: first.attempt, reason: "reclaimed" }]);
    const staleFail = await api("POST", "/v1/worker/fail", { workerId: "w-a", failures: [{ ...first, error: "late" }] });
    assert.equal(staleFail.status, 409);
    const staleSuccess = await api("POST", "/v1/worker/succeed", { workerId: "w-a", jobs: [first] });
    assert.equal(staleSuccess.status, 409);
    assert.deepEqual(await row(), before);

    const good = await api("POST", "/v1/worker/succeed", { workerId: "w-a", jobs: [second] });
    assert.equal(good.status, 200);
    assert.deepEqual(good.json.applied, [{ id: job.id, state: "succeeded" }]);
    const late = await api("POST", "/v1/worker/succeed", { workerId: "w-a", jobs: [second] });
    assert.equal(late.status, 409);
    assert.equal(late.json.error.jobs[0].reason, "finished");
  } finally {
    await db.end();
  }
});

test("without the claim's receipt nobody can beat, finish, fail, release or ask about another worker's attempt", async () => {
  const { id } = await lh.enqueue("guarded", { n: 1 }, { queue: "receipts" });
  const claim = await api("POST", "/v1/worker/claim", { workerId: "w-owner", queues: ["receipts"], tasks: ["guarded"], limit: 1, leaseMs: 60_000 });
  const { attempt, receipt } = claim.json.jobs[0] as { attempt: number; receipt: string };
  const owned = { id: claim.json.jobs[0].id as string, attempt, receipt };
  assert.equal(owned.id, id);
  assert.match(owned.receipt, /^[A-Za-z0-9_-]{43}$/);
  // A receipt the attacker holds for its own claim is no good for the owner's attempt.
  await lh.enqueue("guarded", { n: 2 }, { queue: "receipts-other" });
  const theirs = (
    await api("POST", "/v1/worker/claim", { workerId: "w-attacker", queues: ["receipts-other"], tasks: ["guarded"], limit: 1, leaseMs: 60_000 })
  ).json.jobs[0];
  const db = await rawClient(lh.schema);
  const row = async () => (await db.query("SELECT state, attempt, lease_until, progress, locked_by FROM jobs WHERE id = $1", [id])).rows[0];
  try {
    const before = await row();
    const ref = { id, attempt: owned.attempt };
    for (const forged of [ref, { ...ref, receipt: "A".repeat(43) }, { ...ref, receipt: theirs.receipt }, { ...ref, receipt: owned.receipt + "=" }]) {
      // The attacker names the owner's worker id: the fence alone would let these through.
      const asOwner = { workerId: "w-owner" };
      const success = await api("POST", "/v1/worker/succeed", { ...asOwner, jobs: [forged] });
      assert.equal(success.status, 200, success.text);
      assert.deepEqual([success.json.applied, success.json.refused], [[], [{ id, attempt: owned.attempt, reason: "invalid_receipt" }]]);
      const failure = await api("POST", "/v1/worker/fail", { ...asOwner, failures: [{ ...forged, error: "x", giveUp: true }] });
      assert.deepEqual(
        failure.json.refused.map((r: { reason: string }) => r.reason),
        ["invalid_receipt"],
      );
      const release = await api("POST", "/v1/worker/release", { ...asOwner, jobs: [forged], reason: "stolen" });
      assert.deepEqual(
        release.json.refused.map((r: { reason: string }) => r.reason),
        ["invalid_receipt"],
      );
      const beat = await api("POST", "/v1/worker/heartbeat", { ...asOwner, leaseMs: 5_000, beats: [{ ...forged, progress: { evil: true } }] });
      assert.deepEqual([beat.status, beat.json.renewed, beat.json.invalid.map((i: { code: string }) => i.code)], [200, [], ["invalid_receipt"]]);
      const lost = await api("POST", "/v1/worker/lost", { ...asOwner, attempts: [forged] });
      assert.deepEqual([lost.json.lost, lost.json.invalid.map((i: { code: string }) => i.code)], [[], ["invalid_receipt"]]);
    }
    assert.deepEqual(await row(), before);
    // An id beyond bigint has no receipt either: refused before the database sees it.
    const huge = await api("POST", "/v1/worker/heartbeat", {
      workerId: "w-owner",
      leaseMs: 5_000,
      beats: [{ id: "9223372036854775808", attempt: 1, receipt: owned.receipt }],
    });
    assert.deepEqual([huge.status, huge.json.invalid[0].code], [200, "invalid_receipt"]);
    const metrics = (await api("GET", "/metrics")).text;
    assert.match(metrics, /^leasehold_server_invalid_receipts_total\{kind="complete"\} 4$/m);

    // The owner, with its receipt, is served as before.
    const beat = await api("POST", "/v1/worker/heartbeat", { workerId: "w-owner", leaseMs: 60_000, beats: [{ ...owned, progress: { pct: 50 } }] });
    assert.deepEqual([beat.json.renewed, beat.json.invalid], [[{ id, cancelRequested: false }], []], beat.text);
    const done = await api("POST", "/v1/worker/succeed", { workerId: "w-owner", jobs: [owned] });
    assert.deepEqual(done.json.applied, [{ id, state: "succeeded" }]);
  } finally {
    await db.end();
  }
});

test("a remote worker runs the same runtime over the server: progress rides heartbeats, failures retry, cancel aborts", async () => {
  let cancelReason: unknown;
  const worker = remoteWorker(base, {
    report: async (p: { pct: number }, ctx) => {
      ctx.progress({ pct: p.pct });
      await eventually(async () => ((await lh.getJob(ctx.jobId)).job.progress as { pct?: number } | null)?.pct === p.pct, "progress stored");
    },
    flaky: {
      handler: async (_p: unknown, ctx) => {
        if (ctx.spentAttempts === 0) throw new Error("first try fails");
      },
      backoff: { baseMs: 100, jitter: 0 },
    },
    endless: (_p: unknown, ctx) =>
      new Promise((_resolve, reject) =>
        ctx.signal.addEventListener("abort", () => {
          cancelReason = (ctx.signal.reason as { reason?: string }).reason;
          reject(ctx.signal.reason);
        }),
      ),
  });
  const ended = (task: string, state: string) =>
    waitForEvent(worker, "job:end", (job: { task: string }, o: { state: string }) => job.task === task && o.state === state);
  const reportEnded = ended("report", "succeeded");
  const flakyEnded = ended("flaky", "succeeded");
  const endlessStarted = waitForEvent(worker, "job:start", (job: { task: string }) => job.task === "endless");
  const endlessEnded = ended("endless", "cancelled");
  await worker.start();
  try {
    const report = await lh.enqueue("report", { pct: 40 });
    const flaky = await lh.enqueue("flaky");
    const endless = await lh.enqueue("endless");
    await Promise.all([reportEnded, flakyEnded, endlessStarted]);
    assert.equal((await api("POST", `/v1/jobs/${endless.id}/cancel`)).json.result, "cancel_requested");
    await endlessEnded;
    assert.equal(cancelReason, "cancelled");

    const r = await lh.getJob(report.id);
    assert.equal(r.job.state, "succeeded");
    assert.deepEqual(r.job.progress, { pct: 40 });
    const f = await lh.getJob(flaky.id);
    assert.deepEqual(
      f.attempts.map((a) => a.outcome),
      ["failed", "succeeded"],
    );
    assert.equal((await lh.getJob(endless.id)).job.state, "cancelled");
  } finally {
    await worker.stop();
  }
});

test("a claim whose response never reaches the worker is not lost: the lease expires and the watchdog recovers the job", async () => {
  const proxy = await claimDroppingProxy(Number(new URL(base).port));
  const runs: number[] = [];
  const worker = remoteWorker(proxy.url, { once: (_p: unknown, ctx) => void runs.push(ctx.attempt) }, { requestTimeoutMs: 1_000 });
  const { id } = await lh.enqueue("once", {}, { leaseMs: 1_000 });
  await worker.start();
  try {
    await waitForEvent(worker, "job:end", (job: { id: string }) => job.id === id, 20_000);
  } finally {
    await worker.stop();
    await proxy.close();
  }
  assert.equal(proxy.dropped(), 1);
  assert.deepEqual(runs, [2], "the handler never saw attempt 1, whose claim response was lost");
  const { job, attempts } = await lh.getJob(id);
  assert.equal(job.state, "succeeded");
  assert.deepEqual(
    attempts.map((a) => [a.attempt, a.outcome]),
    [
      [1, "lease_expired"],
      [2, "succeeded"],
    ],
  );
});

test("two server replicas on one database: a receipt from one is good at the other; remote workers on each run every job exactly once", async () => {
  const second = await startServe(["--no-watchdog"]);
  // Replicas with the same token derive the same receipt key: a worker may claim at one and report at the other.
  const { id } = await lh.enqueue("cross", {}, { queue: "cross-replica" });
  const claimed = (await api("POST", "/v1/worker/claim", { workerId: "w-x", queues: ["cross-replica"], tasks: ["cross"], limit: 1, leaseMs: 30_000 }))
    .json.jobs[0];
  const done = await apiAt(second.match[1]!, "POST", "/v1/worker/succeed", {
    workerId: "w-x",
    jobs: [{ id, attempt: claimed.attempt, receipt: claimed.receipt }],
  });
  assert.deepEqual(done.json.applied, [{ id, state: "succeeded" }]);
  const runs = new Map<string, number>();
  const perWorker = [0, 0];
  const handler = (i: number) => async (_p: unknown, ctx: JobContext) => {
    runs.set(ctx.jobId, (runs.get(ctx.jobId) ?? 0) + 1);
    perWorker[i]!++;
    await new Promise((r) => setTimeout(r, 20));
  };
  // A worker claims ahead of its handlers, so one fast worker may take a whole queue: each
  // replica's worker runs a task of its own, and both share a third.
  const workers = [
    remoteWorker(base, { "spread-a": handler(0), "spread-both": handler(0) }),
    remoteWorker(second.match[1]!, { "spread-b": handler(1), "spread-both": handler(1) }),
  ];
  try {
    await Promise.all(workers.map((w) => w.start()));
    const tasks = ["spread-a", "spread-b", "spread-both", "spread-both"];
    const { json } = await api("POST", "/v1/jobs/batch", { jobs: Array.from({ length: 100 }, (_, n) => ({ task: tasks[n % 4], payload: { n } })) });
    assert.equal(json.jobs.length, 100);
    await eventually(
      async () => {
        const stats = (await api("GET", "/v1/stats")).json as { counts: { queue: string; state: string; count: number }[] };
        return stats.counts.some((c) => c.state === "succeeded" && c.count >= 100 + 0) && runs.size === 100;
      },
      "all 100 jobs succeeded",
      30_000,
    );
  } finally {
    await Promise.all(workers.map((w) => w.stop()));
    await second.stop("SIGTERM");
  }
  assert.equal(runs.size, 100);
  assert.ok(
    [...runs.values()].every((n) => n === 1),
    "no job ran twice",
  );
  assert.ok(perWorker[0]! > 0 && perWorker[1]! > 0, `both replicas served jobs: ${perWorker}`);
});

test("leasehold worker --server runs a tasks module against the server, with no database connection", async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-remote-"));
  const tasksFile = path.join(dir, "tasks.mjs");
  fs.writeFileSync(tasksFile, `export default { "remote.echo": async (payload, ctx) => { ctx.progress({ echoed: payload.word }); } };\n`);
  const { json: job } = await api("POST", "/v1/jobs", { task: "remote.echo", payload: { word: "hello" } });
  // DATABASE_URL points nowhere: everything must go through the server.
  const worker = await startCli(["worker", "--server", base, "--tasks", tasksFile, "--json"], {
    schema: lh.schema,
    env: { LEASEHOLD_TOKEN: TOKEN, DATABASE_URL: "postgres://nobody@127.0.0.1:1/none" },
    ready: /"event":"job:end".*\n/,
  });
  const events = worker
    .output()
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l) as { event?: string; id?: string; state?: string });
  assert.deepEqual(
    events.filter((e) => e.event === "job:end").map((e) => [e.id, e.state]),
    [[job.id, "succeeded"]],
  );
  const stopped = await worker.stop("SIGINT");
  assert.equal(stopped.code, 0, stopped.stderr);
  assert.equal((await lh.getJob(job.id)).job.state, "succeeded");
  // A wrong token fails at start with one line, instead of retrying claims forever.
  const refused = await runCli(["worker", "--server", base, "--token", "not-the-token-0123456789", "--tasks", tasksFile], { schema: lh.schema });
  assert.equal(refused.code, 2, refused.stderr);
  assert.match(refused.stderr, /401.*missing or wrong bearer token/);
  assert.ok(isOneLineError(refused.stderr), refused.stderr);
  fs.rmSync(dir, { recursive: true, force: true });
});

test("a job whose own lease is shorter than the worker's beat interval is kept alive by heartbeats over HTTP", async () => {
  // Worker lease 30 s (a beat every 10 s); this job's lease is 1.5 s and its handler runs 3 s.
  const worker = remoteWorker(
    base,
    {
      slow: (_p: unknown, ctx) =>
        new Promise((r, reject) => {
          const t = setTimeout(r, 3_000);
          ctx.signal.addEventListener("abort", () => {
            clearTimeout(t);
            reject(ctx.signal.reason);
          });
        }),
    },
    { leaseMs: 30_000 },
  );
  const { id } = await lh.enqueue("slow", {}, { leaseMs: 1_500 });
  const ended = waitForEvent<[{ id: string }, { state: string }]>(worker, "job:end", (job) => job.id === id);
  await worker.start();
  try {
    const [, outcome] = await ended;
    assert.equal(outcome.state, "succeeded");
  } finally {
    await worker.stop();
  }
  assert.deepEqual(
    (await lh.getJob(id)).attempts.map((a) => a.outcome),
    ["succeeded"],
  );
});

test("job commands go through the server with --server, without a database: enqueue, bulk, list, show, cancel, retry, stats", async () => {
  const env = { DATABASE_URL: "postgres://nobody@127.0.0.1:1/none", LEASEHOLD_TOKEN: TOKEN };
  const cli = (args: string[], input?: string) => runCli(["--server", base, ...args], { schema: lh.schema, env, input });

  const enq = await cli(["enqueue", "via.server", "--payload", '{"k":1}', "--queue", "remote-ops", "--delay", "1h", "--json"]);
  assert.equal(enq.code, 0, enq.stderr);
  const { id } = JSON.parse(enq.stdout) as { id: string };
  const shown = JSON.parse((await cli(["jobs", "show", id, "--json"])).stdout) as { job: { state: string; payload: unknown; queue: string } };
  assert.deepEqual([shown.job.state, shown.job.payload, shown.job.queue], ["waiting", { k: 1 }, "remote-ops"]);
  assert.match((await cli(["jobs", "show", id])).stdout, /attempt history:/);

  const bulk = await cli(
    ["enqueue", "via.server", "--queue", "remote-ops", "--delay", "1h", "--payloads", "-", "--json"],
    Array.from({ length: 2_500 }, (_, n) => `{"n":${n}}`).join("\n"),
  );
  assert.equal(bulk.code, 0, bulk.stderr);
  assert.deepEqual({ ...JSON.parse(bulk.stdout), warnings: undefined }, { enqueued: 2_500, created: 2_500, warnings: undefined });
  const badLine = await cli(["enqueue", "via.server", "--payloads", "-"], '{"n":1}\nnope\n');
  assert.equal(badLine.code, 2);
  assert.match(badLine.stderr, /line 2: invalid JSON/);

  const list = JSON.parse((await cli(["jobs", "list", "--queue", "remote-ops", "--limit", "3000", "--json"])).stdout) as unknown[];
  assert.equal(list.length, 2_501);
  assert.equal((await cli(["jobs", "cancel", id])).stdout, `job ${id} cancelled\n`);
  assert.equal((await cli(["jobs", "retry", id])).code, 0);
  const retryWaiting = await cli(["jobs", "retry", id]);
  assert.equal(retryWaiting.code, 4);
  assert.ok(isOneLineError(retryWaiting.stderr), retryWaiting.stderr);
  const missing = await cli(["jobs", "show", "99999999"]);
  assert.equal(missing.code, 3);
  assert.match(missing.stderr, /job 99999999 does not exist/);
  const stats = JSON.parse((await cli(["stats", "--json"])).stdout) as { counts: { queue: string; state: string; count: number }[] };
  assert.ok(stats.counts.some((c) => c.queue === "remote-ops" && c.state === "waiting" && c.count === 2_501));
  assert.match((await cli(["stats"])).stdout, /remote-ops/);
  const wrongToken = await runCli(["--server", base, "--token", "wrong-token-0123456789", "stats"], { schema: lh.schema, env });
  assert.equal(wrongToken.code, 2);
  assert.match(wrongToken.stderr, /401.*missing or wrong bearer token/);
});

test("a long poll whose client went away claims nothing: a job enqueued afterwards stays waiting", async () => {
  const req = http.request(base + "/v1/worker/claim", {
    method: "POST",
    headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" },
  });
  req.on("error", () => {});
  req.end(JSON.stringify({ workerId: "w-gone", queues: ["left-behind"], tasks: ["t"], limit: 5, leaseMs: 60_000, waitMs: 10_000 }));
  await new Promise((r) => setTimeout(r, 300)); // the server is now waiting for a job
  req.destroy();
  await new Promise((r) => setTimeout(r, 200));
  const { id } = await lh.enqueue("t", {}, { queue: "left-behind" });
  await new Promise((r) => setTimeout(r, 1_500)); // past the long poll's re-check
  const { job } = await lh.getJob(id);
  assert.equal(job.state, "waiting");
  assert.equal(job.attempt, 0);
});

test("a stopping server answers its long polls and closes at once: a kept-alive connection or one that never sent a request does not hold it for the grace period", async () => {
  const app = createServer({ leasehold: lh, token: TOKEN });
  const at = await app.listen({ port: 0, host: "127.0.0.1" });
  const unused = rawConnection(at);
  const keptAlive = new http.Agent({ keepAlive: true });
  const post = (path: string, body: unknown) =>
    new Promise<{ status: number; body: string }>((resolve, reject) => {
      const req = http.request(at + path, {
        method: "POST",
        agent: keptAlive,
        headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" },
      });
      req.on("response", (res) => {
        let text = "";
        res.on("data", (b: Buffer) => (text += b.toString()));
        res.on("end", () => resolve({ status: res.statusCode!, body: text }));
      });
      req.on("error", reject);
      req.end(JSON.stringify(body));
    });
  try {
    // A connection kept alive after its answer, and a long poll waiting for a job.
    assert.equal((await post("/v1/worker/cancels", { workerId: "w-stop", attempts: [] })).status, 200);
    const waiting = post("/v1/worker/claim", { workerId: "w-stop", queues: ["never"], tasks: ["t"], limit: 1, leaseMs: 60_000, waitMs: 30_000 });
    await new Promise((r) => setTimeout(r, 300)); // the server is now waiting for a job
    const started = performance.now();
    await app.close();
    const tookMs = performance.now() - started;
    const answer = await waiting;
    assert.equal(answer.status, 200, answer.body);
    assert.deepEqual(JSON.parse(answer.body).jobs, []);
    await unused.closed;
    assert.ok(tookMs < CLOSE_GRACE_MS / 2, `closed in ${Math.round(tookMs)} ms, not after the ${CLOSE_GRACE_MS} ms grace`);
  } finally {
    unused.socket.destroy();
    keptAlive.destroy();
  }
});

test("job ids beyond PostgreSQL's bigint name no job: a typed 404, not a 500", async () => {
  for (const [method, path] of [
    ["GET", "/v1/jobs/9223372036854775808"],
    ["GET", "/v1/jobs/9999999999999999999"],
    ["POST", "/v1/jobs/9223372036854775808/cancel"],
    ["POST", "/v1/jobs/9223372036854775808/retry"],
  ] as const) {
    const r = await api(method, path);
    assert.equal(r.status, 404, `${method} ${path}: ${r.text}`);
    assert.equal(r.json.error.code, "job_not_found");
  }
  // The largest bigint is a well-formed id that no job has; a malformed one is a 400.
  const max = await api("GET", "/v1/jobs/9223372036854775807");
  assert.equal(max.status, 404);
  assert.equal(max.json.error.code, "job_not_found");
  assert.equal((await api("GET", "/v1/jobs/12ab")).status, 400);
  await assert.rejects(lh.getJob("9223372036854775808"), { code: "job_not_found" });
});

test("serve refuses at start a token nobody could send: whitespace, control characters (one line, usage exit code)", async () => {
  for (const [args, env] of [
    [["--token", "a token with spaces 0123456789"], {}],
    [[], { LEASEHOLD_TOKEN: "tab\tseparated-0123456789" }],
    [[], { LEASEHOLD_TOKEN: "bell\u0007-0123456789abcdef" }],
    [["--token", "tr\u00e8s-secret-0123456789"], {}],
  ] as [string[], Record<string, string>][]) {
    const r = await runCli(["serve", "--port", "0", ...args], { schema: lh.schema, env });
    assert.equal(r.code, 2, `${JSON.stringify(args)} ${JSON.stringify(env)}: ${r.stderr}`);
    assert.ok(isOneLineError(r.stderr), r.stderr);
    assert.match(r.stderr, /token must be printable ASCII without spaces/);
  }
});

test("request metrics keep a bounded set of labels: unknown routes are one label, never the URL", async () => {
  for (let i = 0; i < 20; i++) {
    await api("GET", `/v1/nothing-${i}`);
    await api("POST", `/v1/queues/q-${i}/jobs`, {}, {});
    await api("DELETE", `/v1/jobs/${i + 1}`);
  }
  const { text } = await api("GET", "/metrics");
  const routes = new Set([...text.matchAll(/^leasehold_http_requests_total\{route="([^"]*)"/gm)].map((m) => m[1]));
  assert.ok(!text.includes("nothing-") && !text.includes("q-1"), "a raw URL became a label");
  assert.ok(routes.has("unmatched"), [...routes].join(", "));
  assert.ok(
    [...routes].every((r) => r === "unmatched" || r!.startsWith("/")),
    [...routes].join(", "),
  );
});

test("timeouts: a slow body or slow headers are cut (408), an idle connection is closed, and a long poll still waits its full time", async () => {
  const tight = await startServe(["--request-timeout", "1000", "--keep-alive-timeout", "500", "--no-watchdog"]);
  const url = tight.match[1]!;
  try {
    const head = (path: string, length: number) =>
      `POST ${path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${TOKEN}\r\nContent-Type: application/json\r\nContent-Length: ${length}\r\n\r\n`;
    const slowBody = rawConnection(url);
    slowBody.socket.write(head("/v1/jobs", 200));
    void slowBody.trickle(" ".repeat(200), 200);
    const slowHeaders = rawConnection(url);
    slowHeaders.socket.write("GET /v1/stats HTTP/1.1\r\nHost: x\r\n");
    void slowHeaders.trickle("X-Slow: " + "a".repeat(100), 200);
    const idle = rawConnection(url);
    idle.socket.write(`GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n`);
    const started = Date.now();
    const pollAt = apiAt(url, "POST", "/v1/worker/claim", {
      workerId: "w-timeouts",
      queues: ["never-filled"],
      tasks: ["t"],
      limit: 1,
      leaseMs: 5_000,
      waitMs: 3_000,
    });

    const [bodyMs, headersMs, idleMs] = await Promise.all([slowBody.closed, slowHeaders.closed, idle.closed]);
    assert.ok(bodyMs < 3_000, `slow body kept for ${bodyMs} ms`);
    assert.match(slowBody.received(), /^HTTP\/1\.1 408/);
    assert.ok(headersMs < 3_000, `slow headers kept for ${headersMs} ms`);
    assert.match(slowHeaders.received(), /^HTTP\/1\.1 408/);
    assert.match(idle.received(), /^HTTP\/1\.1 200/);
    assert.ok(idleMs < 2_500, `idle keep-alive connection kept for ${idleMs} ms`);

    const waited = await pollAt;
    assert.equal(waited.status, 200, waited.text);
    assert.deepEqual(waited.json.jobs, []);
    assert.ok(Date.now() - started >= 2_900, "the long poll waited its full waitMs, past the request timeout");
  } finally {
    await tight.stop("SIGTERM");
  }
});

test("an authentication failure closes the connection, even while the client is still sending its body", async () => {
  const conn = rawConnection(base);
  conn.socket.write(
    `POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer not-the-token-0123456789\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{`,
  );
  void conn.trickle(" ".repeat(99), 100);
  const closedMs = await Promise.race([conn.closed, new Promise<number>((r) => setTimeout(() => r(-1), 3_000))]);
  assert.match(conn.received(), /^HTTP\/1\.1 401/);
  assert.match(conn.received(), /\r\nconnection: close\r\n/i);
  assert.ok(closedMs >= 0 && closedMs < 1_000, `connection still open ${closedMs < 0 ? "after 3 s" : `for ${closedMs} ms`}`);
  conn.socket.destroy();
});

test("connections beyond --max-connections are closed as they arrive, and counted", async () => {
  const capped = await startServe(["--max-connections", "3", "--no-watchdog"]);
  const url = capped.match[1]!;
  const held = [rawConnection(url), rawConnection(url), rawConnection(url)];
  try {
    await new Promise((r) => setTimeout(r, 200));
    const extra = rawConnection(url);
    const closedMs = await Promise.race([extra.closed, new Promise<number>((r) => setTimeout(() => r(-1), 2_000))]);
    assert.ok(closedMs >= 0, "the fourth connection was kept");
    assert.equal(extra.received(), "");
    for (const c of held) c.socket.destroy();
    await Promise.all(held.map((c) => c.closed));
    await new Promise((r) => setTimeout(r, 100));
    const metrics = await apiAt(url, "GET", "/metrics");
    assert.match(metrics.text, /^leasehold_server_connections_dropped_total 1$/m);
  } finally {
    for (const c of held) c.socket.destroy();
    await capped.stop("SIGTERM");
  }
});

test("idle long polls are cheap: one shared re-check a second for all of them, and it still wakes a claim when a delayed job comes due", async () => {
  const counter = await statementCountingProxy(databaseUrl());
  // Only the long polls: no watchdog, retention, scheduler or dashboard sampler, whose own
  // periodic statements (a retention run is a dozen) would land in the counting window.
  const counted = await startServe(["--no-watchdog", "--no-retention", "--no-scheduler", "--dashboard", "off"], { DATABASE_URL: counter.url });
  const url = counted.match[1]!;
  const claim = (workerId: string, waitMs: number) =>
    apiAt(url, "POST", "/v1/worker/claim", { workerId, queues: ["idle-q"], tasks: ["idle.t"], limit: 1, leaseMs: 5_000, waitMs });
  try {
    assert.equal((await claim("warm-up", 0)).status, 200);
    // Long enough that none ends inside the counting window below (each poll's end costs a
    // last claim of its own, which is not the idle cost).
    const pollMs = 8_000;
    const issuedAt = Date.now();
    const polls = Array.from({ length: 20 }, (_, i) => claim(`idle-${i}`, pollMs));
    // Count from the moment all 20 have made their first claim and wait (a fixed pause was
    // too short on a busy machine: late first claims were counted as the idle cost).
    await eventually(
      async () => /^leasehold_server_long_polls_waiting 20$/m.test((await apiAt(url, "GET", "/metrics")).text),
      "all 20 long polls waiting",
      3_000,
    );
    const before = counter.statements();
    await new Promise((r) => setTimeout(r, 3_000));
    const during = counter.statements() - before;
    assert.ok(Date.now() - issuedAt < pollMs, "the counting window overlapped the polls' ends: the count is not the idle cost");
    assert.ok(during <= 4, `20 idle long polls cost ${during} statements in 3 s (one re-check a second): ${counter.ranSince(before).join(" | ")}`);
    for (const r of await Promise.all(polls)) assert.deepEqual([r.status, r.json.jobs, r.json.waited], [200, [], true]);

    // A delayed job sends its notification when enqueued, not when due: the re-check finds it.
    const started = Date.now();
    const waiting = claim("delayed-w", 6_000);
    await new Promise((r) => setTimeout(r, 200));
    const { id } = await lh.enqueue("idle.t", {}, { queue: "idle-q", delayMs: 1_500 });
    const got = await waiting;
    assert.deepEqual(
      got.json.jobs.map((j: { id: string }) => j.id),
      [id],
    );
    assert.ok(Date.now() - started < 4_000, `claimed after ${Date.now() - started} ms`);
  } finally {
    await counted.stop("SIGTERM");
    await counter.close();
  }
});

test("beyond --max-long-polls a claim answers at once with what it finds (waited: false), and it is counted", async () => {
  const capped = await startServe(["--max-long-polls", "2", "--no-watchdog"]);
  const url = capped.match[1]!;
  const claim = (queue: string, waitMs: number) =>
    apiAt(url, "POST", "/v1/worker/claim", { workerId: `w-${queue}`, queues: [queue], tasks: ["cap.t"], limit: 1, leaseMs: 5_000, waitMs });
  try {
    const holding = [claim("cap-a", 3_000), claim("cap-b", 3_000)];
    await new Promise((r) => setTimeout(r, 300));
    let started = Date.now();
    const refused = await claim("cap-c", 3_000);
    assert.deepEqual([refused.status, refused.json.jobs, refused.json.waited], [200, [], false]);
    assert.ok(Date.now() - started < 1_000, `the claim over the cap waited ${Date.now() - started} ms`);
    const { id } = await lh.enqueue("cap.t", {}, { queue: "cap-d" });
    started = Date.now();
    const found = await claim("cap-d", 3_000);
    assert.deepEqual(
      found.json.jobs.map((j: { id: string }) => j.id),
      [id],
    );
    const metrics = await apiAt(url, "GET", "/metrics");
    assert.match(metrics.text, /^leasehold_server_long_polls_refused_total 1$/m);
    assert.match(metrics.text, /^leasehold_server_long_polls_waiting 2$/m);
    for (const r of await Promise.all(holding)) assert.deepEqual([r.json.jobs, r.json.waited], [[], true]);
  } finally {
    await capped.stop("SIGTERM");
  }
});

test("scopes: a worker token may use only /v1/worker/* (403 elsewhere); replicas with one --receipt-key accept each other's receipts", async () => {
  const WORKER_TOKEN = "worker-token-0123456789abcdef";
  const OTHER_TOKEN = "another-operator-token-0123456789";
  const RECEIPT_KEY = "receipt-key-0123456789abcdef";
  const one = await startServe(["--no-watchdog", "--receipt-key", RECEIPT_KEY], { LEASEHOLD_WORKER_TOKEN: WORKER_TOKEN });
  const two = await startServe(["--no-watchdog"], { LEASEHOLD_TOKEN: OTHER_TOKEN, LEASEHOLD_RECEIPT_KEY: RECEIPT_KEY });
  const [urlOne, urlTwo] = [one.match[1]!, two.match[1]!];
  const asWorker = { authorization: `Bearer ${WORKER_TOKEN}` };
  try {
    for (const [method, path] of [
      ["GET", "/v1/stats"],
      ["GET", "/v1/jobs"],
      ["POST", "/v1/jobs"],
      ["POST", "/v1/jobs/batch"],
      ["GET", "/v1/jobs/1"],
      ["POST", "/v1/jobs/1/cancel"],
      ["POST", "/v1/jobs/1/retry"],
      ["GET", "/metrics"],
      ["GET", "/openapi.json"],
    ] as const) {
      const r = await apiAt(urlOne, method, path, method === "POST" ? { task: "x" } : undefined, asWorker);
      assert.equal(r.status, 403, `${method} ${path}: ${r.text}`);
      assert.equal(r.json.error.code, "forbidden");
    }
    assert.equal((await apiAt(urlOne, "GET", "/v1/nothing", undefined, asWorker)).status, 404);
    assert.deepEqual((await apiAt(urlOne, "GET", "/v1/worker/check", undefined, asWorker)).json, { scope: "worker" });
    assert.deepEqual((await apiAt(urlOne, "GET", "/v1/worker/check")).json, { scope: "operator" });
    assert.equal((await apiAt(urlOne, "GET", "/v1/stats")).status, 200);
    // The worker token is not accepted where it was not configured.
    assert.equal((await apiAt(urlTwo, "GET", "/v1/worker/check", undefined, asWorker)).status, 401);

    // Claimed at one replica with the worker token, finished at the other (another operator token, same receipt key).
    const { id } = await lh.enqueue("scoped", {}, { queue: "scopes" });
    const claimed = (
      await apiAt(urlOne, "POST", "/v1/worker/claim", { workerId: "w-s", queues: ["scopes"], tasks: ["scoped"], limit: 1, leaseMs: 30_000 }, asWorker)
    ).json.jobs[0];
    const done = await apiAt(
      urlTwo,
      "POST",
      "/v1/worker/succeed",
      { workerId: "w-s", jobs: [{ id, attempt: claimed.attempt, receipt: claimed.receipt }] },
      { authorization: `Bearer ${OTHER_TOKEN}` },
    );
    assert.deepEqual(done.json.applied, [{ id, state: "succeeded" }]);
    // The main server derives its key from its token, so it refuses that receipt.
    const { id: id2 } = await lh.enqueue("scoped", {}, { queue: "scopes" });
    const other = (
      await apiAt(urlOne, "POST", "/v1/worker/claim", { workerId: "w-s", queues: ["scopes"], tasks: ["scoped"], limit: 1, leaseMs: 30_000 }, asWorker)
    ).json.jobs[0];
    const refused = await api("POST", "/v1/worker/release", {
      workerId: "w-s",
      jobs: [{ id: id2, attempt: other.attempt, receipt: other.receipt }],
      reason: "x",
    });
    assert.deepEqual(
      refused.json.refused.map((r: { reason: string }) => r.reason),
      ["invalid_receipt"],
    );

    // A remote worker holding only the worker token checks the server and runs jobs.
    const worker = remoteWorker(urlOne, { scoped: () => {} }, { token: WORKER_TOKEN });
    const { id: id3 } = await lh.enqueue("scoped", {}, { queue: "default" });
    const ended = waitForEvent<[{ id: string }, { state: string }]>(worker, "job:end", (job) => job.id === id3);
    await new RemoteTransport({ serverUrl: urlOne, token: WORKER_TOKEN }).check();
    await worker.start();
    try {
      assert.equal((await ended)[1].state, "succeeded");
    } finally {
      await worker.stop();
    }
  } finally {
    await Promise.all([one.stop("SIGTERM"), two.stop("SIGTERM")]);
  }
  for (const [args, message] of [
    [["--worker-token", "short"], /worker token must be at least 16 characters/],
    [["--worker-token", TOKEN], /worker token must differ from the operator token/],
    [["--receipt-key", "key with spaces 0123456789"], /receipt key must be printable ASCII/],
  ] as [string[], RegExp][]) {
    const r = await runCli(["serve", "--port", "0", ...args], { schema: lh.schema, env: { LEASEHOLD_TOKEN: TOKEN } });
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, message);
  }
});

/** `n` jobs with payloads of about 1 MB each in `queue`. */
async function enqueueBig(queue: string, n: number): Promise<string[]> {
  const jobs = await lh.enqueueMany(
    Array.from({ length: n }, (_, i) => ({ task: "big", queue, payload: { i, blob: String(i % 10).repeat(1_000_000) } })),
  );
  return jobs.map((j) => j.id);
}

test("lists are bounded: payloads only when asked for, pages of at most ~8 MiB continued with a cursor, also through the CLI", async () => {
  const ids = await enqueueBig("big-list", 12);
  const plain = await api("GET", "/v1/jobs?queue=big-list&limit=100");
  assert.equal(plain.status, 200);
  assert.equal(plain.json.jobs.length, 12);
  assert.ok(
    plain.json.jobs.every((j: object) => !("payload" in j)),
    "payloads left out by default",
  );
  assert.ok(plain.text.length < 20_000, `${plain.text.length} bytes without payloads`);
  assert.equal(plain.json.next, null);

  const seen: string[] = [];
  let before: string | null = null;
  let pages = 0;
  do {
    const page = await api("GET", `/v1/jobs?queue=big-list&limit=100&payload=true${before ? `&before=${before}` : ""}`);
    assert.equal(page.status, 200, page.text.slice(0, 300));
    assert.ok(page.text.length <= 8 * 1024 * 1024 + 1024, `a page of ${page.text.length} bytes`);
    for (const j of page.json.jobs as { id: string; payload: { i: number; blob: string } }[]) {
      assert.equal(j.payload.blob.length, 1_000_000);
      seen.push(j.id);
    }
    before = page.json.next;
    pages++;
  } while (before);
  assert.ok(pages >= 2, `${pages} pages`);
  assert.deepEqual(seen, [...ids].reverse(), "every job once, newest first");
  const limited = await api("GET", "/v1/jobs?queue=big-list&limit=3");
  assert.deepEqual([limited.json.jobs.length, limited.json.next], [3, ids[9]]);
  const rest = await api("GET", `/v1/jobs?queue=big-list&limit=100&before=${limited.json.next}`);
  assert.deepEqual(
    rest.json.jobs.map((j: { id: string }) => j.id),
    ids.slice(0, 9).reverse(),
  );
  const tooBig = await api("GET", "/v1/jobs?before=9223372036854775808");
  assert.deepEqual([tooBig.status, tooBig.json.error.code], [400, "invalid_input"]);
  assert.match(tooBig.json.error.message, /before must be a positive integer no larger than 9223372036854775807/);

  const env = { DATABASE_URL: "postgres://nobody@127.0.0.1:1/none", LEASEHOLD_TOKEN: TOKEN };
  const cli = (args: string[]) => runCli(["--server", base, "jobs", "list", "--queue", "big-list", "--json", ...args], { schema: lh.schema, env });
  const withPayloads = JSON.parse((await cli(["--payload", "--limit", "100"])).stdout) as { id: string; payload: { blob: string } }[];
  assert.deepEqual(
    withPayloads.map((j) => j.id),
    [...ids].reverse(),
  );
  assert.ok(withPayloads.every((j) => j.payload.blob.length === 1_000_000));
  const without = JSON.parse((await cli([])).stdout) as object[];
  assert.ok(without.length === 12 && without.every((j) => !("payload" in j)));
  const older = JSON.parse((await cli(["--before", ids[2]!])).stdout) as { id: string }[];
  assert.deepEqual(
    older.map((j) => j.id),
    [ids[1], ids[0]],
  );
});

const CAP = 8 * 1024 * 1024;
/** What a capped answer may read from the database beyond the cap: the statements' other columns and framing. */
const CAP_SLACK = 256 * 1024;

/**
 * A serve whose reads from the database are counted (statementCountingProxy), with nothing
 * periodic of its own (watchdog, retention, scheduler, dashboard sampler) in the count.
 */
async function countedServe() {
  const counter = await statementCountingProxy(databaseUrl());
  const served = await startServe(["--no-watchdog", "--no-retention", "--no-scheduler", "--dashboard", "off"], { DATABASE_URL: counter.url });
  const url = served.match[1]!;
  /** The request's answer, and the bytes the server read from the database while it was served. */
  const measured = async (method: string, path: string, body?: unknown) => {
    const before = counter.bytesFromDatabase();
    const r = await apiAt(url, method, path, body);
    return { ...r, readBytes: counter.bytesFromDatabase() - before };
  };
  return {
    url,
    measured,
    stop: async () => {
      await served.stop("SIGTERM");
      await counter.close();
    },
  };
}

test("a claim's answer is capped at ~8 MiB in its statement: payloads past the cap are not read, those jobs are never leased and wait for the next claim", async () => {
  const ids = await enqueueBig("big-claim", 20);
  const served = await countedServe();
  try {
    const claim = () =>
      served.measured("POST", "/v1/worker/claim", { workerId: "w-big", queues: ["big-claim"], tasks: ["big"], limit: 20, leaseMs: 60_000 });
    const claimed: string[] = [];
    for (let answers = 0; claimed.length < ids.length; answers++) {
      assert.ok(answers < ids.length, "every job is claimed by some answer");
      const r = await claim();
      assert.equal(r.status, 200);
      assert.ok(r.text.length <= CAP, `${r.text.length} bytes`);
      // From the database side: the server read no more than the answer's cap (20 payloads are ~20 MB).
      assert.ok(r.readBytes <= CAP + CAP_SLACK, `the claim read ${r.readBytes} bytes from the database`);
      const got = (r.json.jobs as { id: string; attempt: number }[]).map((j) => [j.id, j.attempt] as const);
      assert.ok(got.length >= 1 && got.length < 20, `${got.length} jobs in one answer`);
      // Each job's first attempt is the one this answer carries: none past the cap was leased and given back.
      assert.ok(got.every(([, attempt]) => attempt === 1));
      claimed.push(...got.map(([id]) => id));
      const rest = ids.filter((id) => !claimed.includes(id));
      // The jobs past the cap are waiting, never leased, with no attempt recorded.
      const { rows } = await lh.pool.query<{ state: string; attempt: number; attempts: number }>(
        `SELECT state, attempt, (SELECT count(*)::int FROM job_attempts AS a WHERE a.job_id = j.id) AS attempts
           FROM jobs AS j WHERE id = ANY($1::bigint[])`,
        [rest],
      );
      assert.deepEqual(
        rows.map((r) => [r.state, r.attempt, r.attempts]),
        rest.map(() => ["waiting", 0, 0]),
      );
    }
    assert.deepEqual([...claimed].sort(), [...ids].sort());
    assert.doesNotMatch((await apiAt(served.url, "GET", "/metrics")).text, /^leasehold_jobs_released_total\{cause="response_cap"\}/m);
  } finally {
    await served.stop();
  }
});

test("a flow-controlled claim's answer is capped too: payloads past the cap are not read, their leases are given back", async () => {
  await lh.setQueueLimits("big-flow", { concurrency: 100 }, { create: true });
  const ids = await enqueueBig("big-flow", 20);
  const served = await countedServe();
  try {
    const claim = () =>
      served.measured("POST", "/v1/worker/claim", {
        workerId: "w-big-flow",
        queues: ["big-flow"],
        flowQueues: ["big-flow"],
        tasks: ["big"],
        limit: 20,
        leaseMs: 60_000,
      });
    const first = await claim();
    assert.equal(first.status, 200);
    assert.ok(first.text.length <= CAP, `${first.text.length} bytes`);
    assert.ok(first.readBytes <= CAP + CAP_SLACK, `the claim read ${first.readBytes} bytes from the database`);
    const got = (first.json.jobs as { id: string }[]).map((j) => j.id);
    assert.ok(got.length >= 1 && got.length < 20, `${got.length} jobs in one answer`);
    const released = ids.filter((id) => !got.includes(id));
    for (const id of released) {
      const { job, attempts } = await lh.getJob(id);
      assert.deepEqual([job.state, job.attempt, job.spentAttempts], ["waiting", 1, 0]);
      assert.deepEqual(
        attempts.map((a) => a.outcome),
        ["released"],
      );
    }
    const second = await claim();
    assert.ok(second.readBytes <= CAP + CAP_SLACK, `the claim read ${second.readBytes} bytes from the database`);
    const again = (second.json.jobs as { id: string; attempt: number }[]).map((j) => [j.id, j.attempt] as const);
    assert.ok(again.length >= 1 && again.every(([id, attempt]) => released.includes(id) && attempt === 2));
  } finally {
    await served.stop();
  }
});

test("a list page is cut at ~8 MiB in its statement: small jobs first do not make the next chunk read every large one", async () => {
  // Newest first: 10 small jobs, then 30 of ~1 MB. The first chunk (10 small rows) once sized the
  // next one from their average: all 30 large payloads, ~30 MB, were read for one page.
  const large = await enqueueBig("list-mixed", 30);
  const small = (await lh.enqueueMany(Array.from({ length: 10 }, (_, i) => ({ task: "small", queue: "list-mixed", payload: { i } })))).map(
    (j) => j.id,
  );
  const served = await countedServe();
  try {
    const seen: string[] = [];
    let before: string | null = null;
    do {
      const page = await served.measured("GET", `/v1/jobs?queue=list-mixed&payload=true&limit=100${before === null ? "" : `&before=${before}`}`);
      assert.equal(page.status, 200, page.text.slice(0, 300));
      assert.ok(page.text.length <= CAP, `${page.text.length} bytes`);
      assert.ok(page.readBytes <= CAP + CAP_SLACK, `the page read ${page.readBytes} bytes from the database`);
      seen.push(...(page.json.jobs as { id: string }[]).map((j) => j.id));
      before = page.json.next;
    } while (before !== null && seen.length <= 40);
    assert.deepEqual(seen, [...large, ...small].reverse());
  } finally {
    await served.stop();
  }
});

test("a job's parents are answered in pages of at most ~8 MiB, read in SQL; a remote worker's ctx.parents() reads every page", async () => {
  const parentNodes = Array.from({ length: 12 }, (_, i) => ({ ref: `p${i}`, task: "bigparent", queue: "big-parents" }));
  const refs = parentNodes.map((n) => n.ref);
  const { jobs } = await lh.enqueueFlow([
    ...parentNodes,
    { ref: "raw", task: "bigchild", queue: "big-children", dependsOn: refs },
    { ref: "remote", task: "bigchild", queue: "big-children", dependsOn: refs },
  ]);
  // Each parent's result is ~1 MB: 12 MB of parents for each child.
  const parentIds = refs.map((r) => jobs[r]!);
  const worker = lh.worker({
    queues: ["big-parents"],
    handlers: { bigparent: (_p: unknown, ctx: JobContext) => ({ n: parentIds.indexOf(ctx.jobId), blob: "r".repeat(1_000_000) }) },
    maxResultBytes: 2_000_000,
    pollIntervalMs: 20,
  });
  await worker.start();
  try {
    await eventually(async () => (await lh.getJob(jobs.remote!)).job.state === "waiting", "every parent succeeded");
  } finally {
    await worker.stop();
  }

  const claim = await api("POST", "/v1/worker/claim", {
    workerId: "w-parents",
    queues: ["big-children"],
    tasks: ["bigchild"],
    limit: 1,
    leaseMs: 60_000,
  });
  const [child] = claim.json.jobs as { id: string; attempt: number; receipt: string }[];
  const job = { id: child!.id, attempt: child!.attempt, receipt: child!.receipt };
  // A client that does not ask for pages (an earlier release's) is refused rather than given part of the list.
  const whole = await api("POST", "/v1/worker/parents", { workerId: "w-parents", job });
  assert.deepEqual([whole.status, whole.json.error.code], [413, "answer_too_large"]);
  assert.match(whole.json.error.message, /do not fit one answer \(the server's cap is 8 MiB\): read them in pages/);

  const pages: { parents: { id: string; state: string; result: { n: number; blob: string } }[]; next: string | null }[] = [];
  let after: string | null = null;
  const served = await countedServe();
  try {
    do {
      const page = await served.measured("POST", "/v1/worker/parents", { workerId: "w-parents", job, after });
      assert.equal(page.status, 200, page.text.slice(0, 300));
      assert.ok(page.text.length <= CAP, `${page.text.length} bytes`);
      // From the database side: a page reads no more than the cap (the parents' results are ~12 MB).
      assert.ok(page.readBytes <= CAP + CAP_SLACK, `the page read ${page.readBytes} bytes from the database`);
      pages.push(page.json);
      after = page.json.next;
    } while (after !== null && pages.length < 12);
  } finally {
    await served.stop();
  }
  assert.ok(pages.length >= 2, `${pages.length} pages`);
  const read = pages.flatMap((p) => p.parents);
  assert.deepEqual(
    read.map((p) => [p.id, p.state, p.result.n, p.result.blob.length]),
    parentIds.map((id, n) => [id, "succeeded", n, 1_000_000]),
  );
  const bad = await api("POST", "/v1/worker/parents", { workerId: "w-parents", job, after: "x" });
  assert.deepEqual([bad.status, bad.json.error.code], [400, "invalid_input"]);
  assert.match(bad.json.error.message, /after/);

  // A remote worker's ctx.parents() reads every page: the same list as a database worker's.
  const transport = new RemoteTransport({ serverUrl: base, token: TOKEN, waitMs: 0 });
  const [remote] = await transport.claim({ queues: ["big-children"], tasks: ["bigchild"], limit: 1, workerId: "w-parents-rt", leaseMs: 60_000 });
  assert.equal(remote!.id, jobs.remote);
  const viaServer = await transport.parents({ workerId: "w-parents-rt", job: { id: remote!.id, attempt: remote!.attempt } });
  assert.equal(viaServer.length, 12);
  assert.deepEqual(viaServer, await store.parentsOf(lh.pool, jobs.remote!));
});

test("a heartbeat judges each beat alone: a progress or checkpoint that cannot be stored refuses that beat, the others are renewed", async () => {
  await lh.enqueueMany(Array.from({ length: 7 }, (_, n) => ({ task: "beat.t", queue: "beats", payload: { n } })));
  const claim = await api("POST", "/v1/worker/claim", { workerId: "w-beats", queues: ["beats"], tasks: ["beat.t"], limit: 7, leaseMs: 60_000 });
  const refs = (claim.json.jobs as { id: string; attempt: number; receipt: string }[]).map(({ id, attempt, receipt }) => ({ id, attempt, receipt }));
  assert.equal(refs.length, 7);
  const [good, plain, nul, surrogate, nulKey, deep, huge] = refs as [(typeof refs)[0], ...typeof refs];
  const DEEP = "__deep__";
  const beats = [
    { ...good, progress: { pct: 10 } },
    plain,
    { ...nul, progress: "a\u0000b" },
    { ...surrogate, checkpoint: { s: "\ud83d" } },
    { ...nulKey, progress: { ["a\u0000b"]: 1 } },
    { ...deep, progress: DEEP },
    { ...huge, checkpoint: "x".repeat(1_100_000) },
  ];
  // 5,000 levels of nesting: more than JSON.stringify can write, so the text is built by hand.
  const body = JSON.stringify({ workerId: "w-beats", leaseMs: 120_000, beats }).replace(`"${DEEP}"`, "[".repeat(5_000) + "]".repeat(5_000));
  const db = await rawClient(lh.schema);
  const rows = async () =>
    new Map(
      (await db.query("SELECT id::text, lease_until, progress, checkpoint FROM jobs WHERE queue = 'beats'")).rows.map((r) => [r.id as string, r]),
    );
  try {
    const before = await rows();
    const r = await api("POST", "/v1/worker/heartbeat", body);
    assert.equal(r.status, 200, r.text.slice(0, 500));
    assert.deepEqual(new Set(r.json.renewed.map((x: { id: string }) => x.id)), new Set([good.id, plain.id]));
    const invalid = r.json.invalid as { id: string; attempt: number; code: string; message: string }[];
    assert.deepEqual(new Set(invalid.map((i) => i.id)), new Set([nul.id, surrogate.id, nulKey.id, deep.id, huge.id]));
    for (const i of invalid) {
      assert.equal(i.code, "invalid_input");
      assert.match(i.message, new RegExp(`^job ${i.id}: `));
      assert.doesNotMatch(i.message, /UPDATE|SELECT|unnest/);
    }
    // (Worded by serializePayload or, for what it lets through, by this server.)
    assert.match(invalid.find((i) => i.id === nul.id)!.message, /NUL|\\u0000/);
    assert.match(invalid.find((i) => i.id === deep.id)!.message, /nest|deep|depth/i);
    assert.match(invalid.find((i) => i.id === huge.id)!.message, /larger|bytes/);
    const after = await rows();
    assert.deepEqual(after.get(good.id)!.progress, { pct: 10 });
    assert.ok(after.get(good.id)!.lease_until > before.get(good.id)!.lease_until);
    assert.ok(after.get(plain.id)!.lease_until > before.get(plain.id)!.lease_until);
    for (const bad of [nul, surrogate, nulKey, deep, huge]) assert.deepEqual(after.get(bad.id), before.get(bad.id), `job ${bad.id} untouched`);
    assert.match((await api("GET", "/metrics")).text, /^leasehold_server_invalid_beats_total 5$/m);
  } finally {
    await db.end();
  }
});

test("a remote worker whose progress the server cannot store keeps its lease: the transport renews it without the value", async () => {
  const worker = remoteWorker(base, {
    unstorable: async (_p: unknown, ctx) => {
      // A lone surrogate: PostgreSQL's jsonb refuses it. (Where the worker refuses it first, nothing is sent.)
      try {
        ctx.progress({ s: "\ud83d" });
      } catch {
        // the worker refused it itself: nothing was sent
      }
      await new Promise((r) => setTimeout(r, 4_000)); // beyond the 3 s lease: only renewals keep it
    },
  });
  const { id } = await lh.enqueue("unstorable", {});
  const ended = waitForEvent<[{ id: string }, { state: string }]>(worker, "job:end", (job) => job.id === id);
  await worker.start();
  try {
    assert.equal((await ended)[1].state, "succeeded");
  } finally {
    await worker.stop();
  }
  const { job, attempts } = await lh.getJob(id);
  assert.deepEqual([job.state, job.progress, attempts.map((a) => a.outcome)], ["succeeded", null, ["succeeded"]]);
});

test("RemoteTransport keeps a claim's receipt while its attempt may still be reported, and drops it once the end is reported", async () => {
  const transport = new RemoteTransport({ serverUrl: base, token: TOKEN, waitMs: 0 });
  const invalidReceipts = async () =>
    Number(/^leasehold_server_invalid_receipts_total\{kind="complete"\} (\d+)$/m.exec((await api("GET", "/metrics")).text)?.[1] ?? 0);
  await lh.enqueueMany([
    { task: "rt.t", queue: "rt" },
    { task: "rt.t", queue: "rt", leaseMs: 1_000 },
  ]);
  const claimed = await transport.claim({ queues: ["rt"], tasks: ["rt.t"], limit: 2, workerId: "w-rt", leaseMs: 30_000 });
  assert.equal(claimed.length, 2);
  assert.ok(
    claimed.every((j) => !("receipt" in j)),
    "the runtime never sees receipts",
  );
  const [done, expiring] = claimed as [(typeof claimed)[0], (typeof claimed)[0]];
  const ref = (j: typeof done) => ({ id: j.id, attempt: j.attempt });

  const before = await invalidReceipts();
  assert.deepEqual([...(await transport.complete({ workerId: "w-rt", jobs: [ref(done)] }))], [[done.id, "succeeded"]]);
  // Its end is reported: the receipt is gone, so the same report again goes without one.
  assert.equal((await transport.complete({ workerId: "w-rt", jobs: [ref(done)] })).size, 0);
  assert.equal(await invalidReceipts(), before + 1);

  // The other's lease (1 s) runs out and the watchdog reaps it: a heartbeat finds it lost.
  await eventually(async () => (await lh.getJob(expiring.id)).job.state === "waiting", "reaped");
  const beat = await transport.heartbeat({ workerId: "w-rt", leaseMs: 30_000, beats: [ref(expiring)] });
  assert.deepEqual(beat.lost, [expiring.id]);
  assert.equal((await transport.describeLost([ref(expiring)])).get(expiring.id)?.reason, "lease_expired");
  // A report of it may still follow (e.g. a retry after an ambiguous commit): it carries the receipt and meets the fence.
  assert.equal((await transport.complete({ workerId: "w-rt", jobs: [ref(expiring)] })).size, 0);
  assert.equal(await invalidReceipts(), before + 1);
  assert.equal((await transport.describeLost([ref(expiring)])).get(expiring.id)?.reason, "lease_expired");
});

test("a remote worker's ctx.transaction ends the job as dead at once, with a message that says why and what to do", async () => {
  const worker = remoteWorker(base, {
    // The handler wraps the error, as handlers do: the job still ends for good (no retry helps).
    "tx.remote": async (_p: unknown, ctx) => {
      try {
        await ctx.transaction(async () => undefined);
      } catch (err) {
        throw new Error(`charging failed: ${(err as Error).message}`, { cause: err });
      }
    },
    // Left unwrapped, it is a PermanentJobError.
    "tx.remote.plain": async (_p: unknown, ctx) => {
      await ctx.transaction(async () => undefined);
    },
  });
  // The default budget (25 attempts): the job must not spend it.
  const { id } = await lh.enqueue("tx.remote", {});
  const { id: plainId } = await lh.enqueue("tx.remote.plain", {});
  const ended = waitForEvent<[{ id: string }, { state: string }]>(worker, "job:end", (job) => job.id === id);
  const plainEnded = waitForEvent<[{ id: string }, { state: string }]>(worker, "job:end", (job) => job.id === plainId);
  await worker.start();
  try {
    assert.equal((await ended)[1].state, "dead");
    assert.equal((await plainEnded)[1].state, "dead");
  } finally {
    await worker.stop();
  }
  for (const jobId of [id, plainId]) {
    const { job } = await lh.getJob(jobId);
    assert.equal(job.state, "dead");
    assert.equal(job.attempt, 1, "one attempt, no retries");
    assert.match(job.lastError!, /ctx\.transaction needs a worker on the database/);
    assert.match(job.lastError!, /without retries/);
    assert.match(job.lastError!, /ctx\.fencedWrite/);
  }
  assert.match((await lh.getJob(plainId)).job.lastError!, /^PermanentJobError/);
});
