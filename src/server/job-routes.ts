/** The CLI's job operations over HTTP: enqueue, list, show, cancel, retry, stats; and the schedules, read-only. */
import type { FastifyInstance } from "fastify";
import type { Leasehold } from "../client.js";
import { ValidationError } from "../errors.js";
import type { NewJob } from "../jobs/types.js";
import { MAX_LIST_RESPONSE_BYTES } from "./limits.js";
import { listPage } from "./list-page.js";
import { routes } from "./schemas.js";

const DEFAULT_LIST_LIMIT = 50;

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
    return reply.status(201).send({ jobs });
  });

  app.get<{ Querystring: { state?: string; queue?: string; limit?: string; before?: string; payload?: "true" | "false" } }>(
    "/v1/jobs",
    { schema: routes.listJobs },
    async (request) => {
      const { state, queue, limit, before, payload } = request.query;
      const query = { state, queue, before, limit: limit === undefined ? DEFAULT_LIST_LIMIT : Number(limit), includePayload: payload === "true" };
      return listPage(lh, query, MAX_LIST_RESPONSE_BYTES);
    },
  );

  app.get<{ Params: { id: string } }>("/v1/jobs/:id", { schema: routes.getJob }, async (request) => lh.getJob(request.params.id));

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
