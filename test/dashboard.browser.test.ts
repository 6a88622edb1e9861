/**
 * The dashboard in a real headless Chromium (Debian's `chromium` through playwright-core),
 * against a server and workers on the test database: sign-in, a progress bar that moves, a
 * job's attempt history after a reaped lease, retry of a dead job (one, and all matching a
 * filter, after a confirmation that says how many), pausing, resuming and limiting a queue,
 * switching its records of succeeded jobs off and on (and a job not kept, on its page),
 * a handler's hold of a queue shown with the job that set it and cleared,
 * hostile payloads shown as text, calls without the token, read-only mode, and a phone's width. With LEASEHOLD_SCREENSHOTS=1 it
 * also takes the pictures in docs/dashboard.md.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import type { FastifyInstance } from "fastify";
import type { Browser, BrowserContext, Page } from "playwright-core";
import { ThroughputSampler } from "../packages/leasehold/src/maintenance/throughput.js";
import { createServer } from "../packages/cli/src/server/app.js";
import type { DashboardMode } from "../packages/cli/src/server/dashboard.js";
import type { Worker } from "../packages/leasehold/src/worker/worker.js";
import { RateLimitedError } from "../packages/leasehold/src/worker/context.js";
import { eventually, freshLeasehold, NO_BACKOFF, silent } from "./helpers/db.js";
import { CHROMIUM_HINT, findChromium, launchChromium, screenshot } from "./helpers/browser.js";
import { TOKEN } from "./helpers/server.js";

/** What the tests read in the page (the tests are compiled without the DOM's types). */
interface InPage {
  __pwned?: number;
  sessionStorage: { getItem(key: string): string | null };
  document: { cookie: string; documentElement: { scrollWidth: number } };
}

const skip = findChromium() ? false : `no Chromium found; ${CHROMIUM_HINT}`;

let lh: Awaited<ReturnType<typeof freshLeasehold>>;
let browser: Browser;
let context: BrowserContext;
let page: Page;
let base: string;
let worker: Worker;
let zombie: Worker;
let sampler: ThroughputSampler;
const servers: FastifyInstance[] = [];
/** Set by a handler to let the long job end. */
let releaseCrunch = false;
const runs = new Map<string, number>();
const countRun = (key: string) => {
  const n = (runs.get(key) ?? 0) + 1;
  runs.set(key, n);
  return n;
};
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The token a read-only dashboard's audience is given: it may only read, and is shown no payloads. */
const VIEWER_TOKEN = "viewer-token-0123456789abcdef";

async function startServer(dashboard: DashboardMode): Promise<string> {
  const app = createServer({ leasehold: lh, token: TOKEN, viewerToken: VIEWER_TOKEN, dashboard, sampleIntervalMs: 1_000 });
  servers.push(app);
  await app.listen({ host: "127.0.0.1", port: 0 });
  const address = app.server.address() as { port: number };
  return `http://127.0.0.1:${address.port}`;
}

async function state(id: string): Promise<string> {
  return (await lh.getJob(id)).job.state;
}

