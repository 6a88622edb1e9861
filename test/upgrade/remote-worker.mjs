/**
 * A remote worker process for test/upgrade.test.ts: the previous release's `Worker` over its
 * `RemoteTransport`, talking to a server of this release (`leasehold serve`), as when the
 * server is upgraded before its remote workers. Imports LEASEHOLD_ENTRY (the previous release's
 * built packages/leasehold/dist/index.js) and runs with plain node, as that release shipped.
 *
 * Task "work" sleeps payload.ms (ended early by its signal) and returns { by: WORKER_NAME }, or
 * throws "asked to fail" with payload.fail. Prints one JSON object a line, as worker.mjs does:
 * {ready}, {start}, {end}, and {log} for every log line at warn or error. Stops on SIGTERM.
 *
 * Environment: LEASEHOLD_ENTRY, SERVER_URL, LEASEHOLD_TOKEN, WORKER_NAME.
 */
import { pathToFileURL } from "node:url";
import process from "node:process";
import { clearTimeout, setTimeout } from "node:timers";

const LEASE_MS = 3_000;
const HEARTBEAT_MS = 1_000;

const name = process.env.WORKER_NAME;
const print = (o) => process.stdout.write(JSON.stringify({ worker: name, at: Date.now(), ...o }) + "\n");
const logAt = (level) => (a, b) =>
  print({ log: level, msg: typeof a === "string" ? a : b, detail: typeof a === "object" ? JSON.stringify(a, errorsAsText) : undefined });
const logger = { debug() {}, info() {}, warn: logAt("warn"), error: logAt("error"), child: () => logger };

function errorsAsText(_key, value) {
  return value instanceof Error ? `${value.name}: ${value.message}` : value;
}

const { Worker, RemoteTransport } = await import(pathToFileURL(process.env.LEASEHOLD_ENTRY).href);

const sleep = (ms, signal) =>
  new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => (clearTimeout(timer), reject(signal.reason ?? new Error("aborted"))), { once: true });
  });

const worker = new Worker({
  name,
  logger,
  transport: new RemoteTransport({ serverUrl: process.env.SERVER_URL, token: process.env.LEASEHOLD_TOKEN, waitMs: 1_000 }),
  concurrency: 5,
  leaseMs: LEASE_MS,
  heartbeatMs: HEARTBEAT_MS,
  handlers: {
    work: async (payload, ctx) => {
      print({ start: ctx.jobId, attempt: ctx.attempt, ms: payload.ms });
      await sleep(payload.ms, ctx.signal);
      if (payload.fail) throw new Error("asked to fail");
      print({ end: ctx.jobId, attempt: ctx.attempt });
      return { by: name };
    },
  },
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
