/**
 * The chaos workload: what the producer enqueues and what the handlers do with it.
 * Handlers take random time (a few far longer than the lease, kept alive by heartbeats),
 * some attempts fail and retry, a few jobs always fail (poison, they end dead), most write
 * a result downstream with a fenced write, half-way through their work, and most of the
 * others finish inside ctx.transaction, writing a row that commits with their completion.
 * Every handler returns its result: its own attempt and worker, and (in graphs) what it read of
 * its parents. A share of the jobs come as graphs (chains, fan-outs, fan-ins, diamonds; some
 * nodes run whatever their parents' end) and as batches with a callback (chaos/graph-checks.ts).
 * A share of the plain jobs are durable: steps, a transactional step, a sleep and a wait for an
 * event (chaos/durable-workload.ts, checked by chaos/step-checks.ts).
 */
import { fencedWrite, type FencedWriteDb, type JobContext, type Leasehold, type NewJob } from "../packages/leasehold/src/index.js";
import { RESULTS_TABLE } from "./config.js";
import type { ProcessLog } from "./process-log.js";
import { PROBE_QUEUE, pickFlowQueue } from "./flow-queues.js";
import type { ChaosJobResult, GraphRole } from "./graph-checks.js";
import { DURABLE_SHARE, makeDurablePlan, runDurable, type DurablePlan } from "./durable-workload.js";

export const TASK = "chaos";
export const QUEUE = "chaos";

export interface ChaosPayload {
  seq: number;
  /** Work before and after the downstream write, in ms. */
  beforeMs: number;
  afterMs: number;
  write: boolean;
  /** End inside ctx.transaction: a row in the effects table commits with the completion (or neither). */
  tx: boolean;
  /** Chance that an attempt throws. */
  failRate: number;
  poison: boolean;
  /** A careless handler ignores ctx.signal and goes on writing after its lease is gone. */
  honorsSignal: boolean;
  /** The job's flow-control key, also kept here: finished jobs keep their payload, not their key. */
  key?: string;
  /** Its place in a graph or batch, also kept here: finished jobs keep no on_parent_failure. */
  graph?: GraphRole;
  /** A durable job: what its steps do (durable-workload.ts). */
  durable?: DurablePlan;
}

/** The job for sequence number `seq`; `random` makes the mix; `durableShare`: the chance it is a durable job. */
export function makeJob(seq: number, random: () => number, leaseMs: number, maxAttempts: number, durableShare = 0): NewJob {
  if (random() < durableShare) return durableJob(seq, random, maxAttempts);
  const r = random();
  // ~75% short, ~20% medium, ~4% around the lease, ~1% far longer than the lease (kept
  // alive by heartbeats): a mean of about 0.3 s.
  const total =
    r < 0.75 ? 20 + random() * 180 : r < 0.95 ? 200 + random() * 400 : r < 0.99 ? 1_000 + random() * leaseMs : leaseMs * (1.5 + random() * 1.5);
  const flow = pickFlowQueue(random);
  const split = random();
  const poison = random() < 0.005;
  const write = random() < 0.7;
  const payload: ChaosPayload = {
    seq,
    beforeMs: Math.round(total * split),
    afterMs: Math.round(total * (1 - split)),
    write,
    tx: !write && random() < 0.8,
    failRate: 0.08,
    poison,
    honorsSignal: random() < 0.5,
    ...(flow.key && { key: flow.key }),
  };
  return {
    task: TASK,
    queue: flow.queue ?? QUEUE,
    ...(flow.key && { key: flow.key }),
    payload,
    maxAttempts: poison ? 3 : maxAttempts,
    uniqueKey: `chaos-${seq}`,
  };
}

/**
 * A durable job: in the main queue, never poison (it must end succeeded), its last attempt
 * failing now and then after its steps (the next attempt replays them all), careless half the time.
 */
function durableJob(seq: number, random: () => number, maxAttempts: number): NewJob {
  const payload: ChaosPayload = {
    seq,
    beforeMs: 0,
    afterMs: 0,
    write: false,
    tx: false,
    failRate: 0.08,
    poison: false,
    honorsSignal: random() < 0.5,
    durable: makeDurablePlan(seq, random),
  };
  return { task: TASK, queue: QUEUE, payload, maxAttempts, uniqueKey: `chaos-${seq}` };
}

