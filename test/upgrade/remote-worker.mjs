/**
 * A remote worker process for test/upgrade.test.ts: the previous release's `Worker` over its
 * `RemoteTransport`, talking to a server of this release (`leasehold serve`), as when the
 * server is upgraded before its remote workers. Imports LEASEHOLD_ENTRY (the previous release's
 * built packages/leasehold/dist/index.js) and runs with plain node, as that release shipped.
 *
 * Task "work" and the output lines are worker.mjs's (common.mjs): {ready}, {start}, {end}, and
 * {log} for every log line at warn or error. Stops on SIGTERM.
 *
 * Environment: LEASEHOLD_ENTRY, SERVER_URL, LEASEHOLD_TOKEN, WORKER_NAME.
 */
import { pathToFileURL } from "node:url";
import process from "node:process";
import { HEARTBEAT_MS, LEASE_MS, output, workHandler } from "./common.mjs";

const name = process.env.WORKER_NAME;
const { print, logger } = output(name);
const { Worker, RemoteTransport } = await import(pathToFileURL(process.env.LEASEHOLD_ENTRY).href);

const worker = new Worker({
  name,
  logger,
  transport: new RemoteTransport({ serverUrl: process.env.SERVER_URL, token: process.env.LEASEHOLD_TOKEN, waitMs: 1_000 }),
  concurrency: 5,
  leaseMs: LEASE_MS,
  heartbeatMs: HEARTBEAT_MS,
  handlers: { work: workHandler(name, print) },
});
await worker.start();
print({ ready: worker.id });

process.on("SIGTERM", () => {
  void worker.stop().then(
    () => process.exit(0),
    (err) => {
      print({ log: "error", msg: `stop failed: ${err.message}` });
      process.exit(1);
    },
  );
});
