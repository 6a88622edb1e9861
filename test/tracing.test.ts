/**
 * OpenTelemetry tracing (src/otel/tracing.ts) with the SDK's in-memory exporter, through real
 * workers on the real database: the trace context captured at enqueue (library, `{ db }`,
 * HTTP) reaches every attempt's span; failures, claims and reports get the spans and
 * attributes docs/tracing.md promises; and without tracing, `@opentelemetry/api` is never
 * imported.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { SpanKind, SpanStatusCode, context, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { Leasehold, type Worker } from "../packages/leasehold/src/index.js";
import { createServer } from "../packages/cli/src/server/app.js";
import { databaseUrl, eventually, freshLeasehold, silent, uniqueSchema, waitForEvent } from "./helpers/db.js";
import { TOKEN } from "./helpers/server.js";
import type { JobContext } from "../packages/leasehold/src/worker/context.js";

const exporter = new InMemorySpanExporter();
const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
trace.setGlobalTracerProvider(provider);
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
const tracer = trace.getTracer("test");

async function tracedLeasehold(t: Parameters<typeof freshLeasehold>[0]) {
  const lh = await freshLeasehold(t);
  const { tracingHooks } = await import("../packages/leasehold/src/otel/tracing.js");
  lh.use(tracingHooks());
  return lh;
}

/** Runs a worker until `n` attempts have ended. */
async function runUntil(worker: Worker, n: number, t: { after(fn: () => Promise<void>): void }): Promise<void> {
  let count = 0;
  const done = waitForEvent(worker, "job:end", () => ++count === n);
  await worker.start();
  t.after(() => worker.stop());
  await done;
}

const spansOf = (jobId: string, kind: "process" | "create") =>
  exporter
    .getFinishedSpans()
    .filter((s) => s.attributes["messaging.operation.type"] === kind && (kind === "create" || s.attributes["messaging.message.id"] === jobId));

test("an enqueue inside an active span: its attempt's span is in the same trace, a child of and linked to the enqueue's span", async (t) => {
  exporter.reset();
  const lh = await tracedLeasehold(t);
  const job = await tracer.startActiveSpan("request", async (request) => {
    try {
      return await lh.enqueue("send-email", { to: "ada" }, { queue: "mail" });
    } finally {
      request.end();
    }
  });
  const request = exporter.getFinishedSpans().find((s) => s.name === "request")!;
  const create = exporter.getFinishedSpans().find((s) => s.name === "create mail")!;
  assert.ok(create, "a create span for the enqueue");
  assert.equal(create.kind, SpanKind.PRODUCER);
  assert.equal(create.spanContext().traceId, request.spanContext().traceId);
  assert.equal(create.parentSpanContext?.spanId, request.spanContext().spanId);
  assert.deepEqual(
    {
      system: create.attributes["messaging.system"],
      destination: create.attributes["messaging.destination.name"],
      id: create.attributes["messaging.message.id"],
      task: create.attributes["leasehold.task"],
    },
    { system: "leasehold", destination: "mail", id: job.id, task: "send-email" },
  );

  let inHandler: string | undefined;
  const worker = lh.worker({
    queues: ["mail"],
    handlers: {
      "send-email": async () => {
        inHandler = trace.getActiveSpan()?.spanContext().spanId;
      },
    },
    watchdog: false,
    scheduler: false,
  });
  await runUntil(worker, 1, t);
  const processSpan = await eventually(async () => spansOf(job.id, "process")[0], "the process span ended");
  assert.equal(processSpan.kind, SpanKind.CONSUMER);
  assert.equal(processSpan.name, "process mail");
  assert.equal(processSpan.spanContext().traceId, request.spanContext().traceId, "same trace as the enqueue");
  assert.equal(processSpan.parentSpanContext?.spanId, create.spanContext().spanId);
  assert.deepEqual(
    processSpan.links.map((l) => l.context.spanId),
    [create.spanContext().spanId],
  );
  assert.equal(inHandler, processSpan.spanContext().spanId, "the handler runs inside its attempt's span");
  assert.deepEqual(
    {
      system: processSpan.attributes["messaging.system"],
      op: processSpan.attributes["messaging.operation.type"],
      destination: processSpan.attributes["messaging.destination.name"],
      task: processSpan.attributes["leasehold.task"],
      attempt: processSpan.attributes["leasehold.attempt"],
      outcome: processSpan.attributes["leasehold.outcome"],
    },
    { system: "leasehold", op: "process", destination: "mail", task: "send-email", attempt: 1, outcome: "succeeded" },
  );
  assert.equal(processSpan.status.code, SpanStatusCode.UNSET);
});

