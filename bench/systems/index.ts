import { graphile } from "./graphile.js";
import { leasehold } from "./leasehold.js";
import { pgboss } from "./pgboss.js";
import type { BenchSystem } from "./types.js";

export const SYSTEMS: Record<string, BenchSystem> = {
  leasehold,
  "pg-boss": pgboss,
  "graphile-worker": graphile,
};

export type { BenchSystem } from "./types.js";
