/** `leasehold serve`: the HTTP API for remote workers and operators and the dashboard, with a watchdog and retention. */
import type { Command } from "commander";
import type { Logger } from "pino";
import type { Leasehold } from "leasehold/internal/client";
import { checkToken } from "../../server/auth.js";
import { DEFAULT_SAMPLE_INTERVAL_MS, ThroughputSampler } from "leasehold/internal/maintenance/throughput";
import { DASHBOARD_MODES, type DashboardMode } from "../../server/dashboard-mode.js";
import { DEFAULT_MAX_LEASE_MS, DEFAULT_MIN_LEASE_MS } from "../../server/limits.js";
import { MAX_RESULT_BYTES_LIMIT } from "leasehold/internal/jobs/validate";
import type { Cli, Run } from "../context.js";
import { CliError } from "../errors.js";
import { int } from "../parse.js";
import { retentionOptions, schedulerOptions, startRetention, startScheduler, type RetentionFlags, type SchedulerFlags } from "../process-services.js";
import { untilSignal } from "../signals.js";
import { unknownTasksOption } from "../unknown-tasks.js";
import type { UnknownTasksMode } from "leasehold/internal/jobs/known-tasks";

export const DEFAULT_PORT = 7070;

export function registerServe(program: Command, run: Run): void {
  const serve = program
    .command("serve")
    .description("run the HTTP API for remote workers and operators and the dashboard (plus a watchdog)")
    .option("--host <host>", "interface to listen on", "127.0.0.1")
    .option("--port <port>", `TCP port (0 picks a free one)`, int("--port", 0, 65535), DEFAULT_PORT)
    .option("--token <token>", "operator API token: every route (default: LEASEHOLD_TOKEN)")
    .option("--worker-token <token>", "a second token that may only use the workers' routes /v1/worker/* (default: LEASEHOLD_WORKER_TOKEN)")
    .option(
      "--viewer-token <token>",
      "a third token that may only read, and is shown no payloads: for a read-only dashboard's audience (default: LEASEHOLD_VIEWER_TOKEN)",
    )
    .option(
      "--receipt-key <secret>",
      "secret for the claim receipts' key; the same on every replica (default: LEASEHOLD_RECEIPT_KEY, else derived from the operator token)",
    )
    .option("--body-limit <bytes>", "largest request body (default 4 MiB)", int("--body-limit", 1024, 256 * 1024 * 1024))
    .option("--request-timeout <ms>", "a request's headers and body must arrive within this (default 30000)", int("--request-timeout", 100, 600_000))
    .option(
      "--headers-timeout <ms>",
      "close a connection that sent no complete request headers within this (default 5000)",
      int("--headers-timeout", 100, 600_000),
    )
    .option("--keep-alive-timeout <ms>", "close a kept-alive connection idle this long (default 10000)", int("--keep-alive-timeout", 100, 600_000))
    .option("--max-connections <n>", "close connections beyond this many as they arrive (default 1000)", int("--max-connections", 1, 1_000_000))
    .option(
      "--max-idle-per-address <n>",
      "idle connections (no request being answered) one client address may hold; more close its oldest (default 64)",
      int("--max-idle-per-address", 1, 1_000_000),
    )
    .option(
      "--max-long-polls <n>",
      "claims that may wait for jobs at once; beyond, a claim answers at once (default 500)",
      int("--max-long-polls", 0, 1_000_000),
    )
    .option("--min-lease <ms>", `shortest lease a remote worker may ask for (default ${DEFAULT_MIN_LEASE_MS})`, int("--min-lease", 1_000, 86_400_000))
    .option("--max-lease <ms>", `longest lease a remote worker may ask for (default ${DEFAULT_MAX_LEASE_MS})`, int("--max-lease", 1_000, 86_400_000))
    .option(
      "--dashboard <mode>",
      "the dashboard at / : on, read-only (the operator token may only read: for wide audiences) or off",
      dashboardMode,
      "on" as DashboardMode,
    )
    .option(
      "--show-payloads",
      "show payloads, results, checkpoints, progress and errors to read-only callers too (the viewer token; all under --dashboard read-only)",
    )
    .option(
      "--max-result-bytes <bytes>",
      "largest result (a handler's return value, as JSON) a remote worker may report; a larger one ends its job dead (default 65536)",
      int("--max-result-bytes", 1, MAX_RESULT_BYTES_LIMIT),
    )
    .option("--no-watchdog", "do not run a watchdog (recovery) in this process")
    .option("--nats <url>", "NATS JetStream dispatch (docs/nats.md), e.g. nats://127.0.0.1:4222 (default: LEASEHOLD_NATS_URL; none: polling only)")
    .option(
      "--watchdog-interval <ms>",
      "how often the watchdog reaps expired leases (crash detection runs more often)",
      int("--watchdog-interval", 100, 3_600_000),
    );
  schedulerOptions(retentionOptions(unknownTasksOption(serve))).action(
    run(async (cli, opts: ServeFlags) => {
      const token = opts.token ?? cli.token;
      if (!token) throw new CliError("serve needs an API token: set LEASEHOLD_TOKEN or pass --token");
      const workerToken = opts.workerToken ?? (process.env.LEASEHOLD_WORKER_TOKEN || undefined);
      const receiptKey = opts.receiptKey ?? (process.env.LEASEHOLD_RECEIPT_KEY || undefined);
      const viewerToken = opts.viewerToken ?? (process.env.LEASEHOLD_VIEWER_TOKEN || undefined);
      // Before connecting: a bad token should not cost a database start.
      checkToken(token);
      if (workerToken !== undefined) checkToken(workerToken, "the worker token", "LEASEHOLD_WORKER_TOKEN or pass --worker-token");
      if (workerToken === token) throw new CliError("the worker token must differ from the operator token");
      if (receiptKey !== undefined) checkToken(receiptKey, "the receipt key", "LEASEHOLD_RECEIPT_KEY or pass --receipt-key");
      if (viewerToken !== undefined) checkToken(viewerToken, "the viewer token", "LEASEHOLD_VIEWER_TOKEN or pass --viewer-token");
      if (viewerToken !== undefined && (viewerToken === token || viewerToken === workerToken))
        throw new CliError("the viewer token must differ from the operator and worker tokens");
      const logger = cli.logger("info");
      cli.useNats(opts.nats);
      // The server's enqueue routes warn about (or refuse) tasks no worker runs, as this says.
      cli.unknownTasks = opts.unknownTasks;
      const lh = await cli.connect({ logger, poolSize: 20, graceful: true });
      const url = await startServer(cli, lh, { ...opts, token, workerToken, viewerToken, receiptKey, logger });
      startRetention(cli, lh, opts);
      startScheduler(cli, lh, opts);
      const dashboard = opts.dashboard === "off" ? null : `${url}/`;
      cli.result(
        { listening: url, schema: lh.schema, watchdog: opts.watchdog, dashboard, dashboardMode: opts.dashboard },
        () =>
          `Leasehold server listening on ${url} (schema ${lh.schema}${opts.watchdog ? ", with a watchdog" : ""})` +
          (dashboard ? `; dashboard at ${dashboard}${opts.dashboard === "read-only" ? " (read-only)" : ""}` : ""),
      );
      await untilSignal(cli, "stopping the server");
    }),
  );
}

