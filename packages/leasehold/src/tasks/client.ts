/**
 * The typed side of a client: `lh.typed([resize, sendEmail])`. Its `enqueue`, `enqueueMany`,
 * `enqueueFlow`, `enqueueBatch` and `schedule` take only the set's task names and each task's
 * payload type, check the payload against the task's schema before anything is written (a
 * PayloadValidationError names the field), its `waitFor` types the job's result by its task,
 * and its `worker()` runs the set's handlers.
 * Everything else (getJob, cancel, stats, ...) stays on the client, `typed.client`.
 *
 * The stored payload is the one given (the schema's input), not the schema's output: the
 * worker validates it again and hands the output to the handler (src/tasks/define.ts).
 */
import type { Leasehold, EnqueueTarget } from "../client.js";
import type { WaitOptions } from "../waiters.js";
import { ConfigError, ValidationError } from "../errors.js";
import type { BatchInput, FlowNode } from "../jobs/flow-graph.js";
import type { ScheduleDefinition } from "../jobs/schedule.js";
import type { EnqueueOptions, EnqueuedJob, JobRecord, NewJob } from "../jobs/types.js";
import type { ScheduleRecord } from "../store/schedules.js";
import type { Worker } from "../worker/worker.js";
import { knownTask, taskSet, toHandlers, type AnyTask, type TaskInput, type TaskName, type TaskResult } from "./define.js";
import { checkPayload, PayloadValidationError, type Checked } from "./validate.js";

/** `payload` may be left out only where the schema accepts undefined. */
type PayloadField<In> = undefined extends In ? { payload?: In } : { payload: In };
type PayloadArgs<In, Options> = undefined extends In ? [payload?: In, options?: Options] : [payload: In, options?: Options];

/** A job for `enqueueMany` of a task set: a task of the set, with that task's payload. */
export type TypedNewJob<T extends readonly AnyTask[]> = {
  [K in TaskName<T>]: { task: K } & PayloadField<TaskInput<T, K>> & EnqueueOptions;
}[TaskName<T>];

/**
 * A node of `enqueueFlow` of a task set: a task of the set, with that task's payload. `Ref` is
 * the flow's refs, inferred from the nodes' `ref`s: `dependsOn` takes only those (or `{ id }`).
 */
export type TypedFlowNode<T extends readonly AnyTask[], Ref extends string = string> = {
  [K in TaskName<T>]: Omit<FlowNode, "ref" | "dependsOn" | "task" | "payload"> & {
    ref: Ref;
    dependsOn?: (NoInfer<Ref> | { id: string })[];
    task: K;
  } & PayloadField<TaskInput<T, K>>;
}[TaskName<T>];

/** What the typed `enqueue` returns: the job, and its task, which `waitFor` types the result by. */
export type TypedEnqueuedJob<K extends string> = EnqueuedJob & { task: K };

/** A job of task `K` of the set as `waitFor` returns it: its `result` has the task's result type. */
export type TypedJobRecord<T extends readonly AnyTask[], K extends TaskName<T>> = Omit<JobRecord, "task" | "result"> & {
  task: K;
  result: TaskResult<T, K> | null;
};

/** A batch of a task set: its members and its `onComplete` job, each a task of the set with its payload. */
export interface TypedBatchInput<T extends readonly AnyTask[]> {
  jobs: TypedNewJob<T>[];
  onComplete: { [K in TaskName<T>]: { task: K } & PayloadField<TaskInput<T, K>> & Omit<EnqueueOptions, "uniqueKey"> }[TaskName<T>];
}

/** A schedule of a task set: a task of the set, with that task's payload. */
export type TypedScheduleDefinition<T extends readonly AnyTask[]> = {
  [K in TaskName<T>]: Omit<ScheduleDefinition, "task" | "payload"> & { task: K } & PayloadField<TaskInput<T, K>>;
}[TaskName<T>];

