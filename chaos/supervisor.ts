/**
 * Runs the chaos child processes the way a process supervisor would: starts them, restarts
 * one whose process ended (at once if it died by itself, after a chosen delay if the harness
 * killed it), and records every exit the harness did not cause: a worker must survive the
 * faults it can survive, so such an exit breaks the run.
 */
import { spawn, type ChildProcess } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

export const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

export interface ChildSpec {
  name: string;
  kind: "worker" | "watchdog";
  script: string;
  env: Record<string, string>;
  stderrFile: string;
}

export interface UnexpectedExit {
  name: string;
  pid: number;
  code: number | null;
  signal: NodeJS.Signals | null;
  /** Exit code 3: the process could not start (database unreachable) and was restarted. */
  duringStartup: boolean;
  stderrTail: string;
}

const STDERR_TAIL = 2_000;

/** When a process stopped running: its attempts end there, whatever it last logged (the overlap invariant). */
export interface ProcessEnd {
  pid: number;
  /** ms since epoch: when the harness sent SIGKILL, else when the exit was seen. */
  at: number;
}

export class Supervised {
  child?: ChildProcess;
  workerId?: string;
  ready = false;
  /** SIGSTOPped, partitioned or killed: not chosen for another fault until it is back. */
  busy = false;
  starts = 0;
  /** Every process of this slot that ended, in order. */
  readonly ends: ProcessEnd[] = [];
  private expectedExit = false;
  /** When the harness sent the current process SIGKILL. */
  private killSentAt?: number;
  private restartDelayMs = 0;
  private stderrTail = "";
  private readyWaiters: (() => void)[] = [];

  constructor(
    readonly spec: ChildSpec,
    private readonly onUnexpectedExit: (e: UnexpectedExit) => void,
    private readonly isShuttingDown: () => boolean,
  ) {}

  start(): void {
    const child = spawn(process.execPath, ["--conditions=source", "--import", "tsx", this.spec.script], {
      cwd: REPO_ROOT,
      env: { ...process.env, ...this.spec.env },
      stdio: ["ignore", "ignore", "pipe", "ipc"],
    });
    this.child = child;
    this.killSentAt = undefined;
    this.ready = false;
    this.workerId = undefined;
    this.starts++;
    child.stderr!.on("data", (b: Buffer) => {
      fs.appendFileSync(this.spec.stderrFile, b);
      this.stderrTail = (this.stderrTail + b.toString()).slice(-STDERR_TAIL);
    });
    child.on("message", (m: { type?: string; workerId?: string }) => {
      if (m?.type !== "ready") return;
      this.ready = true;
      this.workerId = m.workerId;
      for (const w of this.readyWaiters.splice(0)) w();
    });
    child.on("exit", (code, signal) => {
      if (child.pid !== undefined) this.ends.push({ pid: child.pid, at: this.child === child ? (this.killSentAt ?? Date.now()) : Date.now() });
      if (this.child !== child) return;
      this.ready = false;
      if (this.isShuttingDown()) return;
      if (this.expectedExit) {
        this.expectedExit = false;
        setTimeout(() => this.restart(), this.restartDelayMs).unref();
        return;
      }
      this.onUnexpectedExit({
        name: this.spec.name,
        pid: child.pid ?? -1,
        code,
        signal,
        duringStartup: code === 3,
        stderrTail: this.stderrTail,
      });
      setTimeout(() => this.restart(), 300).unref();
    });
  }

  private restart(): void {
    if (this.isShuttingDown()) return;
    this.busy = false;
    this.start();
  }

  whenReady(timeoutMs = 60_000): Promise<void> {
    if (this.ready) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`${this.spec.name} not ready within ${timeoutMs} ms; stderr: ${this.stderrTail}`)), timeoutMs);
      this.readyWaiters.push(() => {
        clearTimeout(timer);
        resolve();
      });
    });
  }

  get pid(): number | undefined {
    return this.child?.exitCode === null ? this.child.pid : undefined;
  }

  /** kill -9; the supervisor starts a new process after `restartAfterMs`. */
  kill9(restartAfterMs: number): void {
    this.expectedExit = true;
    this.restartDelayMs = restartAfterMs;
    this.busy = true;
    // SIGKILL cannot be caught: the process runs nothing more of its own from this moment.
    this.killSentAt = Date.now();
    this.child?.kill("SIGKILL");
  }

  /** A message to the process over IPC (e.g. the hang fault); false if it is not running. */
  message(m: unknown): boolean {
    return this.child?.connected === true && this.child.send(m as object);
  }

  signal(sig: "SIGSTOP" | "SIGCONT"): void {
    if (this.child?.pid) process.kill(this.child.pid, sig);
  }

  /** Graceful stop (SIGTERM), then SIGKILL if it takes too long. */
  async stop(timeoutMs = 10_000): Promise<void> {
    const child = this.child;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
    child.kill("SIGCONT");
    child.kill("SIGTERM");
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    await exited;
    clearTimeout(timer);
  }
}
