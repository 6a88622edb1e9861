/**
 * The example project of docs/testing.md (examples/testing-app) passes its own `npm test`
 * (its type-check, then its node:test suite against leasehold/testing) on the test PostgreSQL.
 *
 * It runs in a copy, installed the way `npm install` installs it, offline: its dependencies
 * linked in its node_modules (leasehold, by its `file:../..`, to this package, whose dist/
 * `npm test` has just built; the rest from this repository's node_modules), with their bins in
 * node_modules/.bin. So the example sees the library only through the package's exports.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { databaseUrl } from "./helpers/db.js";

const ROOT = path.resolve(import.meta.dirname, "..");
const EXAMPLE = path.join(ROOT, "examples", "testing-app");

/** node_modules/<name> (and its bins) linked to `target`. */
function link(nodeModules: string, name: string, target: string): void {
  const at = path.join(nodeModules, name);
  fs.mkdirSync(path.dirname(at), { recursive: true });
  fs.symlinkSync(target, at, "dir");
  const manifest = JSON.parse(fs.readFileSync(path.join(target, "package.json"), "utf8")) as { name: string; bin?: string | Record<string, string> };
  const bins = typeof manifest.bin === "string" ? { [manifest.name.split("/").pop()!]: manifest.bin } : (manifest.bin ?? {});
  fs.mkdirSync(path.join(nodeModules, ".bin"), { recursive: true });
  for (const [bin, file] of Object.entries(bins)) fs.symlinkSync(path.join(at, file), path.join(nodeModules, ".bin", bin));
}

test("the example project's own tests pass against leasehold/testing", async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-testing-app-"));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  fs.cpSync(EXAMPLE, dir, { recursive: true, filter: (src) => !src.includes(`${path.sep}node_modules`) });
  const manifest = JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8")) as {
    dependencies: Record<string, string>;
    devDependencies: Record<string, string>;
  };
  assert.equal(manifest.dependencies.leasehold, "file:../../packages/leasehold", "the example depends on the library in this repository");
  const nodeModules = path.join(dir, "node_modules");
  for (const name of [...Object.keys(manifest.dependencies), ...Object.keys(manifest.devDependencies)]) {
    link(nodeModules, name, name === "leasehold" ? path.join(ROOT, "packages", "leasehold") : path.join(ROOT, "node_modules", name));
  }

  // As a user's shell would run it: not as a child of this test runner (node:test would see
  // NODE_TEST_CONTEXT and skip the example's files).
  // Nor on the repository's TypeScript sources (NODE_OPTIONS): on the built package.
  const { NODE_TEST_CONTEXT: _, ...env } = process.env;
  const child = spawn("npm", ["test"], {
    cwd: dir,
    env: { ...env, NODE_OPTIONS: "", DATABASE_URL: databaseUrl() },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  child.stdout.on("data", (d: Buffer) => (output += d.toString()));
  child.stderr.on("data", (d: Buffer) => (output += d.toString()));
  const code = await new Promise<number | null>((resolve) => child.on("exit", resolve));
  assert.equal(code, 0, `the example's npm test failed:\n${output}`);
  assert.match(output, /# pass 6\b/, output);
  assert.match(output, /# fail 0\b/, output);
});