before(async () => {
  if (skip) return;
  lh = await freshLeasehold();
  sampler = new ThroughputSampler(lh.pool, silent, { intervalMs: 1_000 }).start();
  base = await startServer("on");
  worker = await lh
    .worker({
      name: "web-1",
      queues: ["default", "reports", "mail", "billing", "guarded", "readonly", "flow", "held"],
      concurrency: 8,
      leaseMs: 3_000,
      heartbeatMs: 200,
      pollIntervalMs: 100,
      backoff: NO_BACKOFF,
      watchdog: { intervalMs: 200, backoff: NO_BACKOFF },
      scheduler: false,
      handlers: {
        // Reports a fraction every 150 ms until the test lets it end.
        crunch: async (_p: unknown, ctx) => {
          for (let done = 1; done <= 200 && !releaseCrunch && !ctx.signal.aborted; done++) {
            ctx.progress({ done, of: 200 });
            await sleep(150);
          }
        },
        // Fails its only attempt the first time it runs, succeeds after.
        fragile: (_p: unknown, ctx) => {
          if (countRun(ctx.jobId) === 1) throw new Error("disk full");
        },
        doomed: () => {
          throw new Error("always fails");
        },
        quick: () => {},
        // The first time: what it called said "429, retry in a day" (the docs' Retry-After example).
        throttled: (_p: unknown, ctx) => {
          if (countRun(ctx.jobId) === 1) throw new RateLimitedError(86_400_000, "queue");
        },
        hostile: () => {
          throw new Error('<img src=x onerror="window.__pwned=1"><script>window.__pwned=1</script>');
        },
      },
    })
    .start();
  // A worker with one slot whose first attempt hangs until its lease is taken from it: its
  // next heartbeat is refused (on record as a stale refusal), and then it runs the job again.
  zombie = await lh
    .worker({
      name: "zombie",
      queues: ["imports"],
      concurrency: 1,
      leaseMs: 3_000,
      heartbeatMs: 1_000,
      backoff: NO_BACKOFF,
      watchdog: false,
      scheduler: false,
      handlers: {
        reaped: async (_p: unknown, ctx) => {
          if (countRun(ctx.jobId) > 1) return;
          await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
        },
      },
    })
    .start();
  browser = await launchChromium();
  context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  page = await context.newPage();
});

after(async () => {
  if (skip) return;
  releaseCrunch = true;
  await browser?.close();
  await worker?.stop();
  await zombie?.stop();
  await sampler?.stop();
  for (const app of servers) await app.close();
  await lh?.dispose();
});

/** Fails the test if anything on the page opens a dialog or sets the flag a payload tries to set. */
function watchForScripts(p: Page): () => Promise<void> {
  const dialogs: string[] = [];
  p.on("dialog", (d) => {
    dialogs.push(d.message());
    void d.dismiss();
  });
  return async () => {
    assert.deepEqual(dialogs, [], "no alert/confirm/prompt opened");
    assert.equal(await p.evaluate(() => (globalThis as unknown as InPage).__pwned), undefined, "no injected script ran");
  };
}

test("the page loads with a strict policy, asks for the token and keeps it in the tab (no cookie)", { skip }, async () => {
  const response = await page.goto(`${base}/`);
  const headers = response!.headers();
  assert.match(headers["content-security-policy"]!, /script-src 'self'/);
  assert.match(headers["content-security-policy"]!, /frame-ancestors 'none'/);
  assert.doesNotMatch(headers["content-security-policy"]!, /unsafe-inline|unsafe-eval/);
  assert.equal(headers["x-content-type-options"], "nosniff");

  await lh.enqueue("crunch", { size: 200 }, { queue: "reports" });
  await page.fill('input[name="token"]', "not-the-token-0123456789");
  await page.click('form.sign-in button[type="submit"]');
  await page.waitForSelector("text=The server refused that token.");
  await page.fill('input[name="token"]', TOKEN);
  await page.click('form.sign-in button[type="submit"]');
  await page.waitForSelector('[data-table="queues"] >> text=reports');
  assert.equal(await page.evaluate(() => (globalThis as unknown as InPage).sessionStorage.getItem("leasehold.token")), TOKEN);
  assert.equal(await page.evaluate(() => (globalThis as unknown as InPage).document.cookie), "");
  assert.deepEqual(await context.cookies(), []);
  await page.waitForSelector('[data-table="processes"] >> text=web-1');
});

test("a running job's progress bar moves without a reload", { skip }, async () => {
  await page.goto(`${base}/#/running`);
  const bar = page.locator('[data-table="running"] progress').first();
  await bar.waitFor();
  const first = Number(await bar.getAttribute("value"));
  await eventually(async () => Number(await bar.getAttribute("value")) > first, "the progress bar moved", 15_000);
  const cells = await page.locator('[data-table="running"] tbody tr').first().innerText();
  assert.match(cells, /crunch/);
  assert.match(cells, /reports/);
  await screenshot(page, "running");
  // The overview while things happen: the sampler has had time for a few throughput points.
  await lh.enqueueMany(Array.from({ length: 30 }, () => ({ task: "fragile", queue: "mail" })));
});

