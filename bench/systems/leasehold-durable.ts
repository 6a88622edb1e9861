/**
 * Leasehold's durable steps (docs/durable.md) in the durable workloads: each workflow is a job
 * whose handler runs `ctx.step`, `ctx.waitForEvent` and `ctx.sleep`; the benchmark process
 * enqueues them with `lh.enqueueMany` and sends events with `lh.sendEvent`. Same schema and
 * database as the job workloads (bench_leasehold, reset before each run).
 */
import type { JobContext } from "../../packages/leasehold/src/worker/context.js";
import { connect, recreateSchema } from "./leasehold.js";
import { STEPS_PER_WORKFLOW, type DurableArgs, type DurableDriver, type DurableStarter, type ResumeEvent } from "./durable.js";
import type { DurableShape, Payload } from "./types.js";

const ENQUEUE_BATCH = 5_000;
const EVENT = "bench.resume";
/** A waiter gives up after an hour: longer than any run. */
const WAIT_TIMEOUT_MS = 3_600_000;

const taskOf = (shape: DurableShape) => `durable_${shape}`;

export const leaseholdDurableDriver: DurableDriver = {
  workerSystem: "leasehold-durable",

  reset: recreateSchema,

  async open(url, shape): Promise<DurableStarter> {
    const lh = await connect(url);
    return {
      async start(workflows: DurableArgs[]) {
        for (let i = 0; i < workflows.length; i += ENQUEUE_BATCH) {
          await lh.enqueueMany(workflows.slice(i, i + ENQUEUE_BATCH).map((payload) => ({ task: taskOf(shape), payload })));
        }
      },
      async sendEvent(event: ResumeEvent) {
        await lh.sendEvent(EVENT, event);
      },
      async unfinished() {
        const { rows } = await lh.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM jobs");
        return rows[0]!.n;
      },
      async sleeping() {
        // A job asleep is suspended (no lease, no slot) with the wait its ctx.sleep recorded.
        const { rows } = await lh.pool.query<{ n: number }>(
          "SELECT count(*)::int AS n FROM jobs WHERE state = 'suspended' AND wait ->> 'kind' = 'sleep'",
        );
        return rows[0]!.n;
      },
      close: () => lh.close(),
    };
  },
};

/** The worker side: a worker with the three shapes' handlers, at the spec's concurrency. */
export const leaseholdDurable = {
  async startWorker(url: string, spec: { durable?: DurableShape; concurrency?: number }, run: (payload: Payload) => Promise<void>) {
    if (!spec.durable) throw new Error("leasehold-durable runs durable workflows only: WorkerSpec.durable is required");
    const lh = await connect(url, 10);
    const worker = lh.worker({ handlers: handlersOf(run), concurrency: spec.concurrency ?? 50, shutdownTimeoutMs: 1_000 });
    await worker.start();
    return {
      async stop() {
        await worker.stop();
        await lh.close();
      },
    };
  },
};

function handlersOf(run: (payload: Payload) => Promise<void>): Record<string, (payload: unknown, ctx: JobContext) => Promise<void>> {
  return {
    async [taskOf("steps")](_payload, ctx) {
      for (let i = 1; i <= STEPS_PER_WORKFLOW; i++) {
        // The first step reports the workflow's start (the clock starts at the first).
        await ctx.step(`s${i}`, async () => (i === 1 ? run({}).then(() => ({ ok: true })) : { ok: true }));
      }
    },
    async [taskOf("event")](payload, ctx) {
      const { id } = payload as DurableArgs;
      await ctx.step("ready", () => run({}).then(() => true));
      const event = await ctx.waitForEvent<ResumeEvent>("resume", { event: EVENT, match: { id }, timeout: WAIT_TIMEOUT_MS });
      if (!event) throw new Error("no event within an hour");
      await ctx.step("after", () => run({ t: event.t }).then(() => true));
    },
    async [taskOf("sleep")](payload, ctx) {
      await ctx.sleep("nap", new Date((payload as DurableArgs).wakeAt!));
    },
  };
}
