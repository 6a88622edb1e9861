/**
 * What `leasehold dev` tells the user, with a tasks module of typed tasks: the enqueue command
 * its banner suggests makes a job that succeeds (its payload is one the schema accepts), and a
 * job line says why a job is dead: out of attempts, or failed for good with attempts left.
 */
import assert from "node:assert/strict";
import fs from "node:fs";
import { createRequire } from "node:module";
import os from "node:os";
import path from "node:path";
import { test } from "node:test";
import { pathToFileURL } from "node:url";
import { z } from "zod";
import { defineTask } from "../packages/leasehold/src/index.js";
import { examplePayload } from "../packages/cli/src/cli/example-payload.js";
import { eventually, uniqueSchema } from "./helpers/db.js";
import { CLI, runCli, startCli } from "./helpers/cli.js";

/** The built library, as a tasks module of an app that installed it would load it. */
const LIBRARY = pathToFileURL(path.resolve(path.dirname(CLI), "..", "..", "..", "leasehold", "dist", "index.js")).href;
const ZOD = pathToFileURL(createRequire(import.meta.url).resolve("zod")).href;

test(
  "leasehold dev: the banner's enqueue command makes a job that succeeds; a dead job's line says whether attempts were left",
  { timeout: 120_000 },
  async (t) => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-dev-msg-"));
    t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
    const tasksFile = path.join(dir, "tasks.mjs");
    fs.writeFileSync(
      tasksFile,
      `import { defineTask } from ${JSON.stringify(LIBRARY)};
import { z } from ${JSON.stringify(ZOD)};
export default [
  defineTask({
    name: "send-email",
    schema: z.object({ to: z.email(), subject: z.string().default("hello") }),
    handler: async (payload) => ({ sentTo: payload.to }),
  }),
  defineTask({ name: "broken", schema: z.object({}), handler: async () => { throw new Error("broken on purpose"); } }),
];
`,
    );
    const schema = uniqueSchema("devmsg");
    const opts = { schema, cwd: dir };
    const dev = await startCli(["dev", "--port", "0", "--tasks", tasksFile], { ...opts, ready: /Press Ctrl-C to stop/ });
    t.after(() => void dev.stop("SIGKILL"));

    // The suggested command, run as printed.
    const suggested = /npx leasehold enqueue (\S+) --payload '([^']*)'/.exec(dev.output());
    assert.ok(suggested, `the banner suggests an enqueue: ${dev.output()}`);
    assert.equal(suggested[1], "send-email");
    const enq = await runCli(["enqueue", suggested[1]!, "--payload", suggested[2]!, "--json"], opts);
    assert.equal(enq.code, 0, enq.stderr);
    const { id } = JSON.parse(enq.stdout) as { id: string };
    await eventually(async () => new RegExp(`job ${id} send-email (succeeded|failed)`).exec(dev.output())?.[1], "the suggested job ended");
    assert.match(dev.output(), new RegExp(`✔ job ${id} send-email succeeded`));

    // A payload its schema refuses: dead at once with 24 of 25 attempts left, and the line says so.
    const bad = JSON.parse((await runCli(["enqueue", "send-email", "--payload", '{"to":"not an address"}', "--json"], opts)).stdout) as {
      id: string;
    };
    const badLine = await eventually(async () => new RegExp(`✖ job ${bad.id} send-email .*`).exec(dev.output())?.[0], "the invalid job's line");
    assert.doesNotMatch(badLine, /no attempts left/);
    assert.match(badLine, /failed for good and is dead, not retried \(.*; 24 of 25 attempts unused\)/);
    assert.match(badLine, new RegExp(`leasehold jobs show ${bad.id}`));

    // Out of attempts: that, and only then, is "no attempts left".
    const broken = JSON.parse((await runCli(["enqueue", "broken", "--max-attempts", "1", "--json"], opts)).stdout) as { id: string };
    const brokenLine = await eventually(async () => new RegExp(`✖ job ${broken.id} broken .*`).exec(dev.output())?.[0], "the broken job's line");
    assert.match(brokenLine, /failed and is dead \(no attempts left: all 1 spent\)/);
  },
);

test("the suggested payload is one the schema accepts, or none (the banner then names the fields)", async () => {
  const task = (schema: z.ZodType) => defineTask({ name: "t", schema, handler: () => undefined });
  assert.deepEqual(await examplePayload(undefined), { ok: true, payload: {} });
  assert.deepEqual(await examplePayload(task(z.object({ n: z.number().default(1) }))), { ok: true, payload: {} });
  assert.deepEqual(await examplePayload(task(z.object({ url: z.url(), width: z.number().int(), to: z.email() }))), {
    ok: true,
    payload: { url: "https://example.com", width: 1, to: "ada@example.com" },
  });
  const nested = await examplePayload(task(z.object({ address: z.object({ city: z.string() }) })));
  assert.equal(nested.ok, false);
  assert.deepEqual(!nested.ok && nested.issues.map((i) => i.path), ["payload.address"]);
});
