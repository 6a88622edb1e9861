/**
 * The autoscaling signal (docs/deployment.md#autoscaling): the queue_depth view's numbers for
 * known jobs on the real database and its clock, the watchdog's gauges from it, the same rows
 * through lh.queueDepth(), the CLI and the HTTP API, and the KEDA example in the docs: its
 * ScaledObject parsed as KEDA reads it, and its query run against the view.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import type { FastifyInstance } from "fastify";
import type pg from "pg";
import { parseAllDocuments } from "yaml";
import { createServer } from "../packages/cli/src/server/app.js";
import * as store from "../packages/leasehold/src/store/index.js";
import { runCli } from "./helpers/cli.js";
import { eventually, freshLeasehold, rawClient } from "./helpers/db.js";
import { api as apiAt, TOKEN } from "./helpers/server.js";

const DEPLOYMENT_MD = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "docs", "deployment.md");

let lh: Awaited<ReturnType<typeof freshLeasehold>>;
let db: pg.Client;
let app: FastifyInstance;
let base: string;
/** The oldest ready job's run time, as stored (the database's clock, two minutes back). */
let oldestRunAt: Date;
/** A delayed job due a few seconds after setup. */
let soonId: string;
const SOON_MS = 3_000;

/** The view's row of one queue, as the database returns it (bigint counts as strings). */
async function depthRow(queue: string) {
  const { rows } = await db.query("SELECT * FROM queue_depth WHERE queue = $1", [queue]);
  return rows[0];
}

/** Until the "soon" job is due: the tests after the first count it as ready, whichever ran before. */
async function soonDue(): Promise<void> {
  await eventually(
    async () => (await db.query("SELECT run_at <= now() AS due FROM jobs WHERE id = $1", [soonId])).rows[0].due,
    "the soon job to be due",
    SOON_MS + 10_000,
  );
}

/** The database's time `ms` from now, as enqueue's runAt takes it. */
async function dbTime(ms: number): Promise<Date> {
  const { rows } = await db.query<{ at: Date }>("SELECT now() + $1 * interval '1 millisecond' AS at", [ms]);
  return rows[0]!.at;
}

/**
 * Known jobs, by queue:
 *   emails:  3 ready (the oldest due 2 minutes ago), 2 delayed (one due in SOON_MS), 2 running
 *   default: a flow: its parent ready, its child blocked
 *   reports: 2 ready, paused
 *   other:   4 ready
 *   idle:    settings only (a concurrency limit of 5), no jobs
 *   capped:  6 ready, 1 running, a concurrency limit of 2
 *   metered: 3 ready, a start rate limit
 */
before(async () => {
  lh = await freshLeasehold();
  db = await rawClient(lh.schema);
  app = createServer({ leasehold: lh, token: TOKEN });
  await app.listen({ host: "127.0.0.1", port: 0 });
  base = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;

  // Claimed first (priority -5): they become the running ones and never count as ready.
  await lh.enqueueMany([0, 1].map(() => ({ task: "send", queue: "emails", priority: -5 })));
  const claimed = await store.claimJobs(lh.pool, { queues: ["emails"], limit: 2, workerId: "depth-test", leaseMs: 600_000, tasks: ["send"] });
  assert.equal(claimed.length, 2);

  oldestRunAt = await dbTime(-120_000);
  await lh.enqueue("send", {}, { queue: "emails", runAt: oldestRunAt });
  await lh.enqueue("send", {}, { queue: "emails", runAt: await dbTime(-30_000) });
  await lh.enqueue("send", {}, { queue: "emails" });
  await lh.enqueue("send", {}, { queue: "emails", delayMs: 3_600_000 });

  await lh.enqueueFlow([
    { ref: "fetch", task: "fetch", queue: "default" },
    { ref: "parse", task: "parse", queue: "default", dependsOn: ["fetch"] },
  ]);
  await lh.enqueueMany([0, 1].map(() => ({ task: "report", queue: "reports" })));
  await lh.pauseQueue("reports");
  await lh.enqueueMany([0, 1, 2, 3].map(() => ({ task: "misc", queue: "other" })));
  await lh.setQueueLimits("idle", { concurrency: 5 }, { create: true });
  await lh.enqueueMany([0, 1, 2, 3, 4, 5, 6].map(() => ({ task: "render", queue: "capped" })));
  assert.equal(
    (await store.claimJobs(lh.pool, { queues: ["capped"], limit: 1, workerId: "depth-test", leaseMs: 600_000, tasks: ["render"] })).length,
    1,
  );
  await lh.setQueueLimits("capped", { concurrency: 2 });
  await lh.enqueueMany([0, 1, 2].map(() => ({ task: "ping", queue: "metered" })));
  await lh.setQueueLimits("metered", { rate: { limit: 10, windowMs: 1_000 } });
  // Last, and due well after setup ends, however slow the machine.
  soonId = (await lh.enqueue("send", {}, { queue: "emails", runAt: await dbTime(SOON_MS) })).id;
});

