/**
 * The chaos orchestrator: starts its own PostgreSQL (so it may restart it), the worker and
 * watchdog processes (each worker behind its own TCP proxy), the producer and the fault
 * schedule; waits for the queue to drain; then checks the invariants and writes the report.
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import type { ConsumerInfo } from "@nats-io/jetstream";
import pg from "pg";
import pino from "pino";
import { Leasehold } from "../packages/leasehold/src/index.js";
import { guardClients } from "../packages/leasehold/src/store/index.js";
import { EmbeddedPostgres } from "../packages/cli/src/embedded/postgres.js";
import { NatsServer } from "../test/harness/nats-server.js";
import { CHAOS_SCHEMA, seededRandom, type ChaosOptions, type FaultKind } from "./config.js";
import { DOWNSTREAM_SQL } from "./downstream.js";
import { INJECTORS, TIMED_FAULTS, faultPlan, faultsPerRound, type FaultContext, type FaultRecord } from "./faults.js";
import { checkInvariants } from "./invariants.js";
import { LIMITED_QUEUES } from "./flow-queues.js";
import { readLogs } from "./process-log.js";
import { Producer } from "./producer.js";
import { EventSender } from "./event-sender.js";
import { TcpProxy } from "./proxy.js";
import { recordOff } from "./record-off.js";
import { buildReport, toMarkdown, writeReport, type ChaosReport } from "./report.js";
import { REPO_ROOT, Supervised, type UnexpectedExit } from "./supervisor.js";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export interface ChaosResult {
  report: ChaosReport;
  markdown: string;
  files: { json: string; markdown: string; logs: string };
}

export async function runChaos(options: ChaosOptions): Promise<ChaosResult> {
  const startedAt = Date.now();
  const stamp = new Date(startedAt).toISOString().replace(/[:.]/g, "-");
  const logDir = path.resolve(options.outDir, `logs-${stamp}`);
  fs.mkdirSync(logDir, { recursive: true });
  const say = (line: string) => {
    fs.appendFileSync(path.join(logDir, "harness.log"), `${new Date().toISOString()} ${line}\n`);
    if (options.verbose) console.log(`# chaos ${((Date.now() - startedAt) / 1000).toFixed(1)}s ${line}`);
  };
  const random = seededRandom(options.seed);
  const dataRoot = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-chaos-"));
  fs.chmodSync(dataRoot, 0o755);
  const server = new EmbeddedPostgres({
    dataDir: path.join(dataRoot, "pgdata"),
    settings: { max_connections: 200 },
    onLog: (l) => fs.appendFileSync(path.join(logDir, "postgres.log"), l),
  });
  let shuttingDown = false;
  const exits: UnexpectedExit[] = [];
  const children: Supervised[] = [];
  const proxies = new Map<string, TcpProxy>();
  const natsProxies = new Map<string, TcpProxy>();
  let nats: NatsServer | undefined;
  let lh: Leasehold | undefined;
  let admin: pg.Pool | undefined;
  let events: EventSender | undefined;
  // Ctrl-C: leave no worker, watchdog or PostgreSQL behind.
  const interrupted = (signal: NodeJS.Signals) => {
    shuttingDown = true;
    for (const c of children) c.child?.kill("SIGKILL");
    void server.stop().finally(() => {
      fs.rmSync(dataRoot, { recursive: true, force: true });
      process.exit(signal === "SIGINT" ? 130 : 143);
    });
  };
  process.once("SIGINT", interrupted).once("SIGTERM", interrupted);
  try {
    const url = await server.start();
    const pgPort = Number(new URL(url).port);
    say(`PostgreSQL at ${server.redactedUrl}, data in ${dataRoot}`);
    if (options.dispatch === "nats") {
      nats = await NatsServer.start();
      say(`nats-server at ${nats.url}, store in ${nats.storeDir}`);
    }
    // The producer publishes to NATS directly (it is not the one partitioned).
    lh = await Leasehold.connect({
      databaseUrl: url,
      schema: CHAOS_SCHEMA,
      logger: pino({ level: "silent" }),
      poolSize: 4,
      ...(nats && { nats: nats.url }),
    });
    admin = guardClients(
      new pg.Pool({ connectionString: url, application_name: "chaos-harness", options: `-c search_path=${CHAOS_SCHEMA}`, max: 4 }),
    );
    await admin.query(DOWNSTREAM_SQL);
    // The limits hold from the first job on; the workers read them when they start.
    for (const q of LIMITED_QUEUES) await lh.setQueueLimits(q.name, q.limits, { create: true });
    if (options.record === "off") {
      await recordOff(lh, admin);
      say("the run's queues keep no record of succeeded jobs; the checker reads its own ledger");
    }

    const onExit = (e: UnexpectedExit) => {
      exits.push(e);
      say(`${e.name} exited by itself (code ${e.code}, signal ${e.signal})${e.duringStartup ? " during start-up" : ""}`);
    };
    const common = { CHAOS_SCHEMA, CHAOS_LOG_LEVEL: process.env.CHAOS_LOG_LEVEL ?? "error" };
    const workers: Supervised[] = [];
    for (let i = 1; i <= options.workers; i++) {
      const name = `w${i}`;
      const proxy = new TcpProxy(pgPort);
      const port = await proxy.start();
      proxies.set(name, proxy);
      const viaProxy = new URL(url);
      viaProxy.port = String(port);
      let natsUrl: string | undefined;
      if (nats) {
        const natsProxy = new TcpProxy(nats.port);
        natsUrl = `nats://127.0.0.1:${await natsProxy.start()}`;
        natsProxies.set(name, natsProxy);
      }
      workers.push(
        new Supervised(
          {
            name,
            kind: "worker",
            script: path.join(REPO_ROOT, "chaos", "worker-process.ts"),
            stderrFile: path.join(logDir, `${name}.stderr`),
            env: {
              ...common,
              CHAOS_DATABASE_URL: viaProxy.toString(),
              CHAOS_NAME: name,
              // A restarted worker appends to the same file; every line names its worker id.
              CHAOS_LOG: path.join(logDir, `${name}.jsonl`),
              CHAOS_LEASE_MS: String(options.leaseMs),
              CHAOS_HEARTBEAT_MS: String(options.heartbeatMs),
              CHAOS_PROGRESS_TIMEOUT_MS: String(options.progressTimeoutMs),
              CHAOS_CONCURRENCY: String(options.concurrency),
              ...(natsUrl && { CHAOS_NATS_URL: natsUrl }),
            },
          },
          onExit,
          () => shuttingDown,
        ),
      );
    }
    const watchdogs = Array.from(
      { length: options.watchdogs },
      (_, i) =>
        new Supervised(
          {
            name: `watchdog${i + 1}`,
            kind: "watchdog",
            script: path.join(REPO_ROOT, "chaos", "watchdog-process.ts"),
            stderrFile: path.join(logDir, `watchdog${i + 1}.stderr`),
            env: { ...common, CHAOS_DATABASE_URL: url, CHAOS_WATCHDOG_INTERVAL_MS: String(options.watchdogIntervalMs) },
          },
          onExit,
          () => shuttingDown,
        ),
    );
    children.push(...workers, ...watchdogs);
    for (const c of children) c.start();
    await Promise.all(children.map((c) => c.whenReady()));
    say(`${workers.length} workers and ${watchdogs.length} watchdogs ready`);

    const producer = new Producer(lh, options, random, say);
    const sender = (events = new EventSender(lh, say));
    producer.onLanded = (jobs) => sender.schedule(jobs);
    const faults: FaultRecord[] = [];
    const ctx: FaultContext = {
      options,
      lh,
      faults,
      probes: 0,
      random,
      workers,
      watchdogs,
      proxies,
      server,
      nats,
      natsProxies,
      admin,
      databaseUrl: url,
      schema: CHAOS_SCHEMA,
      producer,
      idleTxnFreeAt: 0,
      pending: [],
      log: say,
    };
    const fullPlan = faultPlan(options, random);
    const plan = fullPlan.filter((k) => !TIMED_FAULTS.has(k));
    const timed = fullPlan.filter((k) => TIMED_FAULTS.has(k));
    const spacing = options.faultWindowMs / plan.length;
    producer.burstsPlanned = plan.filter((k) => k === "burst").length;
    const inject = async (kind: FaultKind) => {
      const record = await INJECTORS[kind](ctx).catch((err): FaultRecord => ({
        kind,
        at: Date.now(),
        held: [],
        skipped: `injector failed: ${String(err)}`,
      }));
      faults.push(record);
      say(
        `fault ${kind}${record.target ? ` on ${record.target}` : ""}${record.detail ? ` (${record.detail})` : ""}` +
          `${record.skipped ? ` skipped: ${record.skipped}` : `, ${record.held.length} attempts held`}`,
      );
    };
    producer.start();
    sender.start();
    const windowEnds = Date.now() + options.faultWindowMs;
    const timedDone = Promise.all(timed.map((kind, i) => sleep(((i + 0.5) / timed.length) * options.faultWindowMs).then(() => inject(kind))));
    for (const kind of plan) {
      await sleep(spacing * (0.5 + random()));
      // Injectors take time too (a restart takes seconds): stop at the window's end, once
      // the whole mix has been injected.
      if (Date.now() > windowEnds && faults.length >= faultsPerRound(options)) break;
      await inject(kind);
    }
    await timedDone;
    await Promise.all(ctx.pending);
    await producer.finish();
    say(`faults over; ${producer.enqueued} jobs enqueued; draining`);

    const drainStart = Date.now();
    const drained = await waitForDrain(admin, options.drainTimeoutMs, say);
    const drainMs = Date.now() - drainStart;
    // Jobs wait for their events until the end: the sender stops only once the queue drained.
    await sender.stop();
    say(`events: ${sender.sent} sent, ${sender.neverSent} never meant to be, ${sender.pending} left unsent, ${sender.retries} sends retried`);
    if (!drained) await describeStuck(admin, nats?.url, say);
    shuttingDown = true;
    await Promise.all(children.map((c) => c.stop()));
    say(`drained in ${(drainMs / 1000).toFixed(1)} s; processes stopped`);

    const check = await checkInvariants({
      admin,
      jobs: options.jobs,
      logs: readLogs(logDir),
      faults,
      unexpectedExits: exits,
      processEnds: workers.flatMap((w) => w.ends),
      options,
      // The chaos handlers return a result for every job (chaos/workload.ts).
      resultsRequired: true,
    });
    const pressure = await idleTxnThroughput(admin, faults, startedAt);
    if (pressure.idleTxnThroughputPerS === 0) {
      check.violations.push({ invariant: "the queue keeps working under pressure", detail: "no job finished while an idle transaction was open" });
    }
    const natsStats = nats ? await natsDelivered(nats.url, `leasehold_${CHAOS_SCHEMA}`).catch(() => null) : undefined;
    if (natsStats) say(`NATS: ${natsStats.delivered} messages delivered, ${natsStats.redelivered} redelivered`);
    const report = buildReport({
      nats: natsStats,
      options,
      startedAt,
      drainMs,
      check,
      faults,
      restarts: children.reduce((n, c) => n + c.starts - 1, 0),
      exits,
      producerRetries: producer.retries,
      pressure,
    });
    const files = writeReport(options.outDir, report);
    return { report, markdown: toMarkdown(report), files: { ...files, logs: logDir } };
  } finally {
    process.off("SIGINT", interrupted).off("SIGTERM", interrupted);
    shuttingDown = true;
    await events?.stop();
    await Promise.all(children.map((c) => c.stop(2_000).catch(() => {})));
    for (const p of [...proxies.values(), ...natsProxies.values()]) await p.close();
    await admin?.end().catch(() => {});
    await lh?.close().catch(() => {});
    await server.stop().catch(() => {});
    await nats?.dispose().catch(() => {});
    fs.rmSync(dataRoot, { recursive: true, force: true });
  }
}

/** The stream's consumers as JetStream reports them now. */
async function natsConsumers(url: string, stream: string): Promise<ConsumerInfo[]> {
  const { connect } = await import("@nats-io/transport-node");
  const { jetstreamManager } = await import("@nats-io/jetstream");
  const nc = await connect({ servers: url });
  try {
    const consumers: ConsumerInfo[] = [];
    for await (const c of (await jetstreamManager(nc)).consumers.list(stream)) consumers.push(c);
    return consumers;
  } finally {
    await nc.close();
  }
}

