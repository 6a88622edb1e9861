import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

/** The repository root: the nearest folder upwards whose package.json is the workspace's (from source or from the compiled bench). */
function findRoot(): string {
  let dir = path.dirname(fileURLToPath(import.meta.url));
  for (;;) {
    const file = path.join(dir, "package.json");
    if (fs.existsSync(file) && (JSON.parse(fs.readFileSync(file, "utf8")) as { name?: string }).name === "leasehold-workspace") return dir;
    const up = path.dirname(dir);
    if (up === dir) throw new Error("cannot find Leasehold's package.json above the benchmark");
    dir = up;
  }
}

export const REPO_ROOT = findRoot();

/** The installed version of a package (or of Leasehold itself), read from its package.json. */
export function packageVersion(name?: string): string {
  const file = name ? path.join(REPO_ROOT, "node_modules", name, "package.json") : path.join(REPO_ROOT, "packages", "leasehold", "package.json");
  return (JSON.parse(fs.readFileSync(file, "utf8")) as { version: string }).version;
}
