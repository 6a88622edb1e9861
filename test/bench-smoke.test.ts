/**
 * Keeps `npm run bench` from rotting: a tiny run of the real harness (a few hundred jobs,
 * every system, enqueue + drain + ceiling) on the test server, checking that it finishes
 * and writes a report with a measurement for each system. No speed is asserted here:
 * speed belongs in the benchmark itself.
 */
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { test } from "node:test";
import assert from "node:assert/strict";
import { databaseUrl } from "./helpers/db.js";
import { findNatsServer } from "./harness/nats-server.js";

test("npm run bench: a tiny run of every system writes JSON, Markdown and an SVG chart", { timeout: 180_000 }, async () => {
  const out = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-bench-smoke-"));
  try {
    const args = [
      "--import",
      "tsx",
      "bench/run.ts",
      "--only",
      "enqueue,drain,ceiling",
      "--jobs",
      "300",
      "--batch",
      "100",
      "--runs",
      "1",
      "--out",
      out,
      "--name",
      "smoke",
    ];
    const child = spawn(process.execPath, args, { env: { ...process.env, BENCH_DATABASE_URL: databaseUrl() }, stdio: ["ignore", "pipe", "pipe"] });
    let output = "";
    child.stdout.on("data", (b: Buffer) => (output += b));
    child.stderr.on("data", (b: Buffer) => (output += b));
    const code = await new Promise<number | null>((resolve) => child.on("exit", resolve));
    assert.equal(code, 0, output);

    const results = JSON.parse(fs.readFileSync(path.join(out, "smoke.json"), "utf8")) as {
      workloads: { id: string; rows: { system: string; median: Record<string, number> }[] }[];
    };
    const drain = results.workloads.find((w) => w.id === "drain")!;
    // With a nats-server the bench adds NATS dispatch rows beside polling.
    const expected = findNatsServer() ? ["graphile-worker", "leasehold", "leasehold-nats", "pg-boss"] : ["graphile-worker", "leasehold", "pg-boss"];
    assert.deepEqual(drain.rows.map((r) => r.system).sort(), expected);
    for (const w of results.workloads) {
      for (const r of w.rows) assert.ok(r.median.jobsPerSecond! > 0, `${w.id}/${r.system}: ${JSON.stringify(r.median)}`);
    }
    const md = fs.readFileSync(path.join(out, "smoke.md"), "utf8");
    assert.match(md, /## 2a\. Drain, 1 worker process/);
    assert.match(md, /\| leasehold \|/);
    const svg = fs.readFileSync(path.join(out, "smoke.svg"), "utf8");
    assert.match(svg, /^<svg xmlns="http:\/\/www\.w3\.org\/2000\/svg"/);
    assert.match(svg, /<rect x="\d+" y="\d+" width="[\d.]+" height="26" fill="#2b7a3d"\/>/, "a Leasehold bar");
  } finally {
    fs.rmSync(out, { recursive: true, force: true });
  }
});
