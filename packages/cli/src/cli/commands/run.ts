/** `leasehold migrate` and `leasehold watchdog`. */
import type { Command } from "commander";
import { DEFAULT_LIVENESS_INTERVAL_MS, DEFAULT_WATCHDOG_INTERVAL_MS } from "leasehold/internal/maintenance/watchdog";
import type { Run } from "../context.js";
import { int } from "../parse.js";
import { metricsOptions, schedulerOptions, startMetricsServer, startScheduler, type MetricsFlags, type SchedulerFlags } from "../process-services.js";
import { untilSignal } from "../signals.js";

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

  const watchdog = program
    .command("watchdog")
    .description("recover the jobs of crashed, hung or cut-off workers (expired leases, lost workers, stalls) until stopped")
    .option(
      "--interval <ms>",
      "how often to reap expired leases and overdue attempts",
      int("--interval", 100, 3_600_000),
      DEFAULT_WATCHDOG_INTERVAL_MS,
    )
    .option(
      "--liveness-interval <ms>",
      "how often to look for workers whose process is gone",
      int("--liveness-interval", 50, 3_600_000),
      DEFAULT_LIVENESS_INTERVAL_MS,
    )
    .option("--once", "recover once, print what was done and exit");
  schedulerOptions(metricsOptions(watchdog)).action(
    run(async (cli, opts: { interval: number; livenessInterval: number; once?: boolean } & MetricsFlags & SchedulerFlags) => {
      const logger = cli.logger("info");
      const lh = await cli.connect({ logger, graceful: !opts.once });
      const service = lh.watchdog({ intervalMs: opts.interval, livenessIntervalMs: opts.livenessInterval });
      if (opts.once) {
        const summary = await service.runOnce();
        cli.result(summary, () => `recovered: ${summary.retried} to retry, ${summary.dead} dead, ${summary.cancelled} cancelled`);
        return;
      }
      const metricsUrl = await startMetricsServer(cli, lh, opts);
      service.start();
      startScheduler(cli, lh, opts);
      cli.note(
        `watchdog running (leases every ${opts.interval} ms, liveness every ${opts.livenessInterval} ms)${metricsUrl ? `; metrics at ${metricsUrl}` : ""}; Ctrl-C stops it`,
      );
      await untilSignal(cli, "stopping the watchdog");
      await service.stop();
    }),
  );
}
