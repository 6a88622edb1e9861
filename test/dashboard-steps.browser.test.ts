/**
 * A durable job in the dashboard, in a real headless Chromium against a server and a worker on
 * the test database: its page shows what it waits for and its steps (name, kind, state, attempt,
 * duration, result size, error), a suspended job can be cancelled there, and the overview and
 * the jobs list count and filter suspended jobs.
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

before(async () => {
  if (skip) return;
  lh = await freshLeasehold();
  app = createServer({ leasehold: lh, token: TOKEN, dashboard: "on", sampleIntervalMs: 1_000 });
  await app.listen({ host: "127.0.0.1", port: 0 });
  base = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
  let failed = false;
  worker = await lh
    .worker({
      name: "steps-1",
      backoff: NO_BACKOFF,
      watchdog: false,
      scheduler: false,
      handlers: {
        order: async (p: { order: string }, ctx: JobContext) => {
          await ctx.step("price", () => ({ total: 42 }));
          await ctx.step("reserve", () => {
            if (!failed) {
              failed = true;
              throw new Error("stock service down");
            }
            return "reserved";
          });
          return ctx.waitForEvent("approval", { event: "order.approved", match: { order: p.order }, timeout: "2h" });
        },
        doomed: async (_: unknown, ctx: JobContext) => ctx.step("charge", () => Promise.reject(new Error("card declined"))),
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

/** The rows of a table on the page, as their cells' texts by column header. */
async function rows(table: string): Promise<Record<string, string>[]> {
  const headers = await page.locator(`[data-table="${table}"] thead th`).allInnerTexts();
  const out: Record<string, string>[] = [];
  for (const row of await page.locator(`[data-table="${table}"] tbody tr`).all()) {
    const cells = await row.locator("td").allInnerTexts();
    out.push(Object.fromEntries(headers.map((h, i) => [h, cells[i]!.trim()])));
  }
  return out;
}

test("a suspended job's page shows its wait and its steps; the overview counts it and the list filters it; cancel ends it", { skip }, async () => {
  const { id } = await lh.enqueue("order", { order: "o1" });
  await eventually(async () => (await state(id)) === "suspended", "the order waits for its approval");
  const until = (await lh.getJob(id)).wait!.until!;

  await page.goto(`${base}/#/jobs/${id}`);
  await page.waitForSelector("h1 >> text=suspended");
  const wait = await page.locator('dt:text-is("suspended") + dd').innerText();
  assert.match(wait, /^waiting at step “approval” for event “order.approved” matching \{"order":"o1"\}, until /);
  assert.match(wait, new RegExp(String(until.getUTCFullYear())));
  const steps = await rows("steps");
  assert.deepEqual(
    steps.map((s) => [s["#"], s.Name, s.Kind, s.State, s.Attempt, s.Result, s.Error]),
    [
      ["0", "price", "step", "succeeded", "1", "13 B", ""],
      ["1", "reserve", "step", "succeeded", "2", "10 B", ""],
      ["2", "approval", "event", "waiting", "2", "–", ""],
    ],
  );
  assert.match(steps[0]!.Took!, /\d/);
  assert.match(steps[2]!["Wake at / event"]!, /order\.approved$/);

  await page.goto(`${base}/#/`);
  await page.waitForSelector('.cards a[href="#/jobs?state=suspended"]');
  // The overview may first draw what it read before this job suspended: its next refresh counts it.
  const card = page.locator('.cards a[href="#/jobs?state=suspended"]');
  await eventually(async () => /^1\s+suspended/.test(await card.innerText()), "the overview counts the suspended job");
  await page.click('.cards a[href="#/jobs?state=suspended"]');
  await page.waitForSelector(`[data-table="jobs"] a[href="#/jobs/${id}"]`);
  assert.equal(await page.locator('[data-table="jobs"] tbody tr').count(), 1);

  await page.goto(`${base}/#/jobs/${id}`);
  await page.waitForSelector("h1 >> text=suspended");
  await page.click('[data-action="cancel"]');
  await page.click('dialog [data-confirm="yes"]');
  await page.waitForSelector("h1 >> text=cancelled", { timeout: 15_000 });
  assert.equal(await state(id), "cancelled");
});

test("a failed step shows its error; a job without steps shows no steps section", { skip }, async () => {
  const { id } = await lh.enqueue("doomed", {}, { maxAttempts: 1 });
  await eventually(async () => (await state(id)) === "dead", "the job is dead");
  await page.goto(`${base}/#/jobs/${id}`);
  await page.waitForSelector("h1 >> text=dead");
  const [charge] = await rows("steps");
  assert.deepEqual([charge!.Name, charge!.State, charge!.Result, charge!.Error], ["charge", "failed", "–", "Error: card declined"]);
  assert.equal(await page.locator('dt:text-is("suspended")').count(), 0);

  const { id: plain } = await lh.enqueue("missing-task", {}, { runAt: new Date(Date.now() + 3600_000) });
  await page.goto(`${base}/#/jobs/${plain}`);
  await page.waitForSelector("h1 >> text=waiting");
  assert.equal(await page.locator('[data-table="steps"]').count(), 0);
  assert.equal(await page.locator('h2:text-is("Steps")').count(), 0);
});
