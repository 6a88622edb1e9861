/**
 * A worker in a process of its own running the durable "trip" task (durable-trip.ts) with its
 * holds, for tests that kill it (-9) at a point of a durable job. No watchdog: the test's own
 * recovers what it leaves. Prints "ready <worker id>", then "at <point> <job id>" at each hold.
 * Environment: DATABASE_URL, LEASEHOLD_SCHEMA, APP_SCHEMA (the effects and ledger tables).
 *
 * "record-charge" holds a record in the transport: the statement that would record the job's
 * "charge" step is never sent, so the process dies with the body run and no record.
 */
import pino from "pino";
import type { StepOutcome } from "../../packages/leasehold/src/store/steps.js";
import { Leasehold } from "../../packages/leasehold/src/client.js";
import { DatabaseTransport } from "../../packages/leasehold/src/worker/transport.js";
import { tripTask } from "./durable-trip.js";

const mark = (point: string, jobId: string) => process.stdout.write(`at ${point} ${jobId}\n`);
const heldRecords = new Set<string>();
const recordSteps = DatabaseTransport.prototype.recordSteps;
DatabaseTransport.prototype.recordSteps = function (p: { workerId: string; steps: StepOutcome[] }) {
  const held = p.steps.find((s) => s.name === "charge" && heldRecords.has(s.id));
  if (!held) return recordSteps.call(this, p);
  mark("record-charge", held.id);
  return new Promise<never>(() => {});
};

const lh = await Leasehold.connect({ logger: pino({ level: "silent" }) });
const worker = lh.worker({
  watchdog: false,
  scheduler: false,
  handlers: { trip: tripTask(lh.pool, process.env.APP_SCHEMA!, { holding: true, mark, holdRecord: (id) => heldRecords.add(id) }) },
});
await worker.start();
process.stdout.write(`ready ${worker.id}\n`);
