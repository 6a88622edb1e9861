/**
 * Durable steps under NATS dispatch (docs/nats.md) against the real nats-server `npm test`
 * starts: a durable job's every attempt is claimed from a doorbell, the first from its enqueue,
 * the next from the watchdog's wake of its sleep, the last from the event that ended its wait.
 */
import { test as nodeTest } from "node:test";
import assert from "node:assert/strict";
import pino from "pino";
import { Registry } from "prom-client";
import { Leasehold, type JobContext } from "../packages/leasehold/src/index.js";
import { databaseUrl, eventually, uniqueSchema } from "./helpers/db.js";

const NATS_URL = process.env.LEASEHOLD_TEST_NATS_URL || undefined;
// Without a nats-server the runner says so in one line, and this file registers no test.
const test: typeof nodeTest = NATS_URL ? nodeTest : ((() => undefined) as unknown as typeof nodeTest);

async function claimedByMessage(lh: Leasehold): Promise<number> {
  const { values } = await lh.metrics.natsMessages.get();
  return values.filter((v) => v.labels.result === "claimed").reduce((n, v) => n + v.value, 0);
}

test("a durable job on NATS workers: its steps replay, its sleep and its wait each end in a doorbell that resumes it", async (t) => {
  const schema = uniqueSchema("nats");
  // What the worker logs: the lost-doorbell check's safety net must not be what resumes the job.
  const logged: string[] = [];
  const logger = pino({ level: "info" }, { write: (line: string) => void logged.push(line) });
  const lh = await Leasehold.connect({
    databaseUrl: databaseUrl(),
    schema,
    logger,
    metricsRegistry: new Registry(),
    poolSize: 20,
    nats: NATS_URL!,
  });
  t.after(async () => {
    await lh.pool.query(`DROP SCHEMA ${schema} CASCADE`).catch(() => {});
    await lh.close();
  });
  const runs: string[] = [];
  const worker = lh.worker({
    // Polling only as a far-off safety net: every claim here must come from a message.
    pollIntervalMs: 60_000,
    handlers: {
      onboard: async (p: { user: string }, ctx: JobContext) => {
        const account = await ctx.step("account", () => {
          runs.push(`account ${ctx.attempt}`);
          return { user: p.user, plan: "trial" };
        });
        await ctx.sleep("cool-off", 800);
        const verified = await ctx.waitForEvent("verified", { event: "user.verified", match: { user: p.user } });
        await ctx.step("welcome", () => void runs.push(`welcome ${ctx.attempt}`));
        return { account, verified };
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));

  const { id } = await lh.enqueue("onboard", { user: "u1" });
  const waitingForEvent = async () => {
    const { rows } = await lh.pool.query("SELECT state, wait->>'kind' AS kind FROM jobs WHERE id = $1", [id]);
    return rows[0].state === "suspended" && rows[0].kind === "event" && (await claimedByMessage(lh)) >= 2;
  };
  await eventually(async () => (await waitingForEvent()) || undefined, "the job slept, woke by its doorbell, and now waits for its event");
  await lh.sendEvent("user.verified", { user: "u1", via: "email" });
  const done = await eventually(async () => {
    const r = await lh.getJob(id);
    return r.job.state === "succeeded" ? r : undefined;
  }, "the event's doorbell resumed the job");
  assert.deepEqual(done.job.result, { account: { user: "u1", plan: "trial" }, verified: { user: "u1", via: "email" } });
  assert.deepEqual(runs, ["account 1", "welcome 3"], "each step ran once");
  assert.deepEqual(
    done.attempts.map((a) => a.outcome),
    ["suspended", "suspended", "succeeded"],
  );
  assert.equal(await claimedByMessage(lh), 3, "each attempt was claimed from its doorbell");
  assert.deepEqual(
    logged.filter((l) => l.includes("without a NATS message")),
    [],
    "no doorbell was found missing and owed again",
  );
  assert.equal((await lh.pool.query("SELECT count(*)::int AS n FROM dispatch_outbox WHERE job_id = $1", [id])).rows[0].n, 0, "nothing owed");
});
