/**
 * A worker process of the benchmark: runs one system's worker, and reports to the parent
 * over IPC how many handlers started and ended, enqueue-to-start latencies, the start of
 * tracked jobs (for the kill -9 workload), and its CPU time and statement count.
 *
 * Started by bench/lib/workers.ts as `node --import tsx bench/worker-process.ts`.
 */
import pg from "pg";
import { SYSTEM_LOADERS, type WorkerSystem } from "./systems/load.js";
import type { Payload, RunningWorker, WorkerSpec } from "./systems/types.js";
import { nowMs } from "./lib/stats.js";

export type ToWorker = { type: "init"; system: string; url: string; spec: WorkerSpec } | { type: "go" } | { type: "stats" } | { type: "stop" };
export type FromWorker =
  | { type: "ready" }
  | { type: "running" }
  | { type: "progress"; started: number; ended: number; firstStartAt: number | null; latencies: number[] }
  | { type: "tracked"; track: string; at: number; pid: number }
  | { type: "stats"; cpuMs: number; statements: number }
  | { type: "stopped"; cpuMs: number; statements: number }
  | { type: "error"; message: string };

// Every system here talks to PostgreSQL through `pg`: count the statements its clients send.
let statements = 0;
const originalQuery = pg.Client.prototype.query;
pg.Client.prototype.query = function (this: pg.Client, ...args: unknown[]) {
  statements++;
  return (originalQuery as (...a: unknown[]) => unknown).apply(this, args);
} as typeof originalQuery;

const send = (m: FromWorker) => process.send?.(m);
let started = 0;
let ended = 0;
let firstStartAt: number | null = null;
let latencies: number[] = [];
let worker: RunningWorker | undefined;
let init: Extract<ToWorker, { type: "init" }> | undefined;
let system: WorkerSystem | undefined;
let reported = { started: -1, ended: -1 };

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener(
      "abort",
      () => {
        clearTimeout(timer);
        resolve();
      },
      { once: true },
    );
  });
}

async function run(payload: Payload, signal?: AbortSignal): Promise<void> {
  const at = nowMs();
  started++;
  firstStartAt ??= at;
  if (payload?.t !== undefined) latencies.push(at - payload.t);
  if (payload?.track) send({ type: "tracked", track: payload.track, at, pid: process.pid });
  if (payload?.sleepMs) await sleep(payload.sleepMs, signal);
  ended++;
}

function cpuMs(): number {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
}

const progress = setInterval(() => {
  if (started === reported.started && ended === reported.ended && latencies.length === 0) return;
  reported = { started, ended };
  send({ type: "progress", started, ended, firstStartAt, latencies });
  latencies = [];
}, 50);

process.on("message", async (msg: ToWorker) => {
  try {
    if (msg.type === "init") {
      // Loaded and compiled, but not yet working: the parent takes its baseline, then says go.
      const load = SYSTEM_LOADERS[msg.system];
      if (!load) throw new Error(`unknown system ${msg.system}`);
      system = await load();
      init = msg;
      send({ type: "ready" });
    } else if (msg.type === "go") {
      worker = await system!.startWorker(init!.url, init!.spec, run);
      send({ type: "running" });
    } else if (msg.type === "stats") {
      send({ type: "stats", cpuMs: cpuMs(), statements });
    } else if (msg.type === "stop") {
      clearInterval(progress);
      await worker?.stop();
      send({ type: "progress", started, ended, firstStartAt, latencies });
      send({ type: "stopped", cpuMs: cpuMs(), statements });
      process.disconnect?.();
      setTimeout(() => process.exit(0), 200).unref();
    }
  } catch (err) {
    send({ type: "error", message: String((err as Error)?.stack ?? err) });
  }
});

// Stray errors from a peer library's background loops must not kill a measurement silently.
process.on("unhandledRejection", (err) => send({ type: "error", message: `unhandled rejection: ${String(err)}` }));
process.on("disconnect", () => process.exit(0));
