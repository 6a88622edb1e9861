/**
 * The CLI side of enqueue's "no worker runs this task" check (src/jobs/known-tasks.ts): the
 * `--unknown-tasks` flag, and the warnings printed on stderr (they ride in the --json output).
 */
import type { Command } from "commander";
import { unknownTasksMode, UNKNOWN_TASKS_MODES } from "leasehold/internal/jobs/known-tasks";
import type { EnqueueWarning } from "leasehold/internal/jobs/types";
import type { Cli } from "./context.js";
import { CliError } from "./errors.js";

export function unknownTasksOption(command: Command): Command {
  return command.option(
    "--unknown-tasks <mode>",
    `a task no worker seen in the last 24 h runs (in that queue): ${UNKNOWN_TASKS_MODES.join(", ")} (default: LEASEHOLD_UNKNOWN_TASKS, else warn)`,
    (v: string) => {
      try {
        return unknownTasksMode(v, "--unknown-tasks");
      } catch (err) {
        throw new CliError((err as Error).message);
      }
    },
  );
}

/** Applies the flag to this command's database connection; through a server, the server's setting applies. */
export function useUnknownTasks(cli: Cli, flag: string | undefined): void {
  if (flag === undefined) return;
  if (cli.serverUrl) throw new CliError("--unknown-tasks applies to a database connection; through --server, the server's own setting applies");
  cli.unknownTasks = unknownTasksMode(flag, "--unknown-tasks");
}

/** Each distinct warning once, as "warning: ..." lines on stderr (never in --json output). */
export function printWarnings(cli: Cli, warnings: readonly EnqueueWarning[] | undefined): void {
  for (const message of new Set((warnings ?? []).map((w) => w.message))) cli.note(`warning: ${message}`);
}
