/**
 * Read-only credentials over real HTTP to `leasehold serve`: the viewer token (and the operator
 * token on a `--dashboard read-only` server) can change nothing, whatever it sends, and is shown
 * no payloads, results, checkpoints, progress or error messages unless the server was started
 * with --show-payloads.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { runCli, startCli } from "./helpers/cli.js";
import { eventually, freshLeasehold } from "./helpers/db.js";
import { api, startServe, TOKEN } from "./helpers/server.js";

const VIEWER = "viewer-token-0123456789abcdef";
/** Personal data that only the operator may see, in a payload, a result, a checkpoint and an error. */
const SECRET = "ada@example.com";

let lh: Awaited<ReturnType<typeof freshLeasehold>>;
let deadId: string;
let doneId: string;

const as = (token: string) => ({ authorization: `Bearer ${token}` });

before(async () => {
  lh = await freshLeasehold();
  deadId = (await lh.enqueue("viewer.mail", { to: SECRET }, { queue: "viewer-q", maxAttempts: 1 })).id;
  doneId = (await lh.enqueue("viewer.lookup", { who: SECRET }, { queue: "viewer-q" })).id;
  const worker = lh.worker({
    queues: ["viewer-q"],
    pollIntervalMs: 50,
    handlers: {
      "viewer.mail": async (_p: unknown, ctx) => {
        ctx.checkpoint({ tried: SECRET });
        throw new Error(`could not mail ${SECRET}`);
      },
      "viewer.lookup": async () => ({ found: SECRET }),
    },
  });
  await worker.start();
  await eventually(
    async () => (await lh.getJob(deadId)).job.state === "dead" && (await lh.getJob(doneId)).job.state === "succeeded",
    "one job dead, one succeeded",
  );
  await worker.stop(1_000);
});

after(async () => {
  await lh.dispose();
});

/** Every write route the dashboard (or anyone) could call, as [method, path, body]. */
function writes(): [string, string, unknown][] {
  return [
    ["POST", "/v1/jobs", { task: "viewer.mail", queue: "viewer-q", payload: {} }],
    ["POST", "/v1/jobs/batch", { jobs: [{ task: "viewer.mail", queue: "viewer-q" }] }],
    ["POST", `/v1/jobs/${deadId}/retry`, {}],
    ["POST", `/v1/jobs/${doneId}/cancel`, {}],
    ["POST", "/v1/bulk/retry", { state: "dead", confirmed: 100 }],
    ["POST", "/v1/queues/viewer-q/pause", {}],
    ["PATCH", "/v1/queues/viewer-q/limits?create=true", { concurrency: 1 }],
    ["DELETE", `/v1/jobs/${deadId}`, undefined],
    ["PUT", "/v1/schedules/nightly", { cron: "0 3 * * *", task: "viewer.mail" }],
    ["POST", "/v1/flows", { nodes: [{ ref: "a", task: "viewer.mail" }] }],
  ];
}

/** The jobs as the database has them: nothing a refused write could have changed slips by. */
async function snapshot(): Promise<unknown> {
  const jobs = await lh.pool.query("SELECT id, state, attempt, run_at FROM jobs ORDER BY id");
  const queues = await lh.pool.query("SELECT name, paused FROM queues ORDER BY name");
  return { jobs: jobs.rows, queues: queues.rows };
}

async function assertCannotWrite(base: string, token: string): Promise<void> {
  const before = await snapshot();
  for (const [method, path, body] of writes()) {
    const r = await api(base, method, path, body, as(token));
    assert.equal(r.status, 403, `${method} ${path}: ${r.status} ${r.text}`);
    assert.equal(r.json.error.code, "read_only", `${method} ${path}: ${r.text}`);
  }
  assert.deepEqual(await snapshot(), before, "a refused write changed something");
}

async function readAll(base: string, token: string): Promise<string> {
  const texts: string[] = [];
  for (const path of [
    `/v1/jobs/${deadId}`,
    `/v1/jobs/${doneId}`,
    `/v1/jobs/${doneId}/wait?timeoutMs=1`,
    "/v1/jobs?payload=true",
    "/v1/jobs?state=dead&payload=true",
    "/v1/recoveries",
  ]) {
    const r = await api(base, "GET", path, undefined, as(token));
    assert.equal(r.status, 200, `GET ${path}: ${r.text}`);
    texts.push(r.text);
  }
  return texts.join("\n");
}