test("a job's page shows its attempt history after a reaped lease, and the refusal shows in Recoveries", { skip }, async () => {
  const { id } = await lh.enqueue("reaped", { order: 42 }, { queue: "imports" });
  await eventually(async () => (await lh.getJob(id)).job.state === "running", "the job runs");
  // Its worker is wedged for longer than its lease: the lease runs out and a watchdog reaps it.
  await eventually(async () => {
    await lh.pool.query("UPDATE jobs SET lease_until = now() - interval '1 ms' WHERE id = $1 AND attempt = 1", [id]);
    return (await lh.getJob(id)).attempts.length > 0;
  }, "the lease is reaped");
  await eventually(async () => (await state(id)) === "succeeded", "the second attempt succeeds", 20_000);

  await page.goto(`${base}/#/jobs/${id}`);
  await page.waitForSelector('li[data-outcome="lease_expired"]');
  await page.waitForSelector('li[data-outcome="succeeded"]');
  const attempts = await page.locator('[data-table="attempts"] tbody tr').allInnerTexts();
  assert.equal(attempts.length, 2);
  assert.match(attempts[0]!, /lease expired/);
  assert.match(attempts[1]!, /succeeded/);
  assert.match(await page.locator("[data-field=payload]").innerText(), /"order": 42/);
  await screenshot(page, "job");

  // The wedged attempt's next heartbeat was refused: on record, with the reaping.
  await page.goto(`${base}/#/recoveries`);
  await page.waitForSelector(`[data-table="recoveries"] >> text=reaped (lease expired)`);
  await page.waitForSelector(`[data-table="recoveries"] >> text=stale refused`, { timeout: 15_000 });
  await screenshot(page, "recoveries");
});

test("retry on a dead job: after the confirmation it runs again", { skip }, async () => {
  const { id } = await lh.enqueue("fragile", { to: "ops@example.com" }, { maxAttempts: 1, queue: "billing" });
  await eventually(async () => (await state(id)) === "dead", "the job is dead");
  await page.goto(`${base}/#/jobs?state=dead`);
  await page.waitForSelector(`[data-table="jobs"] >> text=disk full`);
  await screenshot(page, "dead-letter");
  await page.click(`[data-table="jobs"] a[href="#/jobs/${id}"]`);
  await page.waitForSelector("h1 >> text=dead");
  // "Keep" changes nothing.
  await page.click('[data-action="retry"]');
  await page.click('dialog [data-confirm="no"]');
  await sleep(300);
  assert.equal(await state(id), "dead");
  await page.click('[data-action="retry"]');
  assert.match(await page.locator("dialog h2").innerText(), new RegExp(`Retry job ${id}\\?`));
  await page.click('dialog [data-confirm="yes"]');
  await eventually(async () => (await state(id)) === "succeeded", "the retried job runs and succeeds");
  await page.waitForSelector("h1 >> text=succeeded", { timeout: 10_000 });
  const outcomes = await page.locator("li[data-outcome]").evaluateAll((els) => els.map((e) => e.getAttribute("data-outcome")));
  assert.deepEqual(outcomes, ["failed", "succeeded"]);
});

test("bulk retry of a filter says how many before it acts", { skip }, async () => {
  const jobs = await lh.enqueueMany(Array.from({ length: 3 }, (_, i) => ({ task: "doomed", payload: { i }, maxAttempts: 1 })));
  await eventually(async () => (await Promise.all(jobs.map((j) => state(j.id)))).every((s) => s === "dead"), "three dead jobs");
  await page.goto(`${base}/#/jobs?state=dead&task=doomed`);
  await page.waitForSelector('[data-table="jobs"] >> text=always fails');
  await page.click('[data-action="bulk-retry"]');
  assert.equal(await page.locator("dialog h2").innerText(), "Retry 3 dead jobs?");
  await page.click('dialog [data-confirm="yes"]');
  await page.waitForSelector("text=3 job(s) retried.");
  const { rows } = await lh.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM all_attempts WHERE job_id = ANY($1::bigint[])", [
    jobs.map((j) => j.id),
  ]);
  await eventually(async () => (await Promise.all(jobs.map((j) => lh.getJob(j.id)))).every((j) => j.attempts.length === 2), "each ran again");
  assert.ok(rows[0]!.n >= 3);
});

