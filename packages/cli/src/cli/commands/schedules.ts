/** `leasehold schedules list|add|remove`: periodic jobs, saved in the database. */
import type { Command } from "commander";
import type { Cli, Run } from "../context.js";
import { CliError, EXIT } from "../errors.js";
import { ago, table } from "../format.js";
import { int, json } from "../parse.js";
import { printWarnings, unknownTasksOption, useUnknownTasks } from "../unknown-tasks.js";
import type { ScheduleRecord } from "leasehold/internal/store/index";

interface AddFlags {
  cron: string;
  task: string;
  payload?: string;
  queue?: string;
  timezone?: string;
  backfill?: true | number;
  priority?: number;
  maxAttempts?: number;
  unknownTasks?: string;
}

export function registerScheduleCommands(program: Command, run: Run): void {
  const schedules = program.command("schedules").description("periodic jobs: one job per tick of a cron pattern, enqueued by the running workers");

  schedules
    .command("list")
    .description("every schedule with its next and last tick")
    .action(
      run(async (cli) => {
        const lh = await databaseOnly(cli);
        const list = await lh.listSchedules();
        cli.result(list, () => schedulesTable(list));
      }),
    );

  const add = schedules
    .command("add <name>")
    .description("save a schedule (an existing one of that name is updated; with the same cron it keeps its place)")
    .requiredOption("--cron <pattern>", 'cron pattern, e.g. "0 3 * * *" (five fields, or six with seconds first)')
    .requiredOption("--task <task>", "the task each tick's job runs")
    .option("--payload <json>", "each job's payload (JSON, default {})")
    .option("--queue <queue>", "queue of the jobs (default: default)")
    .option("--timezone <tz>", "IANA time zone of the pattern, e.g. Europe/Paris (default UTC)")
    .option(
      "--backfill [n]",
      "after downtime, enqueue the latest missed ticks: at most n (1-1000; 100 without n) (default: only the latest)",
      backfillFlag,
    )
    .option("--priority <n>", "the jobs' priority (lower runs first)", int("--priority", -32768, 32767))
    .option("--max-attempts <n>", "the jobs' retry budget", int("--max-attempts", 1, 1000));
  unknownTasksOption(add).action(
    run(async (cli, name: string, flags: AddFlags) => {
      useUnknownTasks(cli, flags.unknownTasks);
      const lh = await databaseOnly(cli);
      const saved = await lh.schedule({
        name,
        cron: flags.cron,
        task: flags.task,
        ...(flags.payload !== undefined ? { payload: json(flags.payload, "--payload") } : {}),
        ...(flags.queue !== undefined ? { queue: flags.queue } : {}),
        ...(flags.timezone !== undefined ? { timezone: flags.timezone } : {}),
        ...(flags.backfill !== undefined ? { backfill: flags.backfill } : {}),
        ...(flags.priority !== undefined ? { priority: flags.priority } : {}),
        ...(flags.maxAttempts !== undefined ? { maxAttempts: flags.maxAttempts } : {}),
      });
      cli.result(
        saved,
        () => `schedule ${name} ${saved.created ? "added" : "updated"}; next tick ${saved.nextRunAt.toISOString()} (${ago(saved.nextRunAt)})`,
      );
      printWarnings(cli, saved.warnings);
    }),
  );

  schedules
    .command("remove <name>")
    .description("remove a schedule (jobs it already enqueued stay)")
    .action(
      run(async (cli, name: string) => {
        const lh = await databaseOnly(cli);
        if (!(await lh.unschedule(name))) throw new CliError(`no schedule named ${JSON.stringify(name)}`, EXIT.notFound);
        cli.result({ name, result: "removed" }, () => `schedule ${name} removed`);
      }),
    );
}

/** Schedules live in the database; the HTTP API lists them (for the dashboard) but does not edit them. */
async function databaseOnly(cli: Cli) {
  if (cli.serverUrl) throw new CliError("schedules commands work on the database: give --database-url (or DATABASE_URL), not --server");
  return cli.connect({ quiet: true });
}

function schedulesTable(list: ScheduleRecord[]): string {
  if (list.length === 0) return "no schedules";
  return table(
    ["NAME", "CRON", "TIMEZONE", "TASK", "QUEUE", "NEXT", "LAST", "BACKFILL"],
    list.map((s) => [
      s.name,
      s.cron,
      s.timezone,
      s.task,
      s.queue,
      ago(s.nextRunAt),
      ago(s.lastRunAt),
      s.backfill ? `latest ${s.backfillLimit}` : "no",
    ]),
  );
}

/** `--backfill` alone is true (the default limit); `--backfill 500` that limit, checked by lh.schedule. */
function backfillFlag(value: string): number {
  const n = Number(value);
  if (!/^\d+$/.test(value) || !Number.isSafeInteger(n)) throw new CliError(`--backfill takes a whole number of ticks (got ${JSON.stringify(value)})`);
  return n;
}
