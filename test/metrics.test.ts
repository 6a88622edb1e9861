/**
 * The operational metrics and `leasehold doctor` report what really happened: real jobs on a
 * real worker, a watchdog reaping the lease of a worker process frozen for real (SIGSTOP), a
 * worker cut off from the database by a real proxy, and heartbeat delays from a worker whose
 * event loop was really blocked.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { Registry } from "prom-client";
import type pg from "pg";
import { Leasehold } from "../packages/leasehold/src/client.js";
import { Watchdog } from "../packages/leasehold/src/maintenance/watchdog.js";
import { metricsFor } from "../packages/leasehold/src/metrics.js";
import { databaseUrl, eventually, freshLeasehold, silent } from "./helpers/db.js";
import { runCli } from "./helpers/cli.js";
import { cliWorker } from "./helpers/processes.js";
import { TcpProxy } from "./helpers/proxy.js";

interface Readable {
  get(): Promise<{ values: { value: number; labels: Record<string, unknown>; metricName?: string }[] }>;
}

/** The sum of a metric's values with these labels (a histogram's: its observation count). */
async function valueOf(metric: Readable, labels: Record<string, string> = {}): Promise<number> {
  const { values } = await metric.get();
  return values
    .filter((v) => v.metricName === undefined || v.metricName.endsWith("_count"))
    .filter((v) => Object.entries(labels).every(([k, x]) => v.labels[k] === x))
    .reduce((n, v) => n + v.value, 0);
}

