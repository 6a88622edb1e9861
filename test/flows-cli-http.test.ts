/**
 * Dependencies and batches through the CLI (`leasehold flows enqueue`, `leasehold batches
 * enqueue`, `jobs list --state blocked`, on the database and through a server) and over HTTP
 * (`POST /v1/flows`, `POST /v1/batches`, and a remote worker's ctx.parents/ctx.dependencies),
 * bad input included: refused whole, named, and nothing written.
 */
import { after, before, test } from "node:test";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import assert from "node:assert/strict";
import type { FastifyInstance } from "fastify";
import { createServer } from "../packages/cli/src/server/app.js";
import type { DependencyCounts, ParentRecord } from "../packages/leasehold/src/index.js";
import type { JobContext } from "../packages/leasehold/src/worker/context.js";
import { Registry } from "prom-client";
import { RemoteTransport } from "../packages/leasehold/src/worker/remote-transport.js";
import { Worker } from "../packages/leasehold/src/worker/worker.js";
import { eventually, freshLeasehold, silent } from "./helpers/db.js";
import { isOneLineError, runCli } from "./helpers/cli.js";
import { api as apiAt, TOKEN } from "./helpers/server.js";

const WORKER_TOKEN = "worker-token-0123456789abcdef";
const asWorker = { authorization: `Bearer ${WORKER_TOKEN}` };

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

/** Every job row, edge and queue, and the id sequence: a refused graph leaves it as it was. */
async function checksum(): Promise<string> {
  const { rows } = await lh.pool.query<{ sum: string }>(`
    SELECT md5(coalesce((SELECT string_agg(j::text, '|' ORDER BY id) FROM jobs AS j), '') ||
               coalesce((SELECT string_agg(h::text, '|' ORDER BY id) FROM finished_jobs AS h), '') ||
               coalesce((SELECT string_agg(d::text, '|' ORDER BY child_id, parent_id) FROM job_dependencies AS d), '') ||
               coalesce((SELECT string_agg(q::text, '|' ORDER BY name) FROM queues AS q), '') ||
               (SELECT last_value::text FROM jobs_id_seq)) AS sum`);
  return rows[0]!.sum;
}
const cli = (args: string[], input?: string, env?: Record<string, string>) => runCli(args, { schema: lh.schema, input, env });
const viaServer = () => ({ LEASEHOLD_SERVER_URL: base, LEASEHOLD_TOKEN: TOKEN });
const stateOf = async (id: string) => (await lh.getJob(id)).job.state;

test("leasehold flows enqueue: a graph from stdin, on the database and through a server; jobs list --state blocked", async () => {
  const graph = [
    { ref: "fetch", task: "cli.fetch", payload: { url: "x" }, queue: "cli-held" },
    { ref: "parse", task: "cli.parse", dependsOn: ["fetch"], queue: "cli-held" },
    { ref: "store", task: "cli.store", dependsOn: ["parse"], queue: "cli-held", runAt: "2030-01-01T00:00:00Z" },
  ];
  const fromStdin = await cli(["--json", "flows", "enqueue", "-"], JSON.stringify(graph));
  assert.equal(fromStdin.code, 0, fromStdin.stderr);
  const { jobs } = JSON.parse(fromStdin.stdout);
  assert.deepEqual(Object.keys(jobs), ["fetch", "parse", "store"]);
  assert.equal(await stateOf(jobs.fetch), "waiting");
  assert.equal(await stateOf(jobs.store), "blocked");
  assert.equal((await lh.getJob(jobs.store)).job.runAt?.toISOString(), "2030-01-01T00:00:00.000Z");

  const blocked = await cli(["--json", "jobs", "list", "--state", "blocked", "--queue", "cli-held"]);
  assert.equal(blocked.code, 0, blocked.stderr);
  assert.deepEqual(
    JSON.parse(blocked.stdout)
      .map((j: { id: string }) => j.id)
      .sort(),
    [jobs.parse, jobs.store].sort(),
  );
  const stats = await cli(["stats"]);
  assert.match(stats.stdout, /BLOCKED/);

  const remote = await cli(["flows", "enqueue", "-"], JSON.stringify([{ ref: "one", task: "cli.x", queue: "cli-held" }]), viaServer());
  assert.equal(remote.code, 0, remote.stderr);
  assert.match(remote.stdout, /enqueued a flow of 1 jobs: one=\d+/);

  // Cancel of a blocked job through the CLI: it and its dependent end at once.
  const cancel = await cli(["jobs", "cancel", jobs.parse]);
  assert.equal(cancel.code, 0, cancel.stderr);
  assert.equal(await stateOf(jobs.parse), "cancelled");
  assert.equal(await stateOf(jobs.store), "cancelled");
  assert.equal(await stateOf(jobs.fetch), "waiting");
});

