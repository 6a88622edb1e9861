/**
 * Graphs of jobs (lh.enqueueFlow) and batches (lh.enqueueBatch), checked before anything is
 * written: every node like an enqueue, and the graph itself (refs, edges, cycles, size). A
 * refused graph fails whole, with an error naming the node and the problem.
 */
import { ValidationError } from "../errors.js";
import { isJobId, MAX_JOB_ID } from "./ids.js";
import type { EnqueueOptions, NewJob } from "./types.js";
import { checkText, describeValue, normalizeJob, suggest, type NormalizedJob } from "./validate.js";

/** A graph is written in one transaction: these bound its size (and that transaction's). */
export const MAX_FLOW_NODES = 25_000;
export const MAX_FLOW_EDGES = 100_000;
export const MAX_REF_LENGTH = 256;

/** What a dependent job does when a parent ends dead or cancelled. */
export type OnParentFailure = "cancel" | "run";

/** A node of a flow: a job with a name in the graph and the jobs it waits for. */
export interface FlowNode extends Omit<EnqueueOptions, "uniqueKey"> {
  /** The node's name in this graph: what `dependsOn` and the result's `jobs` use. */
  ref: string;
  task: string;
  payload?: unknown;
  /** Refs of nodes in this graph, or `{ id }` of unfinished jobs: this job runs once they have all succeeded. */
  dependsOn?: (string | { id: string })[];
  /** A parent ended dead or cancelled: cancel this job (default), or run it once every parent has ended. */
  onParentFailure?: OnParentFailure;
}

/** A batch: its members, and the job enqueued once every member has ended (succeeded, dead or cancelled). */
export interface BatchInput {
  jobs: NewJob[];
  onComplete: Omit<NewJob, "uniqueKey">;
}

/** A node ready for the store: the job, its parents in the graph (indexes) and outside it (ids). */
export interface PreparedNode {
  ref: string;
  job: NormalizedJob;
  /** Indexes of this node's parents among the graph's nodes. */
  parents: number[];
  /** Ids of existing jobs this node waits for. */
  parentIds: string[];
  onParentFailure: OnParentFailure;
  /** Some node of the graph depends on this one. */
  hasDependents: boolean;
}

const FLOW_KEYS = new Set(["ref", "dependsOn", "onParentFailure"]);
const JOB_OPTION_KEYS = [
  "task",
  "payload",
  "queue",
  "priority",
  "runAt",
  "delayMs",
  "maxAttempts",
  "key",
  "leaseMs",
  "progressTimeoutMs",
  "maxRunMs",
  "headers",
];
const NODE_KEYS = new Set([...FLOW_KEYS, ...JOB_OPTION_KEYS]);

/** One node as given, named for messages (`node "ref"`, or `job 3` in a batch). */
interface RawNode {
  where: string;
  ref: string;
  value: Record<string, unknown>;
  dependsOn: unknown;
  onParentFailure: unknown;
}

/** Checks a flow's nodes; returns them ready for the store, in input order. */
/** A flow's outer shape, checked before the enqueue hooks see its nodes. */
export function checkFlowShape(nodes: unknown): asserts nodes is unknown[] {
  if (!Array.isArray(nodes)) throw new ValidationError(`a flow is an array of nodes (got ${describeValue(nodes)})`);
}

export function prepareFlow(nodes: unknown): PreparedNode[] {
  checkFlowShape(nodes);
  checkNodeCount(nodes.length);
  const raw = nodes.map((node, i): RawNode => {
    if (node === null || typeof node !== "object" || Array.isArray(node)) {
      throw new ValidationError(`node ${i}: expected an object with a ref and a task (got ${describeValue(node)})`);
    }
    const value = node as Record<string, unknown>;
    checkText(value.ref, `node ${i}: ref`, MAX_REF_LENGTH);
    return { where: `node ${JSON.stringify(value.ref)}`, ref: value.ref, value, dependsOn: value.dependsOn, onParentFailure: value.onParentFailure };
  });
  return prepare(raw);
}