/**
 * A job of the `flow_kill` fault's probe queue: `ms` of work that always succeeds. Its sequence
 * number is negative (probes are not among the producer's jobs). `leaseMs`: the blocker gets a
 * long lease, so only crash detection can give its slot back within seconds.
 */
export function probeJob(seq: number, ms: number, maxAttempts: number, leaseMs?: number): NewJob {
  const payload: ChaosPayload = { seq, beforeMs: ms, afterMs: 0, write: false, tx: false, failRate: 0, poison: false, honorsSignal: true };
  return { task: TASK, queue: PROBE_QUEUE.name, payload, maxAttempts, uniqueKey: `chaos-probe${seq}`, ...(leaseMs && { leaseMs }) };
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** Faults a worker process is asked to act out in its own handlers. */
export interface HandlerFaults {
  /** Handlers still to hang (the `hang` fault). */
  hangNext: number;
}

/** Reports progress at least this often while it works, well inside the task's progress timeout. */
const PROGRESS_EVERY_MS = 250;

/**
 * `effectsTable`: the schema-qualified table transactional jobs write to (ctx.transaction
 * runs with the server's default search_path, not the chaos schema).
 */
export function chaosHandler(
  db: FencedWriteDb,
  log: ProcessLog,
  workerId: () => string,
  faults: HandlerFaults = { hangNext: 0 },
  effectsTable?: string,
  /** The chaos schema: durable jobs write their step rows there. */
  schema?: string,
) {
  return async (p: ChaosPayload, ctx: JobContext): Promise<ChaosJobResult> => {
    // Its start, abort and settling are logged by the wrapper (withTimeline, process-log.ts).
    const w = workerId();
    const result: ChaosJobResult = { seq: p.seq, attempt: ctx.attempt, worker: w };
    if (faults.hangNext > 0) {
      faults.hangNext--;
      log.write({ ev: "hang", t: Date.now(), w, job: ctx.jobId, attempt: ctx.attempt });
      // A socket that never answers: no progress, no end, deaf to the signal.
      return new Promise<never>(() => {});
    }
    // What the handler read of its parents goes into its result, for the checker to compare.
    if (p.graph?.role === "callback") result.dependencies = await ctx.dependencies();
    else if (p.graph) result.parents = (await ctx.parents()).map((x) => ({ id: x.id, state: x.state }));
    const signal = p.honorsSignal ? ctx.signal : undefined;
    const work = async (ms: number) => {
      for (let left = ms; left > 0; left -= PROGRESS_EVERY_MS) {
        ctx.progress({ seq: p.seq, at: Date.now() });
        await sleep(Math.min(left, PROGRESS_EVERY_MS), signal);
      }
    };
    if (p.durable && schema) {
      result.received = (await runDurable(p.durable, ctx, { db, schema, worker: w, work })).received;
    }
    await work(p.beforeMs);
    if (p.write) {
      let accepted: boolean;
      try {
        accepted = await fencedWrite(db, {
          table: RESULTS_TABLE,
          key: { job_id: ctx.jobId },
          token: ctx.attempt,
          values: { worker_id: w },
        });
      } catch (err) {
        log.write({ ev: "write", t: Date.now(), w, job: ctx.jobId, attempt: ctx.attempt, accepted: null, error: String(err) });
        throw err;
      }
      log.write({ ev: "write", t: Date.now(), w, job: ctx.jobId, attempt: ctx.attempt, accepted });
      // The downstream itself refused us: a newer attempt owns the job. Stop here.
      if (!accepted) throw new Error("downstream refused a stale write");
    }
    await work(p.afterMs);
    const failure = p.poison
      ? "chaos: poison job always fails"
      : attemptFails(p.seq, ctx.attempt, p.failRate)
        ? "chaos: injected failure"
        : undefined;
    if (p.tx && effectsTable) {
      // The write comes first and the failure after it, inside the transaction: a failed
      // attempt's row must roll back with it.
      // The job ends at this commit: its result goes with it.
      await ctx.transaction(
        async (tx) => {
          await tx.query(`INSERT INTO ${effectsTable} (job_id, attempt, worker_id) VALUES ($1, $2, $3)`, [ctx.jobId, ctx.attempt, w]);
          if (failure) throw new Error(failure);
        },
        { result: { ...result } },
      );
      return result;
    }
    if (failure) throw new Error(failure);
    return result;
  };
}

/** Deterministic per (job, attempt), so a rerun of the same attempt decides the same way. */
function attemptFails(seq: number, attempt: number, rate: number): boolean {
  let h = (seq * 2654435761 + attempt * 40503) >>> 0;
  h ^= h >>> 16;
  h = Math.imul(h, 0x45d9f3b) >>> 0;
  h = (h ^ (h >>> 16)) >>> 0;
  return h / 4294967296 < rate;
}

/** The share of the producer's batches of jobs sent as graphs and batches instead. */
export const GRAPH_SHARE = 0.4;
/** Poison (always failing, ends dead) among graph nodes and batch members: failed parents to cancel or run past. */
const GRAPH_POISON = 0.08;
/** Graph nodes that run whatever their parents' end (onParentFailure 'run'). */
const RUN_ON_FAILURE = 0.3;

type FlowNodes = Parameters<Leasehold["enqueueFlow"]>[0];
type BatchInput = Parameters<Leasehold["enqueueBatch"]>[0];

/** One enqueue call of the producer: plain jobs, a graph, or a batch with its callback. */
export type Unit = { kind: "jobs"; jobs: NewJob[] } | { kind: "flow"; nodes: FlowNodes } | { kind: "batch"; batch: BatchInput };

/** A graph node or batch member from the chaos job of `seq`: no unique key (a graph refuses one), its role in the payload. */
function graphJob(seq: number, random: () => number, leaseMs: number, maxAttempts: number, graph: GraphRole): NewJob {
  const { uniqueKey: _u, ...job } = makeJob(seq, random, leaseMs, maxAttempts);
  const p = job.payload as ChaosPayload;
  // A callback always ends succeeded, in time; nodes and members fail for good now and then.
  const poison = graph.role !== "callback" && random() < GRAPH_POISON;
  return { ...job, payload: { ...p, poison, graph }, maxAttempts: poison ? 3 : maxAttempts };
}

/**
 * The jobs of seq `from` to `from + n - 1` as enqueue calls: mostly plain jobs; a share as graphs
 * (a chain, a fan-out, a fan-in, a diamond) or batches, each taking the next few seqs.
 */
export function makeUnits(from: number, n: number, random: () => number, leaseMs: number, maxAttempts: number): Unit[] {
  if (random() >= GRAPH_SHARE)
    return [{ kind: "jobs", jobs: Array.from({ length: n }, (_, i) => makeJob(from + i, random, leaseMs, maxAttempts, DURABLE_SHARE)) }];
  const units: Unit[] = [];
  for (let seq = from; seq < from + n;) {
    const size = Math.min(from + n - seq, 3 + Math.floor(random() * 6));
    const seqs = Array.from({ length: size }, (_, i) => seq + i);
    seq += size;
    const shape = size < 3 ? "chain" : (["chain", "fan-out", "fan-in", "diamond", "batch"] as const)[Math.floor(random() * 5)]!;
    if (shape === "batch") {
      const [callback, ...members] = seqs;
      units.push({
        kind: "batch",
        batch: {
          jobs: members.map((s) => graphJob(s, random, leaseMs, maxAttempts, { role: "member" })),
          onComplete: graphJob(callback!, random, leaseMs, maxAttempts, { role: "callback", onParentFailure: "run" }),
        },
      });
      continue;
    }
    const refs = seqs.map((s) => `s${s}`);
    const parentsOf = (i: number): string[] => {
      if (shape === "chain") return i === 0 ? [] : [refs[i - 1]!];
      if (shape === "fan-out") return i === 0 ? [] : [refs[0]!];
      if (shape === "fan-in") return i === size - 1 ? refs.slice(0, -1) : [];
      // diamond: the first is everyone's root, the last waits for all in between
      return i === 0 ? [] : i === size - 1 ? refs.slice(1, -1) : [refs[0]!];
    };
    units.push({
      kind: "flow",
      nodes: seqs.map((s, i) => {
        const dependsOn = parentsOf(i);
        const onParentFailure = dependsOn.length && random() < RUN_ON_FAILURE ? "run" : "cancel";
        return { ref: refs[i]!, ...graphJob(s, random, leaseMs, maxAttempts, { role: "node", onParentFailure }), dependsOn, onParentFailure };
      }),
    });
  }
  return units;
}