/** What JetStream delivered to the run's consumers (evidence that jobs came through NATS). */
async function natsDelivered(url: string, stream: string): Promise<NonNullable<ChaosReport["nats"]>> {
  const total = { delivered: 0, redelivered: 0, pending: 0, ackPending: 0 };
  for (const c of await natsConsumers(url, stream)) {
    total.delivered += c.delivered.consumer_seq;
    total.redelivered += c.num_redelivered;
    total.pending += c.num_pending;
    total.ackPending += c.num_ack_pending;
  }
  return total;
}

/**
 * Waits until no job is waiting or running. Gives up when nothing has finished for a while
 * (a stuck job) or at the overall limit; the checker then reports what is left.
 */
async function waitForDrain(admin: pg.Pool, timeoutMs: number, say: (l: string) => void): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  let lastSaid = 0;
  let last = -1;
  let progressAt = Date.now();
  while (Date.now() < deadline && Date.now() - progressAt < NO_PROGRESS_MS) {
    try {
      const { rows } = await admin.query<{ n: number }>("SELECT count(*)::int AS n FROM jobs");
      const n = rows[0]!.n;
      if (n === 0) return true;
      if (n !== last) progressAt = Date.now();
      last = n;
      if (Date.now() - lastSaid > 5_000) {
        say(`${n} jobs unfinished`);
        lastSaid = Date.now();
      }
    } catch {
      // the server may still be coming back
    }
    await sleep(200);
  }
  say(`queue did not drain (${last} jobs left)`);
  return false;
}

