/**
 * The HTTP server (`leasehold serve`): the API remote workers and operators use, its
 * OpenAPI document, Prometheus metrics and a health check. It holds no job state (every
 * answer comes from the database), so several replicas can serve one database.
 *
 * Every route but /healthz and the dashboard's page and assets needs `Authorization: Bearer
 * <token>`: the operator token, or for the /v1/worker/* routes also the worker token.
 */
import pino from "pino";
import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance, type FastifyRequest } from "fastify";
import swagger from "@fastify/swagger";
import type { Leasehold } from "leasehold/internal/client";
import * as store from "leasehold/internal/store/index";
import { ConfigError } from "leasehold/internal/errors";
import { checkToken, scopeMatcher } from "./auth.js";
import { registerCallbackRoutes } from "./callback-routes.js";
import { registerCancelRoute } from "./cancel-route.js";
import { CancelWaiter } from "./cancel-waiter.js";
import { registerClaimRoute } from "./claim-route.js";
import { ClaimWaiter } from "./claim-waiter.js";
import { errorBody, handleError } from "./errors.js";
import { recordRequests, serverMetrics } from "./http-metrics.js";
import { DASHBOARD_MODES, registerDashboard, type DashboardMode } from "./dashboard.js";
import { JobWaits, registerJobRoutes } from "./job-routes.js";
import { registerEventRoutes } from "./event-routes.js";
import { registerFlowRoutes } from "./flow-routes.js";
import { registerMonitorRoutes } from "./monitor-routes.js";
import { registerQueueRoutes } from "./queue-routes.js";
import { capConnections, resolveLimits, serverOptions, type ServerLimits } from "./limits.js";
import { Receipts } from "./receipts.js";
import { WorkerIdentities } from "./identity.js";
import { routes } from "./schemas.js";
import { registerStepRoutes } from "./step-routes.js";
import { hideUserData } from "./user-data.js";
import { registerWorkerRoutes } from "./worker-routes.js";

/** How long a stopping server lets requests in flight finish. */
export const CLOSE_GRACE_MS = 3_000;

export interface ServerOptions {
  leasehold: Leasehold;
  token: string;
  /** A second token that may only use the remote workers' routes (/v1/worker/*). */
  workerToken?: string;
  /** Secret the claim receipts' key is derived from; default: the operator token. */
  receiptKey?: string;
  /** Timeouts, caps and the body limit; defaults in limits.ts. */
  limits?: Partial<ServerLimits>;
  /** Log requests (default: only errors). */
  logRequests?: boolean;
  /**
   * The dashboard at `/` (default "on"). "read-only": the operator token may only read (every
   * other method is refused with 403 read_only) and is shown no payloads (as the viewer token),
   * for a server that shows the dashboard to a wide audience; the worker token keeps its
   * routes. "off": no page (the API is the same).
   */
  dashboard?: DashboardMode;
  /**
   * A third token that may only read (GET and HEAD on the operator's routes): the one to give
   * a read-only dashboard's audience. Its answers hide payloads, results, checkpoints, progress
   * and error messages unless `showPayloads`.
   */
  viewerToken?: string;
  /** Show payloads (and results, checkpoints, progress, errors) to read-only credentials too (default: hidden). */
  showPayloads?: boolean;
  /** The interval of the throughput sampler that feeds /v1/activity (see maintenance/throughput.ts). */
  sampleIntervalMs?: number;
}

function tokensOf(options: ServerOptions): { operator: string; worker?: string; viewer?: string } {
  const operator = checkToken(options.token);
  const worker =
    options.workerToken === undefined
      ? undefined
      : checkToken(options.workerToken, "the worker token", "LEASEHOLD_WORKER_TOKEN or pass --worker-token");
  const viewer =
    options.viewerToken === undefined
      ? undefined
      : checkToken(options.viewerToken, "the viewer token", "LEASEHOLD_VIEWER_TOKEN or pass --viewer-token");
  if (worker === operator) throw new ConfigError("the worker token must differ from the operator token");
  if (viewer !== undefined && (viewer === operator || viewer === worker))
    throw new ConfigError("the viewer token must differ from the operator and worker tokens");
  return { operator, worker, viewer };
}

