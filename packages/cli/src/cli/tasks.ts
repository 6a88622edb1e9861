/**
 * Loads a tasks module: its default export maps task names to handlers (or to
 * `{ handler, backoff }`), or is an array of tasks made by `defineTask` (docs/typescript.md),
 * whose payloads are then validated before their handlers run. TypeScript files are loaded through tsx, so `--tasks ./tasks.ts`
 * works without a build step.
 */
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import type { TaskHandlers } from "leasehold/internal/worker/context";
import { CliError } from "./errors.js";
import { taskSet, toHandlers, type AnyTask } from "leasehold/internal/tasks/define";

/** The example tasks `leasehold dev` runs when given none: examples/tasks.ts in the package. */
export const EXAMPLE_TASKS = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "examples", "tasks.ts");

/** `tasks`: the module's tasks made by defineTask, by name (their schemas), when it exports them. */
export async function loadTasks(file: string): Promise<{ file: string; handlers: TaskHandlers; tasks: ReadonlyMap<string, AnyTask> }> {
  const abs = path.resolve(file);
  if (!fs.existsSync(abs)) throw new CliError(`--tasks: no such file ${file}`);
  let mod: { default?: unknown };
  try {
    if (/\.[mc]?tsx?$/.test(abs)) {
      const { tsImport } = await import("tsx/esm/api");
      mod = (await tsImport(pathToFileURL(abs).href, import.meta.url)) as { default?: unknown };
    } else {
      mod = (await import(pathToFileURL(abs).href)) as { default?: unknown };
    }
  } catch (err) {
    throw new CliError(`cannot load tasks module ${file}: ${describeThrown(err)}`);
  }
  let handlers = mod.default;
  // A .ts file outside an ESM package is compiled as CommonJS: its exports arrive wrapped once more.
  if (handlers && typeof handlers === "object" && Object.keys(handlers).length === 1 && "default" in handlers) {
    handlers = (handlers as { default: unknown }).default;
  }
  if (Array.isArray(handlers) && handlers.length > 0) {
    try {
      const what = `tasks module ${file}: default export`;
      return { file: abs, handlers: toHandlers(handlers, what), tasks: taskSet(handlers, what) };
    } catch (err) {
      throw new CliError((err as Error).message);
    }
  }
  if (!handlers || typeof handlers !== "object" || Object.keys(handlers).length === 0) {
    throw new CliError(
      `tasks module ${file} must export default an object mapping task names to handlers, e.g. export default { sendEmail: async (payload, ctx) => {...} }, ` +
        "or an array of tasks made by defineTask",
    );
  }
  return { file: abs, handlers: handlers as TaskHandlers, tasks: new Map() };
}

/** The first line of whatever a module threw: an Error's message, or the value itself (null too). */
function describeThrown(err: unknown): string {
  if (err instanceof Error) return err.message.split("\n")[0] || err.name;
  let text: string;
  try {
    text = typeof err === "string" ? err : `it threw ${JSON.stringify(err) ?? String(err)}`;
  } catch {
    text = `it threw ${Object.prototype.toString.call(err)}`;
  }
  return text.split("\n")[0]!;
}
