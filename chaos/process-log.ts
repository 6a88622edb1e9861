/**
 * What each chaos worker process writes about itself, one JSON object per line. Lines are
 * appended synchronously, so a `kill -9` loses nothing the process had already done.
 */
import fs from "node:fs";

export type LogLine =
  | { ev: "hello"; t: number; w: string; pid: number }
  | { ev: "start"; t: number; w: string; job: string; attempt: number }
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
