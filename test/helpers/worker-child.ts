/**
 * A worker in a process of its own, for tests that kill it for real: it runs task "hold"
 * (never ends) and "quick" with the default lease, no watchdog, and prints "started <job id>"
 * when a handler starts. Environment: DATABASE_URL, LEASEHOLD_SCHEMA, WORKER_NAME (optional),
 * NATS_URL (optional: NATS dispatch), LEASE_MS (optional), MAX_RUN (optional: the worker's
 * maximum run time in ms, or "none"), HEARTBEAT_MS (optional: beat this often, lease three
 * times that; a long one keeps beats out of a test's way).
 */
import pino from "pino";
import { Leasehold } from "../../packages/leasehold/src/client.js";

const lh = await Leasehold.connect({ logger: pino({ level: "silent" }), ...(process.env.NATS_URL && { nats: process.env.NATS_URL }) });
const worker = lh.worker({
  watchdog: false,
  ...(process.env.WORKER_NAME && { name: process.env.WORKER_NAME }),
  ...(process.env.LEASE_MS && { leaseMs: Number(process.env.LEASE_MS) }),
  ...(process.env.MAX_RUN && { maxRunMs: process.env.MAX_RUN === "none" ? null : Number(process.env.MAX_RUN) }),
  ...(process.env.HEARTBEAT_MS && { heartbeatMs: Number(process.env.HEARTBEAT_MS), leaseMs: 3 * Number(process.env.HEARTBEAT_MS) }),
  handlers: {
    hold: () => new Promise(() => {}),
    quick: () => undefined,
  },
});
worker.on("job:start", (job: { id: string }) => process.stdout.write(`started ${job.id}\n`));
await worker.start();
process.stdout.write(`ready ${worker.id}\n`);
process.on(
  "SIGTERM",
  () =>
    void worker
      .stop(0)
      .then(() => lh.close())
      .then(() => process.exit(0)),
);