after(async () => {
  await app.close();
  await db.end();
  await lh.dispose();
});

test("queue_depth counts ready, delayed, running and blocked jobs per queue, flags paused queues, lists configured ones; a delayed job becomes ready when due", async () => {
  const { rows: pending } = await db.query("SELECT run_at > now() AS pending FROM jobs WHERE id = $1", [soonId]);
  assert.equal(pending[0].pending, true, `setup took over ${SOON_MS} ms: the "soon" job is already due`);
  const { rows } = await db.query(
    "SELECT queue, paused, ready, running, delayed, blocked, concurrency_limit, limited FROM queue_depth ORDER BY queue",
  );
  const row = (
    queue: string,
    paused: boolean,
    ready: number,
    running: number,
    delayed: number,
    blocked: number,
    limit: number | null,
    limited: boolean,
  ) => ({
    queue,
    paused,
    ready: String(ready),
    running: String(running),
    delayed: String(delayed),
    blocked: String(blocked),
    concurrency_limit: limit,
    limited,
  });
  assert.deepEqual(rows, [
    row("capped", false, 6, 1, 0, 0, 2, false),
    row("default", false, 1, 0, 0, 1, null, false),
    row("emails", false, 3, 2, 2, 0, null, false),
    row("idle", false, 0, 0, 0, 0, 5, false),
    row("metered", false, 3, 0, 0, 0, null, true),
    row("other", false, 4, 0, 0, 0, null, false),
    row("reports", true, 2, 0, 0, 0, null, false),
  ]);

  // The oldest ready job's age is the database's now() less its run_at, to the microsecond
  // (one statement: one now()); 0 where nothing is ready.
  const age = await db.query(
    "SELECT d.oldest_ready_age_seconds AS age, extract(epoch FROM now() - $1::timestamptz)::float8 AS expected FROM queue_depth AS d WHERE d.queue = 'emails'",
    [oldestRunAt],
  );
  assert.ok(age.rows[0].expected >= 120, age.rows[0].expected);
  assert.equal(age.rows[0].age, age.rows[0].expected);
  assert.equal((await depthRow("idle")).oldest_ready_age_seconds, 0);
  assert.equal(typeof (await depthRow("idle")).oldest_ready_age_seconds, "number");

  // The job due a moment after setup moves from delayed to ready by the database's clock.
  await eventually(async () => (await depthRow("emails")).ready === "4", "the delayed job to count as ready once due", SOON_MS + 10_000);
  assert.equal((await depthRow("emails")).delayed, "1");
  const { rows: due } = await db.query("SELECT run_at <= now() AS due FROM jobs WHERE id = $1", [soonId]);
  assert.equal(due[0].due, true);

  // A filter on the queue gives the same row as the whole view.
  const all = await db.query("SELECT * FROM queue_depth WHERE queue = 'other'");
  assert.deepEqual({ ...all.rows[0], oldest_ready_age_seconds: undefined }, { ...(await depthRow("other")), oldest_ready_age_seconds: undefined });

  // Additive: a view, and only that.
  const { rows: kind } = await db.query("SELECT c.relkind FROM pg_class AS c WHERE c.oid = 'queue_depth'::regclass");
  assert.equal(kind[0].relkind, "v");
});

