/**
 * `leasehold dev`: everything on one machine for trying Leasehold and developing handlers:
 * the embedded PostgreSQL (data in <data dir>/pgdata), the server with its API and dashboard, a worker
 * with a watchdog running a tasks module (the bundled examples by default, with a few
 * example jobs enqueued at start), and a readable log of what happens. Other commands run
 * from the same folder find it through <data dir>/dev.json.
 */
import { randomBytes } from "node:crypto";
import path from "node:path";
import type { Command } from "commander";
import pino from "pino";
import type { Leasehold } from "leasehold/internal/client";
import type { Cli, Run } from "../context.js";
import { redactUrl } from "../context.js";
import { readDevState, removeDevState, writeDevState } from "../dev-state.js";
import { CliError } from "../errors.js";
import { printJobEvents } from "../job-events.js";
import { int } from "../parse.js";
import { untilSignal } from "../signals.js";
import { EXAMPLE_TASKS, loadTasks } from "../tasks.js";
import { examplePayload } from "../example-payload.js";
import type { AnyTask } from "leasehold/internal/tasks/define";
import type { PayloadIssue } from "leasehold/internal/tasks/validate";
import type { DashboardMode } from "../../server/dashboard-mode.js";
import { DEFAULT_PORT, dashboardMode, startServer } from "./serve.js";

/** The bundled examples' jobs, enqueued at start so there is something to watch. */
const EXAMPLE_JOBS = [
  { task: "example.progress", payload: { steps: 5 } },
  { task: "example.flaky", payload: { failTimes: 2 } },
  { task: "example.long", payload: { seconds: 15 }, leaseMs: 6_000 },
];

export function registerDev(program: Command, run: Run): void {
  program
    .command("dev")
    .description("embedded PostgreSQL + server and dashboard + worker + watchdog, with example jobs: the quickest way to see Leasehold work")
    .option("--tasks <file>", "your tasks module (default: the bundled examples)")
    .option("--port <port>", "API port (0 picks a free one; a busy default port falls back to a free one)", int("--port", 0, 65535))
    .option("--token <token>", "API token (default: LEASEHOLD_TOKEN, else a random one)")
    .option("--concurrency <n>", "jobs at once", int("--concurrency", 1, 1000), 5)
    .option("--no-examples", "do not enqueue the example jobs at start")
    .option(
      "--dashboard <mode>",
      "the dashboard at / : on, read-only (its link carries a viewer token, which may only read) or off",
      dashboardMode,
      "on" as DashboardMode,
    )
    .option("--show-payloads", "with --dashboard read-only: show payloads, results, checkpoints, progress and errors (default: hidden)")
    .option("--nats <url>", "NATS JetStream dispatch (docs/nats.md), e.g. nats://127.0.0.1:4222 (default: LEASEHOLD_NATS_URL; none: polling only)")
    .action(
      run(
        async (
          cli,
          opts: {
            tasks?: string;
            port?: number;
            token?: string;
            concurrency: number;
            examples: boolean;
            dashboard: DashboardMode;
            showPayloads?: boolean;
            nats?: string;
          },
        ) => {
          const running = readDevState(cli.dataDir);
          if (running)
            throw new CliError(
              `leasehold dev is already running here (pid ${running.pid}, API ${running.apiUrl}); stop it first or use another --data-dir`,
            );
          const say = (line: string) => process.stdout.write(line + "\n");
          // Readable log lines among the job lines; with --json, pino's own lines on stderr.
          const logger = cli.json
            ? pino({ level: process.env.LEASEHOLD_LOG_LEVEL ?? "info" }, pino.destination({ fd: 2, sync: true }))
            : pino({ level: process.env.LEASEHOLD_LOG_LEVEL ?? "info" }, { write: (line: string) => say(formatLog(line)) });
          if (!cli.json) say("Starting Leasehold dev…");
          const { file, handlers, tasks } = await loadTasks(opts.tasks ?? EXAMPLE_TASKS);
          cli.useNats(opts.nats);
          const lh = await cli.connect({ logger, poolSize: 20, quiet: true, graceful: true });
          const token = opts.token ?? cli.token ?? randomBytes(18).toString("base64url");
          // A read-only dashboard's link carries a token that can only read, never the operator's.
          const viewerToken = opts.dashboard === "read-only" ? randomBytes(18).toString("base64url") : undefined;
          const dashboardToken = viewerToken ?? token;
          const serverOpts = {
            host: "127.0.0.1",
            token,
            viewerToken,
            showPayloads: opts.showPayloads,
            watchdog: false,
            logger,
            dashboard: opts.dashboard,
          };
          let apiUrl: string;
          try {
            apiUrl = await startServer(cli, lh, { ...serverOpts, port: opts.port ?? DEFAULT_PORT });
          } catch (err) {
            if (opts.port !== undefined || !(err instanceof CliError)) throw err;
            apiUrl = await startServer(cli, lh, { ...serverOpts, port: 0 });
          }
          writeDevState(cli.dataDir, {
            pid: process.pid,
            databaseUrl: lh.databaseUrl,
            schema: lh.schema,
            apiUrl,
            token,
            startedAt: new Date().toISOString(),
          });
          cli.onClose(async () => removeDevState(cli.dataDir));

          const worker = lh.worker({ handlers, concurrency: opts.concurrency, logger, watchdog: { intervalMs: 1_000 } });
          printJobEvents(worker, (line) => say(cli.json ? line : `${clock()} ${line}`), cli.json);
          await worker.start();

          const taskNames = Object.keys(handlers);
          const rel = (p: string) => (p.startsWith(process.cwd() + path.sep) ? path.relative(process.cwd(), p) : p);
          if (cli.json) {
            say(
              JSON.stringify({
                event: "ready",
                api: apiUrl,
                dashboard: opts.dashboard === "off" ? null : `${apiUrl}/`,
                token,
                ...(viewerToken && { viewerToken }),
                database: redactUrl(lh.databaseUrl),
                schema: lh.schema,
                tasks: taskNames,
                tasksFile: file,
              }),
            );
          } else {
            printBanner(say, {
              apiUrl,
              dashboard: opts.dashboard,
              token,
              dashboardToken,
              lh,
              cli,
              taskNames,
              file: rel(file),
              stateFile: rel(path.join(cli.dataDir, "dev.json")),
              pgdata: rel(cli.embeddedDataDir),
              enqueue: await suggestedEnqueue(taskNames, tasks),
            });
          }
          if (!opts.tasks && opts.examples) {
            const jobs = await lh.enqueueMany(EXAMPLE_JOBS);
            const ids = jobs.map((j) => j.id);
            say(
              cli.json
                ? JSON.stringify({ event: "examples_enqueued", ids })
                : `${clock()} enqueued ${jobs.length} example jobs so you can watch them run: ` +
                    EXAMPLE_JOBS.map((j, i) => `#${ids[i]} ${j.task}`).join(", "),
            );
          }

          await untilSignal(cli, "stopping");
          await worker.stop(5_000);
          say(cli.json ? JSON.stringify({ event: "stopped" }) : "Leasehold dev stopped.");
        },
      ),
    );
}

