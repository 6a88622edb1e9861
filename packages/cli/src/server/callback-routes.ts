/**
 * POST /v1/callbacks/:token: completes a callback's wait (docs/durable-callbacks.md). The token
 * is the credential, so the route needs no API token: a third party (a webhook, an approval
 * page) calls it. Its JSON body, whatever its shape, is the data the job resumes with. Logs
 * name the token by its first characters only.
 */
import type { FastifyInstance, FastifyRequest } from "fastify";
import type { Leasehold } from "leasehold/internal/client";
import { tokenHint } from "leasehold/internal/jobs/callbacks";
import { MAX_EVENT_DATA_BYTES } from "leasehold/internal/jobs/steps";
import { errors } from "./schemas.js";

const TOKEN = { type: "string", pattern: "^[A-Za-z0-9_-]{43}$", description: "the callback token ctx.callback handed out (43 base64url characters)" };

const schema = {
  tags: ["callbacks"],
  summary: "Complete a callback's wait with the request's JSON body as its data; no API token: the callback token is the credential",
  description:
    "Once per token: 200 the first time; 404 callback_not_found for a token never handed out; 410 callback_gone once it was " +
    "completed, its wait timed out, or its job finished. A body is at most 256 KiB of JSON; none completes it with null.",
  params: { type: "object", properties: { token: TOKEN }, required: ["token"], additionalProperties: false },
  response: {
    200: { type: "object", properties: { result: { type: "string", enum: ["completed"] } } },
    ...errors(400, 404, 410, 413, 503),
  },
};

/** The request as logs show it: the token shortened to a hint. */
function redactedRequest(request: FastifyRequest): { method: string; url: string } {
  return {
    method: request.method,
    url: request.url.replace(/(\/v1\/callbacks\/)([A-Za-z0-9_-]+)/, (_, path: string, token: string) => path + tokenHint(token)),
  };
}

export function registerCallbackRoutes(app: FastifyInstance, lh: Leasehold): void {
  app.post<{ Params: { token: string }; Body: unknown }>(
    "/v1/callbacks/:token",
    {
      schema,
      config: { public: true },
      // The event data's limit, and room for the JSON around it.
      bodyLimit: MAX_EVENT_DATA_BYTES + 1024,
      logSerializers: { req: redactedRequest },
    },
    async (request) => {
      await lh.completeCallback(request.params.token, request.body ?? null);
      return { result: "completed" };
    },
  );
}
