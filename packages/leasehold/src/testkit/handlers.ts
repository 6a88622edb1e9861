/**
 * What the test kit runs: plain handlers (`{ task: handler }` or `{ task: { handler, backoff } }`,
 * as `lh.worker` takes) and tasks made by `defineTask`, either in that map or as a list. A defined
 * task runs exactly as a typed worker runs it: behind its schema (defaults filled in, a payload
 * the schema refuses ends the attempt dead with a PayloadValidationError naming the field).
 */
import { ConfigError, type AnyTask, type Handler, type TaskDefinition, type TaskHandlers } from "../index.js";
import { isDefinedTask, toTaskDefinition } from "../tasks/define.js";

/** Handlers by task name (a defined task among them is run behind its schema), or a list of defined tasks. */
export type TestHandlers = Record<string, Handler | TaskDefinition | AnyTask> | readonly AnyTask[];

/** The handlers map a worker takes; throws a ConfigError for a defined task under another task's name. */
export function workerHandlers(input: TestHandlers, what = "handlers"): TaskHandlers {
  const handlers: TaskHandlers = {};
  if (Array.isArray(input)) {
    input.forEach((task: unknown, i) => {
      if (!isDefinedTask(task)) throw new ConfigError(`${what}[${i}] is not a task made by defineTask`);
      if (handlers[task.name]) throw new ConfigError(`${what}: task "${task.name}" is given twice`);
      handlers[task.name] = toTaskDefinition(task);
    });
    return handlers;
  }
  if (input === null || typeof input !== "object") throw new ConfigError(`${what} must map task names to handlers, or list tasks made by defineTask`);
  for (const [name, registration] of Object.entries(input as Record<string, Handler | TaskDefinition | AnyTask>)) {
    if (isDefinedTask(registration)) {
      if (registration.name !== name) throw new ConfigError(`${what}.${name} is the task "${registration.name}": register it under its own name`);
      handlers[name] = toTaskDefinition(registration);
    } else handlers[name] = registration;
  }
  return handlers;
}
