/**
 * Flow control for operators (docs/flow-control.md): list the queues with their settings,
 * pause and resume one, change its limits, lift its handlers' holds, set what it keeps of its finished jobs. Each goes through the library's method, so the
 * checks (a value out of range, an unknown queue) and their messages are the same as for
 * `lh.pauseQueue` and the CLI. A queue nobody has named yet is refused (404 unknown_queue)
 * unless `create=true` says to configure it before its first job. And every queue's depth,
 * for autoscalers and operators (docs/deployment.md#autoscaling).
 */
import type { FastifyInstance } from "fastify";
import type { Leasehold } from "leasehold/internal/client";
import type { QueueHistory, QueueLimits } from "leasehold/internal/store/index";
import { routes } from "./schemas.js";

interface QueueRequest {
  Params: { name: string };
  Querystring: { create?: "true" | "false" };
}

export function registerQueueRoutes(app: FastifyInstance, lh: Leasehold): void {
  app.get("/v1/queues", { schema: routes.listQueues }, async () => ({ queues: await lh.listQueues() }));

  app.get("/v1/queues/depth", { schema: routes.queueDepth }, async () => ({ queues: await lh.queueDepth() }));

  app.post<QueueRequest>("/v1/queues/:name/pause", { schema: routes.pauseQueue }, async (request) => ({
    queue: await lh.pauseQueue(request.params.name, { create: request.query.create === "true" }),
  }));

  app.post<QueueRequest>("/v1/queues/:name/resume", { schema: routes.resumeQueue }, async (request) => ({
    queue: await lh.resumeQueue(request.params.name, { create: request.query.create === "true" }),
  }));

  app.delete<{ Params: { name: string } }>("/v1/queues/:name/hold", { schema: routes.clearQueueHolds }, async (request) => ({
    cleared: await lh.clearQueueHolds(request.params.name),
  }));

  app.patch<QueueRequest & { Body: Partial<QueueLimits> & { create?: boolean } }>(
    "/v1/queues/:name/limits",
    { schema: routes.setQueueLimits },
    async (request) => {
      const { create, ...limits } = request.body;
      return { queue: await lh.setQueueLimits(request.params.name, limits, { create: create === true || request.query.create === "true" }) };
    },
  );

  app.patch<QueueRequest & { Body: QueueHistory & { create?: boolean } }>(
    "/v1/queues/:name/history",
    { schema: routes.setQueueHistory },
    async (request) => {
      const { create, ...history } = request.body;
      return { queue: await lh.setQueueHistory(request.params.name, history, { create: create === true || request.query.create === "true" }) };
    },
  );
}