test("bad graphs through the CLI (database and server): one line naming the problem, exit 2, nothing written", async () => {
  const before = await checksum();
  const cases: [unknown, RegExp][] = [
    [
      [
        { ref: "a", task: "x", dependsOn: ["b"] },
        { ref: "b", task: "x", dependsOn: ["a"] },
      ],
      /cycle: "[ab]" → "[ab]" → "[ab]"/,
    ],
    [[{ ref: "a", task: "x", dependsOn: ["a"] }], /node "a" depends on itself/],
    [[{ ref: "a", task: "x", dependsOn: ["nope"] }], /node "a": dependsOn names unknown ref "nope"/],
    [[{ ref: "a", task: "x", dependsOn: [{ id: "987654321" }] }], /node "a": dependsOn names no job 987654321/],
    [[{ ref: "a", task: "x", uniqueKey: "k" }], /node "a": uniqueKey is not allowed/],
    [Array.from({ length: 25_001 }, (_, i) => ({ ref: `n${i}`, task: "x" })), /25,001 nodes, over the limit of 25,000 nodes/],
  ];
  for (const env of [{}, viaServer()]) {
    for (const [graph, message] of cases) {
      const r = await cli(["flows", "enqueue", "-"], JSON.stringify(graph), env);
      assert.equal(r.code, 2, `${message}: ${r.stderr}`);
      assert.match(r.stderr, message);
      assert.ok(isOneLineError(r.stderr), r.stderr);
    }
    const notJson = await cli(["flows", "enqueue", "-"], "[{", env);
    assert.equal(notJson.code, 2);
    assert.match(notJson.stderr, /stdin is not valid JSON/);
  }
  const batch = await cli(
    ["batches", "enqueue", "-"],
    JSON.stringify({ jobs: [{ task: "ok" }, { task: "x", payload: 1, uniqueKey: "k" }], onComplete: { task: "done" } }),
  );
  assert.equal(batch.code, 2);
  assert.match(batch.stderr, /job 1: uniqueKey is not allowed/);
  const missingFile = await cli(["flows", "enqueue", "/nonexistent/graph.json"]);
  assert.equal(missingFile.code, 2);
  assert.match(missingFile.stderr, /cannot read \/nonexistent\/graph.json \(ENOENT\)/);
  assert.equal(await checksum(), before);
});

test("leasehold batches enqueue (from a file): members and a callback that waits for them all", async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-batch-"));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const file = path.join(dir, "batch.json");
  fs.writeFileSync(
    file,
    JSON.stringify({
      jobs: [
        { task: "cli.member", queue: "cli-batch" },
        { task: "cli.member", queue: "cli-batch" },
      ],
      onComplete: { task: "cli.done", queue: "cli-batch", payload: { n: 2 } },
    }),
  );
  const r = await cli(["--json", "batches", "enqueue", file]);
  assert.equal(r.code, 0, r.stderr);
  const { callbackId, jobIds } = JSON.parse(r.stdout);
  assert.equal(jobIds.length, 2);
  assert.equal(await stateOf(callbackId), "blocked");
  for (const id of jobIds) await lh.cancel(id);
  assert.equal(await stateOf(callbackId), "waiting", "released once every member ended, cancelled or not");
  const remote = await cli(["batches", "enqueue", file], undefined, viaServer());
  assert.equal(remote.code, 0, remote.stderr);
  assert.match(remote.stdout, /enqueued a batch of 2 jobs; its callback is job \d+/);
});

