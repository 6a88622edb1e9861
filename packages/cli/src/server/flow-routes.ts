/**
 * Dependencies and batches over HTTP (docs/flows.md): enqueue a graph or a batch (operators),
 * and the reads behind a remote worker's ctx.parents() and ctx.dependencies() (workers, with
 * the receipt of the attempt that asks: only the worker running a job reads its parents).
 * The library checks the graph and names what is wrong; the schemas here only bound the size.
 */
import type { FastifyInstance } from "fastify";
import type { Leasehold } from "leasehold/internal/client";
import { ValidationError } from "leasehold/internal/errors";
import { MAX_FLOW_NODES, type BatchInput, type FlowNode } from "leasehold/internal/jobs/flow-graph";
import * as store from "leasehold/internal/store/index";
import { errorBody } from "./errors.js";
import { MAX_PARENTS_RESPONSE_BYTES } from "./limits.js";
import type { ServerMetrics } from "./http-metrics.js";
import { INVALID_RECEIPT, INVALID_RECEIPT_MESSAGE, type ReceiptRef, type Receipts } from "./receipts.js";
import { ATTEMPT_REF, COMMON_ERRORS, JOB_ID, WORKER_ID, errors, errorSchema, object, secured } from "./schemas.js";

/**
 * A graph of 10,000 nodes with small payloads is ~1 MB of JSON; one of 25,000 nodes with
 * payloads of a kilobyte or two needs tens. These routes accept up to this much, or the
 * server's own body limit if it is larger.
 */
export const FLOW_BODY_LIMIT_BYTES = 48 * 1024 * 1024;

const NODE = { type: "object", description: "a node: { ref, task, payload?, dependsOn?, onParentFailure?, ...enqueue options }" } as const;
const JOB = { type: "object", description: "a job: { task, payload?, ...enqueue options } (no uniqueKey)" } as const;
const OPERATOR_ERRORS = errors(...COMMON_ERRORS, 403);

const parentRecord = {
  type: "object",
  properties: {
    id: JOB_ID,
    ref: { type: ["string", "null"], description: "the dependent's name for it in its graph; null for a parent named by id" },
    task: { type: ["string", "null"], description: "null when retention has forgotten the parent" },
    state: { type: "string", enum: ["succeeded", "dead", "cancelled", "unknown"] },
    result: { description: "the parent's result (its handler's return value); null when none" },
    error: { type: ["string", "null"], description: "why it ended dead or cancelled" },
  },
};
const countsSchema = {
  type: "object",
  properties: { total: { type: "integer" }, succeeded: { type: "integer" }, dead: { type: "integer" }, cancelled: { type: "integer" } },
};
const attemptQuery = object({ workerId: WORKER_ID, job: ATTEMPT_REF }, ["workerId", "job"]);
const parentsQuery = object(
  {
    workerId: WORKER_ID,
    job: ATTEMPT_REF,
    after: {
      anyOf: [JOB_ID, { type: "null" }],
      description:
        "read the parents in pages: null for the first, then the answer's `next`. Without it, parents that do not fit one " +
        "answer (~8 MiB) are refused with 413 (code answer_too_large)",
    },
  },
  ["workerId", "job"],
);
const refusedReceipt = { 409: { description: "missing or wrong receipt for the attempt (code invalid_receipt)", ...errorSchema } };

export const flowRoutes = {
  enqueueFlow: {
    ...secured,
    tags: ["flows"],
    summary: "Enqueue a graph of jobs in one transaction (docs/flows.md#dependencies)",
    body: object({ nodes: { type: "array", items: NODE, maxItems: MAX_FLOW_NODES + 1 } }, ["nodes"]),
    response: {
      201: {
        type: "object",
        properties: { jobs: { type: "object", additionalProperties: JOB_ID, description: "each node's ref → its job id" } },
      },
      ...OPERATOR_ERRORS,
    },
  },
  enqueueBatch: {
    ...secured,
    tags: ["flows"],
    summary: "Enqueue a batch and its completion callback in one transaction (docs/flows.md#batches)",
    body: object({ jobs: { type: "array", items: JOB, maxItems: MAX_FLOW_NODES }, onComplete: JOB }, ["jobs", "onComplete"]),
    response: {
      201: { type: "object", properties: { callbackId: JOB_ID, jobIds: { type: "array", items: JOB_ID } } },
      ...OPERATOR_ERRORS,
    },
  },
  parents: {
    ...secured,
    tags: ["worker"],
    summary: "ctx.parents(): the parents of a job this worker runs, and how each ended, in pages of at most ~8 MiB",
    body: parentsQuery,
    response: {
      200: {
        type: "object",
        properties: {
          parents: { type: "array", items: parentRecord },
          next: { anyOf: [JOB_ID, { type: "null" }], description: "send as `after` for the next page; null: no more parents" },
        },
      },
      ...errors(...COMMON_ERRORS),
      ...refusedReceipt,
      413: { description: "the parents do not fit one answer and the request did not ask for pages (code answer_too_large)", ...errorSchema },
    },
  },
  dependencies: {
    ...secured,
    tags: ["worker"],
    summary: "ctx.dependencies(): how the parents of a job this worker runs ended, counted",
    body: attemptQuery,
    response: { 200: countsSchema, ...errors(...COMMON_ERRORS), ...refusedReceipt },
  },
};

