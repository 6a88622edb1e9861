/**
 * `leasehold events send EVENT [DATA]` as a user runs it (the built CLI in a real process): on
 * the database and through a server with --server, each event waking the job that waits for it;
 * bad JSON or a bad name exits 2 with one line naming it, and sends nothing.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import type { FastifyInstance } from "fastify";
import { createServer } from "../packages/cli/src/server/app.js";
import type { JobContext } from "../packages/leasehold/src/worker/context.js";
import { eventually, freshLeasehold } from "./helpers/db.js";
import { isOneLineError, runCli } from "./helpers/cli.js";
import { TOKEN } from "./helpers/server.js";

let lh: Awaited<ReturnType<typeof freshLeasehold>>;
let app: FastifyInstance;
let base: string;

before(async () => {
  lh = await freshLeasehold();
  app = createServer({ leasehold: lh, token: TOKEN });
  await app.listen({ host: "127.0.0.1", port: 0 });
  base = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
});

after(async () => {
  await app.close();
  await lh.dispose();
});

const eventCount = async () => (await lh.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM events")).rows[0]!.n;

test("events send wakes the waiting job, on the database and through --server; bad data or names exit 2 naming them", async (t) => {
  const worker = lh.worker({
    handlers: {
      approve: async (p: { doc: string }, ctx: JobContext) => ctx.waitForEvent("approval", { event: "doc.approved", match: { doc: p.doc } }),
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const local = await lh.enqueue("approve", { doc: "d1" });
  const remote = await lh.enqueue("approve", { doc: "d2" });
  for (const { id } of [local, remote]) await eventually(async () => (await lh.getJob(id)).job.state === "suspended" || undefined, `job ${id} waits`);
  const cli = (args: string[], input?: string) => runCli(args, { schema: lh.schema, input });
  // No database for these: everything goes through the server.
  const serverEnv = { DATABASE_URL: "postgres://nobody@127.0.0.1:1/none", LEASEHOLD_TOKEN: TOKEN };
  const viaServer = (args: string[], input?: string) => runCli(["--server", base, ...args], { schema: lh.schema, env: serverEnv, input });

  // Data too large for a command-line argument comes from stdin ("-").
  const big = JSON.stringify({ big: "x".repeat(300 * 1024) });
  for (const bad of [
    { args: ["events", "send", "doc.approved", "{doc: d1}"], says: /the event data is not valid JSON/ },
    { args: ["events", "send", "doc\u0007approved"], says: /events send: the event name .* contains a control character/ },
    { args: ["events", "send", "x".repeat(256)], says: /events send: the event name is 256 characters; the limit is 255/ },
    { args: ["events", "send", "doc.approved", "-"], input: big, says: /event data is \d+ bytes as JSON; the limit is 262144/ },
  ]) {
    for (const run of [cli, viaServer]) {
      const r = await run(bad.args, bad.input);
      assert.equal(r.code, 2, r.stderr);
      assert.ok(isOneLineError(r.stderr), r.stderr);
      assert.match(r.stderr, bad.says);
    }
  }
  assert.equal(await eventCount(), 0, "nothing was sent");

  const sent = await cli(["events", "send", "doc.approved", "-"], '{"doc":"d1","by":"ann"}');
  assert.equal(sent.code, 0, sent.stderr);
  assert.match(sent.stdout, /^event doc\.approved sent \(id \d+\)$/m);
  const sentRemote = await viaServer(["events", "send", "doc.approved", '{"doc":"d2","by":"bob"}', "--json"]);
  assert.equal(sentRemote.code, 0, sentRemote.stderr);
  assert.match(JSON.parse(sentRemote.stdout).id, /^\d+$/);
  const noData = await viaServer(["events", "send", "doc.noted"]);
  assert.equal(noData.code, 0, noData.stderr);

  for (const [{ id }, by] of [
    [local, "ann"],
    [remote, "bob"],
  ] as const) {
    const done = await eventually(async () => {
      const r = await lh.getJob(id);
      return r.job.state === "succeeded" ? r : undefined;
    }, `job ${id} woken`);
    assert.equal((done.job.result as { by: string }).by, by);
  }
  const noted = await lh.pool.query("SELECT data FROM events WHERE name = 'doc.noted'");
  assert.deepEqual(noted.rows, [{ data: null }], "no data: none");
});
