/**
 * Durable steps for remote workers (docs/durable.md): the routes behind a remote worker's
 * ctx.step, ctx.sleep and ctx.waitForEvent. Each names an attempt with the receipt its claim
 * returned (receipts.ts): one without a valid receipt is refused before the database is asked.
 * The rest is the store's fenced SQL, the statements a worker on the database runs: a record or
 * a suspension of an attempt that no longer holds its job changes nothing and is answered 409
 * stale_lease, as the other fenced routes answer. ctx.step.transaction has no route: a remote
 * worker cannot join the server's transactions (the worker ends such a job dead, saying so).
 *
 * Every value is checked here, with the limits a worker on the database applies
 * (jobs/steps.ts), and an error names the field.
 */
import type { FastifyInstance } from "fastify";
import type { Leasehold } from "leasehold/internal/client";
import { ValidationError } from "leasehold/internal/errors";
import {
  MAX_EVENT_NAME_LENGTH,
  MAX_STEP_NAME_LENGTH,
  MAX_STEPS_PER_JOB,
  checkEventName,
  checkStepName,
  durationMs,
  serializeEventData,
  serializeStepResult,
  type StepRecord,
} from "leasehold/internal/jobs/steps";
import { MAX_DELAY_MS, sanitizeText } from "leasehold/internal/jobs/validate";
import * as store from "leasehold/internal/store/index";
import { prepareChildren } from "leasehold/internal/worker/children";
import { childrenAnswer, eventWaitAnswer, sleepAnswer } from "leasehold/internal/worker/step-answers";
import { errorBody } from "./errors.js";
import { FLOW_BODY_LIMIT_BYTES } from "./flow-routes.js";
import { MAX_STEPS_RESPONSE_BYTES } from "./limits.js";
import type { ServerMetrics } from "./http-metrics.js";
import { INVALID_RECEIPT, INVALID_RECEIPT_MESSAGE, type ReceiptRef, type Receipts } from "./receipts.js";
import { ATTEMPT_REF, COMMON_ERRORS, JOB_ID, TIME, WORKER_ID, errors, errorSchema, object, secured } from "./schemas.js";
import { recordRefused, refuse } from "./worker-routes.js";

const STEPS_TOO_LARGE =
  `this job's recorded steps do not fit one answer (the server's cap is ${MAX_STEPS_RESPONSE_BYTES / 1024 / 1024} MiB): ` +
  "read them in pages (send after: null, then each answer's next), as a remote worker of this release does";

/** Most step records one request may carry (a worker sends what its handlers finished meanwhile). */
const MAX_STEP_BATCH = 10_000;
/** The longest error a failed step may record (as a failure report's). */
const MAX_STEP_ERROR_LENGTH = 10_000;
const MAX_INT = 2_147_483_647;

const SEQ = { type: "integer", minimum: 0, maximum: MAX_STEPS_PER_JOB - 1, description: "the step's place in the handler's call order" } as const;
const OCCURRENCE = { type: "integer", minimum: 0, maximum: MAX_STEPS_PER_JOB - 1, description: "the how-many-th call of this name" } as const;
const STEP_NAME = { type: "string", minLength: 1, maxLength: MAX_STEP_NAME_LENGTH } as const;
const EVENT_NAME = { type: "string", minLength: 1, maxLength: MAX_EVENT_NAME_LENGTH } as const;
const ATTEMPT = { type: "integer", minimum: 1, maximum: MAX_INT } as const;

const stepRecordSchema = {
  type: "object",
  properties: {
    seq: { type: "integer" },
    name: { type: "string" },
    occurrence: { type: "integer" },
    kind: { type: "string" },
    state: { type: "string", enum: ["succeeded", "failed", "waiting"] },
    attempt: { type: "integer" },
    result: { description: "the step's result (any JSON); absent when the step returned undefined" },
    error: { type: ["string", "null"] },
    durationMs: { type: ["integer", "null"] },
    wakeAt: TIME,
    event: { type: ["string", "null"] },
    recordedAt: { type: "string", format: "date-time" },
  },
};
const refusedReceipt = {
  409: { description: "stale_lease: the attempt no longer holds its job; invalid_receipt: missing or wrong receipt", ...errorSchema },
};
const WORKER_ERRORS = errors(...COMMON_ERRORS);
const childEnd = {
  type: "object",
  properties: {
    id: JOB_ID,
    ref: { type: ["string", "null"], description: "the node's ref in a child flow; null for a list's children" },
    task: { type: ["string", "null"], description: "null when retention has forgotten the child" },
    state: { type: "string", enum: ["succeeded", "dead", "cancelled", "unknown"] },
    result: { description: "the child's result when it succeeded; null otherwise" },
    error: { type: ["string", "null"], description: "why it ended dead or cancelled" },
  },
};
const place = { workerId: WORKER_ID, job: ATTEMPT_REF, seq: SEQ, name: STEP_NAME, occurrence: OCCURRENCE };

