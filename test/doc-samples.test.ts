/**
 * The docs' samples run as written: every ```ts block of README.md and docs/*.md that is not
 * marked a fragment is a program (test/doc-samples/extract.ts says how to mark one), run here in
 * a child process against the test database, each in a schema of its own, and must exit 0 within
 * its time. (npm run typecheck type-checks them all, fragments included.)
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import path from "node:path";
import pg from "pg";
import { extractSamples, GENERATED_DIR, writeSamples, type DocSample } from "./doc-samples/extract.js";
import { databaseUrl, uniqueSchema } from "./helpers/db.js";

/** Programs at once: each is mostly waiting on its database and worker. */
const AT_ONCE = 3;
const TIME_LIMIT_MS = 30_000;

const programs = writeSamples().filter((s) => s.kind === "program");

test("the docs have programs to run", () => {
  // The extractor finding none would pass everything below without running anything.
  assert.ok(programs.length >= 3, `found ${programs.length} programs`);
});

test("the extractor: a block is a program unless marked a fragment; other languages are left alone", () => {
  const doc = [
    "```ts",
    'console.log("a program");',
    "```",
    "",
    "<!-- sample: fragment -->",
    "",
    "```ts",
    "lh.enqueue(task);",
    "```",
    "````md",
    "```ts",
    "inside another block: not a sample",
    "```",
    "````",
    "- in a list:",
    "  ```typescript",
    "  const indented = 1;",
    "  ```",
    "```sh",
    "npm test",
    "```",
  ].join("\n");
  const samples = extractSamples("docs/x.md", doc);
  assert.deepEqual(
    samples.map((s) => [s.line, s.kind, s.file, s.code]),
    [
      [1, "program", "programs/x-1.ts", 'console.log("a program");'],
      [7, "fragment", "fragments/x-7.ts", "lh.enqueue(task);"],
      [16, "program", "programs/x-16.ts", "const indented = 1;"],
    ],
  );
});

test("the extractor refuses an unknown marker and an unclosed block, naming the line", () => {
  assert.throws(() => extractSamples("docs/x.md", "<!-- sample: fragmnet -->\n```ts\nx;\n```"), /docs\/x\.md:1: unknown sample marker "fragmnet"/);
  assert.throws(() => extractSamples("docs/x.md", "text\n```ts\nx;\n"), /docs\/x\.md:2: a code block that is never closed/);
});

test("every doc sample that is a program runs to exit 0", { concurrency: AT_ONCE }, async (t) => {
  await Promise.all(programs.map((sample) => t.test(`${sample.doc}:${sample.line}`, () => runProgram(sample))));
});

async function runProgram(sample: DocSample): Promise<void> {
  const schema = uniqueSchema("doc");
  try {
    const { code, signal, output } = await run(path.join(GENERATED_DIR, sample.file), schema);
    assert.equal(
      code,
      0,
      `${sample.doc}:${sample.line} ${signal ? `was killed after ${TIME_LIMIT_MS} ms (it never ended)` : `exited ${code}`}:\n${output}`,
    );
  } finally {
    const client = new pg.Client({ connectionString: databaseUrl() });
    await client.connect();
    await client.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`).finally(() => client.end());
  }
}

function run(file: string, schema: string): Promise<{ code: number | null; signal: NodeJS.Signals | null; output: string }> {
  return new Promise((resolve, reject) => {
    // As a user runs a TypeScript file; NODE_OPTIONS (from the test runner) resolves leasehold to its sources.
    const child = spawn(process.execPath, ["--import", "tsx", file], {
      env: { ...process.env, DATABASE_URL: databaseUrl(), LEASEHOLD_SCHEMA: schema },
      stdio: ["ignore", "pipe", "pipe"],
      timeout: TIME_LIMIT_MS,
      killSignal: "SIGKILL",
    });
    let output = "";
    child.stdout.on("data", (d: Buffer) => (output += d.toString()));
    child.stderr.on("data", (d: Buffer) => (output += d.toString()));
    child.on("error", reject);
    child.on("close", (code, signal) => resolve({ code, signal, output }));
  });
}
