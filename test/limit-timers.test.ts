/**
 * The worker's maximum-run-time timers: attempts under the same limit (every job has one, 15
 * minutes by default) share one timer instead of one each, and each still ends at its own
 * deadline; a stopped worker leaves none behind.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import type { Worker } from "../packages/leasehold/src/worker/worker.js";
import { eventually, freshLeasehold } from "./helpers/db.js";

const timers = () => process.getActiveResourcesInfo().filter((r) => r === "Timeout").length;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

test("running jobs under one maximum run time share a timer; each times out at its own deadline; a quick one is left alone", async (t) => {
  const lh = await freshLeasehold(t);
  const MAX_RUN_MS = 1_500;
  const hang = (_: unknown, ctx: { signal: AbortSignal }) =>
    new Promise<void>((_r, reject) => ctx.signal.addEventListener("abort", () => reject(ctx.signal.reason)));
  let release!: () => void;
  const held = new Promise<void>((r) => (release = r));
  const worker: Worker = lh.worker({
    watchdog: false,
    concurrency: 30,
    handlers: {
      hang: { handler: hang, maxRunMs: MAX_RUN_MS },
      // Ends when told to, well before the limit; under the 15-minute default.
      held: () => held,
    },
  });
  const startedAt = new Map<string, number>();
  const endedAt = new Map<string, number>();
  worker.on("job:start", (job) => startedAt.set(job.id, performance.now()));
  worker.on("job:end", (job) => endedAt.set(job.id, performance.now()));
  await worker.start();
  t.after(() => worker.stop(0));
  await sleep(200);
  const idle = timers();

  const first = await lh.enqueueMany(Array.from({ length: 10 }, () => ({ task: "hang", payload: {}, maxAttempts: 1 })));
  const quick = await lh.enqueueMany(Array.from({ length: 10 }, () => ({ task: "held", payload: {} })));
  await eventually(async () => startedAt.size === 20, "20 jobs running");
  // One timer per maximum run time (1.5 s, 15 min), not one per job (20 more).
  assert.ok(timers() <= idle + 3, `${timers() - idle} more timers with 20 jobs running`);

  // A second wave, started later: its deadline is later than the first one's.
  await sleep(500);
  const second = await lh.enqueueMany(Array.from({ length: 5 }, () => ({ task: "hang", payload: {}, maxAttempts: 1 })));
  release();
  const hangs = [...first, ...second];
  await eventually(async () => hangs.every((j) => endedAt.has(j.id)), "every hanging job ended", 15_000);
  for (const { id } of hangs) {
    const { job, attempts } = await lh.getJob(id);
    assert.equal(job.state, "dead");
    assert.equal(attempts[0]!.outcome, "timed_out");
    // Never before its own deadline (a timer fires at or after it), so not at the first wave's.
    assert.ok(endedAt.get(id)! - startedAt.get(id)! >= MAX_RUN_MS - 1, `job ${id} ended ${endedAt.get(id)! - startedAt.get(id)!} ms after its start`);
  }
  for (const { id } of quick) assert.equal((await lh.getJob(id)).job.state, "succeeded");

  // Nothing runs: no limit timer is left armed.
  await sleep(100);
  assert.ok(timers() <= idle, `${timers() - idle} timers left after every job ended`);
});
