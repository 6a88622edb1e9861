/**
 * Keeps the bench's durable workloads (`--only durable`: durable-steps, durable-event,
 * durable-sleep) from rotting: a tiny run on the test server through Leasehold's durable steps
 * and DBOS Transact's workflows, each in its own database. No speed is asserted
 * (bench-smoke.test.ts says why): that every workflow ran, every waiter resumed, every sleeper
 * slept, and the report compares the two.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { runBench } from "./helpers/bench.js";

test(
  "npm run bench -- --only durable: five-step workflows, event-to-resume and sleepers through Leasehold and DBOS Transact",
  { timeout: 240_000 },
  async () => {
    const { workloads, markdown, svg } = await runBench<Record<string, number | null>>([
      ...["--only", "durable", "--systems", "leasehold,dbos", "--processes", "2"],
      ...["--durable-workflows", "40", "--durable-waiters", "5", "--durable-sleepers", "30", "--durable-idle-seconds", "1"],
    ]);
    assert.deepEqual(
      workloads.map((w) => w.id),
      ["durable-steps", "durable-event", "durable-sleep"],
    );
    const [steps, event, sleep] = workloads;
    assert.deepEqual(
      steps!.rows.map((r) => r.label),
      ["leasehold x1", "dbos x1", "leasehold x2", "dbos x2"],
    );
    for (const r of steps!.rows) {
      const m = r.median;
      // A failed row fails the run (runBench asserts its exit code). Both systems' statements
      // are counted: every step costs the system something.
      assert.ok(m.workflowsPerSecond! > 0 && m.statementsPerStep! > 0 && m.xactsPerStep! > 0, `${r.label}: ${JSON.stringify(m)}`);
    }
    for (const r of event!.rows) {
      assert.equal(r.median.resumed, 5, `${r.label}: ${JSON.stringify(r.median)}`);
      assert.ok(r.median.p50Ms! >= 0 && r.median.p99Ms! >= r.median.p50Ms!, `${r.label}: ${JSON.stringify(r.median)}`);
    }
    for (const r of sleep!.rows) {
      assert.equal(r.median.sleepers, 30);
      assert.ok(r.median.createSeconds! > 0 && r.median.bytesPerSleeper! > 0, `${r.label}: ${JSON.stringify(r.median)}`);
    }
    assert.deepEqual(
      event!.rows.map((r) => r.label),
      ["leasehold", "dbos"],
    );
    assert.match(markdown, /leasehold x2 vs dbos x2: \*\*[\d.]+x\*\* the workflows\/s/);
    assert.match(markdown, /durable five-step workflows ≥ 2x DBOS Transact's workflows\/s, x1/);
    assert.match(markdown, /event → resumed step p50 ≤ 10 ms/);
    assert.match(svg, /Durable five-step workflows/);
  },
);
