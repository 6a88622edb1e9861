/**
 * The dashboard's details, in a real headless Chromium against a server and a worker on the
 * test database: how attempts are counted in the jobs list and on a job's page; a confirmation
 * that a navigation closes; a finished job's progress; a cancel's messages and last error; stack
 * traces kept in lines; the status dot while nothing has loaded; the icon, served without a token;
 * stopped and silent processes; times with their date and zone.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import type { FastifyInstance } from "fastify";
import type { Browser, Page } from "playwright-core";
import { createServer } from "../packages/cli/src/server/app.js";
import type { Worker } from "../packages/leasehold/src/worker/worker.js";
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
      queues: ["default", "counted", "details"],
      concurrency: 4,
      leaseMs: 3_000,
      heartbeatMs: 200,
      pollIntervalMs: 100,
      backoff: NO_BACKOFF,
      watchdog: { intervalMs: 200, backoff: NO_BACKOFF },
      scheduler: false,
      handlers: {
        quick: () => undefined,
        // Reports 88 % and then finishes.
        almost: (_p: unknown, ctx) => {
          ctx.progress(0.88);
        },
        // Runs until it is cancelled.
        endless: async (_p: unknown, ctx) => {
          ctx.progress(0.3);
          await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
          ctx.signal.throwIfAborted();
        },
        deep: () => {
          throw new Error("disk full");
        },
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

test("a confirmation closes when the page changes: it answered for the job it was about", { skip }, async () => {
  const { id } = await lh.enqueue("deep", {}, { maxAttempts: 1, queue: "details" });
  const { id: other } = await lh.enqueue("quick", {}, { queue: "details" });
  await eventually(async () => (await state(id)) === "dead" && (await state(other)) === "succeeded", "one dead, one succeeded");
  await page.goto(`${base}/#/jobs/${id}`);
  await page.waitForSelector("h1 >> text=dead");
  await page.click('[data-action="retry"]');
  await page.waitForSelector("dialog[open]");
  await page.evaluate((to) => ((globalThis as unknown as { location: { hash: string } }).location.hash = to), `#/jobs/${other}`);
  await page.waitForSelector("h1 >> text=succeeded");
  assert.equal(await page.locator("dialog").count(), 0, "no dialog left open over the other job");
  assert.equal(await state(id), "dead", "and nothing was retried");
});

test("a succeeded job shows complete, not its last reported 88 %; a running one its bar", { skip }, async () => {
  const { id } = await lh.enqueue("almost", {}, { queue: "details" });
  await eventually(async () => (await state(id)) === "succeeded", "the job succeeds");
  await page.goto(`${base}/#/jobs/${id}`);
  await page.waitForSelector("h1 >> text=succeeded");
  const progress = page.locator("[data-field=progress]");
  assert.equal(await progress.locator("progress").getAttribute("value"), "1000");
  assert.match(await progress.innerText(), /100%/);
  assert.match(await progress.innerText(), /Complete\./);
  assert.doesNotMatch(await progress.locator(".pct").innerText(), /88/);
});

test("cancel: the message follows the job until it has stopped, and its last error is one clean line", { skip }, async () => {
  const { id } = await lh.enqueue("endless", {}, { queue: "details" });
  await eventually(async () => (await state(id)) === "running", "the job runs");
  await page.goto(`${base}/#/jobs/${id}`);
  await page.waitForSelector("h1 >> text=running");
  assert.equal(await page.locator("[data-field=progress] progress").getAttribute("value"), "300");
  await page.click('[data-action="cancel"]');
  await page.click('dialog [data-confirm="yes"]');
  await page.waitForSelector("h1 >> text=cancelled", { timeout: 15_000 });
  await page.waitForSelector(`.flash >> text=Job ${id} stopped: it is cancelled now.`);
  assert.doesNotMatch(await page.locator(".flash").innerText(), /next heartbeat/);
  const lastError = await page.locator("[data-field=last-error]").innerText();
  assert.equal(lastError, `job ${id} attempt 1 aborted: the job was cancelled`);
  assert.equal(await page.locator("[data-field=progress] progress").count(), 0, "no bar for a job that stopped");
});

test("a stack trace keeps its lines, in monospace, in the attempts table and as the last error", { skip }, async () => {
  const { id } = await lh.enqueue("deep", {}, { maxAttempts: 1, queue: "details" });
  await eventually(async () => (await state(id)) === "dead", "the job is dead");
  await page.goto(`${base}/#/jobs/${id}`);
  await page.waitForSelector("h1 >> text=dead");
  for (const error of [page.locator('[data-table="attempts"] .error-text'), page.locator("[data-field=last-error]")]) {
    assert.match(await error.innerText(), /^Error: disk full\n\s+at /);
    const style = await error.evaluate((el) => {
      const s = (globalThis as unknown as { getComputedStyle(e: unknown): { whiteSpace: string; fontFamily: string } }).getComputedStyle(el);
      return { whiteSpace: s.whiteSpace, fontFamily: s.fontFamily };
    });
    assert.equal(style.whiteSpace, "pre-wrap");
    assert.match(style.fontFamily, /mono/i);
  }
});

test("the status dot is not green while nothing could be loaded", { skip }, async () => {
  const p = await browser.newPage();
  await p.route("**/v1/overview*", (route) => route.abort());
  await p.goto(`${base}/#token=${encodeURIComponent(TOKEN)}`);
  await p.waitForSelector(".freshness >> text=not loaded");
  assert.equal(await p.locator("#status .dot").getAttribute("class"), "dot stale");
  await p.unroute("**/v1/overview*");
  await p.waitForSelector(".freshness >> text=live", { timeout: 10_000 });
  assert.equal(await p.locator("#status .dot").getAttribute("class"), "dot live");
  await p.close();
});

