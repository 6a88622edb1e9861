/**
 * ctx.children (docs/durable-children.md): what a handler may ask for, checked before anything is
 * written, and the types of what it gets back. Children are a flow's nodes to the store: a
 * list's children are a flow without edges, so both forms are checked and written alike.
 */
import { ValidationError } from "../errors.js";
import { prepareFlow, type FlowNode, type PreparedNode } from "../jobs/flow-graph.js";
import type { JsonValue, NewJob } from "../jobs/types.js";
import { describeValue } from "../jobs/validate.js";
import { isDefinedTask, type AnyTask, type ResultOf } from "../tasks/define.js";
import type { StandardSchemaV1 } from "../tasks/standard-schema.js";
import { checkPayload, PayloadValidationError } from "../tasks/validate.js";

/** The most children one ctx.children call may start: their ends are recorded together as one step's result. */
export const MAX_CHILDREN_PER_STEP = 1_000;

/** A child as the awaiting handler gets it back, once it has ended. */
export interface ChildEnd<R = JsonValue> {
  id: string;
  /** The node's ref in a child flow; null for a list's children. */
  ref: string | null;
  /** Null when retention has forgotten the child. */
  task: string | null;
  /** "unknown": retention forgot the child before the handler read it. */
  state: "succeeded" | "dead" | "cancelled" | "unknown";
  /** Its handler's return value when it succeeded; null otherwise. */
  result: R | null;
  /** Why it ended dead or cancelled; null when it succeeded. */
  error: string | null;
}

type PayloadField<In> = undefined extends In ? { payload?: In } : { payload: In };

/** A child given as a task made by defineTask: its payload typed (and checked) by the task's schema. */
export type TypedChildJob<Task extends AnyTask> = Omit<NewJob, "task" | "payload" | "uniqueKey"> & { task: Task } & PayloadField<
    StandardSchemaV1.InferInput<Task["schema"]>
  >;

/** A child flow: nodes as lh.enqueueFlow takes them (refs, dependsOn, onParentFailure). */
export interface ChildFlow {
  flow: FlowNode[];
}

/**
 * ctx.children(name, jobs) or ctx.children(name, { flow }): starts the children as a step
 * (exactly once per job) and suspends the job, holding no lease and no worker slot, until every
 * child has ended; resumes with each child's end in the order given. Children given as defined
 * tasks come back with that task's result type.
 */
export interface ChildrenFunction {
  <Task extends AnyTask>(name: string, jobs: readonly TypedChildJob<Task>[]): Promise<ChildEnd<ResultOf<Task>>[]>;
  (name: string, jobs: readonly Omit<NewJob, "uniqueKey">[]): Promise<ChildEnd[]>;
  (name: string, children: ChildFlow): Promise<ChildEnd[]>;
}

/** The children checked and ready for the store; `flow`: a child flow (its refs are kept). */
export interface PreparedChildren {
  nodes: PreparedNode[];
  flow: boolean;
  /**
   * The children as the handler gave them, each task by name: what a remote worker sends, for
   * the server to check again (it trusts no worker's checks) and start.
   */
  given: readonly unknown[] | ChildFlow;
}

const FLOW_ONLY = ["ref", "dependsOn", "onParentFailure"];

/** Checks what a handler passed to ctx.children; a ValidationError names the call, the child and the problem. */
export async function prepareChildren(children: unknown, call: string): Promise<PreparedChildren> {
  let given: unknown[];
  let flow: boolean;
  if (Array.isArray(children)) {
    flow = false;
    given = children;
    children.forEach((job: unknown, i) => {
      if (job === null || typeof job !== "object" || Array.isArray(job)) {
        throw new ValidationError(`${call}: job ${i}: expected an object with a task (got ${describeValue(job)})`);
      }
      for (const key of FLOW_ONLY) {
        if (key in job)
          throw new ValidationError(
            `${call}: job ${i}: "${key}" belongs to a child flow; pass { flow: [...] } for children that depend on each other`,
          );
      }
    });
  } else if (children !== null && typeof children === "object" && Array.isArray((children as ChildFlow).flow)) {
    const extra = Object.keys(children).find((k) => k !== "flow");
    if (extra !== undefined) throw new ValidationError(`${call}: unknown field "${extra}" (a child flow is { flow: [...] })`);
    flow = true;
    given = (children as ChildFlow).flow;
  } else {
    throw new ValidationError(`${call}: children are an array of jobs, or { flow: [...nodes] } (got ${describeValue(children)})`);
  }
  if (given.length > MAX_CHILDREN_PER_STEP) {
    throw new ValidationError(`${call}: ${given.length} children, over the limit of ${MAX_CHILDREN_PER_STEP} per call`);
  }
  const named = await Promise.all(given.map((node, i) => withTaskName(node, `${call}: ${flow ? "node" : "job"} ${i}`)));
  // A list's children are a flow's nodes without edges, named by their place.
  const nodes = flow ? named : named.map((job, i) => ({ ...(job as object), ref: `job ${i}` }));
  try {
    return { nodes: prepareFlow(nodes), flow, given: flow ? { flow: named as FlowNode[] } : named };
  } catch (err) {
    if (err instanceof ValidationError && !(err instanceof PayloadValidationError)) throw new ValidationError(`${call}: ${err.message}`);
    throw err;
  }
}

/** A child given as a defined task: its payload checked by the task's schema, the task named. */
async function withTaskName(node: unknown, where: string): Promise<unknown> {
  if (node === null || typeof node !== "object") return node;
  const task = (node as { task?: unknown }).task;
  if (!isDefinedTask(task)) return node;
  const checked = await checkPayload(task.schema, (node as { payload?: unknown }).payload);
  if (!checked.ok) throw new PayloadValidationError(task.name, checked.issues, `${where} (task "${task.name}")`);
  return { ...node, task: task.name };
}
