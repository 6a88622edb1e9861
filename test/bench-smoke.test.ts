/**
 * Keeps `npm run bench` from rotting: a tiny run of the real harness (a few hundred jobs, every
 * system, BullMQ's PostgreSQL backend among them, enqueue + drain + ceiling; the cancel latency) on the test server, checking that it
 * finishes and writes a report with a measurement for each row. No speed is asserted here:
 * speed belongs in the benchmark itself. The flow-control and graph workloads' smoke tests:
 * bench-smoke-flow.test.ts and bench-smoke-graph.test.ts.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { findNatsServer } from "./harness/nats-server.js";
import { runBench } from "./helpers/bench.js";

test("npm run bench: a tiny run of every system writes JSON, Markdown and an SVG chart", { timeout: 180_000 }, async () => {
  const { workloads, markdown, svg } = await runBench(["--only", "enqueue,drain,ceiling", "--jobs", "300", "--batch", "100"]);
  const drain = workloads.find((w) => w.id === "drain")!;
  // With a nats-server the bench adds NATS dispatch rows beside polling.
  const expected = findNatsServer()
    ? ["bullmq", "graphile-worker", "leasehold", "leasehold-nats", "pg-boss"]
    : ["bullmq", "graphile-worker", "leasehold", "pg-boss"];
  assert.deepEqual(drain.rows.map((r) => r.system).sort(), expected);
  for (const w of workloads) {
    for (const r of w.rows) assert.ok(r.median.jobsPerSecond! > 0, `${w.id}/${r.system}: ${JSON.stringify(r.median)}`);
  }
  assert.match(markdown, /## 2a\. Drain, 1 worker process/);
  assert.match(markdown, /\| leasehold \|/);
  assert.match(svg, /^<svg xmlns="http:\/\/www\.w3\.org\/2000\/svg"/);
  assert.match(svg, /<rect x="\d+" y="\d+" width="[\d.]+" height="26" fill="#2b7a3d"\/>/, "a Leasehold bar");
});

test("npm run bench: the cancel-latency workload measures a database and a remote worker", { timeout: 120_000 }, async () => {
  const { workloads, markdown } = await runBench(["--only", "cancel-latency", "--systems", "leasehold", "--cancels", "3"]);
  const rows = workloads.find((w) => w.id === "cancel-latency")!.rows;
  assert.deepEqual(
    rows.map((r) => r.system),
    ["leasehold", "leasehold-remote"],
  );
  for (const r of rows) {
    assert.equal(r.median.samples, 3, JSON.stringify(r.median));
    assert.equal(r.median.neverAborted, 0, `${r.system}: every cancel reached its handler`);
    assert.ok(r.median.p99Ms! > 0, JSON.stringify(r.median));
  }
  assert.match(markdown, /cancel → handler's AbortSignal p99 ≤ 250 ms \(database worker, defaults\)/);
});
