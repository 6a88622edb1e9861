/** The CLI's job operations over HTTP: enqueue, list, show, cancel, retry, re-run from a step, stats; and the schedules, read-only. */
import type { FastifyInstance, FastifyRequest } from "fastify";
import type { Leasehold } from "leasehold/internal/client";
import type { IncomingMessage } from "node:http";
import { ValidationError, WaitTimeoutError } from "leasehold/internal/errors";
import { checkJobId } from "leasehold/internal/jobs/ids";
import { integerIn } from "leasehold/internal/jobs/validate";
import { progressFraction } from "leasehold/internal/jobs/progress";
import type { JobHeaders, JobState, NewJob } from "leasehold/internal/jobs/types";
import type { JobFilter, TimeField } from "leasehold/internal/store/index";
import { MAX_LIST_RESPONSE_BYTES } from "./limits.js";
import { listPage } from "./list-page.js";
import { MAX_WAIT_MS, routes } from "./schemas.js";

const DEFAULT_LIST_LIMIT = 50;
const MAX_LIST_LIMIT = 10_000;

/** A job filter as a query string or body carries it (validated by the route's schema). */
export interface WireFilter {
  state?: JobState;
  queue?: string;
  task?: string;
  from?: string;
  to?: string;
  time?: TimeField;
}

export function filterFromWire(f: WireFilter): JobFilter {
  return {
    state: f.state,
    queue: f.queue,
    task: f.task,
    from: f.from === undefined ? undefined : new Date(f.from),
    to: f.to === undefined ? undefined : new Date(f.to),
    timeField: f.time,
  };
}

/** JSON has no dates: `runAt` arrives as an ISO string. */
type WireJob = Omit<NewJob, "runAt"> & { runAt?: string };

function fromWire(job: WireJob, where: string): NewJob {
  if (job.runAt === undefined) return job as NewJob;
  const runAt = new Date(job.runAt);
  if (Number.isNaN(runAt.getTime())) throw new ValidationError(`${where}: runAt must be an ISO 8601 date-time`);
  return { ...job, runAt };
}

/**
 * The request's W3C trace context (`traceparent`, `tracestate`), carried into each job's
 * headers unless the job brings its own traceparent: an HTTP enqueue is linked to its caller's
 * trace whether or not this server traces (docs/tracing.md). A malformed traceparent is
 * left out, not refused: tracing never fails an enqueue.
 */
function withRequestTrace(job: NewJob, request: FastifyRequest): NewJob {
  const traceparent = request.headers.traceparent;
  if (typeof traceparent !== "string" || !TRACEPARENT.test(traceparent) || job.headers?.traceparent !== undefined) return job;
  const headers: JobHeaders = { ...job.headers, traceparent };
  const tracestate = request.headers.tracestate;
  if (typeof tracestate === "string" && tracestate.length <= MAX_TRACESTATE) headers.tracestate = tracestate;
  return { ...job, headers };
}

const TRACEPARENT = /^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/;
/** A longer tracestate is dropped (W3C lets a hop do so; 512 is what every hop must carry), so it never fills the job's headers. */
const MAX_TRACESTATE = 512;

/**
 * The job waits open on this server: at most `max` at once (beyond, a wait answers at once
 * with the job as it is), each ended when its client goes away or the server closes. They
 * share the client's one LISTEN session: a wait costs no connection.
 */
export class JobWaits {
  private readonly open = new Set<AbortController>();
  private closed = false;

  constructor(private readonly max: number) {}

  start(req: IncomingMessage): { signal: AbortSignal; end: () => void } | undefined {
    if (this.closed || this.open.size >= this.max) return undefined;
    const controller = new AbortController();
    this.open.add(controller);
    const gone = () => controller.abort(new Error("the client went away"));
    req.socket.once("close", gone);
    return {
      signal: controller.signal,
      end: () => {
        req.socket.off("close", gone);
        this.open.delete(controller);
      },
    };
  }

