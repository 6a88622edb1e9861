/**
 * What the bench smoke tests share (test/bench-smoke*.test.ts): a tiny run of the real harness
 * (bench/run.ts, from source) on the test server, and the report it wrote. The smoke tests are
 * three files so that they take turns with other test files (node runs one file's tests one
 * after another) instead of holding one lane for the sum of them.
 */
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import assert from "node:assert/strict";
import { databaseUrl } from "./db.js";

/** A workload's rows in the report's JSON; `M`: what a row's medians hold. */
export interface BenchWorkload<M = Record<string, number>> {
  id: string;
  rows: { label: string; system: string; compareTo?: string; median: M }[];
}

/** The report of one run: its JSON (smoke.json), Markdown and SVG chart. */
export interface BenchRun<M = Record<string, number>> {
  workloads: BenchWorkload<M>[];
  markdown: string;
  svg: string;
}

/**
 * Runs the harness with `args` (each workload once) against the test server into a temporary
 * folder and reads its report back; fails with the harness's output on a non-zero exit.
 * `ownServer`: the harness starts its own PostgreSQL instead (what `--cores split` pins).
 */
export async function runBench<M = Record<string, number>>(args: string[], { ownServer = false } = {}): Promise<BenchRun<M>> {
  const out = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-bench-smoke-"));
  try {
    // Databases of this file's own: the smoke files may run at once on one server.
    const own = ["--database-suffix", `smoke_${process.pid}`];
    const { code, output } = await runHarness([...args, ...own, "--runs", "1", "--out", out, "--name", "smoke"], { ownServer });
    assert.equal(code, 0, output);
    const read = (name: string) => fs.readFileSync(path.join(out, name), "utf8");
    const { workloads } = JSON.parse(read("smoke.json")) as { workloads: BenchWorkload<M>[] };
    return { workloads, markdown: read("smoke.md"), svg: read("smoke.svg") };
  } finally {
    fs.rmSync(out, { recursive: true, force: true });
  }
}

/** Runs bench/run.ts from source with `args` (on the test server unless `ownServer`): its exit code and output. */
export async function runHarness(args: string[], { ownServer = false } = {}): Promise<{ code: number | null; output: string }> {
  const env = { ...process.env };
  if (ownServer) delete env.BENCH_DATABASE_URL;
  else env.BENCH_DATABASE_URL = databaseUrl();
  const child = spawn(process.execPath, ["--import", "tsx", "bench/run.ts", ...args], { env, stdio: ["ignore", "pipe", "pipe"] });
  let output = "";
  child.stdout.on("data", (b: Buffer) => (output += b));
  child.stderr.on("data", (b: Buffer) => (output += b));
  const code = await new Promise<number | null>((resolve) => child.on("exit", resolve));
  return { code, output };
}
