/**
 * What each chaos worker process writes about itself, one JSON object per line. Lines are
 * appended synchronously, so a `kill -9` loses nothing the process had already done.
 *
 * Every `t` is the wall clock (Date.now(), ms since epoch): all the processes and the harness
 * run on one machine and read the same clock, so stamps from different processes compare
 * (to the millisecond they are floored to). The database's clock is not used here.
 */
import fs from "node:fs";
import type { JobContext } from "../packages/leasehold/src/index.js";

export type LogLine =
  | { ev: "hello"; t: number; w: string; pid: number }
  /** The attempt timeline (withTimeline): the handler was called, ... */
  | { ev: "start"; t: number; w: string; job: string; attempt: number }
  /** ... its ctx.signal fired, with the JobAbortedError's reason (lease_expired, renewal_failed, stalled, shutdown, ...), ... */
  | { ev: "abort"; t: number; w: string; job: string; attempt: number; reason: string }
  /** ... its promise settled (a hung handler never does). */
  | { ev: "settled"; t: number; w: string; job: string; attempt: number; ok: boolean; error?: string }
  | { ev: "write"; t: number; w: string; job: string; attempt: number; accepted: boolean | null; error?: string }
  | {
      ev: "report";
      /** A claim sends no attempts; its accepted ids are the jobs it got. */
      kind: "claim" | "heartbeat" | "complete" | "fail" | "release" | "supersede";
      t: number;
      /** When the request was sent (ms since epoch): the report cannot have landed earlier. */
      sentAt: number;
      w: string;
      sent: [string, number][];
      /** Ids the database accepted; null when the call failed (connection error). */
      accepted: string[] | null;
      error?: string;
    }
  | { ev: "end"; t: number; w: string; job: string; attempt: number; outcome: string; reason?: string }
  /** The `hang` fault: this attempt's handler stopped making progress (and never settles). */
  | { ev: "hang"; t: number; w: string; job: string; attempt: number };

export class ProcessLog {
  private readonly fd: number;
  constructor(readonly file: string) {
    this.fd = fs.openSync(file, "a");
  }
  write(line: LogLine): void {
    fs.writeSync(this.fd, JSON.stringify(line) + "\n");
  }
}

/**
 * Wraps a handler so its attempt's timeline is logged: when it was called, when its
 * AbortSignal fired and why, and when it settled. Reading ctx.signal makes the signal (the
 * worker makes it lazily), which changes nothing for the handler.
 */
export function withTimeline<P, R>(
  handler: (payload: P, ctx: JobContext) => Promise<R>,
  log: ProcessLog,
  workerId: () => string,
): (payload: P, ctx: JobContext) => Promise<R> {
  return async (payload, ctx) => {
    const at = { w: workerId(), job: ctx.jobId, attempt: ctx.attempt };
    log.write({ ev: "start", t: Date.now(), ...at });
    const signal = ctx.signal;
    const aborted = () => log.write({ ev: "abort", t: Date.now(), ...at, reason: abortReason(signal.reason) });
    if (signal.aborted) aborted();
    else signal.addEventListener("abort", aborted, { once: true });
    let result: R;
    try {
      result = await handler(payload, ctx);
    } catch (err) {
      log.write({ ev: "settled", t: Date.now(), ...at, ok: false, error: String((err as Error)?.message ?? err) });
      throw err;
    }
    log.write({ ev: "settled", t: Date.now(), ...at, ok: true });
    return result;
  };
}

/** A JobAbortedError carries its reason; anything else is described as is. */
function abortReason(reason: unknown): string {
  const r = (reason as { reason?: unknown } | undefined)?.reason;
  return typeof r === "string" ? r : String(reason);
}

export function readLogs(dir: string): LogLine[] {
  const lines: LogLine[] = [];
  for (const f of fs.readdirSync(dir).filter((f) => f.endsWith(".jsonl"))) {
    for (const text of fs.readFileSync(`${dir}/${f}`, "utf8").split("\n")) {
      if (!text) continue;
      try {
        lines.push(JSON.parse(text) as LogLine);
      } catch {
        // A line torn by kill -9 mid-write: the process died before it could act on it.
      }
    }
  }
  return lines;
}