  close(): void {
    this.closed = true;
    for (const c of this.open) c.abort(new Error("the server is closing"));
  }
}

export function registerJobRoutes(app: FastifyInstance, lh: Leasehold, waits: JobWaits): void {
  app.post<{ Body: WireJob }>("/v1/jobs", { schema: routes.enqueue }, async (request, reply) => {
    const { task, payload, ...options } = withRequestTrace(fromWire(request.body, "job"), request);
    const job = await lh.enqueue(task, payload, options);
    return reply.status(201).send(job);
  });

  app.post<{ Body: { jobs: WireJob[] } }>("/v1/jobs/batch", { schema: routes.enqueueBatch }, async (request, reply) => {
    const jobs = await lh.enqueueMany(request.body.jobs.map((j, i) => withRequestTrace(fromWire(j, `job ${i}`), request)));
    const warnings = [...new Set(jobs.flatMap((j) => j.warnings ?? []))];
    return reply.status(201).send(warnings.length > 0 ? { jobs, warnings } : { jobs });
  });

  app.get<{ Querystring: WireFilter & { limit?: string; before?: string; payload?: "true" | "false" } }>(
    "/v1/jobs",
    { schema: routes.listJobs },
    async (request) => {
      const { limit, before, payload, ...filter } = request.query;
      const query = {
        ...filterFromWire(filter),
        before,
        limit: limit === undefined ? DEFAULT_LIST_LIMIT : Number(limit),
        includePayload: payload === "true",
      };
      integerIn(query.limit, 1, MAX_LIST_LIMIT, "limit");
      if (before !== undefined) checkJobId(before, "before");
      return listPage(lh, query, MAX_LIST_RESPONSE_BYTES);
    },
  );

  app.get<{ Params: { id: string } }>("/v1/jobs/:id", { schema: routes.getJob }, async (request) => {
    const { job, attempts, ...relationsAndSteps } = await lh.getJob(request.params.id);
    return { job, attempts, progressFraction: progressFraction(job.progress), ...relationsAndSteps };
  });

  // A long poll: answered when the job finishes, or at the timeout (200, finished false, the
  // job as it is then), so a client asks again; a closing server answers its waits at once.
  app.get<{ Params: { id: string }; Querystring: { timeoutMs?: string } }>("/v1/jobs/:id/wait", { schema: routes.waitJob }, async (request) => {
    const { id } = request.params;
    const timeoutMs = Math.min(Number(request.query.timeoutMs ?? MAX_WAIT_MS), MAX_WAIT_MS);
    const waited = waits.start(request.raw);
    try {
      if (waited) return { finished: true, job: await lh.waitFor(id, { timeoutMs, signal: waited.signal }) };
    } catch (err) {
      if (!(err instanceof WaitTimeoutError) && !waited?.signal.aborted) throw err;
    } finally {
      waited?.end();
    }
    // Timed out, over the cap on waits, or the server is closing: the job as it is now.
    const { job } = await lh.getJob(id);
    return { finished: job.finishedAt !== null, job };
  });

  app.post<{ Params: { id: string } }>("/v1/jobs/:id/cancel", { schema: routes.cancel }, async (request) => ({
    result: await lh.cancel(request.params.id),
  }));

  app.post<{ Params: { id: string } }>("/v1/jobs/:id/retry", { schema: routes.retry }, async (request) => {
    await lh.retry(request.params.id);
    return { result: "retried" };
  });

  app.post<{ Params: { id: string }; Body: { fromStep: string; occurrence?: number } }>(
    "/v1/jobs/:id/rerun",
    { schema: routes.rerun },
    async (request) =>
      lh.rerunFromStep(request.params.id, request.body.fromStep, { occurrence: request.body.occurrence, requestedBy: "operator token (HTTP)" }),
  );

  app.get("/v1/stats", { schema: routes.stats }, async () => lh.stats());

  app.get("/v1/schedules", { schema: routes.listSchedules }, async () => ({ schedules: await lh.listSchedules() }));
}
