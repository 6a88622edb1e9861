/**
 * Cancel-to-abort latency: one job at a time runs a handler that waits for its AbortSignal;
 * once it runs, the job is cancelled and the time from the cancel request (the call's start)
 * to the signal firing is measured, on the same clock in this process. Every system at its
 * defaults, and pg-boss also with the heartbeat that lets its cancel reach a handler at all.
 *
 * - Leasehold, database worker: the cancel's NOTIFY (migration 014) reaches the worker's
 *   listening session, which aborts the handler.
 * - Leasehold, remote HTTP worker: the same NOTIFY reaches `leasehold serve`'s listening
 *   session, which answers the worker's cancel poll (POST /v1/worker/cancels).
 * - pg-boss 12: `cancel()` sets the job's state; nothing tells the worker. A handler's
 *   `job.signal` fires only when the worker's heartbeat (queue option `heartbeatSeconds`, at
 *   least 10, refreshed every half of it) finds the job no longer active. At its defaults a
 *   queue has no heartbeat, and the handler runs on to its end. With one, its cancels are made
 *   at a random moment of the refresh interval (Leasehold's do not wait for a beat, so their
 *   moment does not matter: they are made right after the start).
 */
import type { AddressInfo } from "node:net";
import { Registry } from "prom-client";
import { PgBoss } from "pg-boss";
import { Leasehold } from "../../packages/leasehold/src/client.js";
import { silentLogger } from "../../packages/leasehold/src/logger.js";
import { RemoteTransport } from "../../packages/leasehold/src/worker/remote-transport.js";
import { Worker } from "../../packages/leasehold/src/worker/worker.js";
import { createServer, type ServerOptions } from "../../packages/cli/src/server/app.js";
import { percentile } from "../lib/stats.js";
import type { BenchSystem } from "../systems/types.js";
import { urlOf, withClient, type BenchContext, type Metrics } from "./context.js";

const SCHEMA = "bench_cancel";
const QUEUE = "cancel_bench";
const TOKEN = "bench-token-0123456789abcdef";
/** How long a cancel may take before it counts as never reaching the handler. */
const GIVE_UP_MS = 15_000;
/** pg-boss's smallest heartbeat (its validation refuses less). */
const PGBOSS_HEARTBEAT_SECONDS = 10;
const PGBOSS_MAX_SAMPLES = 20;

/** A handler waiting for its abort: resolves `aborted` with the time the signal fired. */
class Held {
  private started?: () => void;
  private aborted?: (at: number) => void;
  readonly start = new Promise<void>((r) => (this.started = r));
  readonly abort = new Promise<number>((r) => (this.aborted = r));
  /** Ends the handler without an abort (a cancel that never reached it). */
  release = () => {};

  run(signal: AbortSignal): Promise<void> {
    this.started!();
    return new Promise((resolve) => {
      this.release = resolve;
      const onAbort = () => {
        this.aborted!(performance.now());
        resolve();
      };
      if (signal.aborted) onAbort();
      else signal.addEventListener("abort", onAbort, { once: true });
    });
  }
}

/** Runs `n` jobs one after another, cancelling each once it runs; the latencies in ms (NaN: never aborted). */
async function measureEach(
  n: number,
  startJob: () => Promise<Held>,
  cancel: () => Promise<void>,
  /** Cancel this long (at most) after the start, at random: a phase of the worker's beat cycle. */
  maxDelayMs = 0,
): Promise<number[]> {
  const latencies: number[] = [];
  for (let i = 0; i < n; i++) {
    const held = await startJob();
    await held.start;
    if (maxDelayMs > 0) await new Promise((r) => setTimeout(r, Math.random() * maxDelayMs));
    const requestedAt = performance.now();
    await cancel();
    let timer: NodeJS.Timeout | undefined;
    const firedAt = await Promise.race([held.abort, new Promise<number>((r) => (timer = setTimeout(() => r(NaN), GIVE_UP_MS)))]);
    clearTimeout(timer);
    latencies.push(firedAt - requestedAt);
    // A cancel that never reaches the handler reaches no later one either: one is enough to say so.
    if (Number.isNaN(firedAt)) {
      held.release();
      break;
    }
  }
  return latencies;
}