test("a queue is paused, resumed and limited from the overview, each after a confirmation; the database holds it", { skip }, async () => {
  const settings = async () =>
    (await lh.pool.query("SELECT paused, concurrency, key_concurrency, rate_limit, rate_window_ms, key_weights FROM queues WHERE name = 'flow'"))
      .rows[0];
  // A job for later lists the queue on the overview; its page shows its key.
  const later = await lh.enqueue("quick", {}, { queue: "flow", delayMs: 3_600_000, key: "acme" });
  await page.goto(`${base}/#/jobs/${later.id}`);
  assert.equal(await page.locator("[data-field=key]").innerText(), "acme");
  await page.goto(`${base}/#/`);
  const pause = page.locator('[data-table="queues"] [data-action="pause-queue"][data-queue="flow"]');
  await pause.waitFor();
  // "Keep" changes nothing.
  await pause.click();
  await page.click('dialog [data-confirm="no"]');
  await sleep(300);
  assert.notEqual((await settings())?.paused, true);
  await pause.click();
  assert.equal(await page.locator("dialog h2").innerText(), "Pause queue “flow”?");
  await page.click('dialog [data-confirm="yes"]');
  await page.waitForSelector("text=Queue flow paused.");
  assert.equal((await settings()).paused, true);
  await page.waitForSelector('[data-table="queues"] [data-flow="paused"] >> text=paused');

  // Its jobs wait while it is paused, and run once it is resumed.
  const { id } = await lh.enqueue("quick", {}, { queue: "flow" });
  await page.waitForSelector('[data-alert="paused"] >> text=Queue “flow” is paused: 1 job(s) wait until it is resumed.');
  assert.equal(await state(id), "waiting");
  await page.click('[data-table="queues"] [data-action="resume-queue"][data-queue="flow"]');
  assert.equal(await page.locator("dialog h2").innerText(), "Resume queue “flow”?");
  await page.click('dialog [data-confirm="yes"]');
  await page.waitForSelector("text=Queue flow resumed.");
  assert.equal((await settings()).paused, false);
  await eventually(async () => (await state(id)) === "succeeded", "the job runs once its queue is resumed");

  // The limits form: what it sends is confirmed first; bad values are named and change nothing.
  const openForm = async () => {
    await page.click('[data-table="queues"] [data-action="edit-limits"][data-queue="flow"]');
    await page.waitForSelector('form[data-form="limits"]');
  };
  await openForm();
  await page.fill('form[data-form="limits"] input[name="concurrency"]', "many");
  await page.click('[data-action="save-limits"]');
  await page.waitForSelector('form[data-form="limits"] >> text=concurrency must be a whole number, or empty for no limit (got “many”)');
  await page.fill('form[data-form="limits"] input[name="concurrency"]', "2");
  await page.fill('form[data-form="limits"] input[name="rateLimit"]', "50");
  await page.fill('form[data-form="limits"] input[name="rateWindow"]', "1s");
  await page.fill('form[data-form="limits"] input[name="keyWeights"]', "acme=3");
  await screenshot(page, "queue-limits");
  await page.click('[data-action="save-limits"]');
  assert.equal(await page.locator("dialog h2").innerText(), "Change the limits of queue “flow”?");
  assert.match(await page.locator("dialog p").innerText(), /concurrency 2, rate 50\/1s, key weights acme=3/);
  await page.click('dialog [data-confirm="yes"]');
  await page.waitForSelector("text=Queue flow: concurrency 2 · rate 50/1s · weights acme=3.");
  assert.deepEqual(await settings(), {
    paused: false,
    concurrency: 2,
    key_concurrency: null,
    rate_limit: 50,
    rate_window_ms: 1_000,
    key_weights: { acme: 3 },
  });
  await page.waitForSelector('[data-table="queues"] [data-flow="active"] >> text=concurrency 2 · rate 50/1s · weights acme=3');

  // The server's check (here: a limit of 0) is shown, and nothing changes.
  await openForm();
  await page.fill('form[data-form="limits"] input[name="concurrency"]', "0");
  await page.click('[data-action="save-limits"]');
  await page.click('dialog [data-confirm="yes"]');
  await page.waitForSelector("text=concurrency must be an integer from 1 to 100000 (got 0)");
  assert.equal((await settings()).concurrency, 2);

  // Emptied fields remove their limits.
  await openForm();
  for (const field of ["concurrency", "rateLimit", "rateWindow", "keyWeights"])
    await page.fill(`form[data-form="limits"] input[name="${field}"]`, "");
  await page.click('[data-action="save-limits"]');
  assert.match(await page.locator("dialog p").innerText(), /no concurrency limit, no rate limit, no key weights limit/);
  await page.click('dialog [data-confirm="yes"]');
  await eventually(async () => (await settings()).concurrency === null, "the limits are removed");
  assert.deepEqual(await settings(), {
    paused: false,
    concurrency: null,
    key_concurrency: null,
    rate_limit: null,
    rate_window_ms: null,
    key_weights: null,
  });
});

