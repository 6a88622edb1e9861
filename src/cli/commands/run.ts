/** The long-running commands: `migrate`, `serve`, `worker`, `watchdog`. */
import type { Command } from "commander";
import type { Logger } from "pino";
import type { Leasehold } from "../../client.js";
import { DEFAULT_WATCHDOG_INTERVAL_MS } from "../../maintenance/watchdog.js";
import { checkToken } from "../../server/auth.js";
import { RemoteTransport } from "../../worker/remote-transport.js";
import { Worker } from "../../worker/worker.js";
import type { Cli, Run } from "../context.js";
import { CliError } from "../errors.js";
import { printJobEvents } from "../job-events.js";
import { int, list } from "../parse.js";
import { loadTasks } from "../tasks.js";
import { untilSignal } from "../signals.js";

export const DEFAULT_PORT = 7070;

export function registerRunCommands(program: Command, run: Run): void {
  program
    .command("migrate")
    .description("create or upgrade Leasehold's tables in the schema")
    .action(
      run(async (cli) => {
        const lh = await cli.connect();
        cli.result({ schema: lh.schema, migrated: true }, () => `schema ${lh.schema} is up to date`);
      }),
    );

  program
    .command("serve")
    .description("run the HTTP API for remote workers and operators (plus a watchdog)")
    .option("--host <host>", "interface to listen on", "127.0.0.1")
    .option("--port <port>", `TCP port (0 picks a free one)`, int("--port", 0, 65535), DEFAULT_PORT)
    .option("--token <token>", "operator API token: every route (default: LEASEHOLD_TOKEN)")
    .option("--worker-token <token>", "a second token that may only use the workers' routes /v1/worker/* (default: LEASEHOLD_WORKER_TOKEN)")
    .option("--receipt-key <secret>", "secret for the claim receipts' key; the same on every replica (default: LEASEHOLD_RECEIPT_KEY, else derived from the operator token)")
    .option("--body-limit <bytes>", "largest request body (default 4 MiB)", int("--body-limit", 1024, 256 * 1024 * 1024))
    .option("--request-timeout <ms>", "a request's headers and body must arrive within this (default 30000)", int("--request-timeout", 100, 600_000))
    .option("--keep-alive-timeout <ms>", "close a kept-alive connection idle this long (default 10000)", int("--keep-alive-timeout", 100, 600_000))
    .option("--max-connections <n>", "close connections beyond this many as they arrive (default 1000)", int("--max-connections", 1, 1_000_000))
    .option("--max-long-polls <n>", "claims that may wait for jobs at once; beyond, a claim answers at once (default 500)", int("--max-long-polls", 0, 1_000_000))
    .option("--no-watchdog", "do not reap expired leases in this process")
    .option("--watchdog-interval <ms>", "how often the watchdog looks for expired leases", int("--watchdog-interval", 100, 3_600_000))
    .action(
      run(async (cli, opts: ServeOptions) => {
        const token = opts.token ?? cli.token;
        if (!token) throw new CliError("serve needs an API token: set LEASEHOLD_TOKEN or pass --token");
        const workerToken = opts.workerToken ?? (process.env.LEASEHOLD_WORKER_TOKEN || undefined);
        const receiptKey = opts.receiptKey ?? (process.env.LEASEHOLD_RECEIPT_KEY || undefined);
        // Before connecting: a bad token should not cost a database start.
        checkToken(token);
        if (workerToken !== undefined) checkToken(workerToken, "the worker token", "LEASEHOLD_WORKER_TOKEN or pass --worker-token");
        if (workerToken === token) throw new CliError("the worker token must differ from the operator token");
        if (receiptKey !== undefined) checkToken(receiptKey, "the receipt key", "LEASEHOLD_RECEIPT_KEY or pass --receipt-key");
        const logger = cli.logger("info");
        const lh = await cli.connect({ logger, poolSize: 20 });
        const url = await startServer(cli, lh, { ...opts, token, workerToken, receiptKey, logger });
        cli.result({ listening: url, schema: lh.schema, watchdog: opts.watchdog }, () => `Leasehold server listening on ${url} (schema ${lh.schema}${opts.watchdog ? ", with a watchdog" : ""})`);
        await untilSignal(cli, "stopping the server");
      }),
    );

  program
    .command("worker")
    .description("run the handlers of a tasks module on jobs, from the database or from a server")
    .requiredOption("--tasks <file>", "module whose default export maps task names to handlers (.ts or .js)")
    .option("--concurrency <n>", "jobs at once (default 10)", int("--concurrency", 1, 10_000))
    .option("--queues <a,b>", "queues to take jobs from (default: default)", list("--queues"))
    .option("--name <name>", "stable worker name (e.g. the pod name): on start, jobs still held by an earlier process of this name are released")
    .option("--lease <ms>", "lease length in ms (default 30000)", int("--lease", 1000, 86_400_000))
    .option("--server <url>", "take jobs from a `leasehold serve` at this URL instead of the database (default: LEASEHOLD_SERVER_URL)")
    .option("--token <token>", "the server's API token (default: LEASEHOLD_WORKER_TOKEN, else LEASEHOLD_TOKEN)")
    .option("--no-watchdog", "do not run a watchdog in this process (database mode)")
    .action(
      run(async (cli, opts: { tasks: string; concurrency?: number; queues?: string[]; name?: string; lease?: number; server?: string; token?: string; watchdog: boolean }) => {
        const { file, handlers } = await loadTasks(opts.tasks);
        const settings = {
          handlers,
          ...(opts.concurrency !== undefined && { concurrency: opts.concurrency }),
          ...(opts.queues !== undefined && { queues: opts.queues }),
          ...(opts.name !== undefined && { name: opts.name }),
          ...(opts.lease !== undefined && { leaseMs: opts.lease }),
        };
        const logger = cli.logger("info");
        const serverUrl = opts.server ?? cli.serverUrl;
        let worker: Worker;
        if (serverUrl) {
          // A worker host needs only the worker token; the operator token works too.
          const token = opts.token ?? cli.options.token ?? (process.env.LEASEHOLD_WORKER_TOKEN || undefined) ?? cli.token;
          if (!token) throw new CliError("a remote worker needs the server's token: set LEASEHOLD_WORKER_TOKEN (or LEASEHOLD_TOKEN) or pass --token");
          const transport = new RemoteTransport({ serverUrl, token });
          await transport.check();
          worker = new Worker({ ...settings, logger, transport });
        } else {
          const lh = await cli.connect({ logger });
          worker = lh.worker({ ...settings, watchdog: opts.watchdog });
        }
        printJobEvents(worker, (line) => process.stdout.write(line + "\n"), cli.json);
        await worker.start();
        cli.result({ worker: worker.id, tasks: Object.keys(handlers), source: serverUrl ?? "database" }, () =>
          `worker ${worker.id} running ${Object.keys(handlers).join(", ")} from ${file} (${serverUrl ? `server ${serverUrl}` : "database"}); Ctrl-C stops it gracefully`,
        );
        await untilSignal(cli, "stopping the worker: running jobs may finish, the rest are released");
        await worker.stop();
      }),
    );

  program
    .command("watchdog")
    .description("reap expired leases (jobs of crashed or cut-off workers) until stopped")
    .option("--interval <ms>", "how often to look", int("--interval", 100, 3_600_000), DEFAULT_WATCHDOG_INTERVAL_MS)
    .option("--once", "reap once, print what was done and exit")
    .action(
      run(async (cli, opts: { interval: number; once?: boolean }) => {
        const logger = cli.logger("info");
        const lh = await cli.connect({ logger });
        const watchdog = lh.watchdog({ intervalMs: opts.interval });
        if (opts.once) {
          const summary = await watchdog.runOnce();
          cli.result(summary, () => `reaped: ${summary.retried} to retry, ${summary.dead} dead, ${summary.cancelled} cancelled`);
          return;
        }
        watchdog.start();
        cli.note(`watchdog running every ${opts.interval} ms; Ctrl-C stops it`);
        await untilSignal(cli, "stopping the watchdog");
        await watchdog.stop();
      }),
    );
}

