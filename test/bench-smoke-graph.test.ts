/**
 * Keeps the bench's graph workloads (graph-fan-out, graph-fan-in, graph-chain) from rotting: a
 * tiny run on the test server through Leasehold's, pg-boss's and BullMQ's flows (BullMQ's in
 * fan-in and chain only: its flows are trees), with the step latencies read from the database. No speed is asserted (bench-smoke.test.ts says why).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { runBench } from "./helpers/bench.js";

test(
  "npm run bench: the graph workloads run Leasehold's, pg-boss's and BullMQ's flows, with step latencies from the database",
  { timeout: 240_000 },
  async () => {
    // pg-boss's flow pass every 2 s and every 1 s: a row for each, as its default (5 s) and its
    // shortest get in the real run, with less time spent waiting for the slower pass.
    const { workloads, markdown } = await runBench<Record<string, number | null>>([
      ...["--only", "graph-fan-out,graph-fan-in,graph-chain", "--systems", "leasehold,pg-boss,bullmq"],
      ...["--graph-size", "30", "--graph-chain", "6", "--graph-pgboss-chain", "2", "--graph-pgboss-intervals", "2,1", "--graph-concurrency", "10"],
    ]);
    assert.deepEqual(
      workloads.map((w) => w.id),
      ["graph-fan-out", "graph-fan-in", "graph-chain"],
    );
    for (const w of workloads) {
      // BullMQ's rows follow pg-boss's, except in fan-out: a BullMQ job has one parent, so one job cannot release many.
      assert.deepEqual(
        w.rows.map((r) => r.label),
        ["leasehold c=10", "pg-boss c=10 flowInterval 2 s", "pg-boss c=10 flowInterval 1 s", ...(w.id === "graph-fan-out" ? [] : ["bullmq c=10"])],
      );
      for (const r of w.rows) {
        const m = r.median;
        // Every child waited for a parent: the step latency has samples (null: none, as NaN in JSON).
        assert.ok(m.jobsPerSecond! > 0 && m.stepP50Ms !== null && m.stepP99Ms! >= m.stepP50Ms!, `${w.id}/${r.label}: ${JSON.stringify(m)}`);
        assert.equal(m.jobs, w.id === "graph-chain" ? (r.label.startsWith("pg-boss") ? 2 : 6) : 31);
        if (w.id === "graph-chain") assert.ok(m.fullChainSeconds! >= m.seconds!, JSON.stringify(m));
      }
    }
    assert.match(markdown, /chain step \(parent's end → child's start\) p50 < 5 ms, c=10/);
    assert.match(markdown, /leasehold c=10 vs pg-boss c=10 flowInterval 1 s: \*\*[\d.]+x\*\* the jobs\/s/);
  },
);