export function createServer(options: ServerOptions): FastifyInstance {
  const lh = options.leasehold;
  const scopeOf = scopeMatcher(tokensOf(options));
  const receiptSecret =
    options.receiptKey === undefined
      ? options.token
      : checkToken(options.receiptKey, "the receipt key", "LEASEHOLD_RECEIPT_KEY or pass --receipt-key");
  const receipts = new Receipts(receiptSecret);
  // Worker identity proofs: a key of their own, derived from the same secret.
  const identities = new WorkerIdentities(receiptSecret);
  const limits = resolveLimits(options.limits);
  const dashboard = options.dashboard ?? "on";
  if (!DASHBOARD_MODES.includes(dashboard))
    throw new ConfigError(`dashboard must be one of ${DASHBOARD_MODES.join(", ")} (got ${JSON.stringify(dashboard)})`);
  const readOnly = dashboard === "read-only";
  const metrics = serverMetrics(lh.metrics.registry);
  const logger = lh.logger.child({ component: "server" });
  const app = Fastify({
    // Fastify needs a pino logger; the CLI gives the client one, a library user may not have.
    loggerInstance: ("level" in logger ? logger : pino({ level: "silent" })) as FastifyBaseLogger,
    logController: new LogController({ disableRequestLogging: !options.logRequests }),
    ...serverOptions(limits),
    // On close: idle keep-alive connections are dropped, requests in flight are answered
    // (long polls are woken first, below), and new requests get 503.
    return503OnClosing: true,
    forceCloseConnections: "idle",
    ajv: {
      // Refuse what the schema does not describe instead of silently dropping or converting it.
      customOptions: { removeAdditional: false, coerceTypes: false, useDefaults: false, allErrors: false },
    },
  });
  if (lh.sessionUrl === undefined) {
    logger.warn(
      'pooling "transaction" without directDatabaseUrl: no LISTEN session, so long-polling claims wake by a once-a-second re-check ' +
        "and remote workers hear cancels at their next heartbeat; set directDatabaseUrl for notifications",
    );
  }
  const cancels = new CancelWaiter();
  const waiter = new ClaimWaiter({
    pool: lh.pool,
    connectionString: lh.sessionUrl,
    channel: store.notifyChannel(lh.schema),
    also: { [store.cancelChannel(lh.schema)]: (payload) => cancels.notice(payload) },
    maxLongPolls: limits.maxLongPolls,
    metrics,
    logger,
  });

  app.register(swagger, {
    openapi: {
      openapi: "3.0.3",
      info: {
        title: "Leasehold server API",
        version: "1",
        description:
          "Remote workers claim, heartbeat and report jobs over this API; operators enqueue and inspect them. " +
          "A claim returns a receipt per job, and every heartbeat and report about that attempt must carry it (a missing or wrong " +
          "receipt refuses that attempt). Every report is fenced by (job id, attempt, worker id): a stale one changes nothing.",
      },
      components: { securitySchemes: { bearerAuth: { type: "http", scheme: "bearer" } } },
    },
  });
  app.setErrorHandler(handleError);
  recordRequests(app, metrics);
  capConnections(
    app.server,
    limits,
    () => metrics.connectionsDropped.inc(),
    () => metrics.idleConnectionsEvicted.inc(),
  );
  app.setNotFoundHandler((request, reply) => {
    reply.status(404).send(errorBody("not_found", `no route ${request.method} ${request.url.split("?")[0]}`));
  });
  const hidesUserData = new WeakSet<FastifyRequest>();
  app.addHook("onRequest", async (request, reply) => {
    const config = request.routeOptions.config;
    if (config?.public) return;
    const scope = scopeOf(request.headers.authorization);
    if (!scope) {
      // Close the connection: whoever sent this gets no further use of it, and node then
      // discards the rest of the body instead of reading it for the next request.
      return reply
        .status(401)
        .header("www-authenticate", "Bearer")
        .header("connection", "close")
        .send(errorBody("unauthorized", "missing or wrong bearer token"));
    }
    // Routes are the operator's unless marked for workers; an unknown route stays a 404.
    if (scope === "worker" && config?.scope !== "worker" && !request.is404) {
      return reply.status(403).send(errorBody("forbidden", "the worker token may only use the /v1/worker/* routes"));
    }
    // The viewer token reads the operator's routes; it never acts as a worker.
    if (scope === "viewer" && config?.scope === "worker") {
      return reply.status(403).send(errorBody("forbidden", "the viewer token may not use the /v1/worker/* routes"));
    }
    // Read-only: whoever holds the operator token here, or the viewer token anywhere, may look, never change.
    const readOnlyCaller = scope === "viewer" || (readOnly && scope === "operator");
    if (readOnlyCaller && request.method !== "GET" && request.method !== "HEAD") {
      return reply
        .status(403)
        .send(
          errorBody(
            "read_only",
            scope === "viewer"
              ? "the viewer token may only read: it changes nothing"
              : "this server is read-only (--dashboard read-only): it changes nothing for the operator token",
          ),
        );
    }
    if (readOnlyCaller && !options.showPayloads) hidesUserData.add(request);
  });
  // What users put in jobs, hidden from read-only callers (unless --show-payloads): see user-data.ts.
  app.addHook("preSerialization", async (request, _reply, payload) => (hidesUserData.has(request) ? hideUserData(payload) : payload));
  const jobWaits = new JobWaits(limits.maxLongPolls);
  // Requests being answered. Once none is left while closing, the connections still open are
  // closed at once: kept-alive ones, and ones a client opened and never sent a request on,
  // which Node does not count as idle (a stopped remote worker leaves those behind).
  let answering = 0;
  let closing = false;
  const closeWhenAnswered = () => {
    if (closing && answering === 0) app.server.closeAllConnections();
  };
  app.server.on("request", (_request, response) => {
    answering++;
    response.once("close", () => {
      answering--;
      closeWhenAnswered();
    });
  });
  app.addHook("preClose", async () => {
    closing = true;
    cancels.close();
    jobWaits.close();
    await waiter.close();
    closeWhenAnswered();
    // Requests still open after a grace period (a client that went silent) are cut: their
    // clients treat that as an ambiguous answer and retry, which the fence makes safe.
    setTimeout(() => app.server.closeAllConnections(), CLOSE_GRACE_MS).unref();
  });
  // Answers given while closing end their connection, or a keep-alive socket freed after
  // close began would hold the server open until its keep-alive timeout.
  app.addHook("onSend", async (_request, reply) => {
    if (waiter.closed) reply.header("connection", "close");
  });

  app.register(async (api) => {
    registerClaimRoute(api, lh, waiter, receipts, limits);
    registerCancelRoute(api, { leasehold: lh, waiter, cancels, receipts, identities, metrics });
    registerWorkerRoutes(api, { leasehold: lh, receipts, identities, metrics, leases: limits, maxResultBytes: limits.maxResultBytes });
    registerJobRoutes(api, lh, jobWaits);
    registerFlowRoutes(api, { leasehold: lh, receipts, metrics, bodyLimitBytes: limits.bodyLimitBytes });
    registerStepRoutes(api, { leasehold: lh, receipts, metrics, bodyLimitBytes: limits.bodyLimitBytes });
    registerEventRoutes(api, lh);
    registerQueueRoutes(api, lh);
    registerCallbackRoutes(api, lh);
    registerMonitorRoutes(api, lh, { sampleIntervalMs: options.sampleIntervalMs });
    if (dashboard !== "off") registerDashboard(api, dashboard);
    api.get("/metrics", { schema: routes.metrics }, async (_request, reply) => {
      const registry = lh.metrics.registry;
      return reply.type(registry.contentType).send(await registry.metrics());
    });
    api.get("/openapi.json", { schema: routes.openapi }, async () => app.swagger());
    api.get("/v1/worker/check", { schema: routes.workerCheck, config: { scope: "worker" } }, async (request) => ({
      scope: scopeOf(request.headers.authorization),
    }));
    api.get("/healthz", { schema: routes.health, config: { public: true } }, async () => {
      await lh.pool.query("SELECT 1");
      return { ok: true };
    });
  });
  return app;
}