test("a handler's hold of a queue shows on the overview with the job that set it, and is cleared after a confirmation", { skip }, async () => {
  await lh.setQueueLimits("held", { allowQueueHold: true }, { create: true });
  const { id } = await lh.enqueue("throttled", {}, { queue: "held" });
  await eventually(
    async () => (await lh.pool.query("SELECT held_by_job FROM queues WHERE name = 'held' AND held_until > now()")).rows[0]?.held_by_job === id,
    "the handler held its queue",
  );
  const next = await lh.enqueue("quick", {}, { queue: "held" });
  await page.goto(`${base}/#/`);
  const hold = page.locator('[data-table="queues"] [data-hold="queue"]');
  await hold.waitFor();
  assert.match(await hold.innerText(), new RegExp(`held until .+ by job ${id}$`));
  assert.equal(await hold.locator("a").getAttribute("href"), `#/jobs/${id}`);
  assert.equal(await state(next.id), "waiting", "nothing of the queue starts while it is held");

  await page.click('[data-table="queues"] [data-action="clear-hold"][data-queue="held"]');
  assert.equal(await page.locator("dialog h2").innerText(), "Clear the hold on queue “held”?");
  await page.click('dialog [data-confirm="yes"]');
  await page.waitForSelector("text=Queue held: hold cleared.");
  await eventually(
    async () => (await state(next.id)) === "succeeded" && (await state(id)) === "succeeded",
    "the queue's jobs run once its hold is cleared",
  );
  await page.waitForSelector('[data-table="queues"] [data-hold="queue"]', { state: "detached" });
});

test(
  "a queue's records of succeeded jobs are shown and switched from the overview after a confirmation; a job not kept says so on its page",
  { skip },
  async () => {
    const keeps = async () => (await lh.pool.query("SELECT keep_succeeded FROM queues WHERE name = 'mail'")).rows[0]?.keep_succeeded;
    await lh.enqueue("quick", {}, { queue: "mail", delayMs: 3_600_000 }); // lists the queue on the overview
    await page.goto(`${base}/#/`);
    const toggle = page.locator('[data-table="queues"] [data-action="queue-history"][data-queue="mail"]');
    await toggle.waitFor();
    assert.equal(await toggle.innerText(), "Keep no records");
    // "Keep" (the dialog's no) changes nothing.
    await toggle.click();
    await page.click('dialog [data-confirm="no"]');
    await sleep(300);
    assert.notEqual(await keeps(), false);
    await toggle.click();
    assert.equal(await page.locator("dialog h2").innerText(), "Keep no record of succeeded jobs in queue “mail”?");
    await page.click('dialog [data-confirm="yes"]');
    await page.waitForSelector("text=Queue mail keeps no record of succeeded jobs.");
    assert.equal(await keeps(), false);
    const row = page.locator('[data-table="queues"] tr', { has: page.locator('[data-queue="mail"]') });
    await row.locator('[data-records="not-kept"] >> text=no records').waitFor();

    // A job of the queue succeeds: its page says it finished and is not kept, not that the server failed.
    const { id } = await lh.enqueue("quick", {}, { queue: "mail" });
    await eventually(async () => (await lh.pool.query("SELECT 1 FROM jobs WHERE id = $1", [id])).rowCount === 0, "the job finished");
    await page.goto(`${base}/#/jobs/${id}`);
    await page.waitForSelector(`[data-job="not-kept"] >> text=job ${id} has finished and its record is not kept`);

    await page.goto(`${base}/#/`);
    // The overview is shared by viewers for a second: it may show the state before the switch at first.
    await page.waitForSelector('[data-table="queues"] [data-action="queue-history"][data-queue="mail"] >> text=Keep records');
    await toggle.click();
    await page.click('dialog [data-confirm="yes"]');
    await page.waitForSelector("text=Queue mail keeps records of succeeded jobs.");
    assert.equal(await keeps(), true);
    await row.locator('[data-records="kept"]').waitFor();
  },
);

