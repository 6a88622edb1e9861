/**
 * One error shape for every response: `{ error: { code, message, ... } }`. Typed Leasehold
 * errors keep their stable code; anything unexpected becomes a bare 500 (logged here, never
 * sent: no SQL, no stack traces leave the server).
 */
import type { FastifyError, FastifyReply, FastifyRequest } from "fastify";
import { LeaseholdError } from "leasehold/internal/errors";
import { isConnectionError } from "leasehold/internal/worker/transport";

const STATUS_BY_CODE: Record<string, number> = {
  invalid_input: 400,
  invalid_config: 400,
  unknown_task: 400,
  no_worker_for_task: 400,
  job_not_found: 404,
  // the job existed and finished, and no record of it is kept (its queue's setting, or retention)
  job_not_kept: 410,
  unknown_queue: 404,
  invalid_state: 409,
  stale_lease: 409,
  name_in_use: 409,
  worker_id_in_use: 409,
  invalid_identity: 403,
  unique_key_conflict: 409,
  callback_not_found: 404,
  callback_gone: 410,
};

export interface ErrorBody {
  error: { code: string; message: string; [key: string]: unknown };
}

export function errorBody(code: string, message: string, extra: Record<string, unknown> = {}): ErrorBody {
  return { error: { code, message, ...extra } };
}

export function handleError(err: FastifyError, request: FastifyRequest, reply: FastifyReply): FastifyReply {
  if (err instanceof LeaseholdError) {
    return reply.status(STATUS_BY_CODE[err.code] ?? 400).send(errorBody(err.code, err.message));
  }
  if (err.validation) {
    // ajv says a field is not allowed without naming it: name it.
    const extra = err.validation[0]?.params?.additionalProperty;
    const named = typeof extra === "string" ? ` (${JSON.stringify(extra)})` : "";
    return reply.status(400).send(errorBody("invalid_input", `invalid request: ${err.message}${named}`));
  }
  if (err.code === "FST_ERR_CTP_BODY_TOO_LARGE") {
    return reply.status(413).send(errorBody("payload_too_large", "request body is larger than the server's limit"));
  }
  if (err.code === "FST_ERR_CTP_INVALID_MEDIA_TYPE") {
    return reply.status(415).send(errorBody("unsupported_media_type", "send request bodies as application/json"));
  }
  if (typeof err.code === "string" && err.code.startsWith("FST_") && err.statusCode && err.statusCode < 500) {
    // fastify's own client errors (malformed JSON, empty body): their messages name no internals.
    return reply.status(err.statusCode).send(errorBody("invalid_input", err.message));
  }
  if (isConnectionError(err)) {
    request.log.warn({ err: String(err) }, "database unavailable");
    return reply.status(503).send(errorBody("server_unavailable", "the server cannot reach its database; retry later"));
  }
  request.log.error({ err }, "unexpected error");
  return reply.status(500).send(errorBody("internal_error", "internal server error (details are in the server log)"));
}
