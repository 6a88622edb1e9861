/**
 * Workers in processes of their own, for tests that kill (-9) or freeze (SIGSTOP) them for
 * real: the worker-child helper, and the real `leasehold worker` CLI with a tasks module.
 */
import { spawn, type ChildProcess } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { databaseUrl, eventually } from "./db.js";
import { startCli } from "./cli.js";

const HELPERS = path.dirname(fileURLToPath(import.meta.url));
const CHILD = path.resolve(HELPERS, "worker-child.ts");
const DURABLE_CHILD = path.resolve(HELPERS, "durable-child.ts");

interface After {
  after(fn: () => unknown): void;
}

/** worker-child.ts ("hold" never ends; no watchdog); killed when the test ends. */
export async function workerChild(
  t: After,
  schema: string,
  env: Record<string, string> = {},
  script = CHILD,
): Promise<{ child: ChildProcess; output: () => string }> {
  const child = spawn(process.execPath, ["--import", "tsx", script], {
    env: { ...process.env, DATABASE_URL: databaseUrl(), LEASEHOLD_SCHEMA: schema, ...env },
    stdio: ["ignore", "pipe", "inherit"],
  });
  t.after(() => child.kill("SIGKILL"));
  let out = "";
  child.stdout!.on("data", (b: Buffer) => (out += b.toString()));
  await eventually(async () => out.includes("ready "), "worker process ready", 30_000);
  return { child, output: () => out };
}

/** durable-child.ts: the durable "trip" task with its holds, its app tables in schema `app`. */
export function durableWorkerChild(t: After, schema: string, app: string) {
  return workerChild(t, schema, { APP_SCHEMA: app }, DURABLE_CHILD);
}

/**
 * `leasehold worker --tasks <module>` with `tasksSource` as the module and `args` added; no
 * watchdog, scheduler or retention of its own. Killed (-9, so a frozen one goes too) when the
 * test ends. `started(id)`: its output says the job started; `metricsUrl` with --metrics-port.
 */
export async function cliWorker(t: After, schema: string, tasksSource: string, args: string[] = []) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-tasks-"));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const tasks = path.join(dir, "tasks.mjs");
  fs.writeFileSync(tasks, tasksSource);
  const cli = await startCli(["worker", "--tasks", tasks, "--no-watchdog", "--no-scheduler", "--no-retention", ...args], {
    schema,
    ready: /Ctrl-C stops it/,
  });
  t.after(() => cli.child.kill("SIGKILL"));
  const metricsUrl = /metrics at (http:\/\/\S+\/metrics)/.exec(cli.output())?.[1];
  return { ...cli, metricsUrl, started: (id: string) => new RegExp(`job ${id} \\S+ started`).test(cli.output()) };
}
