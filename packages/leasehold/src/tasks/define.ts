/**
 * Typed tasks: a task defined once, with its name, its payload schema (any Standard Schema:
 * zod, valibot, arktype, ...), its handler and its policy. The same definition types the
 * enqueue side (`lh.typed([...])`, src/tasks/client.ts) and runs on the worker, where the
 * payload is validated again before the handler sees it (docs/typescript.md).
 *
 * The handler gets the schema's *output* (defaults filled in, transforms applied); the job
 * stores the payload as it was enqueued (the schema's *input*), so a transform runs once per
 * attempt, never on its own output.
 */
import { ConfigError, ValidationError } from "../errors.js";
import { checkName, suggest } from "../jobs/validate.js";
import type { BackoffPolicy } from "../worker/backoff.js";
import { PermanentJobError, type JobContext, type TaskDefinition, type TaskHandlers } from "../worker/context.js";
import type { StandardSchemaV1 } from "./standard-schema.js";
import { checkPayload, PayloadValidationError } from "./validate.js";

/** Marks what defineTask made (Symbol.for: two copies of the package still recognise each other's). */
const DEFINED_TASK: unique symbol = Symbol.for("leasehold.definedTask");

/**
 * Whether a handler's result type can be stored, judged as JSON.stringify writes it (the
 * worker's serialisation): a `toJSON` method (a Date) counts as what it returns; a function,
 * bigint or symbol anywhere, or an object with methods (a Map, a class instance), cannot.
 * `any` and `unknown` pass: there is nothing to judge, the worker checks at run time.
 */
export type StorableResult<T> = 0 extends 1 & T ? true : unknown extends T ? true : Storable<T, []>;
/** Depth-capped (`D` counts levels) so a recursive type such as JsonValue stays cheap to check. */
type Storable<T, D extends unknown[]> = D["length"] extends 8
  ? true
  : T extends string | number | boolean | null | undefined | void
    ? true
    : T extends { toJSON(...args: never[]): infer J }
      ? Storable<J, [...D, 0]>
      : T extends bigint | symbol | ((...args: never[]) => unknown)
        ? false
        : T extends readonly (infer E)[]
          ? Storable<E, [...D, 0]>
          : T extends object
            ? { [K in keyof T]-?: Storable<T[K], [...D, 0]> }[keyof T] extends true
              ? true
              : false
            : false;

/** What a handler whose result cannot be stored is told, in the compile error. */
export interface ResultNotJson {
  "a handler's result must be JSON (a Date or another value with toJSON is stored as what toJSON returns)": never;
}

export interface TaskConfig<N extends string, S extends StandardSchemaV1, R = unknown> {
  /** The task's name: what its jobs carry, what `enqueue` takes. */
  name: N;
  /** The payload's schema, from any library that implements Standard Schema. */
  schema: S;
  /** Runs a job; gets the schema's output (defaults and transforms applied). What it returns is the job's result. */
  handler(payload: StandardSchemaV1.InferOutput<S>, ctx: JobContext): R;
  /** Retry backoff for this task; fields left out take the worker's policy. */
  backoff?: Partial<BackoffPolicy>;
  /** An attempt that calls neither ctx.progress nor ctx.checkpoint for this long has stalled. */
  progressTimeoutMs?: number;
  /** An attempt running longer than this has timed out. */
  maxRunMs?: number;
}

/** What defineTask returns: the definition as given, frozen, and recognisable as one. */
export type DefinedTask<N extends string = string, S extends StandardSchemaV1 = StandardSchemaV1, R = unknown> = Readonly<TaskConfig<N, S, R>> & {
  readonly [DEFINED_TASK]: true;
};

/** Any defined task: what a task set (`lh.typed([...])`) is made of. */
export type AnyTask = DefinedTask<string, StandardSchemaV1>;

/** The names in a task set. */
export type TaskName<T extends readonly AnyTask[]> = T[number]["name"];
/** The task of that name in a task set. */
export type TaskOf<T extends readonly AnyTask[], K extends TaskName<T>> = Extract<T[number], { readonly name: K }>;
/** What `enqueue` takes for a task: its schema's input type. */
export type TaskInput<T extends readonly AnyTask[], K extends TaskName<T>> = StandardSchemaV1.InferInput<TaskOf<T, K>["schema"]>;
/** What its handler gets: its schema's output type. */
export type TaskOutput<T extends readonly AnyTask[], K extends TaskName<T>> = StandardSchemaV1.InferOutput<TaskOf<T, K>["schema"]>;

/**
 * A task's result as stored and read back (`job.result`, `ctx.parents(task)`): what its handler
 * resolves to, or null where it returns nothing (undefined keeps no result).
 */
export type ResultOf<Task extends AnyTask> = Task extends DefinedTask<string, StandardSchemaV1, infer R> ? StoredResult<Awaited<R>> : never;
type StoredResult<V> = [V] extends [void | undefined] ? null : Exclude<V, undefined> | (undefined extends V ? null : never);
/** The result of the task of that name in a task set. */
export type TaskResult<T extends readonly AnyTask[], K extends TaskName<T>> = ResultOf<TaskOf<T, K>>;

