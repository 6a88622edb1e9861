/**
 * A worker process for test/upgrade.test.ts, of either release. It imports Leasehold from
 * LEASEHOLD_ENTRY: the previous release's built packages/leasehold/dist/index.js (run with
 * plain node, as that release shipped), or this tree's source (run with tsx). Plain JavaScript,
 * so that both releases' code runs it unchanged.
 *
 * Task "work" sleeps payload.ms (ended early by its signal) and returns { by: WORKER_NAME }, or
 * throws "asked to fail" with payload.fail.
 * Prints one JSON object a line: {ready}, {start}, {end}, {enqueued}, and {log} for every log
 * line at warn or error. Reads commands on stdin, one a line: "stats" (prints the client's
 * stats() and a page of listJobs(), or the error they threw), "stop-producing".
 *
 * Environment: LEASEHOLD_ENTRY, DATABASE_URL, LEASEHOLD_SCHEMA, WORKER_NAME, QUEUES (a,b; default: "default"), MIGRATE ("false":
 * connect with migrate: false), PRODUCE_EVERY_MS (enqueue a "work" job this often with this
 * process's client: every tenth runs longer than the lease).
 */
import { pathToFileURL } from "node:url";
import process from "node:process";
import readline from "node:readline";
import { clearInterval, setInterval } from "node:timers";
import { HEARTBEAT_MS, LEASE_MS, output, workHandler } from "./common.mjs";

/** Longer than the lease: only heartbeats keep such a job's attempt alive. */
const LONG_JOB_MS = 4_500;

const name = process.env.WORKER_NAME;
const { print, logger } = output(name);

const { Leasehold } = await import(pathToFileURL(process.env.LEASEHOLD_ENTRY).href);
const lh = await Leasehold.connect({ logger, migrate: process.env.MIGRATE !== "false" });

const worker = lh.worker({
  name,
  queues: process.env.QUEUES ? process.env.QUEUES.split(",") : ["default"],
  concurrency: 5,
  leaseMs: LEASE_MS,
  heartbeatMs: HEARTBEAT_MS,
  pollIntervalMs: 250,
  handlers: { work: workHandler(name, print) },
});
await worker.start();
print({ ready: worker.id });

let producing;
let seq = 0;
const inFlight = new Set();
if (process.env.PRODUCE_EVERY_MS) {
  producing = setInterval(() => {
    const n = seq++;
    const enqueued = lh.enqueue("work", { ms: n % 10 === 5 ? LONG_JOB_MS : 100 + ((n * 37) % 300), from: name, n }).then(
      (job) => print({ enqueued: job.id }),
      (err) => print({ log: "error", msg: `enqueue failed: ${err.message}` }),
    );
    inFlight.add(enqueued);
    void enqueued.finally(() => inFlight.delete(enqueued));
  }, Number(process.env.PRODUCE_EVERY_MS));
}

readline.createInterface({ input: process.stdin }).on("line", (line) => {
  if (line === "stop-producing") {
    clearInterval(producing);
    // Every job enqueued is printed before this line.
    void Promise.all(inFlight).then(() => print({ stoppedProducing: seq }));
  } else if (line === "stats") {
    Promise.all([lh.stats(), lh.listJobs({ limit: 100 })]).then(
      ([stats, jobs]) => print({ stats: stats.counts, listed: jobs.map((j) => ({ id: j.id, state: j.state })) }),
      (err) => print({ log: "error", msg: `stats failed: ${err.message}` }),
    );
  }
});

process.on("SIGTERM", () => {
  clearInterval(producing);
  worker
    .stop()
    .then(() => lh.close())
    .then(
      () => process.exit(0),
      (err) => (print({ log: "error", msg: `stop failed: ${err.message}` }), process.exit(1)),
    );
});
