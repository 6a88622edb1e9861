/**
 * The dashboard's details, in a real headless Chromium against a server and a worker on the
 * test database: how attempts are counted in the jobs list and on a job's page.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import type { FastifyInstance } from "fastify";
import type { Browser, Page } from "playwright-core";
import { createServer } from "../src/server/app.js";
import type { Worker } from "../src/worker/worker.js";
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

before(async () => {
  if (skip) return;
  lh = await freshLeasehold();
  app = createServer({ leasehold: lh, token: TOKEN, dashboard: "on", sampleIntervalMs: 1_000 });
  await app.listen({ host: "127.0.0.1", port: 0 });
  base = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
  worker = await lh
    .worker({
      name: "details-1",
      queues: ["default", "counted"],
      concurrency: 4,
      leaseMs: 3_000,
      heartbeatMs: 200,
      pollIntervalMs: 100,
      backoff: NO_BACKOFF,
      watchdog: { intervalMs: 200, backoff: NO_BACKOFF },
      scheduler: false,
      handlers: {
        quick: () => undefined,
      },
    })
    .start();
  browser = await launchChromium();
  page = await (await browser.newContext({ viewport: { width: 1280, height: 860 } })).newPage();
  await page.goto(`${base}/#token=${encodeURIComponent(TOKEN)}`);
  await page.waitForSelector('[data-table="processes"]');
});

after(async () => {
  if (skip) return;
  await browser?.close();
  await worker?.stop();
  await app?.close();
  await lh?.dispose();
});

const state = async (id: string) => (await lh.getJob(id)).job.state;

test("a job that succeeded first time counts one attempt made and none of its budget spent, in the list and on its page", { skip }, async () => {
  const { id } = await lh.enqueue("quick", {}, { queue: "counted" });
  await eventually(async () => (await state(id)) === "succeeded", "the job succeeds");
  await page.goto(`${base}/#/jobs?queue=counted`);
  await page.waitForSelector(`[data-table="jobs"] a[href="#/jobs/${id}"]`);
  const headers = await page.locator('[data-table="jobs"] thead th').allInnerTexts();
  const cells = await page.locator(`[data-table="jobs"] tbody tr:has(a[href="#/jobs/${id}"]) td`).allInnerTexts();
  const column = (name: string) => cells[headers.indexOf(name)];
  assert.equal(column("Attempts made"), "1");
  assert.equal(column("Budget spent"), "0 / 25");
  await page.goto(`${base}/#/jobs/${id}`);
  await page.waitForSelector("h1 >> text=succeeded");
  assert.equal(await page.locator('dt:text-is("attempts made") + dd').innerText(), "1");
  assert.equal(await page.locator('dt:text-is("budget spent") + dd').innerText(), "0 of 25");
});
