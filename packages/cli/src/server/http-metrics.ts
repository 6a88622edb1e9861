/**
 * The server's own metrics, on the same registry as the queue's: requests by route pattern
 * (never the raw URL, which would make a label per job id or unknown path), method and
 * status, and their duration; plus what the limits refused. Claims are long polls: their
 * duration includes the wait. No label carries a name a client chose (a queue, a worker).
 */
import type { FastifyInstance } from "fastify";
import { Counter, Gauge, Histogram, type Registry } from "prom-client";
import type { MetricsRegistry } from "leasehold";

export interface ServerMetrics {
  requests: Counter<"route" | "method" | "status">;
  duration: Histogram<"route">;
  connectionsDropped: Counter;
  idleConnectionsEvicted: Counter;
  longPollsWaiting: Gauge;
  longPollsRefused: Counter;
  invalidReceipts: Counter<"kind">;
  invalidBeats: Counter;
}

const cache = new WeakMap<MetricsRegistry, ServerMetrics>();

/** One set per registry, so several servers in one process (tests) share them. */
export function serverMetrics(registry: MetricsRegistry): ServerMetrics {
  const existing = cache.get(registry);
  if (existing) return existing;
  // The queue's registry is a prom-client one: the library names it only by shape.
  const registers = [registry as Registry];
  const m: ServerMetrics = {
    requests: new Counter({
      name: "leasehold_http_requests_total",
      help: "HTTP requests to the server, by route, method and status.",
      labelNames: ["route", "method", "status"],
      registers,
    }),
    duration: new Histogram({
      name: "leasehold_http_request_duration_seconds",
      help: "HTTP request duration, by route (claims include their long-poll wait).",
      labelNames: ["route"],
      buckets: [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30],
      registers,
    }),
    connectionsDropped: new Counter({
      name: "leasehold_server_connections_dropped_total",
      help: "Connections closed on arrival because the server had --max-connections open.",
      registers,
    }),
    idleConnectionsEvicted: new Counter({
      name: "leasehold_server_idle_connections_evicted_total",
      help: "Idle connections (none of their requests being answered) closed because their client address opened more than --max-idle-per-address.",
      registers,
    }),
    longPollsWaiting: new Gauge({
      name: "leasehold_server_long_polls_waiting",
      help: "Long polls waiting now: claims waiting for a job, and remote workers' cancel polls.",
      registers,
    }),
    longPollsRefused: new Counter({
      name: "leasehold_server_long_polls_refused_total",
      help: "Long polls (claims, cancel polls) answered at once instead of waiting, because --max-long-polls were already waiting.",
      registers,
    }),
    invalidReceipts: new Counter({
      name: "leasehold_server_invalid_receipts_total",
      help: "Attempts refused because their claim receipt was missing or wrong, by request kind.",
      labelNames: ["kind"],
      registers,
    }),
    invalidBeats: new Counter({
      name: "leasehold_server_invalid_beats_total",
      help: "Heartbeats refused one by one because their progress or checkpoint could not be stored.",
      registers,
    }),
  };
  cache.set(registry, m);
  return m;
}

export function recordRequests(app: FastifyInstance, metrics: ServerMetrics): void {
  app.addHook("onResponse", async (request, reply) => {
    const route = request.routeOptions.url ?? "unmatched";
    metrics.requests.inc({ route, method: request.method, status: String(reply.statusCode) });
    metrics.duration.observe({ route }, reply.elapsedTime / 1000);
  });
}
