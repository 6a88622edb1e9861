/**
 * Re-running a dead durable job from a step on the dashboard's job page, in a real headless
 * Chromium against a server and a worker on the test database: the form asks first, the job
 * runs again from that step (the step before it does not), and the page lists the re-run.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import type { FastifyInstance } from "fastify";
import type { Browser, Page } from "playwright-core";
import { createServer } from "../packages/cli/src/server/app.js";
import type { Worker } from "../packages/leasehold/src/worker/worker.js";
import type { JobContext } from "../packages/leasehold/src/worker/context.js";
import { eventually, freshLeasehold, NO_BACKOFF } from "./helpers/db.js";
import { CHROMIUM_HINT, findChromium, launchChromium } from "./helpers/browser.js";
import { TOKEN } from "./helpers/server.js";

const skip = findChromium() ? false : `no Chromium found; ${CHROMIUM_HINT}`;

let lh: Awaited<ReturnType<typeof freshLeasehold>>;
let app: FastifyInstance;
let browser: Browser;
let page: Page;
let base: string;
let worker: Worker;
const runs: string[] = [];
let loadFails = true;

before(async () => {
  if (skip) return;
  lh = await freshLeasehold();
  app = createServer({ leasehold: lh, token: TOKEN, dashboard: "on" });
  await app.listen({ host: "127.0.0.1", port: 0 });
  base = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
  worker = await lh
    .worker({
      backoff: NO_BACKOFF,
      scheduler: false,
      handlers: {
        pipeline: async (_: unknown, ctx: JobContext) => {
          await ctx.step("extract", () => void runs.push("extract"));
          await ctx.step("transform", () => void runs.push("transform"));
          return ctx.step("load", () => {
            runs.push("load");
            if (loadFails) throw new Error("warehouse down");
            return "loaded";
          });
        },
      },
    })
    .start();
  browser = await launchChromium();
  page = await (await browser.newContext({ viewport: { width: 1280, height: 860 } })).newPage();
  await page.goto(`${base}/#token=${encodeURIComponent(TOKEN)}`);
});

after(async () => {
  if (skip) return;
  await browser?.close();
  await worker?.stop();
  await app?.close();
  await lh?.dispose();
});

test("a dead job re-runs from the step named in its page's form, after a confirmation, and the page lists the re-run", { skip }, async () => {
  const { id } = await lh.enqueue("pipeline", {}, { maxAttempts: 1 });
  await eventually(async () => (await lh.getJob(id)).job.state === "dead" || undefined, "the job is dead");
  assert.deepEqual(runs, ["extract", "transform", "load"]);
  loadFails = false;
  await page.goto(`${base}/#/jobs/${id}`);
  await page.waitForSelector("h1 >> text=dead");
  await page.fill('form.rerun input[name="from-step"]', "transform");
  await page.click('[data-action="rerun"]');
  assert.match(await page.locator("dialog h2").innerText(), new RegExp(`Re-run job ${id} from step "transform"\\?`));
  await page.click('dialog [data-confirm="yes"]');
  await eventually(async () => (await lh.getJob(id)).job.state === "succeeded" || undefined, "the re-run succeeds");
  assert.deepEqual(runs, ["extract", "transform", "load", "transform", "load"], "extract did not run again");
  await page.waitForSelector("h1 >> text=succeeded", { timeout: 10_000 });
  const row = await page.locator('[data-table="reruns"] tbody tr').innerText();
  assert.match(row, /transform \(place 1\)\s+dead\s+operator token \(HTTP\)\s+transform, load/);
});
