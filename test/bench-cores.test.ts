/**
 * The bench's core layouts (`--cores shared,split`) and its comparison of each Leasehold fleet
 * row against the fastest peer of the same run. A tiny real run on a PostgreSQL of the bench's
 * own (a split pins the server's processes, so never the shared test server), and the report's
 * arithmetic on results whose numbers are set here. No speed is asserted (bench-smoke.test.ts
 * says why).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import os from "node:os";
import { runBench, runHarness } from "./helpers/bench.js";
import { markdown, targets, type BenchResults, type WorkloadRow } from "../bench/report/write.js";

const twoCores = spawnSync("taskset", ["-cp", String(process.pid)], { encoding: "utf8" }).status === 0 && os.availableParallelism() >= 2;

test(
  "npm run bench --cores shared,split: each drain row in both layouts, the split ones pinned, both against the fastest peer",
  { timeout: 240_000, skip: twoCores ? false : "needs taskset and two cores" },
  async () => {
    const { workloads, markdown: md } = await runBench(
      ["--only", "drain,drain-multi", "--systems", "leasehold,pg-boss", "--jobs", "300", "--processes", "2", "--cores", "shared,split"],
      { ownServer: true },
    );
    const multi = workloads.find((w) => w.id === "drain-multi")!;
    assert.deepEqual(
      multi.rows.map((r) => r.label),
      [
        "leasehold (shared cores)",
        "leasehold (split cores)",
        "pg-boss (shared cores)",
        "pg-boss (split cores)",
        "leasehold c=50 x2 (shared cores)",
        "leasehold c=50 x2 (split cores)",
        "pg-boss c=50 x2 (shared cores)",
        "pg-boss c=50 x2 (split cores)",
        "leasehold c=50 x1 (shared cores)",
        "leasehold c=50 x1 (split cores)",
        "leasehold (record off) (shared cores)",
        "leasehold (record off) (split cores)",
        "leasehold (record off) c=50 x2 (shared cores)",
        "leasehold (record off) c=50 x2 (split cores)",
        "leasehold (record off) c=50 x1 (shared cores)",
        "leasehold (record off) c=50 x1 (split cores)",
      ],
    );
    // Every row measured (a split row whose server or workers left their core fails its run),
    // with the server's CPU and the workers' per 1,000 jobs.
    for (const w of workloads) {
      for (const r of w.rows) {
        assert.ok(r.median.jobsPerSecond! > 0, `${w.id}/${r.label}: ${JSON.stringify(r.median)}`);
        assert.ok(r.median.serverCpuMsPerKJob! >= 0 && r.median.clientCpuMsPerKJob! > 0, `${w.id}/${r.label}: ${JSON.stringify(r.median)}`);
      }
    }
    assert.match(md, /\| server CPU ms\/1k jobs \| worker CPU ms\/1k jobs \|/);
    assert.match(md, /\| leasehold c=50 x2 \(split cores\) \| [\d,]+ \| \d+ \| \d+ \|/);
    // Each layout's rows against the same layout's peers only.
    assert.match(
      md,
      // A 300-job drain's server CPU may read 0 (under /proc's 10 ms tick): n/a, not a number.
      /- split cores: leasehold c=50 x2 vs the fastest peer, pg-boss c=50 x2: \*\*[\d.]+x\*\* the jobs\/s, \*\*(?:[\d.]+x|n\/a)\*\* the server CPU/,
    );
    assert.match(md, /- shared cores: leasehold c=50 x2 vs the fastest peer, pg-boss c=50 x2: /);
    assert.match(
      md,
      /\| server CPU per 1,000 jobs ≤ 1.2x the fastest peer's \(2 processes of concurrency 50, record on, split cores\) \| \*\*(?:[\d.]+x|n\/a)\*\* vs pg-boss c=50 x2 \|/,
    );
    assert.match(md, /\| 2 processes drain at least as fast as 1 \(concurrency 50, record on, shared cores\) \|/);
    assert.match(md, /\| drain ≥ 2x the fastest peer \(1 process, split cores\) \|/);
  },
);

test("npm run bench --cores: a split needs the bench's own server; an unknown layout is named", { timeout: 60_000 }, async () => {
  const given = await runHarness(["--only", "drain", "--systems", "leasehold", "--jobs", "10", "--cores", "split"]);
  assert.equal(given.code, 2, given.output);
  assert.match(given.output, /--cores split pins PostgreSQL's processes: it needs the server the bench starts itself, not --database-url/);
  const unknown = await runHarness(["--only", "drain", "--cores", "shared,apart"]);
  assert.equal(unknown.code, 2, unknown.output);
  assert.match(unknown.output, /--cores: unknown layout "apart"; choose from shared, split/);
});

/** A drain-multi row whose runs measured these jobs/s and server CPU ms per 1,000 jobs. */
function row(label: string, system: string, runs: [jobs: number, serverCpu: number][], cores?: "shared" | "split"): WorkloadRow {
  const metrics = runs.map(([jobsPerSecond, serverCpuMsPerKJob]) => ({ jobsPerSecond, serverCpuMsPerKJob, clientCpuMsPerKJob: 50 }));
  const mid = (k: "jobsPerSecond" | "serverCpuMsPerKJob") => metrics.map((m) => m[k]).sort((a, b) => a - b)[1]!;
  return {
    label: cores ? `${label} (${cores} cores)` : label,
    system,
    settings: "",
    ...(cores ? { cores } : {}),
    runs: metrics,
    median: { jobsPerSecond: mid("jobsPerSecond"), serverCpuMsPerKJob: mid("serverCpuMsPerKJob"), clientCpuMsPerKJob: 50 },
    errors: [],
  };
}

