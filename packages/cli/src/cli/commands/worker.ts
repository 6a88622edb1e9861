/** `leasehold worker`: run a tasks module's handlers on jobs, from the database or from a server. */
import type { Command } from "commander";
import { RemoteTransport } from "leasehold/internal/worker/remote-transport";
import { Worker } from "leasehold/internal/worker/worker";
import type { Run } from "../context.js";
import { CliError } from "../errors.js";
import { printJobEvents } from "../job-events.js";
import { bufferedLines } from "../line-buffer.js";
import { int, limitOrNone, list, noneAsNull } from "../parse.js";
import {
  metricsOptions,
  retentionOptions,
  schedulerOptions,
  startMetricsServer,
  startRetention,
  type MetricsFlags,
  type RetentionFlags,
  type SchedulerFlags,
} from "../process-services.js";
import { loadTasks } from "../tasks.js";
import { untilSignal } from "../signals.js";
import { MAX_RESULT_BYTES_LIMIT } from "leasehold/internal/jobs/validate";

interface WorkerFlags extends MetricsFlags, RetentionFlags, SchedulerFlags {
  nats?: string;
  tasks: string;
  concurrency?: number;
  queues?: string[];
  name?: string;
  waitForName?: boolean;
  lease?: number;
  maxRun?: number | "none";
  maxResultBytes?: number;
  heartbeatInterval?: number;
  livenessGrace?: number;
  liveness: boolean;
  pollInterval?: number;
  watchdogInterval?: number;
  server?: string;
  token?: string;
  watchdog: boolean;
}