export const stepRoutes = {
  load: {
    ...secured,
    tags: ["worker"],
    summary:
      "Durable steps: the recorded steps of a job this worker runs, in call order and in pages of at most ~8 MiB (a replay reads them once per attempt)",
    body: object(
      {
        workerId: WORKER_ID,
        job: ATTEMPT_REF,
        after: {
          anyOf: [SEQ, { type: "null" }],
          description:
            "read the steps in pages: null for the first, then the answer's `next`. Without it, steps that do not fit one answer " +
            "(~8 MiB) are refused with 413 (code answer_too_large)",
        },
      },
      ["workerId", "job"],
    ),
    response: {
      200: {
        type: "object",
        properties: {
          steps: { type: "array", items: stepRecordSchema },
          next: { anyOf: [SEQ, { type: "null" }], description: "send as `after` for the next page; null: no more steps" },
        },
      },
      ...WORKER_ERRORS,
      ...refusedReceipt,
      413: { description: "the steps do not fit one answer and the request did not ask for pages (code answer_too_large)", ...errorSchema },
    },
  },
  record: {
    ...secured,
    tags: ["worker"],
    summary:
      "Durable steps: record step outcomes, fenced (a stale attempt's record is refused; a recorded step is never replaced but by a later success of a failed one)",
    body: object(
      {
        workerId: WORKER_ID,
        steps: {
          type: "array",
          minItems: 1,
          maxItems: MAX_STEP_BATCH,
          items: object(
            {
              id: JOB_ID,
              attempt: ATTEMPT,
              receipt: ATTEMPT_REF.properties.receipt,
              seq: SEQ,
              name: STEP_NAME,
              occurrence: OCCURRENCE,
              kind: { type: "string", enum: ["step", "children", "callback"] },
              state: { type: "string", enum: ["succeeded", "failed"] },
              result: { description: "a success's result (any JSON, at most 256 KiB); absent: the step returned undefined" },
              error: { type: "string", maxLength: MAX_STEP_ERROR_LENGTH, description: "a failure's error (required when failed)" },
              durationMs: { type: "integer", minimum: 0, maximum: MAX_INT },
            },
            ["id", "attempt", "seq", "name", "occurrence", "kind", "state", "durationMs"],
          ),
        },
      },
      ["workerId", "steps"],
    ),
    response: {
      200: {
        type: "object",
        properties: {
          recorded: { type: "array", items: { type: "object", properties: { id: JOB_ID, seq: { type: "integer" } } } },
          refused: {
            type: "array",
            description: "records not made: held false, the attempt lost its job; held true, its place was recorded already",
            items: { type: "object", properties: { id: JOB_ID, attempt: { type: "integer" }, seq: { type: "integer" }, held: { type: "boolean" } } },
          },
          invalid: { type: "array", items: { type: "object", properties: { id: JOB_ID, attempt: { type: "integer" }, code: { type: "string" } } } },
        },
      },
      ...WORKER_ERRORS,
      ...refusedReceipt,
    },
  },
  fate: {
    ...secured,
    tags: ["worker"],
    summary: "Durable steps: why a record was refused (the attempt lost its job, or what was recorded at its place)",
    body: object({ workerId: WORKER_ID, job: ATTEMPT_REF, seq: SEQ }, ["workerId", "job", "seq"]),
    response: {
      200: {
        type: "object",
        properties: {
          held: { type: "boolean" },
          recorded: {
            type: "object",
            properties: { name: { type: "string" }, occurrence: { type: "integer" }, state: { type: "string" }, result: {} },
          },
        },
      },
      ...WORKER_ERRORS,
      ...refusedReceipt,
    },
  },
  sleep: {
    ...secured,
    tags: ["worker"],
    summary: "ctx.sleep: record the sleep and suspend the job until its end (state due: the end had passed, the handler goes on)",
    body: {
      ...object(
        {
          ...place,
          until: { type: "string", format: "date-time", description: "the sleep's end" },
          ms: { type: "integer", minimum: 0, maximum: MAX_DELAY_MS, description: "or its length, from now on the database's clock" },
        },
        ["workerId", "job", "seq", "name", "occurrence"],
      ),
    },
    response: {
      200: { type: "object", properties: { state: { type: "string", enum: ["suspended", "cancelled", "due"] } } },
      ...WORKER_ERRORS,
      ...refusedReceipt,
    },
  },
  waitForEvent: {
    ...secured,
    tags: ["worker"],
    summary: "ctx.waitForEvent: the event (or the timeout's null) if the wait is over, else the job suspends until it comes",
    body: object(
      {
        ...place,
        kind: { type: "string", enum: ["event", "callback", "children"], description: "default event" },
        event: EVENT_NAME,
        match: { description: "JSON the event's data must contain (at most 256 KiB); absent: any" },
        timeoutMs: { type: ["integer", "null"], minimum: 0, maximum: MAX_DELAY_MS, description: "absent or null: no timeout" },
      },
      ["workerId", "job", "seq", "name", "occurrence", "event"],
    ),
    response: {
      200: {
        type: "object",
        properties: {
          state: { type: "string", enum: ["received", "suspended", "cancelled"] },
          received: { type: "boolean", description: "state received: false when the wait timed out" },
          data: { description: "state received: the event's data (null: none, or timed out)" },
        },
      },
      ...WORKER_ERRORS,
      ...refusedReceipt,
    },
  },
  children: {
    ...secured,
    tags: ["worker"],
    summary: "ctx.children: start the children (exactly once per job) and suspend until all have ended; once they have, their ends (state ended)",
    body: object(
      {
        ...place,
        children: {
          description:
            "the children as ctx.children takes them, tasks by name: an array of jobs, or { flow: [...nodes] }; checked here as an " +
            "enqueue is. Required the first time the step is reached; absent on a replay of a started step (only its ends are read)",
        },
      },
      ["workerId", "job", "seq", "name", "occurrence"],
    ),
    response: {
      200: {
        type: "object",
        properties: {
          state: { type: "string", enum: ["ended", "suspended", "cancelled"] },
          ends: { type: "array", items: childEnd, description: "state ended: each child's end, in the order given" },
        },
      },
      ...WORKER_ERRORS,
      ...refusedReceipt,
    },
  },
};

