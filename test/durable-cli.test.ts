/**
 * A durable job in the built CLI (a real process): `jobs show` prints its steps and what it
 * waits for, on the database and through a server (`--server`, where a viewer token sees no
 * step errors); `jobs list --state suspended` lists it; `queues depth` counts it.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "../packages/cli/src/server/app.js";
import type { JobContext } from "../packages/leasehold/src/worker/context.js";
import { eventually, freshLeasehold, NO_BACKOFF } from "./helpers/db.js";
import { runCli } from "./helpers/cli.js";
import { TOKEN } from "./helpers/server.js";

const VIEWER = "viewer-token-0123456789abcdef";

test("jobs show prints a suspended job's steps and wait; jobs list --state suspended and queues depth see it", async (t) => {
  const lh = await freshLeasehold(t);
  let failed = false;
  const worker = lh.worker({
    backoff: NO_BACKOFF,
    watchdog: false,
    handlers: {
      order: async (p: { order: string }, ctx: JobContext) => {
        for (let i = 0; i < 2; i++) await ctx.step("line", () => ({ i }));
        await ctx.step("reserve", () => {
          if (!failed) {
            failed = true;
            throw new Error("stock service down");
          }
          return "reserved";
        });
        return ctx.waitForEvent("approval", { event: "order.approved", match: { order: p.order }, timeout: "2h" });
      },
      nap: async (_: unknown, ctx: JobContext) => ctx.sleep("cool off", "3h"),
      doomed: async (_: unknown, ctx: JobContext) => ctx.step("charge", () => Promise.reject(new Error("card declined"))),
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const { id } = await lh.enqueue("order", { order: "o1" });
  const nap = await lh.enqueue("nap", {});
  const doomed = await lh.enqueue("doomed", {}, { maxAttempts: 1 });
  await eventually(async () => (await lh.getJob(id)).job.state === "suspended", "the order waits for its approval");
  await eventually(async () => (await lh.getJob(nap.id)).job.state === "suspended", "the nap sleeps");
  await eventually(async () => (await lh.getJob(doomed.id)).job.state === "dead", "the doomed job is dead");
  const cli = (...args: string[]) => runCli(args, { schema: lh.schema });

  const shown = await cli("jobs", "show", id);
  assert.equal(shown.code, 0, shown.stderr);
  const until = (await lh.getJob(id)).wait!.until!.toISOString();
  assert.match(
    shown.stdout,
    new RegExp(`suspended: waiting at step "approval" for event "order.approved" matching \\{"order":"o1"\\}, until ${until} \\(in 2h\\)`),
  );
  assert.match(shown.stdout, /^steps:\n#\s+NAME\s+KIND\s+STATE\s+ATTEMPT\s+TOOK\s+RESULT\s+WAKE AT \/ EVENT\s+ERROR$/m);
  assert.match(shown.stdout, /^0\s+line\s+step\s+succeeded\s+1\s+\d+\.\d{3}s\s+8 B\s+-$/m);
  assert.match(shown.stdout, /^1\s+line \(2\)\s+step\s+succeeded\s+1\s+/m);
  assert.match(shown.stdout, /^2\s+reserve\s+step\s+succeeded\s+2\s+\d+\.\d{3}s\s+10 B\s+-$/m);
  assert.match(shown.stdout, new RegExp(`^3\\s+approval\\s+event\\s+waiting\\s+2\\s+-\\s+-\\s+${until} order.approved$`, "m"));

  const napShown = await cli("jobs", "show", nap.id);
  assert.match(napShown.stdout, /suspended: sleeping at step "cool off" until \S+ \(in 3h\)/);
  const deadShown = await cli("jobs", "show", doomed.id);
  assert.match(deadShown.stdout, /^0\s+charge\s+step\s+failed\s+1\s+\d+\.\d{3}s\s+-\s+-\s+Error: card declined$/m);
  assert.doesNotMatch(deadShown.stdout, /suspended:/);

  const json = JSON.parse((await cli("jobs", "show", id, "--json")).stdout);
  assert.equal(json.stepCount, 4);
  assert.deepEqual(json.steps[0].result, { i: 0 });
  assert.deepEqual(json.wait, { kind: "event", step: "approval", until, event: "order.approved", match: { order: "o1" } });

  const listed = JSON.parse((await cli("jobs", "list", "--state", "suspended", "--json")).stdout) as { id: string }[];
  assert.deepEqual(listed.map((j) => j.id).sort(), [id, nap.id].sort());
  const depth = await cli("queues", "depth");
  assert.match(depth.stdout, /^default\s+no\s+0\s+-\s+0\s+0\s+0\s+-\s+no\s+2$/m);

  // Through a server, as the viewer: the same table, the error hidden.
  const app = createServer({ leasehold: lh, token: TOKEN, viewerToken: VIEWER, dashboard: "off" });
  await app.listen({ host: "127.0.0.1", port: 0 });
  t.after(() => app.close());
  const base = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
  const remote = (token: string, ...args: string[]) =>
    runCli(["--server", base, ...args], { schema: lh.schema, env: { DATABASE_URL: "postgres://nobody@127.0.0.1:1/none", LEASEHOLD_TOKEN: token } });
  const remoteShown = await remote(TOKEN, "jobs", "show", id);
  assert.equal(remoteShown.code, 0, remoteShown.stderr);
  assert.match(
    remoteShown.stdout,
    new RegExp(`suspended: waiting at step "approval" for event "order.approved" matching \\{"order":"o1"\\}, until ${until}`),
  );
  assert.match(remoteShown.stdout, new RegExp(`^3\\s+approval\\s+event\\s+waiting\\s+2\\s+-\\s+-\\s+${until} order.approved$`, "m"));
  const viewed = await remote(VIEWER, "jobs", "show", doomed.id);
  assert.equal(viewed.code, 0, viewed.stderr);
  assert.match(viewed.stdout, /^0\s+charge\s+step\s+failed\s+1\s+\d+\.\d{3}s\s+-\s+-\s+\[hidden\]$/m);
});