test("an enqueue in the caller's transaction ({ db }) carries its trace context too", async (t) => {
  exporter.reset();
  const lh = await tracedLeasehold(t);
  const client = await lh.pool.connect();
  let traceId = "";
  let jobId = "";
  try {
    await tracer.startActiveSpan("transaction", async (span) => {
      traceId = span.spanContext().traceId;
      await client.query("BEGIN");
      jobId = (await lh.enqueue("report", {}, { db: client })).id;
      await client.query("COMMIT");
      span.end();
    });
  } finally {
    client.release();
  }
  const [create] = spansOf(jobId, "create");
  assert.equal(create!.attributes["leasehold.in_transaction"], true);
  const worker = lh.worker({ handlers: { report: async () => {} }, watchdog: false, scheduler: false });
  await runUntil(worker, 1, t);
  const processSpan = await eventually(async () => spansOf(jobId, "process")[0], "the process span ended");
  assert.equal(processSpan.spanContext().traceId, traceId);
  assert.equal(processSpan.links[0]?.context.traceId, traceId);
});

test("an HTTP enqueue with a traceparent header: the attempt's span joins the caller's trace (the server itself not tracing)", async (t) => {
  exporter.reset();
  const schema = uniqueSchema();
  const serverSide = await Leasehold.connect({ databaseUrl: databaseUrl(), schema, logger: silent });
  t.after(async () => {
    await serverSide.pool.query(`DROP SCHEMA ${schema} CASCADE`).catch(() => {});
    await serverSide.close();
  });
  const app = createServer({ leasehold: serverSide, token: TOKEN, dashboard: "off" });
  t.after(() => app.close());
  const callerTrace = "4bf92f3577b34da6a3ce929d0e0e4736";
  const callerSpan = "00f067aa0ba902b7";
  const res = await app.inject({
    method: "POST",
    url: "/v1/jobs",
    headers: { authorization: `Bearer ${TOKEN}`, traceparent: `00-${callerTrace}-${callerSpan}-01`, tracestate: "vendor=x" },
    payload: { task: "thumb", payload: {} },
  });
  assert.equal(res.statusCode, 201, res.body);
  const jobId = res.json().id as string;
  const { job } = await serverSide.getJob(jobId);
  assert.equal(job.id, jobId);
  const { rows } = await serverSide.pool.query("SELECT headers FROM jobs WHERE id = $1", [jobId]);
  assert.deepEqual(rows[0].headers, { traceparent: `00-${callerTrace}-${callerSpan}-01`, tracestate: "vendor=x" });

  // The worker traces: its client on the same schema, with the tracing hooks.
  const workerSide = await Leasehold.connect({ databaseUrl: databaseUrl(), schema, logger: silent, tracing: true });
  t.after(() => workerSide.close());
  const worker = workerSide.worker({ handlers: { thumb: async () => {} }, watchdog: false, scheduler: false });
  await runUntil(worker, 1, t);
  const processSpan = await eventually(async () => spansOf(jobId, "process")[0], "the process span ended");
  assert.equal(processSpan.spanContext().traceId, callerTrace);
  assert.equal(processSpan.parentSpanContext?.spanId, callerSpan);
  assert.equal(processSpan.links[0]?.context.spanId, callerSpan);
  assert.equal(processSpan.links[0]?.context.traceState?.get("vendor"), "x");
});

test("a failing attempt's span has an error status, the exception and the outcome", async (t) => {
  exporter.reset();
  const lh = await tracedLeasehold(t);
  const retried = await lh.enqueue("flaky", {}, { maxAttempts: 2 });
  const worker = lh.worker({
    handlers: {
      flaky: async () => {
        throw new Error("disk full");
      },
    },
    backoff: { baseMs: 0, factor: 1, maxMs: 0, jitter: 0 },
    watchdog: false,
    scheduler: false,
  });
  await runUntil(worker, 2, t);
  const spans = await eventually(async () => {
    const s = spansOf(retried.id, "process");
    return s.length === 2 ? s : undefined;
  }, "both attempts' spans ended");
  const [first, second] = spans.sort((a, b) => Number(a.attributes["leasehold.attempt"]) - Number(b.attributes["leasehold.attempt"]));
  for (const span of [first!, second!]) {
    assert.equal(span.status.code, SpanStatusCode.ERROR);
    assert.match(span.status.message ?? "", /disk full/);
    assert.ok(span.events.some((e) => e.name === "exception" && /disk full/.test(String(e.attributes?.["exception.message"]))));
  }
  assert.equal(first!.attributes["leasehold.outcome"], "waiting", "the first attempt is retried");
  assert.equal(second!.attributes["leasehold.outcome"], "dead");
  // Both attempts belong to the enqueue's trace.
  const [create] = spansOf(retried.id, "create");
  assert.equal(first!.spanContext().traceId, create!.spanContext().traceId);
  assert.equal(second!.spanContext().traceId, create!.spanContext().traceId);
});