/** JSON has no dates: a node's `runAt` arrives as an ISO string. */
function withDates<T extends Record<string, unknown>>(job: T, where: string): T {
  if (job === null || typeof job !== "object" || typeof job.runAt !== "string") return job;
  const runAt = new Date(job.runAt);
  if (Number.isNaN(runAt.getTime())) throw new ValidationError(`${where}: runAt must be an ISO 8601 date-time`);
  return { ...job, runAt };
}

const refName = (node: unknown, i: number) => {
  const ref = (node as { ref?: unknown } | null)?.ref;
  return typeof ref === "string" ? `node ${JSON.stringify(ref)}` : `node ${i}`;
};

const PARENTS_TOO_LARGE =
  `this job's parents and their results do not fit one answer (the server's cap is ${MAX_PARENTS_RESPONSE_BYTES / 1024 / 1024} MiB): ` +
  "read them in pages (send after: null, then each answer's next), as a remote worker of this release does";

interface Deps {
  leasehold: Leasehold;
  receipts: Receipts;
  metrics: ServerMetrics;
  bodyLimitBytes: number;
}

export function registerFlowRoutes(app: FastifyInstance, { leasehold: lh, receipts, metrics, bodyLimitBytes }: Deps): void {
  const bodyLimit = Math.max(bodyLimitBytes, FLOW_BODY_LIMIT_BYTES);

  app.post<{ Body: { nodes: Record<string, unknown>[] } }>("/v1/flows", { schema: flowRoutes.enqueueFlow, bodyLimit }, async (request, reply) => {
    const nodes = request.body.nodes.map((n, i) => withDates(n, refName(n, i)));
    return reply.status(201).send(await lh.enqueueFlow(nodes as unknown as FlowNode[]));
  });

  app.post<{ Body: { jobs: Record<string, unknown>[]; onComplete: Record<string, unknown> } }>(
    "/v1/batches",
    { schema: flowRoutes.enqueueBatch, bodyLimit },
    async (request, reply) => {
      const batch = {
        jobs: request.body.jobs.map((j, i) => withDates(j, `job ${i}`)),
        onComplete: withDates(request.body.onComplete, "onComplete"),
      };
      return reply.status(201).send(await lh.enqueueBatch(batch as unknown as BatchInput));
    },
  );

  const worker = { scope: "worker" } as const;
  /** The attempt's receipt proves the asking worker holds it (receipts.ts). */
  const holds = (workerId: string, job: ReceiptRef) => {
    if (receipts.verify(job, workerId)) return true;
    metrics.invalidReceipts.inc({ kind: "parents" }, 1);
    return false;
  };
  const refused = errorBody(INVALID_RECEIPT, INVALID_RECEIPT_MESSAGE);

  app.post<{ Body: { workerId: string; job: ReceiptRef; after?: string | null } }>(
    "/v1/worker/parents",
    { schema: flowRoutes.parents, config: worker },
    async (request, reply) => {
      const { workerId, job, after } = request.body;
      if (!holds(workerId, job)) return reply.status(409).send(refused);
      // The page stops at the cap in its statement: results past it stay in the database.
      const page = await store.parentsPage(lh.pool, job.id, { after: after ?? null, maxBytes: MAX_PARENTS_RESPONSE_BYTES });
      if (after === undefined && page.next !== null) {
        // A client that does not read pages (an earlier release's remote worker) would take the
        // first page for the whole list: refuse rather than answer part of it.
        return reply.status(413).send(errorBody("answer_too_large", PARENTS_TOO_LARGE));
      }
      return page;
    },
  );

  app.post<{ Body: { workerId: string; job: ReceiptRef } }>(
    "/v1/worker/dependencies",
    { schema: flowRoutes.dependencies, config: worker },
    async (request, reply) => {
      const { workerId, job } = request.body;
      if (!holds(workerId, job)) return reply.status(409).send(refused);
      return store.dependencyCounts(lh.pool, job.id);
    },
  );
}