export type TypedWorkerOptions<T extends readonly AnyTask[]> = Omit<Parameters<Leasehold["worker"]>[0], "handlers"> & {
  /** Which tasks of the set this worker runs; default all of them. */
  tasks?: readonly TaskName<T>[];
  /** Untyped handlers beside the set's (for tasks not defined yet); no name may be in both. */
  handlers?: Parameters<Leasehold["worker"]>[0]["handlers"];
};

export class TypedLeasehold<const T extends readonly AnyTask[]> {
  /** The set's tasks by name. */
  readonly tasks: ReadonlyMap<string, AnyTask>;

  constructor(
    /** The client underneath, for everything that is not typed by task (getJob, cancel, stats, ...). */
    readonly client: Leasehold,
    tasks: T,
  ) {
    this.tasks = taskSet(tasks);
  }

  /** Enqueues a job of one of the set's tasks; its payload is checked by the task's schema first. */
  async enqueue<K extends TaskName<T>>(
    task: K,
    ...[payload, options]: PayloadArgs<TaskInput<T, K>, EnqueueOptions & EnqueueTarget>
  ): Promise<TypedEnqueuedJob<K>> {
    const checked = await checkPayload(knownTask(this.tasks, task, "enqueue").schema, payload);
    if (!checked.ok) throw new PayloadValidationError(task, checked.issues);
    return { ...(await this.client.enqueue(task, payload, options)), task };
  }

  /**
   * Enqueues many jobs of the set's tasks, all or nothing; every payload is checked first, and
   * a bad one fails the batch naming its index and field.
   */
  async enqueueMany(jobs: TypedNewJob<T>[], target?: EnqueueTarget): Promise<TypedEnqueuedJob<TaskName<T>>[]> {
    if (!Array.isArray(jobs)) throw new ValidationError("enqueueMany takes an array of jobs");
    await this.checkPayloads(jobs as NewJob[], (i) => `job ${i}`);
    const enqueued = await this.client.enqueueMany(jobs as NewJob[], target);
    return enqueued.map((job, i) => ({ ...job, task: jobs[i]!.task }));
  }

  /**
   * Enqueues a graph of jobs of the set's tasks (see `Leasehold.enqueueFlow`); every node's
   * payload is checked first, and a bad one refuses the graph naming its ref and field. The
   * answer's `jobs` is keyed by the flow's refs.
   */
  async enqueueFlow<Ref extends string>(nodes: TypedFlowNode<T, Ref>[], target?: EnqueueTarget): Promise<{ jobs: Record<Ref, string> }> {
    if (!Array.isArray(nodes)) throw new ValidationError("enqueueFlow takes an array of nodes");
    await this.checkPayloads(nodes as FlowNode[], (i) => {
      const ref = (nodes[i] as { ref?: unknown } | null)?.ref;
      return typeof ref === "string" ? `node ${JSON.stringify(ref)}` : `node ${i}`;
    });
    const { jobs } = await this.client.enqueueFlow(nodes as FlowNode[], target);
    return { jobs: jobs as Record<Ref, string> };
  }

  /**
   * Waits for a job of the set's task `K` to finish (see `Leasehold.waitFor`); its `result` is
   * typed as that task's result. Takes what `enqueue` returned, or the task and the job's id (a
   * flow's `jobs[ref]`). A job of another task is a ValidationError: its result has another type.
   */
  waitFor<K extends TaskName<T>>(job: { id: string; task: K }, options?: WaitOptions): Promise<TypedJobRecord<T, K>>;
  waitFor<K extends TaskName<T>>(task: K, id: string, options?: WaitOptions): Promise<TypedJobRecord<T, K>>;
  async waitFor(
    jobOrTask: { id: string; task: string } | string,
    idOrOptions?: string | WaitOptions,
    maybeOptions?: WaitOptions,
  ): Promise<TypedJobRecord<T, TaskName<T>>> {
    const byHandle = typeof jobOrTask === "object" && jobOrTask !== null;
    const task = byHandle ? jobOrTask.task : jobOrTask;
    const id = byHandle ? jobOrTask.id : idOrOptions;
    const options = (byHandle ? idOrOptions : maybeOptions) as WaitOptions | undefined;
    knownTask(this.tasks, task, "waitFor");
    if (typeof id !== "string") throw new ValidationError(`waitFor: the job id must be a string (got ${typeof id})`);
    const record = await this.client.waitFor(id, options);
    if (record.task !== task) {
      throw new ValidationError(`waitFor: job ${id} is a job of task ${JSON.stringify(record.task)}, not ${JSON.stringify(task)}`);
    }
    // Stored by this task's handler, so the result has its type.
    return record as TypedJobRecord<T, TaskName<T>>;
  }