function printBanner(
  say: (line: string) => void,
  b: {
    apiUrl: string;
    token: string;
    dashboardToken: string;
    lh: Leasehold;
    cli: Cli;
    taskNames: string[];
    file: string;
    stateFile: string;
    pgdata: string;
    dashboard: DashboardMode;
    enqueue: string;
  },
): void {
  const { apiUrl, token, lh, cli, taskNames } = b;
  say("");
  say("Leasehold dev is running.");
  if (b.dashboard !== "off") {
    const note = b.dashboard === "read-only" ? "read-only, with a token that may only read; " : "";
    say(`  Dashboard  ${dashboardLink(apiUrl, b.dashboardToken)}   (${note}opens signed in; the token stays in the browser)`);
  }
  say(`  API        ${apiUrl}   token: ${token}   (OpenAPI: ${apiUrl}/openapi.json)`);
  say(
    `  Database   ${redactUrl(lh.databaseUrl)}  schema ${lh.schema}` +
      (process.env.DATABASE_URL || cli.options.databaseUrl ? "" : `  (embedded, data in ${b.pgdata})`),
  );
  say(`  Tasks      ${taskNames.join(", ")}  from ${b.file}`);
  say("");
  say(`From another terminal in this folder (commands find this dev session through ${b.stateFile}):`);
  say(`  ${b.enqueue}`);
  say("  npx leasehold jobs list        npx leasehold jobs show <id>        npx leasehold stats");
  say(`  curl -H 'Authorization: Bearer ${token}' ${apiUrl}/v1/stats`);
  say("Press Ctrl-C to stop (running jobs get a few seconds to finish; the rest are released).");
  say("");
}

/**
 * The enqueue command the banner suggests, with a payload the task accepts (the examples' own,
 * or one its schema was seen to take), so the job it makes can run. When every task's schema
 * refuses what can be made up, the command has a placeholder and names what the schema asks for.
 */
async function suggestedEnqueue(taskNames: string[], tasks: ReadonlyMap<string, AnyTask>): Promise<string> {
  const command = (task: string, payload: string) => `npx leasehold enqueue ${task} --payload '${payload}'`;
  const example = EXAMPLE_JOBS.find((j) => j.task === taskNames[0]);
  if (example) return command(example.task, JSON.stringify(example.payload));
  let refused: { task: string; issues: PayloadIssue[] } | undefined;
  for (const task of taskNames) {
    const suggestion = await examplePayload(tasks.get(task));
    if (suggestion.ok) return command(task, JSON.stringify(suggestion.payload));
    refused ??= { task, issues: suggestion.issues };
  }
  const needs = refused!.issues
    .slice(0, 3)
    .map((i) => `${i.path}: ${i.message}`)
    .join("; ");
  return `${command(refused!.task, "<JSON>")}   (its schema needs ${needs})`;
}

/** The dashboard, signed in: the token rides in the fragment, which the browser never sends; the page keeps it and drops it from the address. */
function dashboardLink(apiUrl: string, token: string): string {
  return `${apiUrl}/#token=${encodeURIComponent(token)}`;
}

function clock(): string {
  return new Date().toTimeString().slice(0, 8);
}

const HIDDEN = new Set(["level", "time", "pid", "hostname", "msg", "worker", "component", "reqId", "v"]);

/** pino's JSON lines as short readable ones: time, level (when it matters), job, message, fields. */
function formatLog(line: string): string {
  let o: Record<string, unknown>;
  try {
    o = JSON.parse(line) as Record<string, unknown>;
  } catch {
    return line.trimEnd();
  }
  const level = Number(o.level);
  const tag = level >= 50 ? "ERROR " : level >= 40 ? "warn  " : "";
  const job = o.jobId ? `job ${o.jobId}: ` : "";
  const rest = Object.entries(o)
    .filter(([k]) => !HIDDEN.has(k) && k !== "jobId" && k !== "attempt" && k !== "task")
    .map(([k, v]) => `${k}=${typeof v === "string" ? v.split("\n")[0] : JSON.stringify(v)}`)
    .join(" ");
  return `${clock()}   ${tag}${job}${o.msg ?? ""}${rest ? `  ${rest}` : ""}`;
}