function results(rows: WorkloadRow[]): BenchResults {
  return {
    command: "",
    startedAt: "",
    finishedAt: "",
    machine: { cpus: "", memoryGB: 0, os: "", node: "", postgres: "", postgresSettings: {} },
    versions: {},
    settings: {},
    options: {
      ...{ processes: 4, runs: 3, jobs: 1, batch: 1, sweep: [], latencyRate: 1, latencySeconds: 1, heartbeatJobs: 1, heartbeatSeconds: 1 },
      ...{ steadyJobs: 1, pressureRate: 1, pinSeconds: 1 },
    } as unknown as BenchResults["options"],
    workloads: [{ id: "drain-multi", title: "2b. Drain, several worker processes", runs: 3, rows }],
  };
}

test("bench report: each fleet target against the fastest peer of its own run and layout, record on and off", () => {
  const r = results([
    // Shared cores: graphile-worker fastest in the medians; bullmq fastest in run 3.
    row(
      "leasehold c=50 x4",
      "leasehold",
      [
        [12_000, 30],
        [11_000, 33],
        [13_000, 27],
      ],
      "shared",
    ),
    row(
      "leasehold (record off) c=50 x4",
      "leasehold",
      [
        [18_000, 28],
        [18_000, 30],
        [17_000, 26],
      ],
      "shared",
    ),
    row(
      "graphile-worker c=50 x4",
      "graphile-worker",
      [
        [10_000, 25],
        [11_000, 25],
        [9_000, 24],
      ],
      "shared",
    ),
    row(
      "bullmq c=50 x4",
      "bullmq",
      [
        [5_000, 40],
        [4_000, 40],
        [14_000, 20],
      ],
      "shared",
    ),
    row(
      "leasehold c=50 x1",
      "leasehold",
      [
        [10_000, 30],
        [12_000, 30],
        [11_000, 30],
      ],
      "shared",
    ),
    // Split cores: bullmq fastest everywhere.
    row(
      "leasehold c=50 x4",
      "leasehold",
      [
        [20_000, 20],
        [20_000, 20],
        [20_000, 20],
      ],
      "split",
    ),
    row(
      "graphile-worker c=50 x4",
      "graphile-worker",
      [
        [15_000, 15],
        [15_000, 15],
        [15_000, 15],
      ],
      "split",
    ),
    row(
      "bullmq c=50 x4",
      "bullmq",
      [
        [16_000, 25],
        [16_000, 25],
        [16_000, 25],
      ],
      "split",
    ),
  ]);
  const byName = Object.fromEntries(targets(r).map((t) => [t.name, t]));
  const at = (variant: string, cores: string) => `4 processes of concurrency 50, ${variant}, ${cores} cores`;

  // Shared, record on: 12,000 vs graphile-worker's 10,000; server CPU 30 vs 25; per run vs that run's fastest.
  assert.deepEqual(byName[`jobs/s ≥ 1x the fastest peer's (${at("record on", "shared")})`], {
    name: `jobs/s ≥ 1x the fastest peer's (${at("record on", "shared")})`,
    value: "**1.20x** (runs 1.20x, 1.00x, 0.93x) vs graphile-worker c=50 x4",
    met: true,
  });
  assert.deepEqual(
    byName[`server CPU per 1,000 jobs ≤ 1.2x the fastest peer's (${at("record on", "shared")})`]!.value,
    "**1.20x** (runs 1.20x, 1.32x, 1.35x) vs graphile-worker c=50 x4",
  );
  assert.equal(byName[`server CPU per 1,000 jobs ≤ 1.2x the fastest peer's (${at("record on", "shared")})`]!.met, true);
  // Record off, picked up by its label: the stricter aims.
  assert.deepEqual(byName[`jobs/s ≥ 1.5x the fastest peer's (${at("record off", "shared")})`], {
    name: `jobs/s ≥ 1.5x the fastest peer's (${at("record off", "shared")})`,
    value: "**1.80x** (runs 1.80x, 1.64x, 1.21x) vs graphile-worker c=50 x4",
    met: true,
  });
  assert.deepEqual(byName[`server CPU per 1,000 jobs ≤ 1x the fastest peer's (${at("record off", "shared")})`], {
    name: `server CPU per 1,000 jobs ≤ 1x the fastest peer's (${at("record off", "shared")})`,
    value: "**1.12x** (runs 1.12x, 1.20x, 1.30x) vs graphile-worker c=50 x4",
    met: false,
  });
  // 4 processes against 1 of the same system; record off has no x1 row here: no target, no failure.
  assert.equal(
    byName["4 processes drain at least as fast as 1 (concurrency 50, record on, shared cores)"]!.value,
    "**1.09x** (runs 1.20x, 0.92x, 1.18x)",
  );
  assert.equal(byName["4 processes drain at least as fast as 1 (concurrency 50, record off, shared cores)"], undefined);
  // Split: the fastest peer is the split layout's own (bullmq), never a shared row.
  assert.deepEqual(
    byName[`jobs/s ≥ 1x the fastest peer's (${at("record on", "split")})`]!.value,
    "**1.25x** (runs 1.25x, 1.25x, 1.25x) vs bullmq c=50 x4",
  );
  assert.equal(
    byName[`server CPU per 1,000 jobs ≤ 1.2x the fastest peer's (${at("record on", "split")})`]!.value,
    "**0.80x** (runs 0.80x, 0.80x, 0.80x) vs bullmq c=50 x4",
  );
  assert.equal(byName[`jobs/s ≥ 1.5x the fastest peer's (${at("record off", "split")})`], undefined);

  const md = markdown(r);
  assert.match(
    md,
    /- shared cores: leasehold \(record off\) c=50 x4 vs the fastest peer, graphile-worker c=50 x4: \*\*1\.80x\*\* \(runs 1\.80x, 1\.64x, 1\.21x\) the jobs\/s/,
  );
});
