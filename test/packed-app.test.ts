/**
 * A fresh app, as a team adopting Leasehold would make it: `npm run release:check` packs the
 * three packages (and must find nothing missing), the app installs the tarballs and zod from the
 * npm registry, and nothing else of ours. Its code type-checks against the published
 * declarations with skipLibCheck on and off, under module nodenext, node16 and bundler, and as a
 * CommonJS project importing `leasehold/testing`; `ctx.transaction`'s `tx` is pg's client, not
 * `any`. Then a typed task runs end to end, and a test written with the test kit passes.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { databaseUrl, uniqueSchema } from "./helpers/db.js";

const run = promisify(execFile);
const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const TSC = path.join(ROOT, "node_modules", "typescript", "bin", "tsc");
const ZOD = (JSON.parse(fs.readFileSync(path.join(ROOT, "node_modules", "zod", "package.json"), "utf8")) as { version: string }).version;
// The children run the installed packages, not the repository's sources; the app's own node
// --test reports to its stdout, not to this runner.
const CLEAN_ENV: NodeJS.ProcessEnv = { ...process.env, NODE_OPTIONS: "" };
delete CLEAN_ENV.NODE_TEST_CONTEXT;

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-packed-app-"));
test.after(() => fs.rmSync(dir, { recursive: true, force: true }));
const app = path.join(dir, "app");
const schema = uniqueSchema("packed");

const TASKS = `import { defineTask } from "leasehold";
import { z } from "zod";

export const greet = defineTask({
  name: "greet",
  schema: z.object({ name: z.string(), punctuation: z.string().default("!") }),
  handler: async (payload, ctx) => {
    // The attempt completes in this transaction, with the result it returns.
    await ctx.transaction(
      async (tx) => {
        if (payload.name === "never") {
          // @ts-expect-error tx is pg's PoolClient, which has no such method
          tx.thisMethodDoesNotExist();
        }
        const { rows } = await tx.query<{ n: number }>("SELECT 41 + 1 AS n");
        return rows[0]!;
      },
      { result: (row) => ({ greeting: \`hello \${payload.name}\${payload.punctuation}\`, n: row.n }) },
    );
  },
});
`;

const MAIN = `import { Leasehold, PayloadValidationError } from "leasehold";
import { greet } from "./tasks.js";

const lh = await Leasehold.connect({ databaseUrl: process.env.DATABASE_URL!, schema: process.env.SCHEMA! });
const queue = lh.typed([greet]);
// @ts-expect-error no field "nmae" in greet's payload
const refused = await queue.enqueue("greet", { nmae: "Ada" }).catch((e: unknown) => e);
const job = await queue.enqueue("greet", { name: "Ada" });
const worker = queue.worker();
const ended = new Promise<string>((resolve) => worker.on("job:end", (_job, outcome) => resolve(outcome.state)));
await worker.start();
const state = await ended;
await worker.stop();
const { job: done } = await lh.getJob(job.id);
await lh.pool.query(\`DROP SCHEMA "\${process.env.SCHEMA!}" CASCADE\`);
await lh.close();
console.log(JSON.stringify({ state, result: done.result, refused: refused instanceof PayloadValidationError ? refused.message : String(refused) }));
`;

const TESTKIT_TEST = `import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createTestQueue, type TestQueue } from "leasehold/testing";
import { greet } from "./tasks.js";

let queue: TestQueue;
before(async () => (queue = await createTestQueue({ handlers: { greet: greet.handler } })));
after(() => queue.close());

test("a greeting is enqueued and runs", async () => {
  await queue.lh.typed([greet]).enqueue("greet", { name: "Grace", punctuation: "." });
  await queue.expectEnqueued("greet", { name: "Grace" });
  const { ran, failed, left } = await queue.drain();
  assert.deepEqual(failed, []);
  assert.deepEqual(left, []);
  assert.equal(ran.length, 1);
});
`;

const CJS = `import { createTestQueue, type TestQueue } from "leasehold/testing";
import { Leasehold, ConfigError } from "leasehold";

export async function open(): Promise<TestQueue> {
  return createTestQueue({ handlers: {} });
}
console.log(JSON.stringify({ createTestQueue: typeof createTestQueue, connect: typeof Leasehold.connect, ConfigError: ConfigError.name }));
`;

function write(file: string, text: string): void {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, text);
}

async function tsc(cwd: string, compilerOptions: Record<string, unknown>, name: string): Promise<void> {
  write(path.join(cwd, name), JSON.stringify({ compilerOptions: { target: "es2022", strict: true, ...compilerOptions }, include: ["*.ts"] }));
  try {
    await run(process.execPath, [TSC, "-p", name], { cwd, env: CLEAN_ENV });
  } catch (error) {
    const { stdout } = error as { stdout: string };
    assert.fail(`${path.basename(cwd)}/${name} does not type-check:\n${stdout}`);
  }
}

test("release:check passes; the packed tarballs and zod install into a fresh app", async () => {
  const packs = path.join(dir, "packs");
  const { stdout } = await run(process.execPath, ["--import", "tsx", "scripts/release-check.ts", "--pack-destination", packs], {
    cwd: ROOT,
    env: CLEAN_ENV,
  }).catch((error: { stderr: string }) => assert.fail(`release:check failed:\n${error.stderr}`));
  const tarballs = stdout.trim().split("\n");
  assert.equal(tarballs.length, 3);
  write(path.join(app, "package.json"), JSON.stringify({ name: "app", version: "1.0.0", private: true, type: "module" }));
  write(path.join(app, "tasks.ts"), TASKS);
  write(path.join(app, "main.ts"), MAIN);
  write(path.join(app, "testkit.test.ts"), TESTKIT_TEST);
  write(path.join(app, "cjs", "package.json"), JSON.stringify({ type: "commonjs" }));
  write(path.join(app, "cjs", "index.ts"), CJS);
  // All three side by side, with no overrides: their ranges accept each other. The embedded
  // PostgreSQL's binaries are not needed here, so install scripts are skipped.
  await run("npm", ["install", "--no-audit", "--no-fund", "--prefer-offline", "--ignore-scripts", ...tarballs, `zod@${ZOD}`], {
    cwd: app,
    env: CLEAN_ENV,
    maxBuffer: 16 * 1024 * 1024,
  });
});

test("the app type-checks with only leasehold's own dependencies: skipLibCheck on and off, nodenext, node16, bundler, CommonJS", async () => {
  for (const skipLibCheck of [false, true]) {
    await tsc(app, { module: "nodenext", noEmit: true, skipLibCheck }, `tsconfig.nodenext.${skipLibCheck}.json`);
    await tsc(app, { module: "node16", noEmit: true, skipLibCheck }, `tsconfig.node16.${skipLibCheck}.json`);
    await tsc(app, { module: "esnext", moduleResolution: "bundler", noEmit: true, skipLibCheck }, `tsconfig.bundler.${skipLibCheck}.json`);
    // module commonjs resolves as node10, which ignores "exports": typesVersions finds leasehold/testing.
    // esModuleInterop (as tsc --init sets it) lets the declarations' `import pg from "pg"` resolve.
    await tsc(
      path.join(app, "cjs"),
      { module: "commonjs", esModuleInterop: true, noEmit: true, skipLibCheck },
      `tsconfig.commonjs.${skipLibCheck}.json`,
    );
    await tsc(path.join(app, "cjs"), { module: "nodenext", noEmit: true, skipLibCheck }, `tsconfig.cjs-nodenext.${skipLibCheck}.json`);
  }
});

test("a CommonJS app require()s leasehold and leasehold/testing at run time", async () => {
  await tsc(path.join(app, "cjs"), { module: "commonjs", esModuleInterop: true, outDir: "out", skipLibCheck: false }, "tsconfig.json");
  const { stdout } = await run(process.execPath, ["out/index.js"], { cwd: path.join(app, "cjs"), env: CLEAN_ENV });
  assert.deepEqual(JSON.parse(stdout), { createTestQueue: "function", connect: "function", ConfigError: "ConfigError" });
});

test("a typed task runs end to end in the app, and a test-kit test passes", async () => {
  await tsc(app, { module: "nodenext", outDir: "out", skipLibCheck: false }, "tsconfig.json");
  const env = { ...CLEAN_ENV, DATABASE_URL: databaseUrl(), SCHEMA: schema };
  const main = await run(process.execPath, ["out/main.js"], { cwd: app, env });
  const outcome = JSON.parse(main.stdout.trim().split("\n").at(-1)!) as { state: string; result: unknown; refused: string };
  assert.equal(outcome.state, "succeeded");
  assert.deepEqual(outcome.result, { greeting: "hello Ada!", n: 42 });
  assert.match(outcome.refused, /name/);
  const kit = await run(process.execPath, ["--test", "--test-reporter=tap", "out/testkit.test.js"], { cwd: app, env }).catch(
    (error: { stdout: string }) => assert.fail(`the test-kit test failed:\n${error.stdout}`),
  );
  assert.match(kit.stdout, /# pass 1/);
  assert.match(kit.stdout, /# fail 0/);
});