test("payloads and errors holding HTML or script show as text and run nothing", { skip }, async () => {
  const p = await context.newPage();
  const check = watchForScripts(p);
  await p.goto(`${base}/#token=${encodeURIComponent(TOKEN)}`);
  const { id } = await lh.enqueue(
    "hostile",
    {
      html: "<script>window.__pwned=1</script>",
      img: '<img src=x onerror="window.__pwned=1;alert(1)">',
      link: "javascript:window.__pwned=1",
    },
    { maxAttempts: 1 },
  );
  await eventually(async () => (await state(id)) === "dead", "the hostile job is dead");
  await p.goto(`${base}/#/jobs/${id}`);
  await p.waitForSelector("[data-field=payload]");
  const payload = await p.locator("[data-field=payload]").innerText();
  assert.ok(payload.includes("<script>window.__pwned=1</script>"), payload);
  assert.ok(payload.includes('<img src=x onerror=\\"window.__pwned=1;alert(1)\\">'), payload);
  assert.ok((await p.locator("[data-field=last-error]").innerText()).includes('<img src=x onerror="window.__pwned=1">'));
  await p.goto(`${base}/#/jobs?state=dead`);
  await p.waitForSelector(`[data-table="jobs"] >> text=<img src=x`);
  assert.equal(await p.locator("#view img, #view script, #view iframe").count(), 0);
  await sleep(500);
  await check();
  await p.close();
});

test("a call without the token changes nothing", { skip }, async () => {
  const { id } = await lh.enqueue("doomed", null, { maxAttempts: 1, queue: "guarded" });
  await eventually(async () => (await state(id)) === "dead", "dead");
  // From the dashboard's own origin, as a forged request would be: no token, no change.
  const statuses = await page.evaluate(async (jobId) => {
    const calls = [
      fetch(`/v1/jobs/${jobId}/retry`, { method: "POST" }),
      fetch(`/v1/jobs/${jobId}/retry`, { method: "POST", credentials: "include" }),
      fetch("/v1/bulk/retry", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ state: "dead", confirmed: 100 }),
      }),
      fetch("/v1/overview"),
    ];
    return Promise.all(calls.map(async (c) => (await c).status));
  }, id);
  assert.deepEqual(statuses, [401, 401, 401, 401]);
  await sleep(300);
  assert.equal(await state(id), "dead");
});