test("lh.queueDepth() returns the view's rows, typed", async () => {
  await soonDue();
  const depth = await lh.queueDepth();
  assert.deepEqual(
    depth.map((d) => d.queue),
    ["capped", "default", "emails", "idle", "metered", "other", "reports"],
  );
  const emails = depth.find((d) => d.queue === "emails")!;
  assert.equal(emails.ready, 4);
  assert.equal(emails.running, 2);
  assert.equal(emails.delayed, 1);
  assert.equal(emails.blocked, 0);
  assert.equal(emails.paused, false);
  assert.ok(emails.oldestReadyAgeSeconds >= 120 && emails.oldestReadyAgeSeconds < 3600, String(emails.oldestReadyAgeSeconds));
  assert.deepEqual(
    depth.find((d) => d.queue === "reports"),
    {
      queue: "reports",
      paused: true,
      ready: 2,
      oldestReadyAgeSeconds: depth.find((d) => d.queue === "reports")!.oldestReadyAgeSeconds,
      running: 0,
      delayed: 0,
      blocked: 0,
      concurrencyLimit: null,
      limited: false,
      suspended: 0,
    },
  );
  assert.ok(depth.find((d) => d.queue === "reports")!.oldestReadyAgeSeconds > 0);
  const capped = depth.find((d) => d.queue === "capped")!;
  assert.deepEqual([capped.ready, capped.running, capped.concurrencyLimit, capped.limited], [6, 1, 2, false]);
  const metered = depth.find((d) => d.queue === "metered")!;
  assert.deepEqual([metered.ready, metered.concurrencyLimit, metered.limited], [3, null, true]);
});

test("the watchdog sets the depth gauges from the view: ready, running, delayed, blocked, the oldest age, paused", async () => {
  await soonDue();
  await lh.watchdog().runOnce();
  const registry = lh.metrics.registry;
  const values = async (name: string) => (await registry.getSingleMetric(name)!.get()).values;
  const jobs = await values("leasehold_jobs");
  const count = (queue: string, state: string) => jobs.find((v) => v.labels.queue === queue && v.labels.state === state)?.value;
  assert.equal(count("emails", "waiting"), 4);
  assert.equal(count("emails", "scheduled"), 1);
  assert.equal(count("emails", "running"), 2);
  assert.equal(count("default", "waiting"), 1);
  assert.equal(count("default", "blocked"), 1, "a blocked job is counted as blocked, not as waiting");
  assert.equal(count("reports", "waiting"), 2);
  assert.equal(count("idle", "waiting"), undefined, "no series for a state without jobs");

  const [view] = (await db.query("SELECT oldest_ready_age_seconds FROM queue_depth WHERE queue = 'emails'")).rows;
  const oldest = (await values("leasehold_queue_oldest_ready_age_seconds")).find((v) => v.labels.queue === "emails")!.value;
  assert.ok(oldest >= 120 && oldest <= view.oldest_ready_age_seconds, `gauge ${oldest}, view now ${view.oldest_ready_age_seconds}`);
  assert.equal((await values("leasehold_queue_oldest_ready_age_seconds")).find((v) => v.labels.queue === "idle")!.value, 0);

  const paused = await values("leasehold_queue_paused");
  assert.equal(paused.find((v) => v.labels.queue === "reports")!.value, 1);
  assert.equal(paused.find((v) => v.labels.queue === "emails")!.value, 0);
  assert.equal((await values("leasehold_queues_paused"))[0]!.value, 1);
  assert.equal((await values("leasehold_active_leases"))[0]!.value, 3);
});

test("`leasehold queues depth` prints the rows, as a table and as JSON, on the database and through a server", async () => {
  await soonDue();
  const onDb = await runCli(["queues", "depth", "--json"], { schema: lh.schema });
  assert.equal(onDb.code, 0, onDb.stderr);
  const rows = JSON.parse(onDb.stdout) as { queue: string; ready: number; paused: boolean; blocked: number }[];
  assert.deepEqual(
    rows.map((r) => [r.queue, r.ready, r.paused, r.blocked]),
    [
      ["capped", 6, false, 0],
      ["default", 1, false, 1],
      ["emails", 4, false, 0],
      ["idle", 0, false, 0],
      ["metered", 3, false, 0],
      ["other", 4, false, 0],
      ["reports", 2, true, 0],
    ],
  );

  const table = await runCli(["queues", "depth"], { schema: lh.schema });
  assert.equal(table.code, 0, table.stderr);
  assert.match(table.stdout, /^QUEUE\s+PAUSED\s+READY\s+OLDEST READY\s+RUNNING\s+DELAYED\s+BLOCKED\s+LIMIT\s+LIMITED\s+SUSPENDED$/m);
  assert.match(table.stdout, /^emails\s+no\s+4\s+\d+\.\ds\s+2\s+1\s+0\s+-\s+no\s+0$/m);
  assert.match(table.stdout, /^reports\s+yes\s+2\s+\d+\.\ds\s+0\s+0\s+0\s+-\s+no\s+0$/m);
  assert.match(table.stdout, /^idle\s+no\s+0\s+-\s+0\s+0\s+0\s+5\s+no\s+0$/m);
  assert.match(table.stdout, /^capped\s+no\s+6\s+\d+\.\ds\s+1\s+0\s+0\s+2\s+no\s+0$/m);
  assert.match(table.stdout, /^metered\s+no\s+3\s+\d+\.\ds\s+0\s+0\s+0\s+-\s+yes\s+0$/m);

  const remote = await runCli(["queues", "depth", "--json", "--server", base, "--token", TOKEN], { schema: "no_such_schema" });
  assert.equal(remote.code, 0, remote.stderr);
  assert.deepEqual(
    (JSON.parse(remote.stdout) as typeof rows).map((r) => [r.queue, r.ready, r.paused, r.blocked]),
    rows.map((r) => [r.queue, r.ready, r.paused, r.blocked]),
  );
});

