/**
 * Runs the real CLI (`node packages/cli/dist/cli/main.js`, built by `npm test`) as a user would, against
 * the test database, each test on its own schema.
 */
import { spawn, type ChildProcess } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { databaseUrl } from "./db.js";

export const CLI = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "packages", "cli", "dist", "cli", "main.js");

export interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

export function cliEnv(schema: string, extra: Record<string, string | undefined> = {}): NodeJS.ProcessEnv {
  // The built CLI runs on the built library: not on the TypeScript sources the tests load
  // (NODE_OPTIONS carries the test runner's "source" condition).
  return { ...process.env, NODE_OPTIONS: "", DATABASE_URL: databaseUrl(), LEASEHOLD_SCHEMA: schema, LEASEHOLD_LOG_LEVEL: "warn", ...extra };
}

/** Runs one command to its end. */
export function runCli(
  args: string[],
  options: { schema: string; env?: Record<string, string | undefined>; input?: string; cwd?: string },
): Promise<CliResult> {
  const child = spawn(process.execPath, [CLI, ...args], {
    env: cliEnv(options.schema, options.env),
    cwd: options.cwd,
    stdio: ["pipe", "pipe", "pipe"],
  });
  child.stdin.end(options.input ?? "");
  return collect(child, 60_000);
}

export function collect(child: ChildProcess, timeoutMs: number): Promise<CliResult> {
  let stdout = "";
  let stderr = "";
  child.stdout?.on("data", (b: Buffer) => (stdout += b.toString()));
  child.stderr?.on("data", (b: Buffer) => (stderr += b.toString()));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`CLI did not exit within ${timeoutMs} ms; stdout: ${stdout} stderr: ${stderr}`));
    }, timeoutMs);
    child.on("exit", (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

/** A long-running command (serve, worker, dev): resolves once a stdout line matches. */
export async function startCli(
  args: string[],
  options: {
    schema: string;
    env?: Record<string, string | undefined>;
    ready: RegExp;
    cwd?: string;
    timeoutMs?: number;
    /** Run it as a terminal would: in a process group of its own, and stop() signals the whole group (a Ctrl-C). */
    asTerminal?: boolean;
  },
): Promise<{ child: ChildProcess; match: RegExpExecArray; output: () => string; stop: (signal?: NodeJS.Signals) => Promise<CliResult> }> {
  const child = spawn(process.execPath, [CLI, ...args], {
    env: cliEnv(options.schema, options.env),
    cwd: options.cwd,
    stdio: ["ignore", "pipe", "pipe"],
    detached: options.asTerminal ?? false,
  });
  let out = "";
  let err = "";
  child.stderr!.on("data", (b: Buffer) => (err += b.toString()));
  const match = await new Promise<RegExpExecArray>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`not ready in time; stdout: ${out} stderr: ${err}`)), options.timeoutMs ?? 60_000);
    child.stdout!.on("data", (b: Buffer) => {
      out += b.toString();
      const m = options.ready.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve(m);
      }
    });
    child.on("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`exited with ${code} before ready; stdout: ${out} stderr: ${err}`));
    });
  });
  const exited = new Promise<CliResult>((resolve) => child.on("exit", (code) => resolve({ code, stdout: out, stderr: err })));
  return {
    child,
    match,
    output: () => out,
    stop: async (signal = "SIGTERM") => {
      if (child.exitCode === null) {
        if (options.asTerminal) process.kill(-child.pid!, signal);
        else child.kill(signal);
      }
      return exited;
    },
  };
}

/** An error from the CLI is one line on stderr, prefixed, with no stack trace. */
export function isOneLineError(stderr: string): boolean {
  const lines = stderr.trimEnd().split("\n");
  return lines.length === 1 && lines[0]!.length > 0 && !/\n\s+at /.test(stderr);
}