function summary(latencies: number[]): Metrics {
  const fired = latencies.filter(Number.isFinite);
  const never = latencies.length - fired.length;
  return {
    p50Ms: never > 0 ? NaN : percentile(fired, 50),
    p99Ms: never > 0 ? NaN : percentile(fired, 99),
    maxMs: never > 0 ? NaN : Math.max(...fired),
    samples: latencies.length,
    neverAborted: never,
  };
}

async function freshLeasehold(url: string): Promise<Leasehold> {
  // A plain connection: a client (even with migrate: false) refuses a schema with no tables.
  await withClient(url, (db) => db.query(`DROP SCHEMA IF EXISTS ${SCHEMA} CASCADE`));
  return Leasehold.connect({ databaseUrl: url, schema: SCHEMA, logger: silentLogger, metricsRegistry: new Registry() });
}

/** Leasehold at its defaults (lease 30 s, beat 10 s): a database worker, or a remote worker through an in-process server. */
export async function leaseholdCancelWorkload(ctx: BenchContext, system: BenchSystem, remote: boolean): Promise<Metrics> {
  const lh = await freshLeasehold(urlOf(ctx, system));
  let current: Held | undefined;
  const handlers = { hold: (_: unknown, c: { signal: AbortSignal }) => current!.run(c.signal) };
  // The server's types name the built package's class; this is the same class from its sources.
  const app = remote ? createServer({ leasehold: lh as unknown as ServerOptions["leasehold"], token: TOKEN, dashboard: "off" }) : undefined;
  let worker: Worker;
  if (app) {
    await app.listen({ host: "127.0.0.1", port: 0 });
    const serverUrl = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
    worker = new Worker({
      handlers,
      queues: [QUEUE],
      logger: silentLogger,
      metricsRegistry: new Registry(),
      transport: new RemoteTransport({ serverUrl, token: TOKEN }),
    });
  } else {
    worker = lh.worker({ handlers, queues: [QUEUE], watchdog: false, scheduler: false });
  }
  await worker.start();
  let id = "";
  try {
    const latencies = await measureEach(
      ctx.options.cancels,
      async () => {
        current = new Held();
        id = (await lh.enqueue("hold", {}, { queue: QUEUE })).id;
        return current;
      },
      async () => void (await lh.cancel(id)),
    );
    return summary(latencies);
  } finally {
    await worker.stop(1_000);
    await app?.close();
    await lh.pool.query(`DROP SCHEMA IF EXISTS ${SCHEMA} CASCADE`).catch(() => {});
    await lh.close();
  }
}

/** pg-boss 12: at its defaults (no heartbeat), or with `heartbeatSeconds` set to its minimum. */
export async function pgbossCancelWorkload(ctx: BenchContext, system: BenchSystem, heartbeat: boolean): Promise<Metrics> {
  const url = urlOf(ctx, system);
  await system.reset(url, "throughput");
  const boss = new PgBoss({ connectionString: url, schema: system.schema, max: 10, useListenNotify: true, migrate: false, schedule: false });
  boss.on("error", () => {});
  await boss.start();
  await boss.createQueue(QUEUE, { notify: true, ...(heartbeat && { heartbeatSeconds: PGBOSS_HEARTBEAT_SECONDS }) });
  let current: Held | undefined;
  await boss.work(QUEUE, { batchSize: 1, pollingIntervalSeconds: 0.5 }, async ([job]) => current!.run(job!.signal));
  let id = "";
  try {
    const latencies = await measureEach(
      // Each cancel waits for a beat up to 5 s away: fewer samples keep the run short.
      heartbeat ? Math.min(ctx.options.cancels, PGBOSS_MAX_SAMPLES) : 1,
      async () => {
        current = new Held();
        id = (await boss.send(QUEUE, {}))!;
        return current;
      },
      async () => void (await boss.cancel(QUEUE, id)),
      // A cancel right after the start would always wait a whole refresh interval: cancel at a
      // random moment of it instead, as a user would.
      heartbeat ? (PGBOSS_HEARTBEAT_SECONDS / 2) * 1000 : 0,
    );
    return summary(latencies);
  } finally {
    await boss.stop({ graceful: false, timeout: 2_000 });
  }
}