test("GET /v1/queues/depth answers lh.queueDepth()'s rows; it needs the operator token", async () => {
  await soonDue();
  const res = await apiAt(base, "GET", "/v1/queues/depth");
  assert.equal(res.status, 200, res.text);
  const expected = await lh.queueDepth();
  assert.deepEqual(
    res.json.queues.map((q: Record<string, unknown>) => ({ ...q, oldestReadyAgeSeconds: 0 })),
    expected.map((q) => ({ ...q, oldestReadyAgeSeconds: 0 })),
  );
  assert.ok(res.json.queues.find((q: { queue: string }) => q.queue === "emails").oldestReadyAgeSeconds >= 120);
  assert.equal((await apiAt(base, "GET", "/v1/queues/depth", undefined, {})).status, 401);
});

/** The fenced blocks of a language inside the `## Autoscaling` section of docs/deployment.md. */
function autoscalingBlocks(lang: string): string[] {
  const md = fs.readFileSync(DEPLOYMENT_MD, "utf8");
  const start = md.indexOf("\n## Autoscaling\n");
  assert.ok(start >= 0, "docs/deployment.md has an ## Autoscaling section");
  const next = md.indexOf("\n## ", start + 1);
  const section = md.slice(start, next < 0 ? undefined : next);
  return [...section.matchAll(new RegExp("```" + lang + "\\n([\\s\\S]*?)```", "g"))].map((m) => m[1]!);
}

test("the docs' column table names the view's columns, in order", async () => {
  const md = fs.readFileSync(DEPLOYMENT_MD, "utf8");
  const section = md.slice(md.indexOf("\n## Autoscaling\n"));
  const table = section.slice(section.indexOf("| column |"));
  const documented = [...table.slice(0, table.indexOf("\n\n")).matchAll(/^\| `(\w+)` \|/gm)].map((m) => m[1]);
  const { rows } = await db.query(
    "SELECT column_name FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'queue_depth' ORDER BY ordinal_position",
    [lh.schema],
  );
  assert.deepEqual(
    documented,
    rows.map((r) => r.column_name),
  );
});