test("POST /v1/flows and /v1/batches: operators only; the graph's errors are 400 naming them, nothing written", async () => {
  const ok = await api("POST", "/v1/flows", {
    nodes: [
      { ref: "a", task: "http.a", queue: "http-held" },
      { ref: "b", task: "http.b", queue: "http-held", dependsOn: ["a"], onParentFailure: "run", runAt: "2031-02-03T04:05:06Z" },
    ],
  });
  assert.equal(ok.status, 201, ok.text);
  assert.deepEqual(Object.keys(ok.json.jobs), ["a", "b"]);
  assert.equal(await stateOf(ok.json.jobs.b), "blocked");
  const listed = await api("GET", "/v1/jobs?state=blocked&queue=http-held");
  assert.equal(listed.status, 200, listed.text);
  assert.deepEqual(
    listed.json.jobs.map((j: { id: string }) => j.id),
    [ok.json.jobs.b],
  );

  const batch = await api("POST", "/v1/batches", {
    jobs: [{ task: "http.m", queue: "http-held" }],
    onComplete: { task: "http.done", queue: "http-held" },
  });
  assert.equal(batch.status, 201, batch.text);
  assert.equal(batch.json.jobIds.length, 1);
  assert.equal(await stateOf(batch.json.callbackId), "blocked");

  const before = await checksum();
  const refused = async (path: string, body: unknown, status: number, message: RegExp, headers?: Record<string, string>) => {
    const r = await api("POST", path, body, headers);
    assert.equal(r.status, status, r.text);
    assert.match(r.json.error.message, message);
    assert.equal(await checksum(), before, `nothing written for ${message}`);
  };
  await refused("/v1/flows", { nodes: [{ ref: "a", task: "x" }] }, 403, /./, asWorker);
  await refused(
    "/v1/flows",
    {
      nodes: [
        { ref: "x", task: "t", dependsOn: ["z"] },
        { ref: "y", task: "t", dependsOn: ["x"] },
        { ref: "z", task: "t", dependsOn: ["y"] },
      ],
    },
    400,
    /cycle: "[xyz]" → "[xyz]" → "[xyz]" → "[xyz]"/,
  );
  await refused("/v1/flows", { nodes: [{ ref: "a", task: "x", dependsOn: ["a"] }] }, 400, /node "a" depends on itself/);
  await refused("/v1/flows", { nodes: [{ ref: "a", task: "x", dependsOn: ["q"] }] }, 400, /node "a": dependsOn names unknown ref "q"/);
  await lh.cancel(ok.json.jobs.a); // a is finished now: b was released (it runs on failure)
  const afterCancel = await checksum();
  const r = await api("POST", "/v1/flows", { nodes: [{ ref: "late", task: "x", dependsOn: [{ id: ok.json.jobs.a }] }] });
  assert.equal(r.status, 400);
  assert.match(r.json.error.message, new RegExp(`node "late": dependsOn names job ${ok.json.jobs.a}, which has already ended \\(cancelled\\)`));
  assert.equal(await checksum(), afterCancel);
  const again = await checksum();
  const big = { nodes: Array.from({ length: 25_001 }, (_, i) => ({ ref: `n${i}`, task: "x" })) };
  const tooBig = await api("POST", "/v1/flows", big);
  assert.equal(tooBig.status, 400, tooBig.text);
  assert.match(tooBig.json.error.message, /25,001 nodes, over the limit of 25,000 nodes/);
  const roots = Array.from({ length: 400 }, (_, i) => ({ ref: `r${i}`, task: "x" }));
  const wide = { nodes: [...roots, ...Array.from({ length: 251 }, (_, i) => ({ ref: `j${i}`, task: "x", dependsOn: roots.map((n) => n.ref) }))] };
  const tooWide = await api("POST", "/v1/flows", wide);
  assert.equal(tooWide.status, 400, tooWide.text);
  assert.match(tooWide.json.error.message, /100,400 edges .* over the limit of 100,000 edges/);
  const badDate = await api("POST", "/v1/flows", { nodes: [{ ref: "d", task: "x", runAt: "tomorrow" }] });
  assert.equal(badDate.status, 400);
  assert.match(badDate.json.error.message, /node "d": runAt must be an ISO 8601 date-time/);
  const badBatch = await api("POST", "/v1/batches", { jobs: [{ task: "ok", payload: { s: "\u0000" } }], onComplete: { task: "done" } });
  assert.equal(badBatch.status, 400);
  assert.match(badBatch.json.error.message, /job 0: payload.s contains a NUL character/);
  assert.equal(await checksum(), again);
});