/**
 * What a run that did not drain left behind, into the harness log (its database is gone after
 * the run): the unfinished jobs by queue, task, state and attempt, whether they are due and owe a
 * NATS message, and each NATS consumer's counts.
 */
async function describeStuck(admin: pg.Pool, natsUrl: string | undefined, say: (l: string) => void): Promise<void> {
  const { rows } = await admin
    .query<{ queue: string; task: string; state: string; attempt: number; due: boolean; owed: number; n: number; ids: string }>(
      `SELECT j.queue, j.task, j.state, j.attempt, j.run_at <= now() AS due,
              count(o.job_id)::int AS owed, count(*)::int AS n, string_agg(j.id::text, ' ' ORDER BY j.id) AS ids
         FROM jobs AS j LEFT JOIN dispatch_outbox AS o ON o.job_id = j.id AND o.attempt = j.attempt
        GROUP BY 1, 2, 3, 4, 5 ORDER BY n DESC`,
    )
    .catch(() => ({ rows: [] }));
  for (const r of rows)
    say(
      `left: ${r.n} ${r.state} in ${r.queue} (${r.task}), attempt ${r.attempt}, ${r.due ? "due" : "not due"}, ${r.owed} owing a message; e.g. ${r.ids.slice(0, 80)}`,
    );
  if (!natsUrl) return;
  // Diagnostics only: NATS down at this moment must not cost the run its report.
  const consumers = await natsConsumers(natsUrl, `leasehold_${CHAOS_SCHEMA}`).catch((err: unknown) => {
    say(`NATS consumers not read: ${String(err)}`);
    return [];
  });
  for (const c of consumers) {
    say(
      `NATS consumer ${c.name}: pending ${c.num_pending}, ack pending ${c.num_ack_pending}, waiting pulls ${c.num_waiting}, ` +
        `delivered ${c.delivered.consumer_seq}, ack floor ${c.ack_floor.consumer_seq}`,
    );
  }
}

