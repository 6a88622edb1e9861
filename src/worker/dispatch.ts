/**
 * A dispatch mode beside polling (NATS, docs/nats.md): it learns of jobs elsewhere and claims
 * them by id with the same lease-granting claim, then hands them to the worker like a claim
 * of its own. The worker's polling claimer is paused while the dispatch works, and resumed
 * when it says so (its source is unavailable). Nothing here loads a dispatch's client: the
 * worker gets a factory, called at start.
 */
import type { Logger } from "pino";
import type { ClaimedJob } from "../jobs/types.js";
import type { Metrics } from "../metrics.js";
import type { WorkerSettings } from "./options.js";

export interface DispatchHost {
  workerId: string;
  settings: WorkerSettings;
  tasks: string[];
  logger: Logger;
  metrics: Metrics;
  /** Jobs the worker could take now (its target, less those buffered, running and asked for). */
  capacity(): number;
  deliver(jobs: ClaimedJob[], sentAt: number): void;
  /** true: claim from the database by polling (the dispatch is unavailable); false: leave it to the dispatch. */
  setPolling(on: boolean): void;
}

export interface WorkerDispatch {
  /** Throws (a ConfigError) when the settings cannot work; otherwise starts, up or not. */
  start(host: DispatchHost): Promise<void>;
  /** Capacity was freed: fetch more. */
  kick(): void;
  stop(): Promise<void>;
}

export type DispatchFactory = () => Promise<WorkerDispatch>;