const CONFIG_KEYS = new Set(["name", "schema", "handler", "backoff", "progressTimeoutMs", "maxRunMs"]);

/**
 * Defines a task. The name is kept as a literal type, the handler's payload is typed by the
 * schema's output:
 *
 *   export const resize = defineTask({
 *     name: "resize",
 *     schema: z.object({ url: z.url(), width: z.number().int().default(800) }),
 *     handler: async (payload, ctx) => { ... payload.width is a number ... },
 *   });
 *
 * Throws a ConfigError for a bad name, a schema that is not a Standard Schema, or an unknown
 * option; the policy (backoff, limits) is checked when a worker is made, as for untyped handlers.
 */
export function defineTask<const N extends string, S extends StandardSchemaV1, R>(
  config: TaskConfig<N, S, R> & (StorableResult<Awaited<R>> extends true ? unknown : ResultNotJson),
): DefinedTask<N, S, R> {
  if (config === null || typeof config !== "object") throw new ConfigError("defineTask takes { name, schema, handler }");
  for (const key of Object.keys(config)) {
    if (!CONFIG_KEYS.has(key)) throw new ConfigError(`defineTask: unknown option "${key}"${suggest(key, CONFIG_KEYS)}`);
  }
  try {
    checkName(config.name, "defineTask: name");
  } catch (err) {
    throw new ConfigError((err as Error).message);
  }
  const standard = (config.schema as Partial<StandardSchemaV1> | undefined)?.["~standard"];
  if (!standard || standard.version !== 1 || typeof standard.validate !== "function") {
    throw new ConfigError(
      `task "${config.name}": schema must implement Standard Schema v1 (zod 3.24+, valibot 1.0+, arktype 2.0+, ...): ` +
        'an object with a "~standard" property',
    );
  }
  if (typeof config.handler !== "function") throw new ConfigError(`task "${config.name}": handler is not a function`);
  return Object.freeze({ ...config, [DEFINED_TASK]: true as const });
}

export function isDefinedTask(value: unknown): value is AnyTask {
  return typeof value === "object" && value !== null && (value as Record<symbol, unknown>)[DEFINED_TASK] === true;
}

/** A task set by name; throws a ConfigError for anything not made by defineTask, or a name twice. */
export function taskSet(tasks: readonly AnyTask[], what = "tasks"): Map<string, AnyTask> {
  if (!Array.isArray(tasks)) throw new ConfigError(`${what} must be an array of tasks made by defineTask`);
  const byName = new Map<string, AnyTask>();
  tasks.forEach((task, i) => {
    if (!isDefinedTask(task)) throw new ConfigError(`${what}[${i}] is not a task made by defineTask`);
    if (byName.has(task.name)) throw new ConfigError(`${what}: task "${task.name}" is defined twice`);
    byName.set(task.name, task);
  });
  return byName;
}

/**
 * A defined task as the worker runs it: its handler behind the payload's validation. A payload
 * the schema refuses fails the attempt for good (PermanentJobError: the dead letter at once,
 * with the issues as its error), since running it again cannot make it valid.
 */
export function toTaskDefinition(task: AnyTask): TaskDefinition {
  const { name, schema, handler } = task;
  const definition: TaskDefinition = {
    handler: async (payload: unknown, ctx: JobContext) => {
      const checked = await checkPayload(schema, payload);
      if (!checked.ok) {
        const invalid = new PayloadValidationError(name, checked.issues, `job ${ctx.jobId} (task "${name}")`);
        throw new PermanentJobError(invalid.message, { cause: invalid });
      }
      return handler(checked.value, ctx);
    },
  };
  if (task.backoff !== undefined) definition.backoff = task.backoff;
  if (task.progressTimeoutMs !== undefined) definition.progressTimeoutMs = task.progressTimeoutMs;
  if (task.maxRunMs !== undefined) definition.maxRunMs = task.maxRunMs;
  return definition;
}

/** The untyped handlers map a Worker takes, from defined tasks. */
export function toHandlers(tasks: readonly AnyTask[], what?: string): TaskHandlers {
  const handlers: TaskHandlers = {};
  for (const [name, task] of taskSet(tasks, what)) handlers[name] = toTaskDefinition(task);
  return handlers;
}

/** The task of that name in the set, or a ValidationError naming the known ones. */
export function knownTask(tasks: ReadonlyMap<string, AnyTask>, name: unknown, where: string): AnyTask {
  const task = typeof name === "string" ? tasks.get(name) : undefined;
  if (task) return task;
  const known = [...tasks.keys()];
  throw new ValidationError(
    `${where}: unknown task ${JSON.stringify(name)}${typeof name === "string" ? suggest(name, known) : ""} (this task set has: ${known.join(", ")})`,
  );
}
