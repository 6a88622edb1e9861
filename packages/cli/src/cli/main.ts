#!/usr/bin/env node
/**
 * `leasehold`: the command line. Every command takes --database-url (or DATABASE_URL),
 * --schema and --json; failures are one line on stderr and a meaningful exit code
 * (see errors.ts). `leasehold --help` lists the commands.
 */
import { Command, CommanderError, Option } from "commander";
import { Cli, type GlobalOptions } from "./context.js";
import { describeFailure, EXIT } from "./errors.js";
import { registerDev } from "./commands/dev.js";
import { registerEnqueue } from "./commands/enqueue.js";
import { registerFlowCommands } from "./commands/flows.js";
import { registerJobCommands } from "./commands/jobs.js";
import { registerDoctor } from "./commands/doctor.js";
import { registerRunCommands } from "./commands/run.js";
import { registerQueueCommands } from "./commands/queues.js";
import { registerEventCommands } from "./commands/events.js";
import { registerScheduleCommands } from "./commands/schedules.js";
import { registerServe } from "./commands/serve.js";
import { registerWorker } from "./commands/worker.js";
import { survivePipeClose } from "./signals.js";

survivePipeClose();

const program = new Command("leasehold")
  .description("Leasehold: a durable, lease-based job queue on PostgreSQL")
  .version("0.2.0")
  .addOption(new Option("--database-url <url>", "PostgreSQL URL (default: DATABASE_URL, else a running `leasehold dev`, else the embedded server)"))
  .addOption(new Option("--schema <name>", "schema of Leasehold's tables (default: LEASEHOLD_SCHEMA or leasehold)"))
  .addOption(
    new Option(
      "--pooling <mode>",
      "how the database URL reaches PostgreSQL: session (directly, or a session-mode pool) or transaction (PgBouncer's pool_mode = transaction; docs/deployment.md) (default: LEASEHOLD_POOLING, else session)",
    ).choices(["session", "transaction"]),
  )
  .addOption(
    new Option(
      "--direct-database-url <url>",
      "a URL straight to PostgreSQL for the sessions a transaction pooler cannot carry: workers' LISTEN, liveness and name locks (default: LEASEHOLD_DIRECT_DATABASE_URL)",
    ),
  )
  .addOption(new Option("--data-dir <dir>", "where the embedded PostgreSQL and dev state live").env("LEASEHOLD_DATA_DIR").default(".leasehold"))
  .option("--json", "machine-readable output (one JSON value per line)")
  .option(
    "--server <url>",
    "job and queue commands and workers go through this `leasehold serve` instead of the database (default: LEASEHOLD_SERVER_URL)",
  )
  .option("--token <token>", "the server's API token (default: LEASEHOLD_TOKEN)")
  .showSuggestionAfterError(true)
  .exitOverride()
  .configureOutput({
    // commander's own messages ("error: unknown option '--x'") are already one line.
    outputError: (text, write) => write(text.trimEnd() + "\n"),
  });

function run(fn: (cli: Cli, ...args: any[]) => Promise<void>) {
  return async (...args: any[]): Promise<void> => {
    const command = args[args.length - 1] as Command;
    const cli = new Cli(command.optsWithGlobals() as GlobalOptions, command.getOptionValueSourceWithGlobals("dataDir") === "default");
    try {
      await fn(cli, ...args);
    } finally {
      await cli.close();
    }
  };
}

registerDev(program, run);
registerServe(program, run);
registerWorker(program, run);
registerRunCommands(program, run);
registerDoctor(program, run);
registerEnqueue(program, run);
registerFlowCommands(program, run);
registerJobCommands(program, run);
registerQueueCommands(program, run);
registerEventCommands(program, run);
registerScheduleCommands(program, run);
for (const command of program.commands) applyExitOverride(command);

function applyExitOverride(command: Command): void {
  command.exitOverride().showSuggestionAfterError(true);
  command.configureOutput({ outputError: (text, write) => write(text.trimEnd() + "\n") });
  for (const sub of command.commands) applyExitOverride(sub);
}

try {
  await program.parseAsync(process.argv);
  // A command may have set its own (doctor exits 1 when it finds an error).
  process.exitCode ??= EXIT.ok;
} catch (err) {
  if (err instanceof CommanderError) {
    // --help and --version end here with code 0; usage errors were printed by commander.
    process.exitCode = err.exitCode === 0 ? EXIT.ok : EXIT.usage;
  } else {
    const { message, exitCode } = describeFailure(err);
    process.stderr.write(`leasehold: ${message}\n`);
    if (process.env.LEASEHOLD_DEBUG) console.error(err);
    process.exitCode = exitCode;
  }
}
// Something left open (a handler's timer, a socket) must not keep a finished command alive.
setTimeout(() => process.exit(), 2_000).unref();