test("the KEDA ScaledObject in docs/deployment.md is what KEDA's postgresql scaler reads, and its query returns the ready and running jobs of its queues", async () => {
  const docs = autoscalingBlocks("yaml").flatMap((block) => parseAllDocuments(block).map((d) => d.toJS()));
  const scaled = docs.find((d) => d?.kind === "ScaledObject" && d.spec?.triggers?.[0]?.type === "postgresql");
  assert.ok(scaled, "a ScaledObject with a postgresql trigger");
  assert.equal(scaled.apiVersion, "keda.sh/v1alpha1");
  // A Deployment is KEDA's default target: a name, and no other kind.
  assert.equal(typeof scaled.spec.scaleTargetRef.name, "string");
  assert.ok(scaled.spec.scaleTargetRef.name.length > 0);
  assert.ok([undefined, "Deployment"].includes(scaled.spec.scaleTargetRef.kind));
  assert.ok(Number.isInteger(scaled.spec.minReplicaCount) && Number.isInteger(scaled.spec.maxReplicaCount));
  assert.ok(scaled.spec.minReplicaCount <= scaled.spec.maxReplicaCount);

  const trigger = scaled.spec.triggers[0];
  // Trigger metadata is a map of strings in KEDA's CRD: a bare YAML number would be refused.
  for (const [key, value] of Object.entries(trigger.metadata)) assert.equal(typeof value, "string", `metadata.${key} is a string`);
  assert.match(trigger.metadata.targetQueryValue, /^\d+(\.\d+)?$/);
  assert.ok(Number(trigger.metadata.targetQueryValue) > 0);
  assert.match(trigger.metadata.activationTargetQueryValue, /^\d+(\.\d+)?$/);
  // The connection: a TriggerAuthentication in the same example giving the `connection` parameter.
  const auth = docs.find((d) => d?.kind === "TriggerAuthentication" && d.metadata?.name === trigger.authenticationRef?.name);
  assert.ok(auth, "the TriggerAuthentication the trigger names");
  assert.equal(auth.apiVersion, "keda.sh/v1alpha1");
  assert.ok(auth.spec.secretTargetRef.some((r: { parameter: string }) => r.parameter === "connection"));

  await soonDue();
  // The query, on this test's schema, as a role that may only read the view (as KEDA's would).
  const query: string = trigger.metadata.query;
  assert.equal(query.split("leasehold.queue_depth").length, 2, "the query reads leasehold.queue_depth once");
  const ours = query.replace("leasehold.queue_depth", `${lh.schema}.queue_depth`);
  const role = `keda_${randomBytes(4).toString("hex")}`;
  await db.query(`CREATE ROLE ${role} NOLOGIN`);
  try {
    await db.query(`GRANT USAGE ON SCHEMA ${lh.schema} TO ${role}; GRANT SELECT ON ${lh.schema}.queue_depth TO ${role}`);
    const asKeda = async () => {
      await db.query(`SET ROLE ${role}`);
      try {
        return await db.query({ text: ours, rowMode: "array" });
      } finally {
        await db.query("RESET ROLE");
      }
    };
    const result = await asKeda();
    assert.equal(result.rows.length, 1, "one row");
    assert.equal(result.fields.length, 1, "one column");
    assert.equal(result.fields[0]!.dataTypeID, 20, "an integer (bigint), as KEDA's scaler wants");
    // default: 1 ready (the flow's parent; its child is blocked); emails: 4 ready + 2 running;
    // reports is paused and other is not served: both left out.
    assert.equal(Number(result.rows[0][0]), 7);
    assert.ok(Number(result.rows[0][0]) > Number(trigger.metadata.activationTargetQueryValue), "active: scaled up from zero");

    // A queue at a concurrency limit counts as at most its limit: capped has 6 ready and 1
    // running, and may run 2 at once.
    const withCapped = ours.replace("IN ('default', 'emails')", "IN ('default', 'emails', 'capped')");
    assert.notEqual(withCapped, ours, "the query names its queues as IN ('default', 'emails')");
    await db.query(`SET ROLE ${role}`);
    try {
      assert.equal(Number((await db.query({ text: withCapped, rowMode: "array" })).rows[0][0]), 7 + 2);
    } finally {
      await db.query("RESET ROLE");
    }

    // A job in a served queue counts; one in a paused queue does not.
    await lh.enqueue("send", {}, { queue: "emails" });
    await lh.enqueue("report", {}, { queue: "reports" });
    assert.equal(Number((await asKeda()).rows[0][0]), 8);
    // A served queue paused: its jobs wait however many workers run, so they are left out.
    await lh.pauseQueue("emails");
    assert.equal(Number((await asKeda()).rows[0][0]), 1);
    await lh.resumeQueue("emails");
    // Nothing to do: the sum is 0, not null.
    await db.query("DELETE FROM jobs WHERE queue IN ('default', 'emails')");
    assert.equal(Number((await asKeda()).rows[0][0]), 0);
  } finally {
    await db.query(`DROP OWNED BY ${role}`);
    await db.query(`DROP ROLE ${role}`);
  }
});

test("the docs' Prometheus variant reads gauges the watchdog exports", async () => {
  const docs = autoscalingBlocks("yaml").flatMap((block) => parseAllDocuments(block).map((d) => d.toJS()));
  const prom = docs.flatMap((d) => d?.spec?.triggers ?? d?.triggers ?? []).find((t: { type?: string }) => t?.type === "prometheus");
  assert.ok(prom, "a prometheus trigger");
  for (const [key, value] of Object.entries(prom.metadata)) assert.equal(typeof value, "string", `metadata.${key} is a string`);
  await lh.watchdog().runOnce();
  const exported = await lh.metrics.registry.metrics();
  const names = [...new Set(String(prom.metadata.query).match(/leasehold_\w+/g))];
  assert.ok(names.length > 0);
  for (const name of names) assert.match(exported, new RegExp(`^${name}\\{`, "m"), `${name} is exported with labels`);
});
