/**
 * The library stays a library: importing it loads no CLI, server, embedded-database or bench
 * code, and connecting without a database URL is an error, never a database started on the
 * user's behalf.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Registry } from "prom-client";
import { ConfigError, Leasehold } from "../packages/leasehold/src/index.js";
import { MAX_QUEUE_LABELS, metricsFor } from "../packages/leasehold/src/metrics.js";

const PACKAGES = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "packages");
const DIST = path.join(PACKAGES, "leasehold", "dist");

/** Static imports and re-exports of a compiled module (dynamic `import()` is loaded on demand). */
function staticImports(file: string): string[] {
  const text = fs.readFileSync(file, "utf8");
  const specifiers: string[] = [];
  for (const m of text.matchAll(/^(?:import|export)\s[^;]*?\sfrom\s+"([^"]+)";?$|^import\s+"([^"]+)";?$/gms)) {
    specifiers.push((m[1] ?? m[2])!);
  }
  return specifiers;
}

/** Every compiled file and bare package reached from `entry` through static imports. */
function importGraph(entry: string): { files: Set<string>; packages: Set<string> } {
  const files = new Set<string>();
  const packages = new Set<string>();
  const visit = (file: string) => {
    if (files.has(file)) return;
    files.add(file);
    for (const spec of staticImports(file)) {
      if (spec.startsWith(".")) visit(path.resolve(path.dirname(file), spec));
      else
        packages.add(
          spec.startsWith("node:")
            ? "node:"
            : spec
                .split("/")
                .slice(0, spec.startsWith("@") ? 2 : 1)
                .join("/"),
        );
    }
  };
  visit(entry);
  return { files, packages };
}

test("importing the library loads only its own runtime: no CLI, server, embedded database or tooling", () => {
  const { files, packages } = importGraph(path.join(DIST, "index.js"));
  const outside = [...files].map((f) => path.relative(DIST, f)).filter((f) => f.startsWith(".."));
  assert.deepEqual(outside, []);
  // prom-client, the OpenTelemetry API, NATS and the embedded server are optional: loaded when present or asked for.
  assert.deepEqual([...packages].sort(), ["croner", "node:", "pg"]);
  // The walk sees real imports: the graph is more than the entry file.
  assert.ok(files.size > 10, `only ${files.size} files reached`);
});

test("the walk would notice a tooling import (it can fail)", () => {
  const cli = importGraph(path.join(PACKAGES, "cli", "dist", "cli", "main.js"));
  assert.ok(cli.packages.has("commander"));
});

test("connect without a database URL is a ConfigError and starts nothing", async (t) => {
  const saved = process.env.DATABASE_URL;
  delete process.env.DATABASE_URL;
  t.after(() => {
    process.env.DATABASE_URL = saved;
  });
  const cwdBefore = fs.readdirSync(process.cwd());
  await assert.rejects(Leasehold.connect(), (err: unknown) => err instanceof ConfigError && /databaseUrl|DATABASE_URL/.test(err.message));
  assert.deepEqual(fs.readdirSync(process.cwd()), cwdBefore, "nothing was created in the working directory");
  await assert.rejects(Leasehold.connect({ databaseUrl: "notaurl" }), (err: unknown) => err instanceof ConfigError && !/notaurl/.test(err.message));
});

test("metrics label at most MAX_QUEUE_LABELS queues by name; later ones count as other", () => {
  const metrics = metricsFor(new Registry());
  const labels = Array.from({ length: MAX_QUEUE_LABELS + 50 }, (_, i) => metrics.queueLabel(`q${i}`));
  assert.equal(new Set(labels).size, MAX_QUEUE_LABELS + 1);
  assert.equal(labels.at(-1), "other");
  assert.equal(metrics.queueLabel("q0"), "q0", "a queue seen early keeps its label");
});
