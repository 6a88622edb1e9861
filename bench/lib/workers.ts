/**
 * Worker processes seen from the benchmark's side: spawn N of one system, follow their
 * progress, ask for their CPU and statement counts, stop them or kill -9 one of them.
 */
import { fork, type ChildProcess } from "node:child_process";
import { EventEmitter } from "node:events";
import path from "node:path";
import { fileURLToPath } from "node:url";
import type { WorkerSpec } from "../systems/types.js";
import type { FromWorker, ToWorker } from "../worker-process.js";

// Compiled (npm run bench): plain JS. Run from source (tsx): the same through tsx.
const HERE = fileURLToPath(import.meta.url);
const COMPILED = HERE.endsWith(".js");
const ENTRY = path.join(path.dirname(HERE), "..", COMPILED ? "worker-process.js" : "worker-process.ts");
const READY_TIMEOUT_MS = 60_000;

interface Child {
  process: ChildProcess;
  started: number;
  ended: number;
  firstStartAt: number | null;
  exited: boolean;
}

export class WorkerGroup extends EventEmitter {
  private readonly children: Child[] = [];
  /** Enqueue-to-start latencies (ms) reported so far; take them with `takeLatencies()`. */
  private latencies: number[] = [];
  readonly errors: string[] = [];

  private constructor() {
    super();
  }

  /**
   * Spawns `count` worker processes and waits until each is loaded; with `go` (default),
   * also starts their workers and waits until they run.
   */
  static async start(system: string, url: string, spec: WorkerSpec, count: number, go = true): Promise<WorkerGroup> {
    const group = new WorkerGroup();
    try {
      await Promise.all(Array.from({ length: count }, () => group.spawn(system, url, spec)));
      if (go) await group.go();
    } catch (err) {
      group.killAll();
      throw err;
    }
    return group;
  }

  /** Spawns one more process and starts its worker; resolves with its pid once it runs. */
  async add(system: string, url: string, spec: WorkerSpec): Promise<number> {
    const proc = await this.spawn(system, url, spec);
    await this.go(this.children.filter((c) => c.process === proc));
    return proc.pid!;
  }

  /** Starts the workers of every loaded process (or of `children`); resolves when all run. */
  async go(children: Child[] = this.children): Promise<void> {
    await Promise.all(
      children
        .filter((c) => !c.exited)
        .map(
          (c) =>
            new Promise<void>((resolve, reject) => {
              const timer = setTimeout(() => reject(new Error("worker did not start within 60 s")), READY_TIMEOUT_MS);
              const onMessage = (m: FromWorker) => {
                if (m.type === "running" || m.type === "error") {
                  clearTimeout(timer);
                  c.process.off("message", onMessage);
                  if (m.type === "running") resolve();
                  else reject(new Error(`worker failed to start: ${m.message}`));
                }
              };
              c.process.on("message", onMessage);
              c.process.send({ type: "go" } satisfies ToWorker);
            }),
        ),
    );
  }

  /** kill -9 every process (when handlers would not finish in time: long jobs). */
  killAll(): void {
    for (const c of this.children) if (!c.exited) c.process.kill("SIGKILL");
  }

  async spawn(system: string, url: string, spec: WorkerSpec): Promise<ChildProcess> {
    const proc = fork(ENTRY, [], {
      execArgv: COMPILED ? [] : ["--conditions=source", "--import", "tsx"],
      stdio: ["ignore", "ignore", "pipe", "ipc"],
      env: { ...process.env, LEASEHOLD_LOG_LEVEL: "silent" },
    });
    const child: Child = { process: proc, started: 0, ended: 0, firstStartAt: null, exited: false };
    this.children.push(child);
    let stderr = "";
    proc.stderr?.on("data", (b: Buffer) => (stderr = (stderr + b.toString()).slice(-4000)));
    proc.on("exit", () => {
      child.exited = true;
      this.emit("exit", proc.pid);
    });
    proc.on("message", (m: FromWorker) => {
      if (m.type === "progress") {
        child.started = m.started;
        child.ended = m.ended;
        child.firstStartAt = m.firstStartAt;
        for (const l of m.latencies) this.latencies.push(l);
        this.emit("progress");
      } else if (m.type === "error") {
        this.errors.push(m.message);
      }
      this.emit(m.type, m);
    });
    const ready = new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`${system} worker not ready after ${READY_TIMEOUT_MS} ms: ${stderr}`)), READY_TIMEOUT_MS);
      const onMessage = (m: FromWorker) => {
        if (m.type === "ready" || m.type === "error") {
          clearTimeout(timer);
          proc.off("message", onMessage);
          if (m.type === "ready") resolve();
          else reject(new Error(`${system} worker failed to start: ${m.message}`));
        }
      };
      proc.on("message", onMessage);
      proc.once("exit", (code) => {
        clearTimeout(timer);
        reject(new Error(`${system} worker exited with code ${code} before it was ready: ${stderr}`));
      });
    });
    proc.send({ type: "init", system, url, spec } satisfies ToWorker);
    await ready;
    return proc;
  }

  get started(): number {
    return this.children.reduce((n, c) => n + c.started, 0);
  }
  get ended(): number {
    return this.children.reduce((n, c) => n + c.ended, 0);
  }
  /** When the first handler of any process started (ms, nowMs clock). */
  get firstStartAt(): number | null {
    const starts = this.children.map((c) => c.firstStartAt).filter((t): t is number => t !== null);
    return starts.length ? Math.min(...starts) : null;
  }
  get pids(): number[] {
    return this.children.filter((c) => !c.exited).map((c) => c.process.pid!);
  }

  takeLatencies(): number[] {
    const out = this.latencies;
    this.latencies = [];
    return out;
  }

  /** CPU ms and statements of every live process, summed. */
  async stats(): Promise<{ cpuMs: number; statements: number }> {
    const live = this.children.filter((c) => !c.exited);
    const replies = await Promise.all(live.map((c) => this.ask(c.process, { type: "stats" }, "stats")));
    return replies.reduce((a, r) => ({ cpuMs: a.cpuMs + r.cpuMs, statements: a.statements + r.statements }), { cpuMs: 0, statements: 0 });
  }

  /** Stops every process gracefully; returns their total CPU ms and statements. */
  async stop(): Promise<{ cpuMs: number; statements: number }> {
    const live = this.children.filter((c) => !c.exited);
    const replies = await Promise.all(
      live.map((c) => this.ask(c.process, { type: "stop" }, "stopped", 20_000).catch(() => ({ cpuMs: NaN, statements: NaN }))),
    );
    for (const c of live) if (!c.exited) c.process.kill("SIGKILL");
    return replies.reduce((a, r) => ({ cpuMs: a.cpuMs + r.cpuMs, statements: a.statements + r.statements }), { cpuMs: 0, statements: 0 });
  }

  /** kill -9 the process with this pid. */
  kill9(pid: number): void {
    this.children.find((c) => c.process.pid === pid)?.process.kill("SIGKILL");
  }

  private ask(proc: ChildProcess, msg: ToWorker, reply: "stats" | "stopped", timeoutMs = 10_000): Promise<{ cpuMs: number; statements: number }> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no ${reply} reply`)), timeoutMs);
      const onMessage = (m: FromWorker) => {
        if (m.type === reply) {
          clearTimeout(timer);
          proc.off("message", onMessage);
          resolve({ cpuMs: m.cpuMs, statements: m.statements });
        }
      };
      proc.on("message", onMessage);
      proc.send(msg);
    });
  }
}