test("a span per durable step: each run a child of its attempt's span, with its kind; replays marked; a failure an error; a sleep no error", async (t) => {
  exporter.reset();
  const lh = await tracedLeasehold(t);
  let failed = false;
  const worker = lh.worker({
    handlers: {
      durable: async (_: unknown, ctx: JobContext) => {
        await ctx.step("fetch", () => "page");
        await ctx.step("parse", () => {
          if (!failed) {
            failed = true;
            throw new Error("bad markup");
          }
          return "parsed";
        });
        await ctx.sleep("pause", 1);
        return "done";
      },
    },
    backoff: { baseMs: 0, factor: 1, maxMs: 0, jitter: 0 },
    watchdog: { intervalMs: 200, livenessIntervalMs: 50 },
    scheduler: false,
  });
  const job = await lh.enqueue("durable", {});
  // Attempt 1: fetch, parse fails. 2: fetch replayed, parse, the pause suspends. 3: all replayed.
  await worker.start();
  t.after(() => worker.stop(0));
  await eventually(async () => (await lh.getJob(job.id)).job.state === "succeeded", "the job succeeded");
  const steps = await eventually(async () => {
    const s = exporter.getFinishedSpans().filter((x) => x.name.startsWith("step ") && x.attributes["messaging.message.id"] === job.id);
    return s.length === 8 ? s : undefined;
  }, "eight step spans");
  const byAttempt = (n: number) => steps.filter((s) => s.attributes["leasehold.attempt"] === n);
  const names = (n: number) =>
    byAttempt(n)
      .map((s) => `${s.name} ${s.attributes["leasehold.step.replayed"] ? "replayed" : "ran"}`)
      .sort();
  assert.deepEqual(names(1), ["step fetch ran", "step parse ran"]);
  assert.deepEqual(names(2), ["step fetch replayed", "step parse ran", "step pause ran"]);
  assert.deepEqual(names(3), ["step fetch replayed", "step parse replayed", "step pause replayed"]);
  const failedParse = byAttempt(1).find((s) => s.name === "step parse")!;
  assert.equal(failedParse.status.code, SpanStatusCode.ERROR);
  assert.match(failedParse.status.message ?? "", /bad markup/);
  const pause = byAttempt(2).find((s) => s.name === "step pause")!;
  assert.equal(pause.attributes["leasehold.step.kind"], "sleep");
  assert.equal(pause.attributes["leasehold.step.suspended"], true);
  assert.notEqual(pause.status.code, SpanStatusCode.ERROR, "a suspension is no failure");
  // Each step's span is a child of its attempt's process span.
  const processes = spansOf(job.id, "process");
  for (const s of steps) {
    const parent = processes.find((p) => p.attributes["leasehold.attempt"] === s.attributes["leasehold.attempt"])!;
    assert.equal(s.parentSpanContext?.spanId, parent.spanContext().spanId, `${s.name} of attempt ${s.attributes["leasehold.attempt"]}`);
    assert.equal(s.spanContext().traceId, parent.spanContext().traceId);
  }
});

