/**
 * `ctx.parents(task)`: a job's parents that are jobs of one defined task, with that task's
 * result type. Shared by the worker's context and the test kit's, so both filter alike.
 */
import { ConfigError } from "../errors.js";
import type { ParentRecord } from "../store/dependencies.js";
import { isDefinedTask, type AnyTask, type ResultOf } from "./define.js";

/** A parent that is a job of `Task`: its `result` is that task's result. */
export type TypedParentRecord<Task extends AnyTask> = Omit<ParentRecord, "task" | "result"> & {
  task: Task["name"];
  result: ResultOf<Task> | null;
};

/**
 * The parents that are jobs of `task`. A parent forgotten by retention (task null) is left out:
 * nothing says which task it was. A task not made by defineTask is a ConfigError.
 */
export function parentsOfTask<Task extends AnyTask>(parents: readonly ParentRecord[], task: Task): TypedParentRecord<Task>[] {
  if (!isDefinedTask(task)) throw new ConfigError("ctx.parents(task) takes a task made by defineTask");
  // The result was stored by that task's handler, so it has the handler's type.
  return parents.filter((p) => p.task === task.name) as TypedParentRecord<Task>[];
}
