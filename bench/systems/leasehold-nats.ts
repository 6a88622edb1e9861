/**
 * Leasehold with NATS JetStream dispatch (docs/nats.md): the same client and worker as
 * `leasehold`, with `nats` set, so enqueue publishes and workers take jobs from JetStream.
 * Measured only where dispatch matters (enqueue, drain, latency); the bench starts its own
 * nats-server (BENCH_NATS_URL) when this system is chosen.
 */
import pino from "pino";
import { Registry } from "prom-client";
import { connect as natsConnect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { Leasehold } from "../../packages/leasehold/src/client.js";
import { packageVersion } from "../lib/versions.js";
import { producerOf, recreateSchema, THROUGHPUT_CONCURRENCY } from "./leasehold.js";
import { QUEUE, type BenchSystem, type Payload, type Producer } from "./types.js";

const silent = pino({ level: "silent" });
const SCHEMA = "leasehold";
const STREAM = `leasehold_${SCHEMA}`;

function natsUrl(): string {
  const url = process.env.BENCH_NATS_URL;
  if (!url) throw new Error("BENCH_NATS_URL is not set (the bench starts a nats-server when leasehold-nats is chosen)");
  return url;
}

function connect(url: string, poolSize?: number): Promise<Leasehold> {
  return Leasehold.connect({
    databaseUrl: url,
    schema: SCHEMA,
    logger: silent,
    metricsRegistry: new Registry(),
    migrate: false,
    poolSize,
    nats: natsUrl(),
  });
}

export const leaseholdNats: BenchSystem = {
  name: "leasehold-nats",
  version: packageVersion(),
  database: "bench_leasehold_nats",
  schema: SCHEMA,
  workloads: ["enqueue", "drain", "drain-multi", "latency"],
  settings: {
    throughput: `as leasehold (concurrency ${THROUGHPUT_CONCURRENCY}), with NATS dispatch: one local nats-server, enqueue publishes after commit, workers fetch from a durable pull consumer and claim by id`,
    recovery: "not measured (recovery is the database's, as in leasehold)",
    heartbeat: "not measured (as leasehold)",
    steady: "not measured",
  },

  async reset(url: string) {
    await recreateSchema(url);
    // A fresh stream too: messages of an earlier run would only be skipped, but cost time.
    const nc = await natsConnect({ servers: natsUrl() });
    try {
      await (await jetstreamManager(nc)).streams.delete(STREAM).catch(() => false);
    } finally {
      await nc.close();
    }
  },

  async producer(url: string): Promise<Producer> {
    return producerOf(await connect(url));
  },

  async startWorker(url, spec, run) {
    const lh = await connect(url, 10);
    const worker = lh.worker({
      handlers: { [QUEUE]: (payload, ctx) => run(payload as Payload, ctx.signal) },
      concurrency: spec.concurrency ?? THROUGHPUT_CONCURRENCY,
      shutdownTimeoutMs: 1_000,
    });
    await worker.start();
    return {
      async stop() {
        await worker.stop();
        await lh.close();
      },
    };
  },
};
