/**
 * The packages as users install them: `npm pack` of each workspace (built by `npm test`), then
 * `npm install` of the tarballs into fresh projects, from the npm registry like a user's own.
 * The library alone must stay small (≤ 20 packages, ≤ 5 MB, no native code, no engine warnings
 * at the Node version it declares), ship only what runs, type-check for ESM and CommonJS
 * consumers, and stay quiet; the tooling package must give a working `leasehold` command.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import semver from "semver";
import { databaseUrl, uniqueSchema } from "./helpers/db.js";

const run = promisify(execFile);
const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const TSC = path.join(ROOT, "node_modules", "typescript", "bin", "tsc");
// The children run the installed packages, not the repository's sources.
const CLEAN_ENV = { ...process.env, NODE_OPTIONS: "" };

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-packages-"));
test.after(() => fs.rmSync(dir, { recursive: true, force: true }));

let packed: Promise<Record<string, string>> | undefined;
/** The three tarballs, packed once: package name to file. */
function tarballs(): Promise<Record<string, string>> {
  packed ??= (async () => {
    const { stdout } = await run("npm", ["pack", "--json", "--workspaces", "--pack-destination", dir], { cwd: ROOT, env: CLEAN_ENV });
    const out = JSON.parse(stdout) as { name: string; filename: string }[];
    return Object.fromEntries(out.map((p) => [p.name, path.join(dir, p.filename)]));
  })();
  return packed;
}

async function project(name: string, pkg: Record<string, unknown> = {}): Promise<string> {
  const cwd = path.join(dir, name);
  fs.mkdirSync(cwd);
  fs.writeFileSync(path.join(cwd, "package.json"), JSON.stringify({ name, version: "1.0.0", private: true, ...pkg }));
  return cwd;
}

async function npmInstall(cwd: string, specs: string[], extra: string[] = []): Promise<string> {
  const { stdout, stderr } = await run("npm", ["install", "--no-audit", "--no-fund", "--prefer-offline", ...extra, ...specs], {
    cwd,
    env: CLEAN_ENV,
    maxBuffer: 16 * 1024 * 1024,
  });
  return stdout + stderr;
}

/** Every installed package directory (scoped ones included), nested ones too. */
function installedPackages(nodeModules: string): string[] {
  const found: string[] = [];
  const visit = (nm: string) => {
    if (!fs.existsSync(nm)) return;
    for (const entry of fs.readdirSync(nm)) {
      if (entry.startsWith(".")) continue;
      const dirs = entry.startsWith("@") ? fs.readdirSync(path.join(nm, entry)).map((e) => path.join(nm, entry, e)) : [path.join(nm, entry)];
      for (const d of dirs) {
        if (!fs.existsSync(path.join(d, "package.json"))) continue;
        found.push(d);
        visit(path.join(d, "node_modules"));
      }
    }
  };
  visit(nodeModules);
  return found;
}

function filesUnder(root: string): string[] {
  return fs
    .readdirSync(root, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile())
    .map((e) => path.join(e.parentPath, e.name));
}

test("the library installs lean: at most 20 packages and 5 MB, no native code, no engine warnings at its declared Node", async () => {
  const { leasehold } = await tarballs();
  const cwd = await project("lean-app");
  const output = await npmInstall(cwd, [leasehold!]);
  assert.doesNotMatch(output, /EBADENGINE|deprecated/i, output);
  const nm = path.join(cwd, "node_modules");
  const packages = installedPackages(nm);
  assert.ok(packages.length <= 20, `${packages.length} packages: ${packages.map((p) => path.relative(nm, p)).join(", ")}`);
  const files = filesUnder(nm);
  const bytes = files.reduce((n, f) => n + fs.statSync(f).size, 0);
  // The largest, to say where the bytes went: @types/node (through @types/pg) is about half.
  const sizes = packages
    .map((p) => ({ name: path.relative(nm, p), kb: Math.round(filesUnder(p).reduce((n, f) => n + fs.statSync(f).size, 0) / 1024) }))
    .sort((a, b) => b.kb - a.kb)
    .slice(0, 4);
  assert.ok(
    bytes <= 5 * 1024 * 1024,
    `${(bytes / 1024 / 1024).toFixed(2)} MB installed; largest: ${sizes.map((s) => `${s.name} ${s.kb} kB`).join(", ")}`,
  );
  const native = files.filter(
    (f) => f.endsWith(".node") || path.basename(f) === "binding.gyp" || fs.readFileSync(f).subarray(0, 4).toString("latin1") === "\x7fELF",
  );
  assert.deepEqual(native, []);
  // No warning at the lowest Node the library declares, for any package it brings.
  const lib = JSON.parse(fs.readFileSync(path.join(nm, "leasehold", "package.json"), "utf8")) as { engines: { node: string } };
  const lowest = semver.minVersion(lib.engines.node)!.version;
  for (const p of packages) {
    const { name, engines } = JSON.parse(fs.readFileSync(path.join(p, "package.json"), "utf8")) as { name: string; engines?: { node?: string } };
    if (engines?.node) assert.ok(semver.satisfies(lowest, engines.node), `${name} wants node ${engines.node}; leasehold says ${lib.engines.node}`);
  }
});

