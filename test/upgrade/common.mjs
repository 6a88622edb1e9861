/**
 * What both upgrade worker scripts (worker.mjs on the database, remote-worker.mjs through a
 * server) share: one JSON object a line on stdout, a logger that prints warn and error lines,
 * and the task "work". Plain JavaScript, run by either release's code unchanged.
 */
import process from "node:process";
import { clearTimeout, setTimeout } from "node:timers";

export const LEASE_MS = 3_000;
export const HEARTBEAT_MS = 1_000;

function errorsAsText(_key, value) {
  return value instanceof Error ? `${value.name}: ${value.message}` : value;
}

/** `print(o)`: o with the worker's name and the time, as one line; `logger` prints through it. */
export function output(name) {
  const print = (o) => process.stdout.write(JSON.stringify({ worker: name, at: Date.now(), ...o }) + "\n");
  const logAt = (level) => (a, b) =>
    print({ log: level, msg: typeof a === "string" ? a : b, detail: typeof a === "object" ? JSON.stringify(a, errorsAsText) : undefined });
  const logger = { debug() {}, info() {}, warn: logAt("warn"), error: logAt("error"), child: () => logger };
  return { print, logger };
}

const sleep = (ms, signal) =>
  new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => (clearTimeout(timer), reject(signal.reason ?? new Error("aborted"))), { once: true });
  });

/**
 * Task "work": sleeps payload.ms (ended early by its signal) and returns { by: name }, or throws
 * "asked to fail" with payload.fail. Prints {start} and {end}.
 */
export function workHandler(name, print) {
  return async (payload, ctx) => {
    print({ start: ctx.jobId, attempt: ctx.attempt, ms: payload.ms });
    await sleep(payload.ms, ctx.signal);
    if (payload.fail) throw new Error("asked to fail");
    print({ end: ctx.jobId, attempt: ctx.attempt });
    return { by: name };
  };
}