test("claim batches get receive spans and report batches settle spans, with their sizes", async (t) => {
  exporter.reset();
  const lh = await tracedLeasehold(t);
  await lh.enqueueMany(Array.from({ length: 5 }, () => ({ task: "noop" })));
  const [create] = spansOf("", "create");
  assert.equal(create!.attributes["messaging.batch.message_count"], 5);
  const worker = lh.worker({ handlers: { noop: async () => {} }, watchdog: false, scheduler: false });
  await runUntil(worker, 5, t);
  const spans = await eventually(async () => {
    const settled = exporter.getFinishedSpans().filter((s) => s.attributes["messaging.operation.type"] === "settle");
    return settled.reduce((n, s) => n + Number(s.attributes["messaging.batch.message_count"]), 0) === 5 ? exporter.getFinishedSpans() : undefined;
  }, "settle spans for all five");
  const receive = spans.filter((s) => s.attributes["messaging.operation.type"] === "receive");
  assert.ok(receive.length >= 1);
  assert.equal(
    receive.reduce((n, s) => n + Number(s.attributes["messaging.batch.message_count"]), 0),
    5,
    "the claims' spans count every job claimed (an empty claim is no span)",
  );
  assert.ok(receive.every((s) => s.name === "claim default" && s.kind === SpanKind.CLIENT && s.attributes["messaging.system"] === "leasehold"));
  const settle = spans.filter((s) => s.attributes["messaging.operation.type"] === "settle");
  assert.ok(
    settle.every(
      (s) =>
        s.name === "complete" &&
        s.kind === SpanKind.CLIENT &&
        s.attributes["leasehold.settle.applied"] === s.attributes["messaging.batch.message_count"],
    ),
  );
});

/** A module-resolution hook that makes `@opentelemetry/*` unresolvable, as in an app that does not install it. */
function hideOpenTelemetry(): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-no-otel-"));
  fs.writeFileSync(
    path.join(dir, "hooks.mjs"),
    `import { appendFileSync } from "node:fs";
export async function resolve(specifier, ctx, next) {
  if (specifier.startsWith("@opentelemetry/")) {
    appendFileSync(${JSON.stringify(path.join(dir, "imported.txt"))}, specifier + "\\n");
    throw Object.assign(new Error("Cannot find package '" + specifier + "'"), { code: "ERR_MODULE_NOT_FOUND" });
  }
  return next(specifier, ctx);
}\n`,
  );
  fs.writeFileSync(
    path.join(dir, "register.mjs"),
    `import { register } from "node:module";\nregister(${JSON.stringify(path.join(dir, "hooks.mjs"))}, import.meta.url);\n`,
  );
  return path.join(dir, "register.mjs");
}

test("without tracing, @opentelemetry/api is never imported: enqueue and a worker run where it cannot be resolved; tracing: true says what to install", async (t) => {
  const register = hideOpenTelemetry();
  t.after(() => fs.rmSync(path.dirname(register), { recursive: true, force: true }));
  const dist = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "packages", "leasehold", "dist", "index.js");
  const schema = uniqueSchema();
  t.after(async () => {
    const lh = await Leasehold.connect({ databaseUrl: databaseUrl(), schema, logger: silent, migrate: false });
    await lh.pool.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
    await lh.close();
  });
  const script = `
    const { Leasehold } = await import(${JSON.stringify(dist)});
    const tracing = process.env.TRACING === "1";
    let lh;
    try {
      lh = await Leasehold.connect({ schema: ${JSON.stringify(schema)}, tracing, logger: (await import("pino")).default({ level: "silent" }) });
    } catch (err) {
      console.log("CONNECT FAILED: " + err.name + ": " + err.message);
      process.exit(0);
    }
    await lh.enqueue("t", { n: 1 }, { headers: { tenant: "a" } });
    const worker = lh.worker({ handlers: { t: async () => {} }, hooks: { afterAttempt: (job, end) => console.log("ENDED " + end.outcome.state) }, watchdog: false, scheduler: false });
    const ended = new Promise((r) => worker.once("job:end", r));
    await worker.start();
    await ended;
    await worker.stop();
    await lh.pool.query("DROP SCHEMA ${schema} CASCADE");
    await lh.close();
    console.log("DONE");
  `;
  const run = (tracing: boolean) =>
    spawnSync(process.execPath, ["--import", register, "--input-type=module", "-e", script], {
      env: { ...process.env, DATABASE_URL: databaseUrl(), TRACING: tracing ? "1" : "0" },
      encoding: "utf8",
      timeout: 60_000,
    });
  const imported = () => fs.readFileSync(path.join(path.dirname(register), "imported.txt"), { encoding: "utf8", flag: "a+" });
  const off = run(false);
  assert.equal(off.status, 0, off.stderr);
  assert.match(off.stdout, /ENDED succeeded\nDONE/);
  assert.equal(imported(), "", "nothing asked for @opentelemetry/*");
  // The hook works: tracing on tries the import, and the error names the package to install.
  const on = run(true);
  assert.match(imported(), /^@opentelemetry\/api$/m);
  assert.match(on.stdout, /CONNECT FAILED: ConfigError: tracing needs the @opentelemetry\/api package.*npm install @opentelemetry\/api/);
});