test("each package ships what its users run: a README, a LICENSE, compiled code with source maps (the tooling's inline their sources; the library's name them, to stay small), no tests", async () => {
  const all = await tarballs();
  assert.deepEqual(Object.keys(all).sort(), ["@leasehold/cli", "@leasehold/nats", "leasehold"]);
  for (const [name, file] of Object.entries(all)) {
    const { stdout } = await run("tar", ["-tzf", file]);
    const entries = stdout.trim().split("\n");
    assert.ok(entries.includes("package/LICENSE"), `${name} has no LICENSE`);
    assert.ok(entries.includes("package/README.md"), `${name} has no README.md`);
    const compiled = entries.filter((e) => e.endsWith(".js") && e.startsWith("package/dist/"));
    assert.ok(compiled.length > 0);
    for (const js of compiled) assert.ok(entries.includes(`${js}.map`), `${name}: ${js} has no source map`);
    const { stdout: map } = await run("tar", ["-xzOf", file, `${compiled[0]}.map`]);
    const { sources, sourcesContent } = JSON.parse(map) as { sources: string[]; sourcesContent?: string[] };
    if (name === "leasehold")
      assert.ok(sources.length > 0 && sources.every((s) => s.endsWith(".ts")), `${name}: ${compiled[0]}.map names no TypeScript source`);
    else assert.equal(sourcesContent?.length, sources.length, `${name}: ${compiled[0]}.map does not inline its sources`);
    assert.deepEqual(
      entries.filter((e) => /^package\/src\/|\/testing\/|\.test\./.test(e)),
      [],
      `${name} ships files its users never run`,
    );
  }
});

test("ESM and CommonJS consumers type-check against the installed library and run it; it is quiet without a logger", async () => {
  const { leasehold } = await tarballs();
  const cwd = await project("consumers");
  // Nothing but the library: its types bring what they need (@types/pg, and @types/node with it).
  await npmInstall(cwd, [leasehold!]);
  fs.writeFileSync(
    path.join(cwd, "tsconfig.json"),
    JSON.stringify({
      compilerOptions: {
        module: "nodenext",
        moduleResolution: "nodenext",
        target: "es2022",
        strict: true,
        skipLibCheck: false,
        noEmit: false,
        outDir: "out",
      },
    }),
  );
  const schema = uniqueSchema("pkg");
  fs.writeFileSync(
    path.join(cwd, "esm.mts"),
    `import { Leasehold, ConfigError, type JobContext } from "leasehold";
const lh = await Leasehold.connect({ databaseUrl: process.env.DATABASE_URL, schema: ${JSON.stringify(schema)} });
const job = await lh.enqueue("hello", { to: "world" });
const worker = lh.worker({ handlers: { hello: (payload: { to: string }, ctx: JobContext) => void ctx.progress({ to: payload.to }) } });
const ended = new Promise((resolve) => worker.on("job:end", resolve));
await worker.start();
await ended;
await worker.stop();
const { job: done } = await lh.getJob(job.id);
await lh.pool.query("DROP SCHEMA ${schema} CASCADE");
await lh.close();
const refused = await Leasehold.connect({ databaseUrl: process.env.DATABASE_URL, nats: "nats://127.0.0.1:4222" }).catch((e: unknown) => e);
console.error(JSON.stringify({ state: done.state, natsRefused: refused instanceof ConfigError ? refused.message : String(refused) }));
`,
  );
  fs.writeFileSync(
    path.join(cwd, "cjs.cts"),
    `import leasehold = require("leasehold");
const { Leasehold, ConfigError } = leasehold;
Leasehold.connect({ embedded: true }).then(
  () => console.error("connected?"),
  (e: unknown) => console.error(JSON.stringify({ embeddedRefused: e instanceof ConfigError ? e.message : String(e) })),
);
`,
  );
  await run(process.execPath, [TSC, "-p", "."], { cwd, env: CLEAN_ENV });
  const env = { ...CLEAN_ENV, DATABASE_URL: databaseUrl() };
  const esm = await run(process.execPath, ["out/esm.mjs"], { cwd, env });
  assert.equal(esm.stdout, "", "the library wrote to stdout without a logger");
  const result = JSON.parse(esm.stderr.trim().split("\n").at(-1)!) as { state: string; natsRefused: string };
  assert.equal(result.state, "succeeded");
  assert.match(result.natsRefused, /the nats option needs the @leasehold\/nats package: npm install @leasehold\/nats/);
  const noDatabase: NodeJS.ProcessEnv = { ...CLEAN_ENV };
  delete noDatabase.DATABASE_URL;
  const cjs = await run(process.execPath, ["out/cjs.cjs"], { cwd, env: noDatabase });
  assert.match(cjs.stderr, /"embeddedRefused":"embedded: true needs the @leasehold\/cli package: npm install @leasehold\/cli"/);
});

test("the tooling package gives a working leasehold command, with the library and NATS dispatch beside it", async () => {
  const all = await tarballs();
  const cwd = await project("tooling");
  // The embedded PostgreSQL's binaries are not needed to run --help; skipping install scripts
  // keeps this test from downloading them again.
  const output = await npmInstall(cwd, [all["leasehold"]!, all["@leasehold/nats"]!, all["@leasehold/cli"]!], ["--ignore-scripts"]);
  // fastify's inject helper took cookie@2 (Node 22 only) until @leasehold/cli pinned light-my-request.
  assert.doesNotMatch(output, /EBADENGINE/, output);
  const { stdout } = await run(path.join(cwd, "node_modules", ".bin", "leasehold"), ["--help"], { cwd, env: CLEAN_ENV });
  for (const command of ["dev", "serve", "worker", "enqueue", "jobs", "doctor"]) assert.match(stdout, new RegExp(`\\b${command}\\b`));
  assert.ok(fs.existsSync(path.join(cwd, "node_modules", "@leasehold", "cli", "dashboard", "index.html")));
});
