/**
 * A job's `runAt` must be from 1970-01-01T00:00:00Z to 3650 days from now (docs/api.md):
 * anything else (year 0, a time in seconds taken for milliseconds, a typo'd century) is
 * refused naming runAt, and nothing is written, at every edge that takes a time: the library
 * (enqueue, enqueueMany, flows, batches), HTTP with a real token, and the CLI. (SQL: in
 * sql-enqueue-role.test.ts.)
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { ValidationError } from "../packages/leasehold/src/errors.js";
import { freshLeasehold } from "./helpers/db.js";
import { runCli } from "./helpers/cli.js";
import { api, startServe, TOKEN } from "./helpers/server.js";

type Lh = Awaited<ReturnType<typeof freshLeasehold>>;

const DAY = 86_400_000;
const OUT_OF_RANGE = ["0000-01-01T00:00:00Z", "1969-12-31T23:59:59Z", "+010000-01-01T00:00:00Z", new Date(Date.now() + 3651 * DAY).toISOString()];
const RANGE = /runAt must be from 1970-01-01T00:00:00.000Z to 3650 days from now \(got /;
const count = async (lh: Lh) => (await lh.pool.query("SELECT count(*)::int AS n FROM jobs")).rows[0].n as number;

test("library: a runAt out of range is refused naming it, in enqueue, enqueueMany, flows and batches", async (t) => {
  const lh = await freshLeasehold(t);
  for (const text of OUT_OF_RANGE) {
    const runAt = new Date(text);
    assert.ok(!Number.isNaN(runAt.getTime()), `${text} is a valid Date`);
    const refused = (where: string) => (err: unknown) => err instanceof ValidationError && err.message.startsWith(where) && RANGE.test(err.message);
    await assert.rejects(lh.enqueue("t", {}, { runAt }), refused("job 0: runAt"), text);
    await assert.rejects(lh.enqueueMany([{ task: "t" }, { task: "t", runAt }]), refused("job 1: runAt"), text);
    await assert.rejects(
      lh.enqueueFlow([
        { ref: "a", task: "t" },
        { ref: "b", task: "t", dependsOn: ["a"], runAt },
      ]),
      RANGE,
      text,
    );
    await assert.rejects(lh.enqueueBatch({ jobs: [{ task: "t", runAt }], onComplete: { task: "done" } }), RANGE, text);
  }
  assert.equal(await count(lh), 0, "nothing written");
  // The edges themselves are fine.
  await lh.enqueue("t", {}, { runAt: new Date("1970-01-01T00:00:00Z") });
  await lh.enqueue("t", {}, { runAt: new Date(Date.now() + 3649 * DAY) });
  assert.equal(await count(lh), 2);
});

test("HTTP and CLI: a runAt out of range is 400 naming runAt (CLI: --run-at); nothing written", async (t) => {
  const lh = await freshLeasehold(t);
  const serve = await startServe(lh.schema);
  t.after(async () => void (await serve.stop("SIGTERM")));
  const base = serve.match[1]!;
  for (const runAt of OUT_OF_RANGE) {
    for (const [path, body] of [
      ["/v1/jobs", { task: "t", runAt }],
      ["/v1/jobs/batch", { jobs: [{ task: "t" }, { task: "t", runAt }] }],
      ["/v1/flows", { nodes: [{ ref: "a", task: "t", runAt }] }],
    ] as const) {
      const res = await api(base, "POST", path, body);
      assert.deepEqual([res.status, res.json?.error?.code], [400, "invalid_input"], `${path} ${runAt}: ${res.text}`);
      assert.match(res.json.error.message, /runAt/, `${path} ${runAt}`);
    }
  }
  const ok = await api(base, "POST", "/v1/jobs", { task: "t", runAt: "1970-01-01T00:00:00Z" });
  assert.equal(ok.status, 201, ok.text);
  assert.equal(await count(lh), 1, "only the one in range");

  const viaServer = (...args: string[]) => runCli(["--server", base, ...args], { schema: lh.schema, env: { LEASEHOLD_TOKEN: TOKEN } });
  const onDb = (...args: string[]) => runCli(args, { schema: lh.schema });
  for (const [where, cli] of [
    ["server", viaServer],
    ["database", onDb],
  ] as const) {
    for (const runAt of ["0000-01-01T00:00:00Z", "1969-07-20T20:17:00Z"]) {
      const res = await cli("enqueue", "t", "--run-at", runAt);
      assert.notEqual(res.code, 0, `${where} ${runAt}`);
      assert.match(res.stderr, /--run-at must be from 1970-01-01T00:00:00.000Z to 3650 days from now/, `${where} ${runAt}`);
    }
  }
  assert.equal(await count(lh), 1, "nothing written by the CLI");
});