export function registerWorker(program: Command, run: Run): void {
  const worker = program
    .command("worker")
    .description("run the handlers of a tasks module on jobs, from the database or from a server")
    .requiredOption("--tasks <file>", "module whose default export maps task names to handlers (.ts or .js)")
    .option("--concurrency <n>", "jobs at once (default 10)", int("--concurrency", 1, 10_000))
    .option("--queues <a,b>", "queues to take jobs from (default: default)", list("--queues"))
    .option(
      "--name <name>",
      "stable worker name (e.g. the pod name): one live process at a time may hold it; at start, jobs an earlier (dead) process of the name held are recovered",
    )
    .option("--wait-for-name", "if another live process holds --name, wait for it to end instead of exiting")
    .option("--lease <ms>", "lease length in ms (default 30000)", int("--lease", 1000, 86_400_000))
    .option(
      "--max-run <duration|none>",
      "maximum run time of tasks that set none, e.g. 1h; none: no limit (default 15m; a task's or job's own wins)",
      limitOrNone("--max-run"),
    )
    .option(
      "--max-result-bytes <bytes>",
      "largest result (a handler's return value, as JSON) kept; a larger one ends its job dead (default 65536)",
      int("--max-result-bytes", 1, MAX_RESULT_BYTES_LIMIT),
    )
    .option(
      "--heartbeat-interval <ms>",
      "how often leases are renewed (default: a third of the lease, at most 10000)",
      int("--heartbeat-interval", 100, 86_400_000),
    )
    .option(
      "--liveness-grace <ms>",
      "how long this worker's database session may be gone before the watchdog recovers its jobs; the worker aborts them after half of it unless the session is back (default 1000)",
      int("--liveness-grace", 200, 86_400_000),
    )
    .option("--no-liveness", "no liveness session: jobs are recovered only when their leases run out (for flaky networks; slower crash recovery)")
    .option(
      "--poll-interval <ms>",
      "how often an idle worker looks for jobs when no wake-up arrives (default 1000)",
      int("--poll-interval", 10, 3_600_000),
    )
    .option(
      "--watchdog-interval <ms>",
      "how often this process's watchdog reaps expired leases (default 2000)",
      int("--watchdog-interval", 100, 3_600_000),
    )
    .option("--server <url>", "take jobs from a `leasehold serve` at this URL instead of the database (default: LEASEHOLD_SERVER_URL)")
    .option("--token <token>", "the server's API token (default: LEASEHOLD_WORKER_TOKEN, else LEASEHOLD_TOKEN)")
    .option("--no-watchdog", "do not run a watchdog in this process (database mode)")
    .option("--nats <url>", "NATS JetStream dispatch (docs/nats.md), e.g. nats://127.0.0.1:4222 (default: LEASEHOLD_NATS_URL; none: polling only)");
  schedulerOptions(retentionOptions(metricsOptions(worker))).action(
    run(async (cli, opts: WorkerFlags) => {
      const { file, handlers } = await loadTasks(opts.tasks);
      const settings = {
        handlers,
        ...(opts.concurrency !== undefined && { concurrency: opts.concurrency }),
        ...(opts.queues !== undefined && { queues: opts.queues }),
        ...(opts.name !== undefined && { name: opts.name }),
        ...(opts.waitForName && { waitForName: true }),
        ...(opts.lease !== undefined && { leaseMs: opts.lease }),
        ...(opts.maxRun !== undefined && { maxRunMs: noneAsNull(opts.maxRun) }),
        ...(opts.maxResultBytes !== undefined && { maxResultBytes: opts.maxResultBytes }),
        ...(opts.heartbeatInterval !== undefined && { heartbeatMs: opts.heartbeatInterval }),
        ...(opts.pollInterval !== undefined && { pollIntervalMs: opts.pollInterval }),
        ...(opts.livenessGrace !== undefined && { livenessGraceMs: opts.livenessGrace }),
        ...(!opts.liveness && { livenessGraceMs: null }),
      };
      const logger = cli.logger("info");
      const serverUrl = opts.server ?? cli.serverUrl;
      let worker: Worker;
      let nats = false;
      let metrics: Pick<Worker, "metrics">;
      if (serverUrl) {
        // A worker host needs only the worker token; the operator token works too.
        const token = opts.token ?? cli.options.token ?? (process.env.LEASEHOLD_WORKER_TOKEN || undefined) ?? cli.token;
        if (!token) throw new CliError("a remote worker needs the server's token: set LEASEHOLD_WORKER_TOKEN (or LEASEHOLD_TOKEN) or pass --token");
        const transport = new RemoteTransport({ serverUrl, token });
        await transport.check();
        worker = new Worker({ ...settings, logger, transport });
        metrics = worker;
      } else {
        cli.useNats(opts.nats);
        const lh = await cli.connect({ logger, graceful: true });
        nats = lh.nats !== undefined;
        worker = lh.worker({ ...settings, watchdog: opts.watchdog && { intervalMs: opts.watchdogInterval }, scheduler: opts.scheduler });
        startRetention(cli, lh, opts);
        metrics = lh;
      }
      const metricsUrl = await startMetricsServer(cli, metrics, opts);
      const out = bufferedLines((chunk) => process.stdout.write(chunk));
      printJobEvents(worker, out.line, cli.json, out.urgent);
      // Another process that took this worker's name (while its session was gone) stops it: the
      // command then exits with that error, so a supervisor sees it instead of an idle process.
      const identityLost = new Promise<Error>((resolve) => worker.once("identity:lost", resolve));
      await worker.start();
      cli.onClose(() => worker.stop());
      cli.result(
        {
          worker: worker.id,
          tasks: Object.keys(handlers),
          source: serverUrl ?? (nats ? "database, NATS dispatch" : "database"),
          metrics: metricsUrl ?? null,
        },
        () =>
          `worker ${worker.id} running ${Object.keys(handlers).join(", ")} from ${file} (${serverUrl ? `server ${serverUrl}` : nats ? "database, NATS dispatch" : "database"})` +
          `${metricsUrl ? `; metrics at ${metricsUrl}` : ""}; Ctrl-C stops it gracefully`,
      );
      const stopped = await Promise.race([untilSignal(cli, "stopping the worker: running jobs may finish, the rest are released"), identityLost]);
      await worker.stop();
      if (stopped instanceof Error) throw stopped;
    }),
  );
}