test(
  "read-only mode with the viewer token: no buttons that change jobs, the server refuses them, and payloads and errors are hidden",
  { skip },
  async () => {
    const { id } = await lh.enqueue("doomed", { card: "4242-4242-secret" }, { maxAttempts: 1, queue: "readonly" });
    await eventually(async () => (await state(id)) === "dead", "dead");
    const readOnlyBase = await startServer("read-only");
    const p = await context.newPage();
    // The link `leasehold dev --dashboard read-only` prints: the viewer token in the fragment, which the browser never sends.
    await p.goto(`${readOnlyBase}/#token=${encodeURIComponent(VIEWER_TOKEN)}`);
    await p.waitForSelector(".badge.read-only");
    assert.equal(new URL(p.url()).hash, "#/", "the token left the address");
    await p.waitForSelector('[data-table="queues"]');
    assert.equal(await p.locator('[data-action="pause-queue"], [data-action="edit-limits"], [data-action="queue-history"]').count(), 0);
    await p.goto(`${readOnlyBase}/#/jobs/${id}`);
    await p.waitForSelector("h1 >> text=dead");
    assert.equal(await p.locator('[data-action="retry"]').count(), 0);
    assert.equal(await p.locator('[data-field="payload"]').textContent(), '"[hidden]"');
    assert.equal(await p.locator('[data-field="last-error"]').textContent(), "[hidden]");
    assert.ok(!(await p.content()).includes("4242-4242-secret"), "the page shows the payload");
    await p.goto(`${readOnlyBase}/#/jobs?state=dead`);
    await p.waitForSelector('[data-table="jobs"]');
    assert.equal(await p.locator('[data-action="bulk-retry"]').count(), 0);
    const answers = await p.evaluate(async (jobId) => {
      const auth = {
        authorization: `Bearer ${(globalThis as unknown as InPage).sessionStorage.getItem("leasehold.token")}`,
        "content-type": "application/json",
      };
      const one = await fetch(`/v1/jobs/${jobId}/retry`, { method: "POST", headers: auth, body: "{}" });
      const bulk = await fetch("/v1/bulk/retry", { method: "POST", headers: auth, body: JSON.stringify({ state: "dead", confirmed: 100 }) });
      const pause = await fetch("/v1/queues/readonly/pause", { method: "POST", headers: auth });
      const limits = await fetch("/v1/queues/readonly/limits", { method: "PATCH", headers: auth, body: JSON.stringify({ concurrency: 1 }) });
      return [one.status, ((await one.json()) as { error: { code: string } }).error.code, bulk.status, pause.status, limits.status];
    }, id);
    assert.deepEqual(answers, [403, "read_only", 403, 403, 403]);
    assert.equal((await lh.pool.query("SELECT 1 FROM queues WHERE name = 'readonly'")).rowCount, 0);
    assert.equal(await state(id), "dead");
    await p.close();
  },
);

test("usable at a phone's width: nothing wider than the screen, every view reachable", { skip }, async () => {
  await lh.schedule({ name: "nightly-report", cron: "0 3 * * *", task: "crunch", queue: "reports", timezone: "Europe/Paris" });
  const phone = await browser.newContext({ viewport: { width: 390, height: 844 }, deviceScaleFactor: 1, isMobile: true, hasTouch: true });
  const p = await phone.newPage();
  await p.goto(`${base}/#token=${encodeURIComponent(TOKEN)}`);
  await p.waitForSelector('[data-table="queues"]');
  for (const route of ["#/", "#/running", "#/jobs?state=dead", "#/recoveries", "#/schedules"]) {
    await p.goto(`${base}/${route}`);
    await p.waitForSelector(".freshness[data-fresh=yes]");
    const width = await p.evaluate(() => (globalThis as unknown as InPage).document.documentElement.scrollWidth);
    assert.ok(width <= 390, `${route} is ${width} px wide at 390 px`);
  }
  await p.waitForSelector('[data-table="schedules"] >> text=nightly-report');
  await screenshot(p, "schedules-phone");
  await p.goto(`${base}/#/`);
  await p.waitForSelector('[data-table="queues"]');
  await screenshot(p, "overview-phone");
  await phone.close();
  // A backlog no worker serves, some of it for later: the overview's counts and oldest wait.
  await lh.enqueueMany(Array.from({ length: 12 }, (_, i) => ({ task: "export", queue: "backlog", delayMs: i < 4 ? 600_000 : undefined })));
  await page.goto(`${base}/#/`);
  await page.waitForSelector('[data-table="queues"] >> text=backlog');
  await sleep(1_000);
  await screenshot(page, "overview");
});
