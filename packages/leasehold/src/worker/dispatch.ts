/**
 * A dispatch mode beside polling (NATS, docs/nats.md): it learns of jobs elsewhere and claims
 * them by id with the same lease-granting claim, then hands them to the worker like a claim
 * of its own. The worker's polling claimer is paused while the dispatch works, and resumed
 * when it says so (its source is unavailable). Nothing here loads a dispatch's client: the
 * worker gets a factory, called at start.
 */
import type { Logger } from "../logger.js";
import type { ClaimedJob } from "../jobs/types.js";
import type { Metrics } from "../metrics.js";
import type pg from "pg";
import type { Doorbell } from "../store/dispatch.js";
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

/** NATS JetStream dispatch (docs/nats.md), implemented by the `@leasehold/nats` package. */
export interface NatsOptions {
  /** Server URL(s): nats://host:4222 or tls://host:4222, several separated by commas. */
  url: string;
  /** The JetStream stream (created if missing); default `leasehold_<schema>`. Its subjects are `<stream>.<queue>.<task>`. */
  stream?: string;
  /**
   * How long JetStream waits for a worker to acknowledge a message before delivering it again;
   * must be longer than every NATS worker's lease. Default: twice the lease, at least a minute.
   */
  ackWaitMs?: number;
  /** Replicas of the stream when Leasehold creates it (a NATS cluster: 3); default 1. */
  replicas?: number;
}

/** A client's NATS connection, as the client uses it: publishes new jobs' doorbells. */
export interface NatsPublisher {
  readonly connected: boolean;
  waitConnected(ms: number): Promise<boolean>;
  publish(doorbells: Doorbell[]): Promise<void>;
  close(): Promise<void>;
}

/** What the `@leasehold/nats` package exports (its default export), loaded only when NATS is configured. */
export interface NatsPlugin {
  /** How long the outbox keeps a doorbell owed in case the publish after commit fails. */
  PUBLISH_GRACE_MS: number;
  /** Validates the options (ConfigError), before anything connects. */
  resolveNatsOptions(input: string | NatsOptions, schema: string): unknown;
  connect(resolved: unknown, p: { logger: Logger; metrics: Metrics; name: string }): NatsPublisher;
  workerDispatch(link: NatsPublisher, p: { pool: pg.Pool; connectionString: string; schema: string }): WorkerDispatch;
}