/**
 * A batch as a flow: the members have no parents, the callback depends on all of them and
 * runs whatever they ended as. Members are named `job <index>`, the callback `onComplete`.
 */
/** A batch's outer shape ({ jobs: [...], onComplete: {...} }), checked before the enqueue hooks see its jobs. */
export function checkBatchShape(batch: unknown): asserts batch is BatchInput {
  if (batch === null || typeof batch !== "object" || Array.isArray(batch)) {
    throw new ValidationError(`a batch is an object { jobs, onComplete } (got ${describeValue(batch)})`);
  }
  const { jobs, onComplete, ...rest } = batch as Record<string, unknown>;
  const extra = Object.keys(rest)[0];
  if (extra !== undefined) throw new ValidationError(`batch: unknown field "${extra}"${suggest(extra, ["jobs", "onComplete"])}`);
  if (!Array.isArray(jobs)) throw new ValidationError(`batch: jobs must be an array of jobs (got ${describeValue(jobs)})`);
  if (onComplete === null || typeof onComplete !== "object" || Array.isArray(onComplete)) {
    throw new ValidationError(`batch: onComplete must be a job ({ task, payload?, ...options }) (got ${describeValue(onComplete)})`);
  }
}

export function prepareBatch(batch: unknown): PreparedNode[] {
  checkBatchShape(batch);
  const { jobs, onComplete } = batch as { jobs: unknown[]; onComplete: Record<string, unknown> };
  checkNodeCount(jobs.length + 1);
  const raw: RawNode[] = jobs.map((job, i) => {
    if (job === null || typeof job !== "object" || Array.isArray(job)) {
      throw new ValidationError(`job ${i}: expected an object with a task (got ${describeValue(job)})`);
    }
    for (const key of ["ref", "dependsOn", "onParentFailure"]) {
      if (key in job) throw new ValidationError(`job ${i}: "${key}" belongs to flows; a batch's members have no parents`);
    }
    return { where: `job ${i}`, ref: `job ${i}`, value: job as Record<string, unknown>, dependsOn: undefined, onParentFailure: undefined };
  });
  for (const key of ["ref", "dependsOn", "onParentFailure"]) {
    if (key in onComplete) throw new ValidationError(`onComplete: "${key}" is not an option of a batch's callback (it depends on every member)`);
  }
  raw.push({
    where: "onComplete",
    ref: "onComplete",
    value: onComplete as Record<string, unknown>,
    dependsOn: raw.map((r) => r.ref),
    onParentFailure: "run",
  });
  return prepare(raw);
}

function checkNodeCount(n: number): void {
  if (n > MAX_FLOW_NODES) {
    throw new ValidationError(`the graph has ${n.toLocaleString("en-US")} nodes, over the limit of ${MAX_FLOW_NODES.toLocaleString("en-US")} nodes`);
  }
}