test("active and held leases follow the running jobs; heartbeats count each lease renewed or cancelled, and are timed", async (t) => {
  const lh = await freshLeasehold(t);
  const m = lh.metrics;
  const release: (() => void)[] = [];
  const worker = lh.worker({
    concurrency: 3,
    leaseMs: 30_000,
    watchdog: { intervalMs: 100 },
    handlers: { block: () => new Promise<void>((r) => release.push(r)) },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  assert.equal(await valueOf(m.heartbeatDuration), 0);
  const jobs = await lh.enqueueMany(Array.from({ length: 3 }, () => ({ task: "block" })));
  await eventually(async () => release.length === 3, "three handlers running");
  assert.ok((await valueOf(m.claimDuration)) >= 1, "claims are timed");
  await eventually(async () => (await valueOf(m.activeLeases)) === 3, "the watchdog counted three running jobs");
  assert.equal(await valueOf(m.leasesHeld), 3, "this process's worker holds three leases");

  // The first beat after the claims (the 30 s lease beats every 10 s: none came yet).
  const renewed = await valueOf(m.heartbeatLeases, { outcome: "renewed" });
  await worker.heartbeatNow();
  assert.ok((await valueOf(m.heartbeatLeases, { outcome: "renewed" })) - renewed >= 3, "one beat renewed three leases");
  assert.ok((await valueOf(m.heartbeatDuration)) >= 1, "the beat's round trip was timed");

  // A cancel reaches the worker with its next beat.
  assert.equal(await valueOf(m.heartbeatLeases, { outcome: "cancelled" }), 0);
  await lh.cancel(jobs[0]!.id);
  await worker.heartbeatNow();
  assert.ok((await valueOf(m.heartbeatLeases, { outcome: "cancelled" })) >= 1, "the beat found the cancel");

  for (const r of release) r();
  await eventually(async () => {
    const states = await Promise.all(jobs.map(async ({ id }) => (await lh.getJob(id)).job.state));
    return states.every((s) => s === "succeeded" || s === "cancelled");
  }, "the jobs ended");
  await eventually(async () => (await valueOf(m.activeLeases)) === 0, "active leases back to 0");
  assert.equal(await valueOf(m.leasesHeld), 0);
  assert.equal(await valueOf(m.heartbeatLeases, { outcome: "error" }), 0);
  assert.equal(await valueOf(m.heartbeatLeases, { outcome: "lost" }), 0);
});

test("a heartbeat that cannot reach the database counts each of its leases as an error", async (t) => {
  const { proxy, proxiedUrl } = TcpProxy.forUrl(databaseUrl());
  await proxy.start();
  t.after(() => proxy.stop());
  const admin = await freshLeasehold(t);
  const lh = await Leasehold.connect({
    databaseUrl: proxiedUrl(),
    schema: admin.schema,
    logger: silent,
    metricsRegistry: new Registry(),
    migrate: false,
  });
  t.after(() => lh.close());
  let release!: () => void;
  const worker = lh.worker({ watchdog: false, handlers: { t: () => new Promise<void>((r) => (release = r)) } });
  await worker.start();
  t.after(() => worker.stop(0));
  const { id } = await admin.enqueue("t");
  await eventually(async () => (await admin.getJob(id)).job.state === "running", "the job runs");
  assert.equal(await valueOf(lh.metrics.heartbeatLeases, { outcome: "error" }), 0);
  proxy.cut();
  await worker.heartbeatNow();
  assert.equal(await valueOf(lh.metrics.heartbeatLeases, { outcome: "error" }), 1, "the one lease the failed beat carried");
  proxy.restore();
  release();
  await eventually(async () => (await admin.getJob(id)).job.state === "succeeded", "the job finished once the database was back");
});

test("a frozen worker's lease runs out: the watchdog counts the expiry and the recovery; the worker, woken, counts the lease lost", async (t) => {
  const lh = await freshLeasehold(t);
  const m = lh.metrics;
  const frozen = await cliWorker(t, lh.schema, "export default { hold: () => new Promise(() => {}) };\n", ["--lease", "1000", "--metrics-port", "0"]);
  const scrape = async () => (await fetch(frozen.metricsUrl!)).text();
  const { id } = await lh.enqueue("hold", {}, { maxAttempts: 1 });
  await eventually(async () => frozen.started(id), "the job started in the worker process");
  frozen.child.kill("SIGSTOP"); // alive (its session and liveness lock stay), but silent
  const watchdog = lh.watchdog({ intervalMs: 100 }).start();
  t.after(() => watchdog.stop());
  await eventually(async () => (await lh.getJob(id)).job.state === "dead", "the watchdog reaped the lease", 10_000);
  assert.deepEqual(
    (await lh.getJob(id)).attempts.map((a) => a.outcome),
    ["lease_expired"],
  );
  assert.equal(await valueOf(m.leaseExpirations, { result: "dead" }), 1, "the expiry counted, by what became of the job");
  assert.equal(await valueOf(m.leaseExpirations), 1, "and counted once");
  assert.equal(await valueOf(m.recoveries, { cause: "lease_expired" }), 1, "the recovery counted by its cause");
  assert.equal(await valueOf(m.recoveryDelay, { cause: "lease_expired" }), 1, "its delay since the last beat observed");
  frozen.child.kill("SIGCONT");
  await eventually(
    async () => /^leasehold_heartbeat_leases_total\{outcome="lost"\} 1$/m.test(await scrape()),
    "the woken worker's beat found its lease lost",
  );
  assert.match(await scrape(), /^leasehold_fencing_rejections_total\{kind="heartbeat",reason="finished"\} 1$/m);
});

test("leasehold doctor recommends a lease from the beat delays real workers sent: a worker whose event loop was blocked", async (t) => {
  const lh = await freshLeasehold(t);
  const worker = lh.worker({
    leaseMs: 3_000,
    heartbeatMs: 200,
    watchdog: false,
    handlers: {
      // Blocks the event loop (a long synchronous parse, a GC pause): the beat due meanwhile waits.
      block: () => {
        const until = performance.now() + 1_500;
        while (performance.now() < until) Math.sqrt(Math.random());
      },
    },
  });
  await worker.start();
  t.after(() => worker.stop(0));
  const { id } = await lh.enqueue("block");
  await eventually(async () => (await lh.getJob(id)).job.state === "succeeded", "the job ran");
  // The late beat's delay is recorded when it returns and sent with the beats after it.
  for (let i = 0; i < 3; i++) await worker.heartbeatNow();
  const r = await runCli(["doctor", "--json"], { schema: lh.schema });
  const d = JSON.parse(r.stdout) as {
    findings: { level: string; message: string }[];
    lease: { beats: number; p99DelayMs: number; workers: { id: string; recommendedMs: number }[] };
  };
  // Three beats carry a delay for certain: the late one's and the first two of ours (the third's
  // rides on a later beat). A beat due meanwhile adds one when the machine is slow, not otherwise.
  assert.ok(d.lease.beats >= 3 && d.lease.beats < 100, `${d.lease.beats} beats recorded`);
  // Fewer than 100 beats: the 99th percentile is the worst, 1.3 to 1.5 s late (bucket 1-2.5 s).
  assert.equal(d.lease.p99DelayMs, 2_500);
  // max(3 x 200 ms, 200 ms + 2.5 s + 2.5 s), in whole seconds: more than its 3 s lease.
  assert.deepEqual(d.lease.workers, [{ id: worker.id, queues: ["default"], leaseMs: 3_000, heartbeatMs: 200, recommendedMs: 6_000 }]);
  assert.ok(
    d.findings.some(
      (f) => f.level === "warn" && f.message.includes(`worker ${worker.id} (queues default) has a 3000 ms lease, shorter than the 6000 ms`),
    ),
    JSON.stringify(d.findings),
  );
});

test("a fleet's watchdogs read the queue-depth gauges in turns: about once per interval for the whole fleet, and each process's gauges are kept", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.enqueueMany(Array.from({ length: 20 }, () => ({ task: "t", delayMs: 3_600_000 })));
  // Each watchdog on its own counting view of the pool: the statements that read the depth view.
  const reads: number[] = [];
  const watchdogs = Array.from({ length: 3 }, (_, i) => {
    reads.push(0);
    const db = {
      query: (text: string, values?: unknown[]) => {
        if (/FROM queue_depth/.test(text)) reads[i]!++;
        return lh.pool.query(text, values);
      },
    } as unknown as pg.Pool;
    return new Watchdog(db, metricsFor(new Registry()), silent, { intervalMs: 100, livenessIntervalMs: 100 });
  });
  for (const w of watchdogs) w.start();
  // Each counts the fleet (3) at its first reap; from then on the turns are shared.
  await eventually(async () => reads.every((n) => n >= 2), "every watchdog read the gauges at least twice");
  const before = reads.reduce((a, b) => a + b, 0);
  const started = performance.now();
  await new Promise((r) => setTimeout(r, 2_000));
  const elapsed = performance.now() - started;
  for (const w of watchdogs) await w.stop();
  const fleetReads = reads.reduce((a, b) => a + b, 0) - before;
  const intervals = elapsed / 100;
  // One read per interval for the fleet (each watchdog alone would make 3x as many); late ticks
  // on a loaded machine only lower the count.
  assert.ok(fleetReads <= intervals * 1.5 + 3, `the fleet read the view ${fleetReads} times in ${intervals.toFixed(0)} intervals`);
  assert.ok(
    reads.every((n) => n >= 3),
    `each watchdog keeps its own gauges fresh: ${reads.join(", ")}`,
  );
});

test("jobs ended are counted exactly, added to the counter once per label set per turn rather than once per job", async (t) => {
  const lh = await freshLeasehold(t);
  // Every increment the worker makes, by label set: prom-client hashes the labels at each one.
  let increments = 0;
  const labels = lh.metrics.jobsEnded.labels.bind(lh.metrics.jobsEnded);
  lh.metrics.jobsEnded.labels = (l) => {
    const child = labels(l);
    return { inc: (n?: number) => (increments++, child.inc(n)) };
  };
  const worker = lh.worker({ watchdog: false, concurrency: 50, handlers: { noop: () => undefined, broken: () => Promise.reject(new Error("no")) } });
  const ok = await lh.enqueueMany(Array.from({ length: 150 }, () => ({ task: "noop", payload: {} })));
  const bad = await lh.enqueueMany(Array.from({ length: 50 }, () => ({ task: "broken", payload: {}, maxAttempts: 1 })));
  let ended = 0;
  worker.on("job:end", () => ended++);
  await worker.start();
  t.after(() => worker.stop(0));
  await eventually(async () => ended === ok.length + bad.length, "every job ended");
  await new Promise((r) => setImmediate(r));
  const values = (await lh.metrics.jobsEnded.get()).values;
  assert.equal(values.find((v) => v.labels.outcome === "succeeded")?.value, ok.length);
  assert.equal(values.find((v) => v.labels.outcome === "dead")?.value, bad.length);
  assert.ok(increments < (ok.length + bad.length) / 4, `${increments} increments for ${ok.length + bad.length} ends`);
});