type Ref = { id: string; attempt: number };
type WireStep = ReceiptRef & {
  seq: number;
  name: string;
  occurrence: number;
  kind: store.StepOutcome["kind"];
  state: store.StepOutcome["state"];
  result?: unknown;
  error?: string;
  durationMs: number;
};
type Place = { workerId: string; job: ReceiptRef; seq: number; name: string; occurrence: number };

interface Deps {
  leasehold: Leasehold;
  receipts: Receipts;
  metrics: ServerMetrics;
  bodyLimitBytes: number;
}

export function registerStepRoutes(app: FastifyInstance, { leasehold: lh, receipts, metrics, bodyLimitBytes }: Deps): void {
  const pool = lh.pool;
  const worker = { scope: "worker" } as const;
  const invalidReceipt = errorBody(INVALID_RECEIPT, INVALID_RECEIPT_MESSAGE);
  /** The attempt's receipt proves the asking worker holds it (receipts.ts). */
  const holds = (workerId: string, job: ReceiptRef) => {
    if (receipts.verify(job, workerId)) return true;
    metrics.invalidReceipts.inc({ kind: "step" }, 1);
    return false;
  };

  app.post<{ Body: { workerId: string; job: ReceiptRef; after?: number | null } }>(
    "/v1/worker/steps/load",
    { schema: stepRoutes.load, config: worker },
    async (request, reply) => {
      const { workerId, job, after } = request.body;
      if (!holds(workerId, job)) return reply.status(409).send(invalidReceipt);
      // The page stops at the cap in its statement: results past it stay in the database.
      const page = await store.loadStepsPage(pool, job.id, { after: after ?? null, maxBytes: MAX_STEPS_RESPONSE_BYTES });
      // A client that does not read pages (an earlier release's remote worker) would take the
      // first page for every step and run the rest again: refuse rather than answer part of them.
      if (after === undefined && page.next !== null) return reply.status(413).send(errorBody("answer_too_large", STEPS_TOO_LARGE));
      return { steps: page.steps.map(toWire), next: page.next };
    },
  );

  app.post<{ Body: { workerId: string; steps: WireStep[] } }>(
    "/v1/worker/steps/record",
    { schema: stepRoutes.record, config: worker },
    async (request, reply) => {
      const { workerId, steps } = request.body;
      // Every value is checked before anything is written: a bad one refuses the request, naming it.
      const outcomes = steps.map((s, i) => outcomeOf(s, `steps[${i}]`));
      const { valid, invalid } = receipts.check(
        steps.map((s, i) => ({ ...s, outcome: outcomes[i]! })),
        workerId,
      );
      if (invalid.length > 0) metrics.invalidReceipts.inc({ kind: "step" }, invalid.length);
      const recorded = await store.recordSteps(pool, { workerId, steps: valid.map((s) => s.outcome) });
      const notRecorded = valid.filter((s) => !recorded.has(`${s.id}:${s.seq}`));
      const fates = await Promise.all(notRecorded.map((s) => store.stepFate(pool, { workerId, id: s.id, attempt: s.attempt, seq: s.seq })));
      const stale = attemptsOf(notRecorded.filter((_, i) => !fates[i]!.held));
      if (recorded.size === 0 && invalid.length === 0 && fates.every((f) => !f.held)) return refuse(reply, "step", stale, workerId, lh);
      await recordRefused("step", stale, workerId, lh);
      return {
        recorded: [...recorded].map((k) => ({ id: k.slice(0, k.indexOf(":")), seq: Number(k.slice(k.indexOf(":") + 1)) })),
        refused: notRecorded.map((s, i) => ({ id: s.id, attempt: s.attempt, seq: s.seq, held: fates[i]!.held })),
        invalid: invalid.map((s) => ({ id: s.id, attempt: s.attempt, code: INVALID_RECEIPT })),
      };
    },
  );

  app.post<{ Body: { workerId: string; job: ReceiptRef; seq: number } }>(
    "/v1/worker/steps/fate",
    { schema: stepRoutes.fate, config: worker },
    async (request, reply) => {
      const { workerId, job, seq } = request.body;
      if (!holds(workerId, job)) return reply.status(409).send(invalidReceipt);
      return store.stepFate(pool, { workerId, id: job.id, attempt: job.attempt, seq });
    },
  );

  app.post<{ Body: Place & { until?: string; ms?: number } }>(
    "/v1/worker/sleep",
    { schema: stepRoutes.sleep, config: worker },
    async (request, reply) => {
      const { until, ms, ...p } = request.body;
      if ((until === undefined) === (ms === undefined))
        throw new ValidationError("sleep: send either until (a date-time) or ms, not both or neither");
      const target = until === undefined ? { ms: durationMs(ms, "ms") } : { until: sleepEnd(until) };
      const suspending = suspendingStep(p, "sleep");
      if (!holds(p.workerId, p.job)) return reply.status(409).send(invalidReceipt);
      const answer = await sleepAnswer(pool, { ...suspending, ...target });
      if (answer === "stale") return refuse(reply, "step", [ref(p.job)], p.workerId, lh);
      return { state: answer };
    },
  );

  app.post<{ Body: Place & { kind?: store.EventWait["kind"]; event: string; match?: unknown; timeoutMs?: number | null } }>(
    "/v1/worker/wait-for-event",
    { schema: stepRoutes.waitForEvent, config: worker },
    async (request, reply) => {
      const { kind, event, match, timeoutMs, ...p } = request.body;
      checkEventName(event, "waitForEvent");
      const suspending = suspendingStep(p, "waitForEvent");
      // Absent is "any data"; a JSON null would match only a null (or absent) data, as on the database.
      const matchJson = match === undefined ? null : serializeEventData(match, "waitForEvent: match");
      if (!holds(p.workerId, p.job)) return reply.status(409).send(invalidReceipt);
      const answer = await eventWaitAnswer(pool, { ...suspending, kind: kind ?? "event", event, matchJson, timeoutMs: timeoutMs ?? null });
      if (answer === "stale") return refuse(reply, "step", [ref(p.job)], p.workerId, lh);
      return typeof answer === "object" ? { state: "received", received: answer.received, data: answer.data } : { state: answer };
    },
  );

  // Children are as large as a flow's nodes: this route takes what POST /v1/flows takes.
  app.post<{ Body: Place & { children?: unknown } }>(
    "/v1/worker/children",
    { schema: stepRoutes.children, config: worker, bodyLimit: Math.max(bodyLimitBytes, FLOW_BODY_LIMIT_BYTES) },
    async (request, reply) => {
      const { children, ...p } = request.body;
      const suspending = suspendingStep(p, "children");
      // The server checks the children itself, as it checks an enqueue: it trusts no worker's checks.
      const start = children === undefined ? null : await prepareChildren(withRunAts(children), "children");
      if (!holds(p.workerId, p.job)) return reply.status(409).send(invalidReceipt);
      const answer = await childrenAnswer(pool, { ...suspending, nodes: start?.nodes ?? null, flow: start?.flow ?? false }).catch((err: unknown) => {
        // Nothing was started at this place: the children were needed (the transaction rolled back).
        if (start === null && err instanceof ValidationError) throw new ValidationError(`children: required here: ${err.message}`);
        throw err;
      });
      if (answer === "stale") return refuse(reply, "step", [ref(p.job)], p.workerId, lh);
      return typeof answer === "object" ? { state: "ended", ends: answer.ends } : { state: answer };
    },
  );
}

