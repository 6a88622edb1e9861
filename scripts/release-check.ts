/**
 * npm run release:check — packs the three packages as `npm publish` would and checks that each
 * tarball carries what a registry user needs: package.json, README.md, LICENSE and CHANGELOG.md;
 * every file its exports, `types` and `typesVersions` name; a source map beside every compiled
 * file, with the sources it maps inlined (src/ is not shipped), except the library's, whose maps
 * name the TypeScript files they map and leave them out (LEAN_MAPS); no tests. The three share one
 * version, named in CHANGELOG.md, and depend on each other by a range that takes later
 * compatible releases, never by one exact version.
 *
 *   node --import tsx scripts/release-check.ts [--pack-destination DIR]
 *
 * With --pack-destination the tarballs stay in DIR (the packed-app test installs them);
 * otherwise they go to a temporary directory that is removed. Exits 1 naming each problem.
 */
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import semver from "semver";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const PACKAGES = ["leasehold", "@leasehold/cli", "@leasehold/nats"];

interface Manifest {
  name: string;
  version: string;
  main?: string;
  types?: string;
  exports?: Record<string, unknown>;
  typesVersions?: Record<string, Record<string, string[]>>;
  dependencies?: Record<string, string>;
  peerDependencies?: Record<string, string>;
}

interface SourceMap {
  sources: string[];
  sourcesContent?: (string | null)[];
}

/** The files a package.json points users at: exports' targets (not the repository-only "source"), main, types, typesVersions. */
function namedFiles(manifest: Manifest): string[] {
  const named = new Set<string>();
  const visit = (target: unknown, condition?: string) => {
    if (typeof target === "string") {
      if (condition !== "source" && !target.includes("*")) named.add(path.posix.normalize(target));
    } else if (target && typeof target === "object") {
      for (const [key, value] of Object.entries(target)) visit(value, key.startsWith(".") ? undefined : key);
    }
  };
  visit(manifest.exports ?? {});
  for (const file of [manifest.main, manifest.types]) if (file) named.add(path.posix.normalize(file));
  for (const paths of Object.values(manifest.typesVersions ?? {}))
    for (const targets of Object.values(paths)) targets.forEach((t) => named.add(path.posix.normalize(t)));
  return [...named];
}

/** Checks one unpacked tarball; returns its problems. */
/**
 * Packages whose maps leave their sources out: the library a user installs, whose install has a
 * size budget (test/packages.test.ts). Its maps still turn a stack trace into TypeScript file:line.
 */
const LEAN_MAPS = new Set(["leasehold"]);

function checkTarball(name: string, unpacked: string): string[] {
  const problems: string[] = [];
  const files = fs
    .readdirSync(unpacked, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile())
    .map((e) => path.relative(unpacked, path.join(e.parentPath, e.name)).split(path.sep).join("/"));
  const has = new Set(files);
  for (const required of ["package.json", "README.md", "LICENSE", "CHANGELOG.md"]) {
    if (!has.has(required)) problems.push(`${name}: no ${required}`);
  }
  const manifest = JSON.parse(fs.readFileSync(path.join(unpacked, "package.json"), "utf8")) as Manifest;
  for (const file of namedFiles(manifest)) if (!has.has(file)) problems.push(`${name}: package.json names ${file}, which is not in the tarball`);
  if (!files.some((f) => f.endsWith(".d.ts"))) problems.push(`${name}: no type declarations`);
  for (const file of files.filter((f) => f.startsWith("dist/") && f.endsWith(".js"))) {
    const mapFile = `${file}.map`;
    if (!has.has(mapFile)) {
      problems.push(`${name}: ${file} has no source map`);
      continue;
    }
    const map = JSON.parse(fs.readFileSync(path.join(unpacked, mapFile), "utf8")) as SourceMap;
    if (LEAN_MAPS.has(name)) {
      if (map.sources.length === 0 || !map.sources.every((s) => s.endsWith(".ts"))) problems.push(`${name}: ${mapFile} names no TypeScript source`);
      continue;
    }
    map.sources.forEach((source, i) => {
      const inlined = typeof map.sourcesContent?.[i] === "string";
      const shipped = has.has(path.posix.join(path.posix.dirname(mapFile), source));
      if (!inlined && !shipped) problems.push(`${name}: ${mapFile} maps ${source}, which is neither inlined nor shipped`);
    });
  }
  const stray = files.filter((f) => /^src\/|\/testing\/|\.test\./.test(f));
  if (stray.length) problems.push(`${name}: ships files its users never run: ${stray.join(", ")}`);
  return problems;
}

/** The three share one version and take each other by a range that accepts the next compatible release. */
function checkVersions(manifests: Manifest[]): string[] {
  const problems: string[] = [];
  const versions = new Map(manifests.map((m) => [m.name, m.version]));
  if (new Set(versions.values()).size !== 1) problems.push(`the packages' versions differ: ${[...versions].map(([n, v]) => `${n}@${v}`).join(", ")}`);
  for (const m of manifests) {
    for (const [dep, range] of Object.entries({ ...m.dependencies, ...m.peerDependencies })) {
      const version = versions.get(dep);
      if (!version) continue;
      const next = semver.inc(version, "patch")!;
      if (semver.valid(range) || !semver.satisfies(version, range) || !semver.satisfies(next, range)) {
        problems.push(`${m.name} takes ${dep} as "${range}": it must accept ${version} and later compatible releases (e.g. "^${version}")`);
      }
    }
  }
  const changelog = fs.readFileSync(path.join(ROOT, "CHANGELOG.md"), "utf8");
  const version = manifests[0]!.version;
  if (!changelog.includes(`## ${version}`)) problems.push(`CHANGELOG.md has no "## ${version}" section`);
  return problems;
}

function main(): void {
  const at = process.argv.indexOf("--pack-destination");
  const keep = at >= 0 ? path.resolve(process.argv[at + 1]!) : undefined;
  const dir = keep ?? fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-release-"));
  fs.mkdirSync(dir, { recursive: true });
  try {
    const packed = JSON.parse(
      execFileSync("npm", ["pack", "--json", "--workspaces", "--pack-destination", dir], {
        cwd: ROOT,
        encoding: "utf8",
        stdio: ["ignore", "pipe", "inherit"],
      }),
    ) as { name: string; filename: string }[];
    const problems: string[] = [];
    const manifests: Manifest[] = [];
    for (const name of PACKAGES) if (!packed.some((p) => p.name === name)) problems.push(`${name} was not packed`);
    for (const { name, filename } of packed) {
      const unpacked = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-unpacked-"));
      try {
        execFileSync("tar", ["-xzf", path.join(dir, filename), "-C", unpacked, "--strip-components=1"]);
        manifests.push(JSON.parse(fs.readFileSync(path.join(unpacked, "package.json"), "utf8")) as Manifest);
        problems.push(...checkTarball(name, unpacked));
      } finally {
        fs.rmSync(unpacked, { recursive: true, force: true });
      }
      console.log(`${path.join(dir, filename)}`);
    }
    problems.push(...checkVersions(manifests));
    if (problems.length) {
      console.error(`release check: ${problems.length} problem(s)\n${problems.map((p) => `- ${p}`).join("\n")}`);
      process.exitCode = 1;
    } else {
      console.error(`release check: ${packed.length} packages at ${manifests[0]!.version} carry what they need`);
    }
  } finally {
    if (!keep) fs.rmSync(dir, { recursive: true, force: true });
  }
}

main();
