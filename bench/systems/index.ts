import { bullmq } from "./bullmq.js";
import { dbos } from "./dbos.js";
import { graphile } from "./graphile.js";
import { leasehold } from "./leasehold.js";
import { leaseholdNats } from "./leasehold-nats.js";
import { pgboss } from "./pgboss.js";
import type { BenchSystem } from "./types.js";

export const SYSTEMS: Record<string, BenchSystem> = {
  leasehold,
  "leasehold-nats": leaseholdNats,
  "pg-boss": pgboss,
  "graphile-worker": graphile,
  dbos,
  bullmq,
};

export type { BenchSystem } from "./types.js";
