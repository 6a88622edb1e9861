/**
 * `npm run chaos -- --jobs 100000`: one chaos run, its report printed as Markdown and
 * written (JSON and Markdown) under chaos/results/. Exits 1 if any invariant broke.
 */
import path from "node:path";
import { Command, InvalidArgumentError } from "commander";
import { optionsFor, type ChaosOptions } from "./config.js";
import { runChaos } from "./harness.js";
import { resolveWorkerSettings } from "../packages/leasehold/src/worker/options.js";
import { REPO_ROOT } from "./supervisor.js";

function positiveInt(name: string) {
  return (value: string): number => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < 1) throw new InvalidArgumentError(`${name} must be a positive integer (got ${JSON.stringify(value)})`);
    return n;
  };
}

const program = new Command("chaos")
  .description("Run Leasehold under injected faults (kills, zombies, partitions, restarts...) and check its invariants")
  .option("--jobs <n>", "jobs to enqueue", positiveInt("--jobs"))
  .option("--workers <n>", "worker processes", positiveInt("--workers"))
  .option("--watchdogs <n>", "watchdog-only processes", positiveInt("--watchdogs"))
  .option("--concurrency <n>", "handlers per worker", positiveInt("--concurrency"))
  .option("--lease-ms <n>", "lease length", positiveInt("--lease-ms"))
  .option("--fault-window-s <n>", "seconds of fault injection (default scales with --jobs)", positiveInt("--fault-window-s"))
  .option("--dispatch <mode>", "how workers learn of jobs: polling (LISTEN/NOTIFY, default) or nats (JetStream; adds NATS faults)", (v: string) => {
    if (v !== "polling" && v !== "nats") throw new InvalidArgumentError(`--dispatch must be polling or nats (got ${JSON.stringify(v)})`);
    return v;
  })
  .option("--record <on|off>", "off: the run's queues keep no record of succeeded jobs (the checker reads its own audit instead)", (v: string) => {
    if (v !== "on" && v !== "off") throw new InvalidArgumentError(`--record must be on or off (got ${JSON.stringify(v)})`);
    return v;
  })
  .option("--seed <n>", "random seed, to replay a run's choices", positiveInt("--seed"))
  .option("--out <dir>", "where reports and process logs go", path.join(REPO_ROOT, "chaos", "results"))
  .option("--quiet", "print only the report")
  .showHelpAfterError();

program.parse();
const o = program.opts<{
  jobs?: number;
  workers?: number;
  watchdogs?: number;
  concurrency?: number;
  leaseMs?: number;
  faultWindowS?: number;
  seed?: number;
  dispatch?: "polling" | "nats";
  record?: "on" | "off";
  out: string;
  quiet?: boolean;
}>();
const partial: Partial<ChaosOptions> & { outDir: string } = { outDir: path.resolve(o.out), verbose: !o.quiet };
if (o.jobs) partial.jobs = o.jobs;
if (o.workers) partial.workers = o.workers;
if (o.watchdogs) partial.watchdogs = o.watchdogs;
if (o.concurrency) partial.concurrency = o.concurrency;
if (o.leaseMs) {
  partial.leaseMs = o.leaseMs;
  partial.heartbeatMs = Math.floor(o.leaseMs / 4);
}
if (o.faultWindowS) partial.faultWindowMs = o.faultWindowS * 1000;
if (o.seed) partial.seed = o.seed;
if (o.dispatch) partial.dispatch = o.dispatch;
if (o.record) partial.record = o.record;

const options = optionsFor(partial);
try {
  // The workers' own validation, up front: a bad lease is one clear line, not a restart loop.
  resolveWorkerSettings({
    handlers: { chaos: () => {} },
    leaseMs: options.leaseMs,
    heartbeatMs: options.heartbeatMs,
    concurrency: options.concurrency,
  });
} catch (err) {
  program.error(`error: ${(err as Error).message}`);
}
let result;
try {
  result = await runChaos(options);
} catch (err) {
  console.error(`chaos run could not complete: ${(err as Error).message}`);
  process.exit(2);
}
console.log(result.markdown);
console.log(`Report: ${result.files.markdown} and ${result.files.json}; process logs in ${result.files.logs}`);
process.exit(result.report.passed ? 0 : 1);
