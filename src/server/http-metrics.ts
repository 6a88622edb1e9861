/**
 * Request metrics for the server, on the same registry as the queue's: requests by route
 * pattern (never the raw URL, which would make a label per job id), method and status, and
 * their duration. Claims are long polls: their duration includes the wait.
 */
import type { FastifyInstance } from "fastify";
import { Counter, Histogram, type Registry } from "prom-client";

function counter(registry: Registry): Counter<"route" | "method" | "status"> {
  const name = "leasehold_http_requests_total";
  return (registry.getSingleMetric(name) as Counter<"route" | "method" | "status"> | undefined) ??
    new Counter({ name, help: "HTTP requests to the server, by route, method and status.", labelNames: ["route", "method", "status"], registers: [registry] });
}

function histogram(registry: Registry): Histogram<"route"> {
  const name = "leasehold_http_request_duration_seconds";
  return (registry.getSingleMetric(name) as Histogram<"route"> | undefined) ??
    new Histogram({
      name,
      help: "HTTP request duration, by route (claims include their long-poll wait).",
      labelNames: ["route"],
      buckets: [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30],
      registers: [registry],
    });
}

export function recordRequests(app: FastifyInstance, registry: Registry): void {
  const requests = counter(registry);
  const duration = histogram(registry);
  app.addHook("onResponse", async (request, reply) => {
    const route = request.routeOptions.url ?? "unmatched";
    requests.inc({ route, method: request.method, status: String(reply.statusCode) });
    duration.observe({ route }, reply.elapsedTime / 1000);
  });
}
