/**
 * Events over HTTP (docs/durable.md#events-and-the-race-with-a-wait): POST /v1/events sends one, as `lh.sendEvent`
 * does, through send_event() in SQL, so it is stored and wakes its waiting jobs in one
 * transaction. Sending starts work, as an enqueue does, so it takes the operator token (the
 * worker and viewer tokens are refused, and so is a read-only server).
 */
import type { FastifyInstance } from "fastify";
import type { Leasehold } from "leasehold/internal/client";
import { MAX_EVENT_NAME_LENGTH } from "leasehold/internal/jobs/steps";
import { COMMON_ERRORS, JOB_ID, errors, object, secured } from "./schemas.js";

export const eventRoutes = {
  sendEvent: {
    ...secured,
    tags: ["events"],
    summary: "Send an event: stored, and the jobs waiting for it (ctx.waitForEvent) woken",
    body: object(
      {
        event: { type: "string", minLength: 1, maxLength: MAX_EVENT_NAME_LENGTH, description: "the event's name (no control characters)" },
        data: { description: "any JSON, at most 256 KiB; absent: none (null)" },
      },
      ["event"],
    ),
    response: {
      201: { type: "object", properties: { id: { ...JOB_ID, description: "the event's id" } } },
      ...errors(...COMMON_ERRORS, 403),
    },
  },
};

export function registerEventRoutes(app: FastifyInstance, lh: Leasehold): void {
  app.post<{ Body: { event: string; data?: unknown } }>("/v1/events", { schema: eventRoutes.sendEvent }, async (request, reply) => {
    // The library checks the name and the data's size, naming what is wrong (400).
    const { event, data } = request.body;
    return reply.status(201).send(await lh.sendEvent(event, data));
  });
}
