/**
 * A throwaway nats-server with JetStream, for tests, chaos runs and the bench: on a free
 * port, its store in a temp directory, restartable on the same port and store (a NATS
 * restart keeps the stream). Found on the PATH or in /usr/sbin (Debian's `nats-server`).
 */
import { spawn, type ChildProcess } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { findProgram, freePort } from "./programs.js";

export const NATS_INSTALL_HINT = "install it with `apt-get install nats-server` (Debian/Ubuntu)";

/** The nats-server binary, or undefined when there is none. LEASEHOLD_NATS_SERVER names one (or "none"). */
export function findNatsServer(): string | undefined {
  return findProgram("nats-server", "LEASEHOLD_NATS_SERVER");
}

export class NatsServer {
  private child?: ChildProcess;
  readonly storeDir: string;

  private constructor(
    readonly binary: string,
    readonly port: number,
  ) {
    this.storeDir = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-nats-"));
  }

  /** Starts a server; throws if there is no nats-server binary. */
  static async start(binary = findNatsServer()): Promise<NatsServer> {
    if (!binary) throw new Error(`nats-server not found: ${NATS_INSTALL_HINT}`);
    const server = new NatsServer(binary, await freePort());
    await server.resume();
    return server;
  }

  get url(): string {
    return `nats://127.0.0.1:${this.port}`;
  }

  get pid(): number | undefined {
    return this.child?.pid;
  }

  /** Starts (again) on the same port and store; resolves once it accepts connections. */
  async resume(): Promise<void> {
    if (this.child) return;
    const child = spawn(this.binary, ["-js", "-a", "127.0.0.1", "-p", String(this.port), "-sd", this.storeDir], {
      stdio: ["ignore", "ignore", "pipe"],
    });
    let stderr = "";
    child.stderr!.on("data", (d: Buffer) => (stderr = (stderr + d.toString()).slice(-4_000)));
    this.child = child;
    child.on("exit", () => {
      if (this.child === child) this.child = undefined;
    });
    const deadline = Date.now() + 15_000;
    for (;;) {
      if (!this.child) throw new Error(`nats-server exited at start: ${stderr.trim()}`);
      // JetStream answers once the server logs it is ready; a TCP connect is close enough,
      // and the clients retry.
      if (await canConnect(this.port)) return;
      if (Date.now() > deadline) throw new Error(`nats-server did not listen on ${this.port}: ${stderr.trim()}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  /** Stops the server (SIGKILL with `kill`: a crash), keeping its store. */
  async stop(kill = false): Promise<void> {
    const child = this.child;
    if (!child) return;
    const exited = new Promise((r) => child.once("exit", r));
    child.kill(kill ? "SIGKILL" : "SIGTERM");
    await exited;
    this.child = undefined;
  }

  async restart(): Promise<void> {
    await this.stop();
    await this.resume();
  }

  /** Stops the server and removes its store. */
  async dispose(): Promise<void> {
    await this.stop(true);
    fs.rmSync(this.storeDir, { recursive: true, force: true });
  }
}

function canConnect(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect(port, "127.0.0.1");
    s.once("connect", () => {
      s.destroy();
      resolve(true);
    });
    s.once("error", () => resolve(false));
  });
}
