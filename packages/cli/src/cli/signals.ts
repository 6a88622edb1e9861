/**
 * Graceful stop for long-running commands: the first SIGINT/SIGTERM resolves (the command
 * then shuts down cleanly); a second one exits at once.
 *
 * Output down a pipe whose reader is gone is no crash either. Ctrl-C on `npm start | tee log`
 * sends SIGINT to the whole pipeline, so `tee` dies with the command, and every line written
 * during the graceful shutdown then fails with EPIPE. Unhandled, that error killed the process
 * mid-shutdown (a job left running, dev.json left behind). Now it is swallowed, later output
 * is dropped, and a reader gone first (no signal) stops a long-running command as a signal
 * would: with nobody reading, there is no one to run for.
 */
import { EventEmitter } from "node:events";
import type { Cli } from "./context.js";

export type StopReason = NodeJS.Signals | "output closed";

const output = new EventEmitter();
let outputClosed = false;

/**
 * A signal this soon after the first is the same Ctrl-C: `npm start` forwards the terminal's
 * SIGINT to its child, which the terminal signalled too, so one Ctrl-C arrives twice.
 */
const SAME_STOP_MS = 500;

export function untilSignal(cli: Cli, what: string): Promise<StopReason> {
  return new Promise((resolve) => {
    let firstAt: number | undefined;
    // One handler for the command's whole life: removing it, even for a moment, would let a
    // signal arriving then kill the process by default (mid-shutdown, as by a second Ctrl-C).
    const onStop = (reason: StopReason) => {
      if (firstAt === undefined) {
        firstAt = performance.now();
        output.off("closed", onStop);
        cli.note(`${reason}: ${what} (${reason === "output closed" ? "a SIGINT or SIGTERM exits" : "send it again to exit"} at once)`);
        resolve(reason);
        return;
      }
      if (reason === "output closed" || performance.now() - firstAt < SAME_STOP_MS) return;
      process.exit(reason === "SIGTERM" ? 143 : 130);
    };
    process.on("SIGINT", onStop);
    process.on("SIGTERM", onStop);
    if (outputClosed) onStop("output closed");
    else output.once("closed", onStop);
  });
}

/** Calls `fn` once stdout's or stderr's reader is gone (at once if it already is). */
export function onOutputClosed(fn: () => void): () => void {
  if (outputClosed) {
    fn();
    return () => {};
  }
  output.once("closed", fn);
  return () => output.off("closed", fn);
}

/** Installed once at start (main.ts): see the module comment. */
export function survivePipeClose(): void {
  for (const stream of [process.stdout, process.stderr]) {
    stream.on("error", (err: NodeJS.ErrnoException) => {
      // Anything but a closed pipe is a real failure: let it surface as before.
      if (err.code !== "EPIPE" && err.code !== "ERR_STREAM_DESTROYED") throw err;
      if (outputClosed) return;
      outputClosed = true;
      output.emit("closed", "output closed");
    });
  }
}