/** Retries back off 2 s at most and leases are seconds long: a minute without a change is a stuck job. */
const NO_PROGRESS_MS = 60_000;

/** Jobs finished per second while an idle transaction was open, and the rest of the run. */
async function idleTxnThroughput(admin: pg.Pool, faults: FaultRecord[], startedAt: number): Promise<ChaosReport["pressure"]> {
  const windows = faults.filter((f) => f.kind === "idle_txn" && !f.skipped).map((f) => [f.at, f.at + (f.durationMs ?? 0)] as const);
  const { rows } = await admin.query<{ at: number }>("SELECT (extract(epoch FROM finished_at) * 1000)::float8 AS at FROM audit_finished");
  const end = Math.max(...rows.map((r) => r.at), startedAt + 1);
  const inside = (t: number) => windows.some(([a, b]) => t >= a && t <= b);
  let insideMs = 0;
  for (const [a, b] of windows) insideMs += Math.max(0, Math.min(b, end) - a);
  const n = rows.filter((r) => inside(r.at)).length;
  const otherMs = end - startedAt - insideMs;
  return {
    idleTxnThroughputPerS: insideMs > 0 ? (n * 1000) / insideMs : null,
    otherThroughputPerS: otherMs > 0 ? ((rows.length - n) * 1000) / otherMs : null,
  };
}
