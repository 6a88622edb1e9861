/**
 * Keeps the bench's flow-control workloads (flow-cost, flow-index, flow-rate) from rotting: a
 * tiny run on the test server, every row of Leasehold and pg-boss, each reported against the
 * row it is a share of. No speed is asserted (bench-smoke.test.ts says why).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { runBench } from "./helpers/bench.js";

test("npm run bench: the flow-control workloads run, each row against the row it is a share of", { timeout: 240_000 }, async () => {
  const { workloads, markdown } = await runBench([
    ...["--only", "flow-cost,flow-index,flow-rate", "--systems", "leasehold,pg-boss", "--jobs", "300"],
    ...["--flow-jobs", "300", "--flow-keys", "20", "--flow-concurrency", "10", "--rate", "20", "--rate-seconds", "2", "--rate-processes", "2"],
  ]);
  const workload = (id: string) => workloads.find((w) => w.id === id)!;
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
  // A row per handler concurrency (10 and 50), each with the handlers' own stamped starts.
  const rates = workload("flow-rate").rows;
  assert.deepEqual(
    rates.map((r) => / c=(\d+)/.exec(r.label)?.[1]),
    ["10", "50"],
  );
  for (const { median: rate } of rates) {
    assert.ok(rate.starts! > 0, JSON.stringify(rate));
    assert.ok(rate.worstHandlerWindowStarts! > 0, JSON.stringify(rate));
    assert.ok(rate.worstWindowStarts! <= 20, `worst 1-second window: ${rate.worstWindowStarts} starts against a limit of 20`);
  }
  assert.match(markdown, /- leasehold c=10: keyConcurrency 1, 20 keys: \*\*\d+%\*\* of leasehold c=10: unlimited \(no queues row\)/);
  assert.match(markdown, /\| rate limit: no 1-second window more than 10% over, c=50 \|/);
});