test("the viewer token reads every job but never its payload, result, checkpoint or error, and can change nothing; the operator token is unchanged", async () => {
  const serve = await startServe(lh.schema, ["--viewer-token", VIEWER, "--no-watchdog"]);
  const base = serve.match[1]!;
  try {
    const seen = await readAll(base, VIEWER);
    assert.ok(!seen.includes(SECRET), `the viewer was shown ${SECRET}: ${seen}`);
    const dead = (await api(base, "GET", `/v1/jobs/${deadId}`, undefined, as(VIEWER))).json;
    assert.deepEqual(
      [dead.job.state, dead.job.payload, dead.job.checkpoint, dead.job.lastError, dead.attempts.map((a: { error: unknown }) => a.error)],
      ["dead", "[hidden]", "[hidden]", "[hidden]", ["[hidden]"]],
    );
    const done = (await api(base, "GET", `/v1/jobs/${doneId}`, undefined, as(VIEWER))).json;
    assert.deepEqual([done.job.state, done.job.result], ["succeeded", "[hidden]"]);

    await assertCannotWrite(base, VIEWER);
    // Nor may it act as a remote worker (a claim would take a job and show its payload).
    for (const [method, path] of [
      ["POST", "/v1/worker/claim"],
      ["GET", "/v1/worker/queues"],
    ] as const) {
      const r = await api(
        base,
        method,
        path,
        method === "POST" ? { workerId: "w", queues: ["viewer-q"], tasks: ["viewer.mail"], limit: 1, leaseMs: 5_000 } : undefined,
        as(VIEWER),
      );
      assert.equal(r.status, 403, `${method} ${path}: ${r.text}`);
    }

    // The operator token on a server with the dashboard on sees and changes everything as before.
    assert.ok((await readAll(base, TOKEN)).includes(SECRET));
    const paused = await api(base, "POST", "/v1/queues/viewer-q/pause", {}, as(TOKEN));
    assert.equal(paused.status, 200, paused.text);
    assert.equal((await api(base, "POST", "/v1/queues/viewer-q/resume", {}, as(TOKEN))).status, 200);
  } finally {
    await serve.stop("SIGTERM");
  }
});

test("--dashboard read-only: the operator token is read-only and shown no payloads too; --show-payloads shows them, and still nothing can be changed", async () => {
  const readOnly = await startServe(lh.schema, ["--dashboard", "read-only", "--viewer-token", VIEWER, "--no-watchdog"]);
  try {
    const base = readOnly.match[1]!;
    for (const token of [TOKEN, VIEWER]) {
      const seen = await readAll(base, token);
      assert.ok(!seen.includes(SECRET), `a read-only caller was shown ${SECRET}`);
      await assertCannotWrite(base, token);
    }
  } finally {
    await readOnly.stop("SIGTERM");
  }
  const shown = await startServe(lh.schema, ["--dashboard", "read-only", "--viewer-token", VIEWER, "--show-payloads", "--no-watchdog"]);
  try {
    const base = shown.match[1]!;
    const dead = (await api(base, "GET", `/v1/jobs/${deadId}`, undefined, as(VIEWER))).json;
    assert.deepEqual(dead.job.payload, { to: SECRET });
    assert.ok(dead.job.lastError.startsWith(`Error: could not mail ${SECRET}`), dead.job.lastError);
    await assertCannotWrite(base, VIEWER);
  } finally {
    await shown.stop("SIGTERM");
  }
});

test("leasehold dev --dashboard read-only: the dashboard link carries a viewer token, which may only read, not the operator token", async () => {
  const cwd = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-viewer-dev-"));
  const dev = await startCli(["dev", "--port", "0", "--no-examples", "--dashboard", "read-only"], {
    schema: lh.schema,
    cwd,
    ready: /Dashboard\s+(http:\/\/[^\s/]+)\/#token=(\S+)[\s\S]*API\s+\S+\s+token: (\S+)/,
  });
  try {
    const [, base, linkToken, operatorToken] = dev.match as unknown as [string, string, string, string];
    const viewer = decodeURIComponent(linkToken);
    assert.notEqual(viewer, operatorToken, "the dashboard link hands out the operator token");
    assert.equal((await api(base, "GET", "/v1/stats", undefined, as(viewer))).status, 200);
    await assertCannotWrite(base, viewer);
    const job = (await api(base, "GET", `/v1/jobs/${deadId}`, undefined, as(viewer))).json;
    assert.equal(job.job.payload, "[hidden]");
  } finally {
    await dev.stop("SIGINT");
    fs.rmSync(cwd, { recursive: true, force: true });
  }
});

test("serve refuses a viewer token equal to the operator token", async () => {
  const r = await runCli(["serve", "--port", "0", "--viewer-token", TOKEN], { schema: lh.schema, env: { LEASEHOLD_TOKEN: TOKEN } });
  assert.equal(r.code, 2, r.stderr);
  assert.match(r.stderr, /viewer token must differ/);
});