/** JSON has no dates: a child's `runAt` arrives as an ISO string (anything else is left for the checks to name). */
function withRunAts(children: unknown): unknown {
  const dated = (node: unknown, where: string) => {
    if (node === null || typeof node !== "object" || typeof (node as { runAt?: unknown }).runAt !== "string") return node;
    const runAt = new Date((node as { runAt: string }).runAt);
    if (Number.isNaN(runAt.getTime())) throw new ValidationError(`children: ${where}: runAt must be an ISO 8601 date-time`);
    return { ...node, runAt };
  };
  if (Array.isArray(children)) return children.map((job, i) => dated(job, `job ${i}`));
  const flow = (children as { flow?: unknown } | null)?.flow;
  if (Array.isArray(flow)) return { ...(children as object), flow: flow.map((node, i) => dated(node, `node ${i}`)) };
  return children;
}

function ref(r: Ref): Ref {
  return { id: r.id, attempt: r.attempt };
}

/** Each attempt once (a batch may carry several steps of one attempt). */
function attemptsOf(steps: Ref[]): Ref[] {
  const seen = new Map<string, Ref>();
  for (const s of steps) seen.set(`${s.id}:${s.attempt}`, ref(s));
  return [...seen.values()];
}

function suspendingStep(p: Place, call: string): store.SuspendingStep {
  checkStepName(p.name, call);
  return { workerId: p.workerId, id: p.job.id, attempt: p.job.attempt, seq: p.seq, name: p.name, occurrence: p.occurrence };
}