  /**
   * Enqueues a batch of jobs of the set's tasks and its `onComplete` job (see
   * `Leasehold.enqueueBatch`); every payload is checked first, members named by index.
   */
  async enqueueBatch(batch: TypedBatchInput<T>, target?: EnqueueTarget): Promise<{ callbackId: string; jobIds: string[] }> {
    if (batch === null || typeof batch !== "object" || !Array.isArray(batch.jobs)) {
      throw new ValidationError("enqueueBatch takes { jobs: [...], onComplete: { task, payload } }");
    }
    const members = batch.jobs as NewJob[];
    await this.checkPayloads([...members, batch.onComplete as NewJob], (i) => (i < members.length ? `job ${i}` : "onComplete"));
    return this.client.enqueueBatch(batch as BatchInput, target);
  }

  /**
   * Each job's task must be in the set and its payload pass the task's schema; `label(i)` names
   * the job in the error. Async schemas are awaited together.
   */
  private async checkPayloads(jobs: readonly { task: string; payload?: unknown }[], label: (i: number) => string): Promise<void> {
    const pending: Promise<void>[] = [];
    try {
      jobs.forEach((job, i) => {
        const name = label(i);
        if (job === null || typeof job !== "object") throw new ValidationError(`${name}: a job must be an object with a task`);
        const checked = checkPayload(knownTask(this.tasks, job.task, name).schema, job.payload);
        const verdict = (c: Checked<unknown>) => {
          if (!c.ok) throw new PayloadValidationError(job.task, c.issues, `${name} (task ${JSON.stringify(job.task)})`);
        };
        if (checked instanceof Promise) pending.push(checked.then(verdict));
        else verdict(checked);
      });
    } catch (err) {
      // The first refusal is the answer: the async checks already started must not reject
      // later with nobody listening (an unhandled rejection ends the process).
      for (const p of pending) p.catch(() => {});
      throw err;
    }
    await Promise.all(pending);
  }

  /** Saves a schedule of one of the set's tasks; its payload is checked by the task's schema first. */
  async schedule(def: TypedScheduleDefinition<T>): Promise<ScheduleRecord & { created: boolean }> {
    if (def === null || typeof def !== "object") throw new ValidationError("a schedule must be an object with a name, a cron pattern and a task");
    const where = `schedule ${def.name}`;
    const checked = await checkPayload(knownTask(this.tasks, def.task, where).schema, def.payload);
    if (!checked.ok) throw new PayloadValidationError(def.task, checked.issues, `${where} (task "${def.task}")`);
    return this.client.schedule(def as ScheduleDefinition);
  }

  /** A worker running the set's tasks (or those named in `tasks`); see `Leasehold.worker`. */
  worker(options: TypedWorkerOptions<T> = {}): Worker {
    const { tasks: names, handlers: extra = {}, ...rest } = options;
    const chosen = names === undefined ? [...this.tasks.values()] : names.map((n) => this.taskForWorker(n));
    const handlers = toHandlers(chosen, "worker tasks");
    for (const name of Object.keys(extra)) {
      if (name in handlers) throw new ConfigError(`task "${name}" is both a defined task and in handlers; keep one`);
    }
    return this.client.worker({ ...rest, handlers: { ...handlers, ...extra } });
  }

  private taskForWorker(name: unknown): AnyTask {
    try {
      return knownTask(this.tasks, name, "worker tasks");
    } catch (err) {
      throw new ConfigError((err as Error).message);
    }
  }
}
