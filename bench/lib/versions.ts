import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

export const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");

/** The installed version of a package (or of Leasehold itself), read from its package.json. */
export function packageVersion(name?: string): string {
  const file = name ? path.join(REPO_ROOT, "node_modules", name, "package.json") : path.join(REPO_ROOT, "package.json");
  return (JSON.parse(fs.readFileSync(file, "utf8")) as { version: string }).version;
}
