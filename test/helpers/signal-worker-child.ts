/**
 * A worker process shut down as the README shows: `worker.stopOnSignals({ afterStop: () =>
 * lh.close() })` and nothing else (no exit of its own). Task "hold" never ends and ignores its
 * signal; "finish" ends FINISH_MS after it starts. Prints "started <job id>" when a handler
 * starts and "ready" once started. Environment: DATABASE_URL, LEASEHOLD_SCHEMA,
 * SHUTDOWN_TIMEOUT_MS, FINISH_MS.
 */
import pino from "pino";
import { Leasehold } from "../../packages/leasehold/src/client.js";

const lh = await Leasehold.connect({ logger: pino({ level: "silent" }) });
const worker = lh.worker({
  watchdog: false,
  shutdownTimeoutMs: Number(process.env.SHUTDOWN_TIMEOUT_MS),
  handlers: {
    hold: () => new Promise(() => {}),
    finish: () => new Promise((r) => setTimeout(() => r({ finished: true }), Number(process.env.FINISH_MS))),
  },
});
worker.on("job:start", (job: { id: string }) => process.stdout.write(`started ${job.id}\n`));
await worker.start();
worker.stopOnSignals({ afterStop: () => lh.close() });
process.stdout.write("ready\n");
