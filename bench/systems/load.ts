import type { BenchSystem } from "./types.js";

/** What a worker process needs of a system: its worker. */
export type WorkerSystem = Pick<BenchSystem, "startWorker">;

/**
 * One system's module by name, loaded on demand: a worker process runs one system and loads
 * only it, not the other three with their drivers (a second more per process from source).
 */
export const SYSTEM_LOADERS: Record<string, () => Promise<WorkerSystem>> = {
  leasehold: async () => (await import("./leasehold.js")).leasehold,
  "leasehold-nats": async () => (await import("./leasehold-nats.js")).leaseholdNats,
  "pg-boss": async () => (await import("./pgboss.js")).pgboss,
  "graphile-worker": async () => (await import("./graphile.js")).graphile,
  dbos: async () => (await import("./dbos.js")).dbos,
  bullmq: async () => (await import("./bullmq.js")).bullmq,
  // Leasehold's durable workflows (bench/workloads/durable.ts), beside DBOS's.
  "leasehold-durable": async () => (await import("./leasehold-durable.js")).leaseholdDurable,
};