interface ServeOptions {
  host: string;
  port: number;
  token?: string;
  workerToken?: string;
  viewerToken?: string;
  receiptKey?: string;
  showPayloads?: boolean;
  bodyLimit?: number;
  requestTimeout?: number;
  headersTimeout?: number;
  keepAliveTimeout?: number;
  maxConnections?: number;
  maxIdlePerAddress?: number;
  maxLongPolls?: number;
  minLease?: number;
  maxLease?: number;
  maxResultBytes?: number;
  watchdog: boolean;
  watchdogInterval?: number;
  /** Default "on". */
  dashboard?: DashboardMode;
}

/** Parses --dashboard (serve and dev). */
export function dashboardMode(value: string): DashboardMode {
  if (!DASHBOARD_MODES.includes(value as DashboardMode)) {
    throw new CliError(`--dashboard must be one of ${DASHBOARD_MODES.join(", ")} (got ${JSON.stringify(value)})`);
  }
  return value as DashboardMode;
}

type ServeFlags = ServeOptions & RetentionFlags & SchedulerFlags & { nats?: string; unknownTasks?: UnknownTasksMode };

export async function startServer(cli: Cli, lh: Leasehold, opts: Omit<ServeOptions, "token"> & { token: string; logger: Logger }): Promise<string> {
  // Loaded here, not at the top: the other commands should not pay for fastify's start-up.
  const { createServer } = await import("../../server/app.js");
  const app = createServer({
    leasehold: lh,
    token: opts.token,
    workerToken: opts.workerToken,
    viewerToken: opts.viewerToken,
    showPayloads: opts.showPayloads,
    receiptKey: opts.receiptKey,
    dashboard: opts.dashboard,
    sampleIntervalMs: DEFAULT_SAMPLE_INTERVAL_MS,
    limits: {
      bodyLimitBytes: opts.bodyLimit,
      requestTimeoutMs: opts.requestTimeout,
      headersTimeoutMs: opts.headersTimeout,
      keepAliveTimeoutMs: opts.keepAliveTimeout,
      maxConnections: opts.maxConnections,
      maxIdlePerAddress: opts.maxIdlePerAddress,
      maxLongPolls: opts.maxLongPolls,
      minLeaseMs: opts.minLease,
      maxLeaseMs: opts.maxLease,
      maxResultBytes: opts.maxResultBytes,
    },
  });
  const watchdog = opts.watchdog ? lh.watchdog({ intervalMs: opts.watchdogInterval }).start() : undefined;
  // The dashboard's throughput chart reads the samples this stores (a few statements a minute).
  const sampler =
    opts.dashboard === "off" ? undefined : new ThroughputSampler(lh.pool, opts.logger, { intervalMs: DEFAULT_SAMPLE_INTERVAL_MS }).start();
  try {
    await app.listen({ host: opts.host, port: opts.port });
  } catch (err) {
    await watchdog?.stop();
    await sampler?.stop();
    const code = (err as NodeJS.ErrnoException).code;
    if (code === "EADDRINUSE") throw new CliError(`port ${opts.port} on ${opts.host} is in use; choose another with --port (0 picks a free one)`);
    if (code === "EADDRNOTAVAIL" || code === "ENOTFOUND") throw new CliError(`cannot listen on ${opts.host}: no such local address`);
    throw err;
  }
  cli.onClose(async () => {
    await watchdog?.stop();
    await sampler?.stop();
    await app.close();
  });
  const address = app.server.address();
  const port = typeof address === "object" && address ? address.port : opts.port;
  const host = opts.host.includes(":") ? `[${opts.host}]` : opts.host;
  return `http://${host}:${port}`;
}
