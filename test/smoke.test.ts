import { test } from "node:test";
import assert from "node:assert/strict";
import { freshLeasehold, recordEvents } from "./helpers/db.js";
import type { JobContext } from "../packages/leasehold/src/worker/context.js";

test("a job enqueued is run by a worker and recorded as succeeded", async (t) => {
  const lh = await freshLeasehold(t);
  const seen: unknown[] = [];
  const worker = lh.worker({
    handlers: {
      greet: async (p: { name: string }, ctx: JobContext) => {
        ctx.logger.info({ name: p.name }, "greeting"); // the per-job logger is created on first use
        seen.push(p.name);
      },
    },
  });
  await worker.start();
  const ends = recordEvents(worker, "job:end");
  const { id } = await lh.enqueue("greet", { name: "ada" });
  await ends.waitFor((job: { id: string }) => job.id === id);
  await worker.stop();
  const { job, attempts } = await lh.getJob(id);
  assert.deepEqual(seen, ["ada"]);
  assert.equal(job.state, "succeeded");
  assert.equal(attempts.length, 1);
  assert.equal(attempts[0]!.outcome, "succeeded");
});
