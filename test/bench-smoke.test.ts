/**
 * Keeps `npm run bench` from rotting: a tiny run of the real harness (a few hundred jobs,
 * every system, enqueue + drain + ceiling; then the flow-control workloads) on the test
 * server, checking that it finishes and writes a report with a measurement for each row. No
 * speed is asserted here: speed belongs in the benchmark itself.
 */
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { test } from "node:test";
import assert from "node:assert/strict";
import { databaseUrl } from "./helpers/db.js";
import { findNatsServer } from "./harness/nats-server.js";

/** Runs the harness from source with `args` against the test server; fails the test on a non-zero exit. */
async function runBench(out: string, args: string[]): Promise<void> {
  const child = spawn(process.execPath, ["--import", "tsx", "bench/run.ts", ...args, "--runs", "1", "--out", out, "--name", "smoke"], {
    env: { ...process.env, BENCH_DATABASE_URL: databaseUrl() },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  child.stdout.on("data", (b: Buffer) => (output += b));
  child.stderr.on("data", (b: Buffer) => (output += b));
  const code = await new Promise<number | null>((resolve) => child.on("exit", resolve));
  assert.equal(code, 0, output);
}

test("npm run bench: a tiny run of every system writes JSON, Markdown and an SVG chart", { timeout: 180_000 }, async () => {
  const out = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-bench-smoke-"));
  try {
    await runBench(out, ["--only", "enqueue,drain,ceiling", "--jobs", "300", "--batch", "100"]);

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

test("npm run bench: the flow-control workloads run, each row against the row it is a share of", { timeout: 240_000 }, async () => {
  const out = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-bench-smoke-"));
  try {
    await runBench(out, [
      ...["--only", "flow-cost,flow-index,flow-rate", "--systems", "leasehold,pg-boss", "--jobs", "300"],
      ...["--flow-jobs", "300", "--flow-keys", "20", "--flow-concurrency", "10", "--rate", "20", "--rate-seconds", "2", "--rate-processes", "2"],
    ]);
    const results = JSON.parse(fs.readFileSync(path.join(out, "smoke.json"), "utf8")) as {
      workloads: { id: string; rows: { label: string; system: string; compareTo?: string; median: Record<string, number> }[] }[];
    };
    const workload = (id: string) => results.workloads.find((w) => w.id === id)!;
    const cost = workload("flow-cost");
    // Each setting's row beside its unlimited baseline, for Leasehold and for pg-boss.
    assert.deepEqual(
      cost.rows.map((r) => r.label),
      [
        "leasehold c=10: unlimited (no queues row)",
        "leasehold c=10: queues row, nothing set",
        "leasehold c=10: concurrency 100,000",
        "leasehold c=10: 20 keys, no limit",
        "leasehold c=10: keyConcurrency 1, 20 keys",
        "leasehold c=10: keyConcurrency 5, 20 keys",
        "pg-boss c=10: unlimited (no groups)",
        "pg-boss c=10: groupConcurrency 1, 20 groups",
        "pg-boss c=10: groupConcurrency 5, 20 groups",
      ],
    );
    const baseline = (system: string) => cost.rows.find((r) => r.system === system)!.label;
    for (const r of cost.rows) assert.equal(r.compareTo, r.label === baseline(r.system) ? undefined : baseline(r.system), r.label);
    for (const r of [...cost.rows, ...workload("flow-index").rows]) assert.ok(r.median.jobsPerSecond! > 0, `${r.label}: ${JSON.stringify(r.median)}`);
    // The rate workload reads the starts from the audit trail: some, and never more in a 1-second
    // window than the limit (claim_flow's window is exact; this is not a speed).
    const rate = workload("flow-rate").rows[0]!.median;
    assert.ok(rate.starts! > 0, JSON.stringify(rate));
    assert.ok(rate.worstWindowStarts! <= 20, `worst 1-second window: ${rate.worstWindowStarts} starts against a limit of 20`);
    const md = fs.readFileSync(path.join(out, "smoke.md"), "utf8");
    assert.match(md, /- leasehold c=10: keyConcurrency 1, 20 keys: \*\*\d+%\*\* of leasehold c=10: unlimited \(no queues row\)/);
    assert.match(md, /\| rate limit: no 1-second window more than 10% over \|/);
  } finally {
    fs.rmSync(out, { recursive: true, force: true });
  }
});

test("npm run bench: the cancel-latency workload measures a database and a remote worker", { timeout: 120_000 }, async () => {
  const out = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-bench-smoke-"));
  try {
    await runBench(out, ["--only", "cancel-latency", "--systems", "leasehold", "--cancels", "3"]);
    const results = JSON.parse(fs.readFileSync(path.join(out, "smoke.json"), "utf8")) as {
      workloads: { id: string; rows: { system: string; median: Record<string, number> }[] }[];
    };
    const rows = results.workloads.find((w) => w.id === "cancel-latency")!.rows;
    assert.deepEqual(
      rows.map((r) => r.system),
      ["leasehold", "leasehold-remote"],
    );
    for (const r of rows) {
      assert.equal(r.median.samples, 3, JSON.stringify(r.median));
      assert.equal(r.median.neverAborted, 0, `${r.system}: every cancel reached its handler`);
      assert.ok(r.median.p99Ms! > 0, JSON.stringify(r.median));
    }
    assert.match(fs.readFileSync(path.join(out, "smoke.md"), "utf8"), /cancel → handler's AbortSignal p99 ≤ 250 ms \(database worker, defaults\)/);
  } finally {
    fs.rmSync(out, { recursive: true, force: true });
  }
});

test(
  "npm run bench: the graph workloads run Leasehold's and pg-boss's flows, with step latencies from the database",
  { timeout: 240_000 },
  async () => {
    const out = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-bench-smoke-"));
    try {
      await runBench(out, [
        ...["--only", "graph-fan-out,graph-fan-in,graph-chain", "--systems", "leasehold,pg-boss"],
        ...["--graph-size", "30", "--graph-chain", "6", "--graph-pgboss-chain", "2", "--graph-concurrency", "10"],
      ]);
      const results = JSON.parse(fs.readFileSync(path.join(out, "smoke.json"), "utf8")) as {
        workloads: { id: string; rows: { label: string; median: Record<string, number | null> }[] }[];
      };
      assert.deepEqual(
        results.workloads.map((w) => w.id),
        ["graph-fan-out", "graph-fan-in", "graph-chain"],
      );
      for (const w of results.workloads) {
        assert.deepEqual(
          w.rows.map((r) => r.label),
          ["leasehold c=10", "pg-boss c=10 flowInterval 5 s", "pg-boss c=10 flowInterval 1 s"],
        );
        for (const r of w.rows) {
          const m = r.median;
          // Every child waited for a parent: the step latency has samples (null: none, as NaN in JSON).
          assert.ok(m.jobsPerSecond! > 0 && m.stepP50Ms !== null && m.stepP99Ms! >= m.stepP50Ms!, `${w.id}/${r.label}: ${JSON.stringify(m)}`);
          assert.equal(m.jobs, w.id === "graph-chain" ? (r.label.startsWith("pg-boss") ? 2 : 6) : 31);
          if (w.id === "graph-chain") assert.ok(m.fullChainSeconds! >= m.seconds!, JSON.stringify(m));
        }
      }
      const md = fs.readFileSync(path.join(out, "smoke.md"), "utf8");
      assert.match(md, /chain step \(parent's end → child's start\) p50 < 5 ms, c=10/);
      assert.match(md, /leasehold c=10 vs pg-boss c=10 flowInterval 1 s: \*\*[\d.]+x\*\* the jobs\/s/);
    } finally {
      fs.rmSync(out, { recursive: true, force: true });
    }
  },
);