test("a flow of 10,000 nodes fits one request, past the default body limit (~5.5 MB)", async () => {
  const nodes = [
    { ref: "root", task: "http.root", queue: "http-big" },
    ...Array.from({ length: 10_000 }, (_, i) => ({
      ref: `leaf-${i}`,
      task: "http.leaf",
      queue: "http-big",
      payload: { i, note: "x".repeat(500) },
      dependsOn: ["root"],
    })),
  ];
  const body = JSON.stringify({ nodes });
  assert.ok(body.length > 4 * 1024 * 1024, `the body is ${body.length} bytes, over the server's default limit`);
  const r = await api("POST", "/v1/flows", body);
  assert.equal(r.status, 201, r.text.slice(0, 300));
  assert.equal(Object.keys(r.json.jobs).length, 10_001);
  await lh.cancel(r.json.jobs.root);
  assert.equal((await lh.pool.query("SELECT count(*)::int AS n FROM jobs WHERE queue = 'http-big'")).rows[0].n, 0);
});

test("a remote worker's ctx.parents and ctx.dependencies go through the server, with the attempt's receipt", async (t) => {
  const { jobs } = await lh.enqueueFlow([
    { ref: "p1", task: "remote.parent", queue: "remote" },
    { ref: "p2", task: "remote.fail", queue: "remote" },
    { ref: "child", task: "remote.child", queue: "remote", dependsOn: ["p1", "p2"], onParentFailure: "run" },
  ]);
  let parents: ParentRecord[] = [];
  let counts: DependencyCounts | undefined;
  // The failing parent dies at once.
  await lh.pool.query("UPDATE jobs SET max_attempts = 1 WHERE id = $1", [jobs.p2]);
  const worker = new Worker({
    queues: ["remote"],
    handlers: {
      "remote.parent": () => {},
      "remote.fail": () => {
        throw new Error("remote failure on purpose");
      },
      "remote.child": async (_p: unknown, ctx: JobContext) => {
        parents = await ctx.parents();
        counts = await ctx.dependencies();
      },
    },
    leaseMs: 3_000,
    logger: silent,
    metricsRegistry: new Registry(),
    transport: new RemoteTransport({ serverUrl: base, token: WORKER_TOKEN, waitMs: 500, requestTimeoutMs: 5_000 }),
  });
  await worker.start();
  t.after(() => worker.stop());
  await eventually(async () => (await stateOf(jobs.child!)) === "succeeded", "the child ran remotely");
  assert.deepEqual(counts, { total: 2, succeeded: 1, dead: 1, cancelled: 0 });
  assert.deepEqual(
    parents.map((p) => [p.id, p.ref, p.state]),
    [
      [jobs.p1, "p1", "succeeded"],
      [jobs.p2, "p2", "dead"],
    ],
  );
  assert.match(parents[1]!.error!, /remote failure on purpose/);

  // Without the attempt's receipt the server refuses to read a job's parents.
  const refused = await api(
    "POST",
    "/v1/worker/parents",
    { workerId: "w-someone", job: { id: jobs.child, attempt: 1, receipt: "forged" } },
    asWorker,
  );
  assert.equal(refused.status, 409);
  assert.equal(refused.json.error.code, "invalid_receipt");
  const noReceipt = await api("POST", "/v1/worker/dependencies", { workerId: "w-someone", job: { id: jobs.child, attempt: 1 } }, asWorker);
  assert.equal(noReceipt.status, 409);
});
