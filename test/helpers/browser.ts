/**
 * A real headless Chromium for the dashboard's tests, through playwright-core (which brings no
 * browser of its own): LEASEHOLD_CHROMIUM, else /usr/bin/chromium, else `chromium` (or
 * `chromium-browser`) on PATH. npm test's harness uses findChromium() too, to skip the browser
 * tests in one line where there is none.
 */
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { chromium, type Browser, type Page } from "playwright-core";

export { findChromium, CHROMIUM_HINT } from "../harness/chromium.js";
import { findChromium } from "../harness/chromium.js";

export async function launchChromium(): Promise<Browser> {
  const executablePath = findChromium();
  if (!executablePath) throw new Error("no Chromium found");
  // Chromium's sandbox refuses to start as root (CI containers): only then go without it.
  const args = process.getuid?.() === 0 ? ["--no-sandbox"] : [];
  return chromium.launch({ executablePath, args, headless: true });
}

const IMAGES = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "docs", "images");

/** With LEASEHOLD_SCREENSHOTS=1, saves the page as docs/images/dashboard-<name>.png (the pictures in docs/dashboard.md). */
export async function screenshot(page: Page, name: string): Promise<void> {
  if (process.env.LEASEHOLD_SCREENSHOTS !== "1") return;
  fs.mkdirSync(IMAGES, { recursive: true });
  await page.screenshot({ path: path.join(IMAGES, `dashboard-${name}.png`), fullPage: false });
}
