/**
 * Where the dashboard's browser tests find Chromium: LEASEHOLD_CHROMIUM, else /usr/bin/chromium,
 * else `chromium` or `chromium-browser` on PATH. Shared by the test harness (which skips the
 * browser tests in one line without it) and the tests themselves.
 */
import fs from "node:fs";
import path from "node:path";

export const CHROMIUM_HINT = "install it with `apt-get install chromium` (or set LEASEHOLD_CHROMIUM to a Chromium binary)";

export function findChromium(): string | undefined {
  const explicit = process.env.LEASEHOLD_CHROMIUM;
  if (explicit) return executable(explicit) ? explicit : undefined;
  if (executable("/usr/bin/chromium")) return "/usr/bin/chromium";
  for (const dir of (process.env.PATH ?? "").split(path.delimiter)) {
    for (const name of ["chromium", "chromium-browser"]) {
      const file = path.join(dir, name);
      if (dir && executable(file)) return file;
    }
  }
  return undefined;
}

function executable(file: string): boolean {
  try {
    fs.accessSync(file, fs.constants.X_OK);
    return fs.statSync(file).isFile();
  } catch {
    return false;
  }
}
