/**
 * Callback tokens and re-runs from a step (docs/durable-callbacks.md), against real PostgreSQL,
 * `leasehold serve`'s routes over real HTTP, and the built CLI: a callback's token completes its
 * wait once (a second use, a wrong token and a late one are refused with a body that says why),
 * a replay hands out the same token, a timeout gives null; a finished job re-runs from its
 * middle step (the steps before keep their records and do not run, it and those after run
 * again), and its re-runs show in `GET /v1/jobs/:id` and `jobs show`.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { Writable } from "node:stream";
import type { FastifyInstance } from "fastify";
import pino from "pino";
import { Registry } from "prom-client";
import { Leasehold } from "../packages/leasehold/src/client.js";
import { createServer } from "../packages/cli/src/server/app.js";
import type { JobContext } from "../packages/leasehold/src/worker/context.js";
import { CallbackRefusedError } from "../packages/leasehold/src/errors.js";
import { databaseUrl, eventually, freshLeasehold, settled } from "./helpers/db.js";
import { runCli } from "./helpers/cli.js";
import { api, TOKEN } from "./helpers/server.js";

type Lh = Awaited<ReturnType<typeof freshLeasehold>>;

let lh: Lh;
let app: FastifyInstance;
let base: string;
const anonymous = {};

before(async () => {
  lh = await freshLeasehold();
  app = createServer({ leasehold: lh, token: TOKEN });
  await app.listen({ host: "127.0.0.1", port: 0 });
  base = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
});

after(async () => {
  await app.close();
  await lh.dispose();
});

const inState = (id: string, state: string, timeoutMs?: number) => settled(lh, id, state, timeoutMs);

async function steps(id: string) {
  const { rows } = await lh.pool.query<{ seq: number; name: string; kind: string; attempt: number; recorded_at: Date }>(
    "SELECT seq, name, kind, attempt, recorded_at FROM job_steps WHERE job_id = $1 ORDER BY seq",
    [id],
  );
  return rows;
}

test("approval: the callback's URL completes its wait once over HTTP without an API token; a replay hands out the same token", async (t) => {
  const tokens: string[] = [];
  const asked: (string | null)[] = [];
  const worker = lh.worker({
    queues: ["approvals"],
    callbackBaseUrl: base,
    handlers: {
      publish: async (p: { post: string }, ctx: JobContext) => {
        const cb = await ctx.callback<{ approved: boolean; by: string }>("approval", { timeout: "1h" });
        tokens.push(cb.token);
        await ctx.step("ask", () => void asked.push(cb.url));
        const answer = await cb.wait();
        return { post: p.post, answer };
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const { id } = await lh.enqueue("publish", { post: "p1" }, { queue: "approvals" });
  await inState(id, "suspended");
  assert.equal(asked.length, 1);
  const url = asked[0]!;
  assert.ok(url.startsWith(`${base}/v1/callbacks/`), url);
  const token = url.slice(url.lastIndexOf("/") + 1);
  assert.match(token, /^[A-Za-z0-9_-]{43}$/);
  // The token is the credential: the wait, the job's row and the events name only its hash.
  const { rows } = await lh.pool.query(
    "SELECT (SELECT wait::text FROM jobs WHERE id = $1) AS wait, (SELECT string_agg(name, ',') FROM events) AS events",
    [id],
  );
  assert.ok(!String(rows[0].wait).includes(token) && !String(rows[0].events ?? "").includes(token));
  assert.match(String(rows[0].wait), /callback:[0-9a-f]{64}/);

  const wrong = await api(base, "POST", `/v1/callbacks/${"A".repeat(43)}`, { approved: true }, anonymous);
  assert.equal(wrong.status, 404);
  assert.equal(wrong.json.error.code, "callback_not_found");
  const malformed = await api(base, "POST", "/v1/callbacks/not-a-token", { approved: true }, anonymous);
  assert.equal(malformed.status, 400);
  assert.match(malformed.json.error.message, /token/);

  // Data over the limit is refused whole, and the token stays good for one completion.
  const tooLarge = await api(base, "POST", `/v1/callbacks/${token}`, { note: "x".repeat(300 * 1024) }, anonymous);
  assert.equal(tooLarge.status, 413);
  assert.equal((await lh.getJob(id)).job.state, "suspended");
  const done = await api(base, "POST", `/v1/callbacks/${token}`, { approved: true, by: "ana" }, anonymous);
  assert.equal(done.status, 200, done.text);
  assert.deepEqual(done.json, { result: "completed" });
  const { job } = await inState(id, "succeeded");
  assert.deepEqual(job.result, { post: "p1", answer: { approved: true, by: "ana" } });
  assert.deepEqual(tokens, [token, token], "the resumed attempt replayed the same token");
  assert.equal(asked.length, 1, "the step that handed it out ran once");

  const again = await api(base, "POST", `/v1/callbacks/${token}`, { approved: false }, anonymous);
  assert.equal(again.status, 410);
  assert.equal(again.json.error.code, "callback_gone");
  assert.match(again.json.error.message, /completed already/);
  const { rows: sent } = await lh.pool.query("SELECT count(*)::int AS n FROM events WHERE name LIKE 'callback:%'");
  assert.equal(sent[0].n, 1, "the refused second completion stored nothing");
});

test("a callback's wait times out with null, and a late completion is refused; two completions at once: one wins", async (t) => {
  const seen: string[] = [];
  const worker = lh.worker({
    queues: ["late"],
    handlers: {
      late: async (_: unknown, ctx: JobContext) => {
        const cb = await ctx.callback("reply", { timeout: "1s" });
        assert.equal(cb.url, null, "a database worker without callbackBaseUrl hands out the token only");
        await ctx.step("ask", () => void seen.push(cb.token));
        return { answer: await cb.wait() };
      },
      twice: async (_: unknown, ctx: JobContext) => {
        const cb = await ctx.callback("reply");
        await ctx.step("ask", () => void seen.push(cb.token));
        return { answer: await cb.wait() };
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const late = await lh.enqueue("late", {}, { queue: "late" });
  const { job } = await inState(late.id, "succeeded");
  assert.deepEqual(job.result, { answer: null });
  await assert.rejects(lh.completeCallback(seen[0]!, { ok: true }), (err: unknown) => {
    assert.ok(err instanceof CallbackRefusedError);
    assert.equal(err.code, "callback_gone");
    assert.match(err.message, /timed out/);
    return true;
  });

  const twice = await lh.enqueue("twice", {}, { queue: "late" });
  await inState(twice.id, "suspended");
  const token = seen[1]!;
  const outcomes = await Promise.allSettled([lh.completeCallback(token, { n: 1 }), lh.completeCallback(token, { n: 2 })]);
  assert.equal(outcomes.filter((o) => o.status === "fulfilled").length, 1);
  const refused = outcomes.find((o) => o.status === "rejected") as PromiseRejectedResult;
  assert.equal((refused.reason as CallbackRefusedError).reason, "used");
  const done = await inState(twice.id, "succeeded");
  assert.ok([1, 2].includes((done.job.result as { answer: { n: number } }).answer.n));

  // The data a wait received is the caller's: a "token" in it is no token handed out.
  const forged = "F".repeat(43);
  const third = await lh.enqueue("twice", {}, { queue: "late" });
  await inState(third.id, "suspended");
  await lh.completeCallback(seen[2]!, { token: forged });
  await inState(third.id, "succeeded");
  await assert.rejects(lh.completeCallback(forged, {}), (err: unknown) => (err as CallbackRefusedError).reason === "unknown");
});

/** A 3-step job that has succeeded once; `runs` says which steps ran, in order. */
async function threeStepJob(t: { after(fn: () => Promise<void>): void }, queue: string) {
  const runs: string[] = [];
  const worker = lh.worker({
    queues: [queue],
    handlers: {
      pipeline: async (_: unknown, ctx: JobContext) => {
        const a = await ctx.step("extract", () => (runs.push("extract"), 1));
        const b = await ctx.step("transform", () => (runs.push("transform"), a + 1));
        return ctx.step("load", () => (runs.push("load"), b + 1));
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const { id } = await lh.enqueue("pipeline", {}, { queue });
  await inState(id, "succeeded");
  assert.deepEqual(runs, ["extract", "transform", "load"]);
  return { id, runs };
}

test("re-run from the middle step over HTTP: the step before keeps its record and does not run; the step and the one after run again; the audit shows it", async (t) => {
  const { id, runs } = await threeStepJob(t, "rerun-http");
  const before = await steps(id);

  const noToken = await api(base, "POST", `/v1/jobs/${id}/rerun`, { fromStep: "transform" }, anonymous);
  assert.equal(noToken.status, 401);
  const unknownStep = await api(base, "POST", `/v1/jobs/${id}/rerun`, { fromStep: "trnasform" });
  assert.equal(unknownStep.status, 400);
  assert.match(unknownStep.json.error.message, /no step "trnasform".*"extract", "load", "transform"/);
  const noStep = await api(base, "POST", `/v1/jobs/${id}/rerun`, {});
  assert.equal(noStep.status, 400);
  assert.match(noStep.json.error.message, /fromStep/);
  assert.equal((await api(base, "POST", "/v1/jobs/999999999/rerun", { fromStep: "transform" })).status, 404);

  const res = await api(base, "POST", `/v1/jobs/${id}/rerun`, { fromStep: "transform" });
  assert.equal(res.status, 200, res.text);
  assert.equal(res.json.fromSeq, 1);
  assert.equal(res.json.stepsDropped, 2);
  assert.equal(res.json.previousState, "succeeded");
  const { job, attempts, reruns } = await inState(id, "succeeded");
  assert.equal(job.result, 3);
  assert.deepEqual(runs, ["extract", "transform", "load", "transform", "load"]);
  const afterRerun = await steps(id);
  assert.deepEqual(afterRerun[0], before[0], "extract's record is untouched");
  assert.deepEqual(
    afterRerun.map((s) => [s.name, s.attempt]),
    [
      ["extract", 1],
      ["transform", 2],
      ["load", 2],
    ],
  );
  assert.equal(attempts.length, 2);
  assert.equal(job.spentAttempts, 0);

  const shown = await api(base, "GET", `/v1/jobs/${id}`);
  assert.equal(shown.status, 200);
  assert.equal(shown.json.reruns.length, 1);
  const audit = shown.json.reruns[0];
  assert.equal(audit.fromStep, "transform");
  assert.equal(audit.requestedBy, "operator token (HTTP)");
  assert.deepEqual(
    audit.stepsDropped.map((s: { name: string; attempt: number }) => [s.name, s.attempt]),
    [
      ["transform", 1],
      ["load", 1],
    ],
  );
  assert.equal(reruns.length, 1);

  // A job that has not finished cannot be re-run: 409, nothing changed.
  const waiting = await lh.enqueue("pipeline", {}, { queue: "nobody-claims-this" });
  const busy = await api(base, "POST", `/v1/jobs/${waiting.id}/rerun`, { fromStep: "transform" });
  assert.equal(busy.status, 409);
  assert.match(busy.json.error.message, /has not finished/);
});

test("the CLI completes a callback and re-runs a job from a step; jobs show lists the re-run", async (t) => {
  const { id, runs } = await threeStepJob(t, "rerun-cli");
  const cli = (...args: string[]) => runCli(args, { schema: lh.schema });

  const rerun = await cli("jobs", "rerun", id, "--from-step", "load");
  assert.equal(rerun.code, 0, rerun.stderr);
  assert.match(rerun.stdout, /waiting again from step "load" \(place 2\); 1 step record\(s\) dropped/);
  await eventually(async () => runs.length === 4 || undefined, "the re-run ran load");
  assert.deepEqual(runs, ["extract", "transform", "load", "load"]);
  await inState(id, "succeeded");
  const show = await cli("jobs", "show", id);
  assert.equal(show.code, 0, show.stderr);
  assert.match(show.stdout, /re-runs:[\s\S]*"load" \(place 2\)\s+succeeded\s+cli \(/);
  const stillRunning = await cli("jobs", "rerun", "999999999", "--from-step", "load");
  assert.equal(stillRunning.code, 3, "no such job: exit 3");

  const tokens: string[] = [];
  const worker = lh.worker({
    queues: ["cli-callback"],
    handlers: {
      ask: async (_: unknown, ctx: JobContext) => {
        const cb = await ctx.callback("answer");
        await ctx.step("send", () => void tokens.push(cb.token));
        return cb.wait();
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const asked = await lh.enqueue("ask", {}, { queue: "cli-callback" });
  await inState(asked.id, "suspended");
  const done = await cli("callbacks", "complete", tokens[0]!, '{"answer":42}');
  assert.equal(done.code, 0, done.stderr);
  const { job } = await inState(asked.id, "succeeded");
  assert.deepEqual(job.result, { answer: 42 });
  const again = await cli("callbacks", "complete", tokens[0]!, "{}");
  assert.equal(again.code, 4, "a used token: exit 4 (invalid state)");
  assert.match(again.stderr, /completed already/);
});

test("a server that logs its requests names a callback token by its first characters only", async (t) => {
  const lines: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _encoding, done) {
      lines.push(chunk.toString());
      done();
    },
  });
  const logged = await Leasehold.connect({
    databaseUrl: databaseUrl(),
    schema: lh.schema,
    logger: pino({ level: "info" }, sink),
    metricsRegistry: new Registry(),
  });
  t.after(() => logged.close());
  const server = createServer({ leasehold: logged, token: TOKEN, logRequests: true });
  await server.listen({ host: "127.0.0.1", port: 0 });
  t.after(() => server.close());
  const at = `http://127.0.0.1:${(server.server.address() as { port: number }).port}`;
  const token = "Zq9".repeat(14) + "x";
  const res = await api(at, "POST", `/v1/callbacks/${token}`, { approved: true }, anonymous);
  assert.equal(res.status, 404);
  await eventually(async () => lines.some((l) => l.includes("/v1/callbacks/")) || undefined, "the request is logged");
  const all = lines.join("");
  assert.ok(all.includes(`/v1/callbacks/${token.slice(0, 6)}`), all);
  assert.ok(!all.includes(token), "the full token is never logged");
});

test("through a server (--server, no database): the CLI re-runs a job from a step, shows it, and completes a callback", async (t) => {
  const { id, runs } = await threeStepJob(t, "rerun-remote");
  const env = { DATABASE_URL: "postgres://nobody@127.0.0.1:1/none", LEASEHOLD_TOKEN: TOKEN };
  const cli = (...args: string[]) => runCli(["--server", base, ...args], { schema: lh.schema, env });

  const unknownStep = await cli("jobs", "rerun", id, "--from-step", "nope");
  assert.equal(unknownStep.code, 2);
  assert.match(unknownStep.stderr, /recorded no step "nope"/);
  const rerun = await cli("jobs", "rerun", id, "--from-step", "transform", "--json");
  assert.equal(rerun.code, 0, rerun.stderr);
  assert.equal(JSON.parse(rerun.stdout).stepsDropped, 2);
  await eventually(async () => (await lh.getJob(id)).job.state === "succeeded" && runs.length === 5 && (true as const), "the re-run succeeds");
  assert.deepEqual(runs, ["extract", "transform", "load", "transform", "load"]);
  const show = await cli("jobs", "show", id, "--json");
  assert.equal(show.code, 0, show.stderr);
  assert.equal(JSON.parse(show.stdout).reruns[0].fromStep, "transform");

  const tokens: string[] = [];
  const worker = lh.worker({
    queues: ["remote-callback"],
    handlers: {
      ask: async (_: unknown, ctx: JobContext) => {
        const cb = await ctx.callback("answer");
        await ctx.step("send", () => void tokens.push(cb.token));
        return cb.wait();
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const asked = await lh.enqueue("ask", {}, { queue: "remote-callback" });
  await inState(asked.id, "suspended");
  const done = await cli("callbacks", "complete", tokens[0]!, '["yes"]');
  assert.equal(done.code, 0, done.stderr);
  assert.deepEqual((await inState(asked.id, "succeeded")).job.result, ["yes"]);
  const again = await cli("callbacks", "complete", tokens[0]!);
  assert.equal(again.code, 4, again.stderr);
  const unknown = await cli("callbacks", "complete", "B".repeat(43));
  assert.equal(unknown.code, 3, unknown.stderr);
});
