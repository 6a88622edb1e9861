/** The CLI's job operations over HTTP: enqueue, list, show, cancel, retry, stats; and the schedules, read-only. */
import type { FastifyInstance } from "fastify";
import type { Leasehold } from "../client.js";
import { ValidationError } from "../errors.js";
import { progressFraction } from "../jobs/progress.js";
import type { JobState, NewJob } from "../jobs/types.js";
import type { JobFilter, TimeField } from "../store/index.js";
import { MAX_LIST_RESPONSE_BYTES } from "./limits.js";
import { listPage } from "./list-page.js";
import { routes } from "./schemas.js";

const DEFAULT_LIST_LIMIT = 50;

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

export function registerJobRoutes(app: FastifyInstance, lh: Leasehold): void {
  app.post<{ Body: WireJob }>("/v1/jobs", { schema: routes.enqueue }, async (request, reply) => {
    const { task, payload, ...options } = fromWire(request.body, "job");
    const job = await lh.enqueue(task, payload, options);
    return reply.status(201).send(job);
  });

  app.post<{ Body: { jobs: WireJob[] } }>("/v1/jobs/batch", { schema: routes.enqueueBatch }, async (request, reply) => {
    const jobs = await lh.enqueueMany(request.body.jobs.map((j, i) => fromWire(j, `job ${i}`)));
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
      return listPage(lh, query, MAX_LIST_RESPONSE_BYTES);
    },
  );

  app.get<{ Params: { id: string } }>("/v1/jobs/:id", { schema: routes.getJob }, async (request) => {
    const { job, attempts } = await lh.getJob(request.params.id);
    return { job, attempts, progressFraction: progressFraction(job.progress) };
  });

  app.post<{ Params: { id: string } }>("/v1/jobs/:id/cancel", { schema: routes.cancel }, async (request) => ({
    result: await lh.cancel(request.params.id),
  }));

  app.post<{ Params: { id: string } }>("/v1/jobs/:id/retry", { schema: routes.retry }, async (request) => {
    await lh.retry(request.params.id);
    return { result: "retried" };
  });

  app.get("/v1/stats", { schema: routes.stats }, async () => lh.stats());

  app.get("/v1/schedules", { schema: routes.listSchedules }, async () => ({ schedules: await lh.listSchedules() }));
}