interface ServeOptions {
  host: string;
  port: number;
  token?: string;
  workerToken?: string;
  receiptKey?: string;
  bodyLimit?: number;
  requestTimeout?: number;
  keepAliveTimeout?: number;
  maxConnections?: number;
  maxLongPolls?: number;
  watchdog: boolean;
  watchdogInterval?: number;
}

export async function startServer(cli: Cli, lh: Leasehold, opts: Omit<ServeOptions, "token"> & { token: string; logger: Logger }): Promise<string> {
  // Loaded here, not at the top: the other commands should not pay for fastify's start-up.
  const { createServer } = await import("../../server/app.js");
  const app = createServer({
    leasehold: lh,
    token: opts.token,
    workerToken: opts.workerToken,
    receiptKey: opts.receiptKey,
    limits: {
      bodyLimitBytes: opts.bodyLimit,
      requestTimeoutMs: opts.requestTimeout,
      keepAliveTimeoutMs: opts.keepAliveTimeout,
      maxConnections: opts.maxConnections,
      maxLongPolls: opts.maxLongPolls,
    },
  });
  const watchdog = opts.watchdog ? lh.watchdog({ intervalMs: opts.watchdogInterval }).start() : undefined;
  try {
    await app.listen({ host: opts.host, port: opts.port });
  } catch (err) {
    await watchdog?.stop();
    const code = (err as NodeJS.ErrnoException).code;
    if (code === "EADDRINUSE") throw new CliError(`port ${opts.port} on ${opts.host} is in use; choose another with --port (0 picks a free one)`);
    if (code === "EADDRNOTAVAIL" || code === "ENOTFOUND") throw new CliError(`cannot listen on ${opts.host}: no such local address`);
    throw err;
  }
  cli.onClose(async () => {
    await watchdog?.stop();
    await app.close();
  });
  const address = app.server.address();
  const port = typeof address === "object" && address ? address.port : opts.port;
  const host = opts.host.includes(":") ? `[${opts.host}]` : opts.host;
  return `http://${host}:${port}`;
}
