/**
 * The dashboard's job page in a real headless Chromium: a job's result once it succeeded (and
 * "none returned" when its handler returned nothing), and its parents and children in a flow as
 * links with their states. The flow is made with SQL, as a graph's enqueue would write it.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import type { FastifyInstance } from "fastify";
import type { Browser, Page } from "playwright-core";
import { createServer } from "../packages/cli/src/server/app.js";
import * as store from "../packages/leasehold/src/store/index.js";
import { freshLeasehold } from "./helpers/db.js";
import { CHROMIUM_HINT, findChromium, launchChromium } from "./helpers/browser.js";
import { TOKEN } from "./helpers/server.js";

const skip = findChromium() ? false : `no Chromium found; ${CHROMIUM_HINT}`;

let lh: Awaited<ReturnType<typeof freshLeasehold>>;
let app: FastifyInstance;
let browser: Browser;
let page: Page;
let base: string;

before(async () => {
  if (skip) return;
  lh = await freshLeasehold();
  app = createServer({ leasehold: lh, token: TOKEN, dashboard: "on" });
  await app.listen({ host: "127.0.0.1", port: 0 });
  base = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
  browser = await launchChromium();
  page = await (await browser.newContext({ viewport: { width: 1280, height: 860 } })).newPage();
  await page.goto(`${base}/#token=${encodeURIComponent(TOKEN)}`);
  await page.waitForSelector("h2 >> text=Queues");
});

after(async () => {
  if (skip) return;
  await browser?.close();
  await app?.close();
  await lh?.dispose();
});

/** Ends the one waiting job of `task` as a success, with `resultJson` if given. */
async function succeed(task: string, resultJson?: string): Promise<string> {
  const [job] = await store.claimJobs(lh.pool, { queues: ["default"], limit: 1, workerId: "w", leaseMs: 60_000, tasks: [task] });
  await store.completeJobs(lh.pool, { workerId: "w", jobs: [{ id: job!.id, attempt: job!.attempt, ...(resultJson && { resultJson }) }] });
  return job!.id;
}

test("a succeeded job's page shows its result, or that it returned none", { skip }, async () => {
  await lh.enqueueMany([{ task: "answer" }, { task: "silent" }]);
  const answered = await succeed("answer", '{"answer":42,"words":["forty","two"]}');
  const silent = await succeed("silent");
  await page.goto(`${base}/#/jobs/${answered}`);
  await page.waitForSelector("h1 >> text=succeeded");
  assert.deepEqual(JSON.parse(await page.locator("[data-field=result]").innerText()), { answer: 42, words: ["forty", "two"] });
  await page.goto(`${base}/#/jobs/${silent}`);
  await page.waitForSelector(`h1 >> text=Job ${silent}`);
  assert.equal(await page.locator("[data-field=result]").innerText(), "None returned.");
});

test("a job's parents and children are links with their states", { skip }, async () => {
  const { id: parent } = await lh.enqueue("extract");
  const { id: child } = await lh.enqueue("load");
  await lh.pool.query("UPDATE jobs SET has_dependents = true WHERE id = $1", [parent]);
  await lh.pool.query("UPDATE jobs SET state = 'blocked', parents_pending = 1, on_parent_failure = 'cancel' WHERE id = $1", [child]);
  await lh.pool.query("INSERT INTO job_dependencies (child_id, parent_id, ref) VALUES ($1, $2, 'extract')", [child, parent]);

  await page.goto(`${base}/#/jobs/${child}`);
  await page.waitForSelector('[data-table="parents"]');
  const row = page.locator('[data-table="parents"] tbody tr');
  assert.deepEqual(await row.locator("td").allInnerTexts(), [parent, "extract", "extract", "waiting"]);
  assert.equal(await page.locator('[data-table="children"]').count(), 0, "a job without children shows no children");

  await succeed("extract", '"rows"');
  await row.locator(`a[href="#/jobs/${parent}"]`).click();
  await page.waitForSelector(`h1 >> text=Job ${parent}`);
  await page.waitForSelector('[data-table="children"]');
  // The parent's end released its child (migration 014's trigger).
  assert.deepEqual(await page.locator('[data-table="children"] tbody tr td').allInnerTexts(), [child, "extract", "load", "waiting"]);
  assert.equal(await page.locator("[data-field=result]").innerText(), '"rows"');
});