function sleepEnd(until: string): Date {
  const at = new Date(until);
  if (Number.isNaN(at.getTime())) throw new ValidationError(`sleep: until must be an ISO 8601 date-time, got ${JSON.stringify(until.slice(0, 80))}`);
  if (at.getTime() > Date.now() + MAX_DELAY_MS) throw new ValidationError("sleep: until is more than 3650 days ahead");
  return at;
}

/** A wire record as the store takes it: its name and result checked as the worker checks them. */
function outcomeOf(s: WireStep, where: string): store.StepOutcome {
  checkStepName(s.name, where);
  const outcome: store.StepOutcome = {
    id: s.id,
    attempt: s.attempt,
    seq: s.seq,
    name: s.name,
    occurrence: s.occurrence,
    kind: s.kind,
    state: s.state,
    durationMs: s.durationMs,
  };
  if (s.state === "failed") {
    if (s.error === undefined) throw new ValidationError(`${where}: error is required for a failed step`);
    if (s.result !== undefined) throw new ValidationError(`${where}: a failed step has no result`);
    // A client's error text may hold what PostgreSQL refuses (NUL, lone surrogates).
    return { ...outcome, error: sanitizeText(s.error, MAX_STEP_ERROR_LENGTH) };
  }
  if (s.error !== undefined) throw new ValidationError(`${where}: a succeeded step has no error`);
  let resultJson: string | undefined;
  try {
    resultJson = serializeStepResult(s.result, s.name);
  } catch (err) {
    throw err instanceof ValidationError ? new ValidationError(`${where}: ${err.message}`) : err;
  }
  return resultJson === undefined ? outcome : { ...outcome, resultJson };
}

function toWire(r: StepRecord): Record<string, unknown> {
  const { result, ...rest } = r;
  return result === undefined ? rest : { ...rest, result };
}
