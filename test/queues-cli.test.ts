/**
 * `leasehold queues list|pause|resume|limit|history` and `enqueue --key` as a user runs them (the built
 * CLI in a real process): on the database, and through a server with --server; what they
 * store, what they print, and one-line errors with their exit codes.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import type { FastifyInstance } from "fastify";
import { createServer } from "../packages/cli/src/server/app.js";
import * as store from "../packages/leasehold/src/store/index.js";
import { freshLeasehold } from "./helpers/db.js";
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

async function queueRow(name: string) {
  const { rows } = await lh.pool.query(
    "SELECT paused, concurrency, key_concurrency, rate_limit, rate_window_ms, key_rate_limit, key_rate_window_ms, key_weights FROM queues WHERE name = $1",
    [name],
  );
  return rows[0];
}

test("on the database: enqueue --key, queues list, pause, resume and limit store what they say; bad input exits 2 with one line", async () => {
  const cli = (...args: string[]) => runCli(args, { schema: lh.schema });

  const enq = await cli("enqueue", "sync", "--queue", "tenants", "--key", "acme", "--json");
  assert.equal(enq.code, 0, enq.stderr);
  const { rows } = await lh.pool.query("SELECT flow_key FROM jobs WHERE id = $1", [JSON.parse(enq.stdout).id]);
  assert.equal(rows[0].flow_key, "acme");
  assert.match((await cli("jobs", "show", JSON.parse(enq.stdout).id)).stdout, /^key\s+acme$/m);
  const tooLong = await cli("enqueue", "sync", "--key", "k".repeat(513));
  assert.equal(tooLong.code, 2);
  assert.ok(isOneLineError(tooLong.stderr), tooLong.stderr);

  const unknown = await cli("queues", "pause", "tenant");
  assert.equal(unknown.code, 3, unknown.stderr);
  assert.ok(isOneLineError(unknown.stderr), unknown.stderr);
  assert.match(unknown.stderr, /queue "tenant" is unknown.*did you mean "tenants".*--create/);
  assert.equal(await queueRow("tenant"), undefined);

  const paused = await cli("queues", "pause", "tenants");
  assert.equal(paused.code, 0, paused.stderr);
  assert.match(paused.stdout, /^queue tenants paused/);
  assert.equal((await queueRow("tenants")).paused, true);

  const limited = await cli(
    "queues",
    "limit",
    "tenants",
    "--concurrency",
    "10",
    "--key-concurrency",
    "1",
    "--rate",
    "50/1s",
    "--key-rate",
    "100/1m",
    "--key-weight",
    "acme=3",
    "--key-weight",
    "globex=2",
  );
  assert.equal(limited.code, 0, limited.stderr);
  assert.match(limited.stdout, /concurrency 10, key concurrency 1, rate 50\/1s, key rate 100\/1m, key weights acme=3, globex=2/);
  assert.deepEqual(await queueRow("tenants"), {
    paused: true,
    concurrency: 10,
    key_concurrency: 1,
    rate_limit: 50,
    rate_window_ms: 1_000,
    key_rate_limit: 100,
    key_rate_window_ms: 60_000,
    key_weights: { acme: 3, globex: 2 },
  });

  const table = await cli("queues", "list");
  assert.equal(table.code, 0, table.stderr);
  const [header, ...lines] = table.stdout.trimEnd().split("\n");
  assert.match(header!, /^NAME\s+PAUSED\s+CONCURRENCY\s+KEY CONC\.\s+RATE\s+KEY RATE\s+WAITING\s+RUNNING\s+HELD\s+RECORDS$/);
  assert.ok(
    lines.some((l) => /^tenants\s+yes\s+10\s+1\s+50\/1s\s+100\/1m\s+1\s+0\s+-\s+all$/.test(l)),
    table.stdout,
  );
  const json = await cli("queues", "list", "--json");
  const tenants = (JSON.parse(json.stdout) as { name: string; paused: boolean; rate: unknown; waiting: number }[]).find((q) => q.name === "tenants")!;
  assert.deepEqual([tenants.paused, tenants.rate, tenants.waiting], [true, { limit: 50, windowMs: 1_000 }, 1]);

  // none removes a limit; the others stay.
  const cleared = await cli("queues", "limit", "tenants", "--rate", "none", "--key-weight", "none", "--concurrency", "none", "--json");
  assert.equal(cleared.code, 0, cleared.stderr);
  assert.deepEqual(JSON.parse(cleared.stdout).rate, null);
  assert.deepEqual(Object.values(await queueRow("tenants")), [true, null, 1, null, null, 100, 60_000, null]);

  const resumed = await cli("queues", "resume", "tenants", "--json");
  assert.equal(JSON.parse(resumed.stdout).paused, false);
  assert.equal((await queueRow("tenants")).paused, false);

  // A queue before its first job.
  assert.equal((await cli("queues", "limit", "fresh", "--concurrency", "2")).code, 3);
  const created = await cli("queues", "limit", "fresh", "--concurrency", "2", "--create");
  assert.equal(created.code, 0, created.stderr);
  assert.equal((await queueRow("fresh")).concurrency, 2);
  assert.equal((await cli("queues", "pause", "fresh-too", "--create")).code, 0);
  assert.equal((await queueRow("fresh-too")).paused, true);

  const before = await queueRow("tenants");
  for (const [args, message] of [
    [["--rate", "50"], /--rate must be starts per window like 50\/1s/],
    [["--rate", "0/1s"], /--rate must allow 1 to 1000000 starts per window \(got "0\/1s"\)/],
    [["--rate", "5/5ms"], /--rate needs a window from 10ms to 1d \(got "5\/5ms"\)/],
    [["--key-rate", "5/fortnight"], /--key-rate must be starts per window/],
    [["--concurrency", "0"], /--concurrency must be a whole number from 1 to 100000, or none/],
    [["--key-concurrency", "lots"], /--key-concurrency must be a whole number/],
    [["--key-weight", "acme"], /--key-weight must be KEY=WEIGHT/],
    [["--key-weight", "acme=101"], /--key-weight must be KEY=WEIGHT with a weight from 1 to 100/],
    [["--key-weight", "none", "--key-weight", "acme=2"], /--key-weight none clears the weights: give it alone/],
    [[], /give at least one of --concurrency/],
  ] as const) {
    const bad = await cli("queues", "limit", "tenants", ...args);
    assert.equal(bad.code, 2, `${args.join(" ")}: ${bad.stderr}`);
    assert.ok(isOneLineError(bad.stderr), bad.stderr);
    assert.match(bad.stderr, message);
  }
  const badName = await cli("queues", "pause", "no spaces", "--create");
  assert.equal(badName.code, 2);
  assert.match(badName.stderr, /queue must be 1-128 characters/);
  assert.deepEqual(await queueRow("tenants"), before);
});

test("through a server (--server, no database): the same commands, the same errors and exit codes", async () => {
  const env = { DATABASE_URL: "postgres://nobody@127.0.0.1:1/none", LEASEHOLD_TOKEN: TOKEN };
  const cli = (...args: string[]) => runCli(["--server", base, ...args], { schema: lh.schema, env });

  const enq = await cli("enqueue", "sync", "--queue", "remote-q", "--key", "initech", "--json");
  assert.equal(enq.code, 0, enq.stderr);
  const { rows } = await lh.pool.query("SELECT flow_key FROM jobs WHERE id = $1", [JSON.parse(enq.stdout).id]);
  assert.equal(rows[0].flow_key, "initech");
  assert.equal(JSON.parse((await cli("jobs", "show", JSON.parse(enq.stdout).id, "--json")).stdout).job.key, "initech");

  const paused = await cli("queues", "pause", "remote-q");
  assert.equal(paused.code, 0, paused.stderr);
  assert.equal((await queueRow("remote-q")).paused, true);
  const limited = await cli("queues", "limit", "remote-q", "--key-concurrency", "2", "--rate", "5/500ms", "--json");
  assert.equal(limited.code, 0, limited.stderr);
  assert.deepEqual(JSON.parse(limited.stdout).rate, { limit: 5, windowMs: 500 });
  assert.deepEqual([(await queueRow("remote-q")).key_concurrency, (await queueRow("remote-q")).rate_window_ms], [2, 500]);

  const listed = await cli("queues", "list");
  assert.ok(
    listed.stdout.split("\n").some((l) => /^remote-q\s+yes\s+-\s+2\s+5\/500ms\s+-\s+1\s+0\s+-\s+all$/.test(l)),
    listed.stdout,
  );
  const json = JSON.parse((await cli("queues", "list", "--json")).stdout) as { name: string; pausedAt: string }[];
  assert.ok(!Number.isNaN(Date.parse(json.find((q) => q.name === "remote-q")!.pausedAt)));

  assert.equal((await cli("queues", "resume", "remote-q")).code, 0);
  assert.equal((await queueRow("remote-q")).paused, false);

  const unknown = await cli("queues", "pause", "remote-x");
  assert.equal(unknown.code, 3, unknown.stderr);
  assert.ok(isOneLineError(unknown.stderr), unknown.stderr);
  assert.match(unknown.stderr, /^leasehold: queue "remote-x" is unknown.*--create/);
  assert.equal((await cli("queues", "pause", "remote-x", "--create")).code, 0);
  assert.equal((await queueRow("remote-x")).paused, true);
  // A slash in a name travels in the path.
  assert.equal((await cli("queues", "limit", "team/a", "--concurrency", "4", "--create")).code, 0);
  assert.equal((await queueRow("team/a")).concurrency, 4);
});

test("queues history: on the database and through a server it sets and shows a queue's record of succeeded jobs; jobs show of a job not kept says so", async () => {
  const direct = (...args: string[]) => runCli(args, { schema: lh.schema });
  const env = { DATABASE_URL: "postgres://nobody@127.0.0.1:1/none", LEASEHOLD_TOKEN: TOKEN };
  const remote = (...args: string[]) => runCli(["--server", base, ...args], { schema: lh.schema, env });
  const keeps = async (name: string) => (await lh.pool.query("SELECT keep_succeeded FROM queues WHERE name = $1", [name])).rows[0]?.keep_succeeded;

  for (const [cli, queue] of [
    [direct, "lean-db"],
    [remote, "lean-http"],
  ] as const) {
    const unknown = await cli("queues", "history", queue, "--no-keep-succeeded");
    assert.equal(unknown.code, 3, unknown.stderr);
    assert.ok(isOneLineError(unknown.stderr), unknown.stderr);
    const off = await cli("queues", "history", queue, "--no-keep-succeeded", "--create");
    assert.equal(off.code, 0, off.stderr);
    assert.match(off.stdout, new RegExp(`^queue ${queue} keeps no record of succeeded jobs`));
    assert.equal(await keeps(queue), false);
    const shown = await cli("queues", "history", queue, "--json");
    assert.equal(JSON.parse(shown.stdout).keepSucceeded, false);
    const table = await cli("queues", "list");
    assert.ok(
      table.stdout.split("\n").some((l) => new RegExp(`^${queue}\\s.*\\sno succeeded$`).test(l)),
      table.stdout,
    );

    // A job of it succeeds: `jobs show` says it finished and is not kept (exit 3, one line).
    const [enqueued] = await lh.enqueueMany([{ task: "t", queue }]);
    const [job] = await store.claimJobs(lh.pool, { queues: [queue], limit: 1, workerId: "w", leaseMs: 30_000, tasks: ["t"] });
    await store.completeJobs(lh.pool, { workerId: "w", jobs: [{ id: job!.id, attempt: job!.attempt }] });
    const show = await cli("jobs", "show", enqueued!.id);
    assert.equal(show.code, 3, show.stderr);
    assert.ok(isOneLineError(show.stderr), show.stderr);
    assert.match(show.stderr, new RegExp(`job ${enqueued!.id} has finished and its record is not kept`));

    const on = await cli("queues", "history", queue, "--keep-succeeded", "--json");
    assert.equal(on.code, 0, on.stderr);
    assert.equal(JSON.parse(on.stdout).keepSucceeded, true);
    assert.equal(await keeps(queue), true);
  }
  const nothing = await direct("queues", "history", "lean-db", "--create");
  assert.equal(nothing.code, 2);
  assert.match(nothing.stderr, /--create needs --keep-succeeded or --no-keep-succeeded/);
});
