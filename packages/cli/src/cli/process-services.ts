/**
 * What every long-running command can add to its process: a Prometheus scrape endpoint
 * (`--metrics-port`, off by default), retention (on by default for `worker` and `serve`,
 * so history stays bounded in a deployment that is only the CLI) and the scheduler (on by
 * default in `worker`, `serve` and `watchdog`, so schedules run whichever of them a
 * deployment has).
 */
import http from "node:http";
import type { Command } from "commander";
import type { Leasehold } from "leasehold/internal/client";
import { DEFAULT_RETAIN_DEAD_MS, DEFAULT_RETAIN_EVENTS_MS, DEFAULT_RETAIN_MS } from "leasehold/internal/maintenance/retention";
import type { Cli } from "./context.js";
import { CliError } from "./errors.js";
import { duration, int } from "./parse.js";

export interface MetricsFlags {
  metricsPort?: number;
  metricsHost: string;
}

export interface RetentionFlags {
  retention: boolean;
  retain?: number;
  retainDead?: number;
  retainEvents?: number;
}

export interface SchedulerFlags {
  scheduler: boolean;
}

export function schedulerOptions(command: Command): Command {
  return command.option("--no-scheduler", "do not enqueue the jobs of due schedules from this process");
}

/** Runs the scheduler in this process unless --no-scheduler; it stops with the command. */
export function startScheduler(cli: Cli, lh: Leasehold, flags: SchedulerFlags): void {
  if (!flags.scheduler) return;
  const scheduler = lh.scheduler().start();
  cli.onClose(() => scheduler.stop());
}

export function metricsOptions(command: Command): Command {
  return command
    .option(
      "--metrics-port <port>",
      "serve Prometheus metrics at http://<metrics-host>:<port>/metrics (off by default)",
      int("--metrics-port", 0, 65535),
    )
    .option("--metrics-host <host>", "interface for --metrics-port", "127.0.0.1");
}

export function retentionOptions(command: Command): Command {
  return command
    .option("--retain <duration>", `keep finished jobs this long (default ${DEFAULT_RETAIN_MS / 3_600_000}h)`, duration("--retain"))
    .option("--retain-dead <duration>", `keep dead jobs this long (default ${DEFAULT_RETAIN_DEAD_MS / 86_400_000}d)`, duration("--retain-dead"))
    .option(
      "--retain-events <duration>",
      `keep events (sendEvent) this long: a wait that begins later still receives one sent within it (default ${DEFAULT_RETAIN_EVENTS_MS / 86_400_000}d)`,
      duration("--retain-events"),
    )
    .option("--no-retention", "do not delete old finished jobs from this process");
}

/** Starts the scrape endpoint if asked for; it stops with the command. Returns its URL. */
export async function startMetricsServer(cli: Cli, lh: Pick<Leasehold, "metrics">, flags: MetricsFlags): Promise<string | undefined> {
  if (flags.metricsPort === undefined) return undefined;
  const registry = lh.metrics.registry;
  const server = http.createServer((request, response) => {
    if (request.method !== "GET" || request.url?.split("?")[0] !== "/metrics") {
      response.writeHead(404).end("only GET /metrics here\n");
      return;
    }
    registry.metrics().then(
      (text) => response.writeHead(200, { "content-type": registry.contentType }).end(text),
      () => response.writeHead(500).end(),
    );
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", (err: NodeJS.ErrnoException) =>
      reject(err.code === "EADDRINUSE" ? new CliError(`--metrics-port ${flags.metricsPort} on ${flags.metricsHost} is in use`) : err),
    );
    server.listen(flags.metricsPort, flags.metricsHost, () => resolve());
  });
  cli.onClose(() => new Promise((resolve) => server.close(() => resolve())));
  const address = server.address();
  const port = typeof address === "object" && address ? address.port : flags.metricsPort;
  return `http://${flags.metricsHost.includes(":") ? `[${flags.metricsHost}]` : flags.metricsHost}:${port}/metrics`;
}

/** Runs retention in this process unless --no-retention; it stops with the command. */
export function startRetention(cli: Cli, lh: Leasehold, flags: RetentionFlags): void {
  if (!flags.retention) return;
  const retention = lh.retention({ retainMs: flags.retain, retainDeadMs: flags.retainDead, retainEventsMs: flags.retainEvents }).start();
  cli.onClose(() => retention.stop());
}