function prepare(raw: RawNode[]): PreparedNode[] {
  const index = new Map<string, number>();
  raw.forEach((node, i) => {
    const earlier = index.get(node.ref);
    if (earlier !== undefined) throw new ValidationError(`duplicate ref ${JSON.stringify(node.ref)} (nodes ${earlier} and ${i})`);
    index.set(node.ref, i);
  });

  // Edge count first: a graph over the limit is refused before its edges are walked one by one.
  let edges = 0;
  for (const node of raw) {
    if (node.dependsOn === undefined) continue;
    if (!Array.isArray(node.dependsOn)) {
      throw new ValidationError(`${node.where}: dependsOn must be an array of refs or { id } (got ${describeValue(node.dependsOn)})`);
    }
    edges += node.dependsOn.length;
  }
  if (edges > MAX_FLOW_EDGES) {
    throw new ValidationError(
      `the graph has ${edges.toLocaleString("en-US")} edges (dependsOn entries), over the limit of ${MAX_FLOW_EDGES.toLocaleString("en-US")} edges`,
    );
  }

  const prepared = raw.map((node): PreparedNode => {
    const { where, value } = node;
    const options: Record<string, unknown> = {};
    for (const [key, v] of Object.entries(value)) {
      if (key === "uniqueKey") {
        throw new ValidationError(
          `${where}: uniqueKey is not allowed in a flow or batch (each node is always a new job; a key matching an existing job would leave its dependents without it)`,
        );
      }
      if (!NODE_KEYS.has(key)) throw new ValidationError(`${where}: unknown option "${key}"${suggest(key, NODE_KEYS)}`);
      if (!FLOW_KEYS.has(key)) options[key] = v;
    }
    const job = normalizeJob(options as unknown as NewJob, where);
    const failure = node.onParentFailure ?? "cancel";
    if (failure !== "cancel" && failure !== "run") {
      throw new ValidationError(`${where}: onParentFailure must be "cancel" or "run" (got ${describeValue(failure)})`);
    }
    const parents: number[] = [];
    const parentIds: string[] = [];
    const seen = new Set<string>();
    for (const dep of (node.dependsOn as unknown[] | undefined) ?? []) {
      if (typeof dep === "string") {
        const at = index.get(dep);
        if (at === undefined) throw new ValidationError(`${where}: dependsOn names unknown ref ${describeValue(dep)}${suggest(dep, index.keys())}`);
        if (dep === node.ref) throw new ValidationError(`${where} depends on itself`);
        if (seen.has(dep)) throw new ValidationError(`${where}: dependsOn names ref ${JSON.stringify(dep)} twice`);
        seen.add(dep);
        parents.push(at);
      } else if (dep !== null && typeof dep === "object" && !Array.isArray(dep) && Object.keys(dep).length === 1 && "id" in dep) {
        const id = (dep as { id: unknown }).id;
        if (!isJobId(id)) {
          throw new ValidationError(
            `${where}: dependsOn { id } must be a job id, a positive integer no larger than ${MAX_JOB_ID} (got ${describeValue(id)})`,
          );
        }
        const key = `#${id}`;
        if (seen.has(key)) throw new ValidationError(`${where}: dependsOn names job ${id} twice`);
        seen.add(key);
        parentIds.push(id);
      } else {
        throw new ValidationError(`${where}: each dependsOn entry is a ref (a string) or { id: "<job id>" } (got ${describeValue(dep)})`);
      }
    }
    return { ref: node.ref, job, parents, parentIds, onParentFailure: failure, hasDependents: false };
  });
  for (const node of prepared) for (const p of node.parents) prepared[p]!.hasDependents = true;
  const cycle = findCycle(prepared);
  if (cycle) throw new ValidationError(`the graph has a cycle: ${cycle.map((i) => JSON.stringify(prepared[i]!.ref)).join(" → ")}`);
  return prepared;
}

/**
 * A cycle among the nodes' parent edges, as the indexes along it (first repeated at the end),
 * or undefined. Iterative depth-first search: a chain of 25,000 nodes would overflow a
 * recursive one.
 */
function findCycle(nodes: PreparedNode[]): number[] | undefined {
  const NEW = 0,
    OPEN = 1,
    DONE = 2;
  const color = new Uint8Array(nodes.length);
  for (let start = 0; start < nodes.length; start++) {
    if (color[start] !== NEW) continue;
    const path: number[] = [start];
    const next: number[] = [0];
    color[start] = OPEN;
    while (path.length > 0) {
      const top = path.length - 1;
      const node = path[top]!;
      const parents = nodes[node]!.parents;
      const i = next[top]!;
      if (i === parents.length) {
        color[node] = DONE;
        path.pop();
        next.pop();
        continue;
      }
      next[top] = i + 1;
      const p = parents[i]!;
      if (color[p] === OPEN) {
        // The path from p to here, then p again: walking parent edges, so reverse it to read
        // in the direction of the edges (parent → child).
        const cycle = path.slice(path.indexOf(p));
        cycle.push(p);
        return cycle.reverse();
      }
      if (color[p] === NEW) {
        color[p] = OPEN;
        path.push(p);
        next.push(0);
      }
    }
  }
  return undefined;
}