test("the icon is served without a token, and the page asks for nothing it is refused", { skip }, async () => {
  for (const path of ["/favicon.ico", "/assets/favicon.svg"]) {
    const r = await fetch(`${base}${path}`);
    assert.equal(r.status, 200, path);
    assert.equal(r.headers.get("content-type"), "image/svg+xml");
    assert.match(await r.text(), /^<svg /);
  }
  const p = await browser.newPage();
  const refused: string[] = [];
  p.on("response", (r) => {
    if (r.status() >= 400) refused.push(`${r.status()} ${r.url()}`);
  });
  await p.goto(`${base}/#token=${encodeURIComponent(TOKEN)}`);
  await p.waitForSelector('[data-table="processes"]');
  assert.equal(await p.locator('link[rel="icon"]').getAttribute("href"), "assets/favicon.svg");
  assert.deepEqual(refused, []);
  await p.close();
});

test("a stopped watchdog leaves the list; one gone silent is marked, then dropped", { skip }, async () => {
  const watchdog = lh.watchdog({ intervalMs: 200 }).start();
  await page.goto(`${base}/#/`);
  const row = () => page.locator(`[data-table="processes"] tr:has-text("${watchdog.id}")`);
  await eventually(async () => (await row().count()) === 1, "the watchdog is listed", 10_000);
  await watchdog.stop();
  await eventually(async () => (await row().count()) === 0, "the stopped watchdog is gone from the list", 10_000);

  // Two watchdogs that were killed (no goodbye): one silent for a minute, one for an hour.
  await lh.pool.query(
    `INSERT INTO workers (id, kind, host, pid, queues, started_at, last_seen_at)
     VALUES ('watchdog/silent', 'watchdog', 'h', 1, '{}', now() - interval '2 minutes', now() - interval '1 minute'),
            ('watchdog/long-gone', 'watchdog', 'h', 2, '{}', now() - interval '2 hours', now() - interval '50 minutes')`,
  );
  await page.waitForSelector('[data-table="processes"] tr:has-text("watchdog/silent") >> text=/silent: last beat/');
  assert.equal(await page.locator('[data-table="processes"] tr:has-text("watchdog/long-gone")').count(), 0);
});

test("times show their date and zone", { skip }, async () => {
  const { id } = await lh.enqueue("quick", {}, { queue: "details" });
  await eventually(async () => (await state(id)) === "succeeded", "the job succeeds");
  await page.goto(`${base}/#/jobs/${id}`);
  await page.waitForSelector("h1 >> text=succeeded");
  const created = await page.locator('dt:text-is("created") + dd').innerText();
  assert.match(created, /^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} (UTC|GMT[+-]?\d*|[A-Z]{2,5})$/);
  const listed = await page
    .goto(`${base}/#/jobs?queue=details`)
    .then(() => page.locator('[data-table="jobs"] tbody tr td:nth-child(7)').first().innerText());
  assert.match(listed, /^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} \S+$/);
});
