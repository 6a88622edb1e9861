/**
 * The NATS side of NATS dispatch (docs/nats.md): one connection per Leasehold client, the
 * stream and the durable pull consumers (created if missing), and publishing doorbells.
 * NATS is only a doorbell: a message names a job (id and attempt) for a worker to claim in
 * PostgreSQL; losing, repeating or delaying one never decides who owns a job.
 *
 * Loaded with a dynamic import() when NATS is configured, so the library without NATS never
 * loads the NATS client. The connection retries forever in the background: NATS being down
 * never fails an enqueue or a worker's start; `connected` says whether it is up now.
 */
import { randomUUID } from "node:crypto";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import {
  AckPolicy,
  DeliverPolicy,
  DiscardPolicy,
  jetstream,
  jetstreamManager,
  JetStreamApiError,
  RetentionPolicy,
  StorageType,
  type Consumer,
  type ConsumerInfo,
  type JetStreamClient,
  type JetStreamManager,
} from "@nats-io/jetstream";
import type { Logger } from "leasehold/internal/logger";
import type { Metrics } from "leasehold/internal/metrics";
import type { Doorbell } from "leasehold/internal/store/dispatch";
import { checkAckWait, consumerOf, DUPLICATE_WINDOW_MS, PUBLISH_TIMEOUT_MS, subjectOf, type ResolvedNatsOptions } from "./options.js";

const nanos = (ms: number) => ms * 1_000_000;
/** Messages a consumer may have delivered and not yet acknowledged, across all its workers. */
export const MAX_ACK_PENDING = 50_000;
/**
 * Messages older than this are dropped by the stream: with no NATS worker consuming (jobs
 * enqueued with NATS, run by polling workers) the stream would otherwise grow for ever. A job
 * whose message expired is still waiting in the database; the lost-message check owes it again.
 */
export const STREAM_MAX_AGE_MS = 24 * 3600_000;
/** Pings find a connection that went silent (a partition) within about two intervals. */
const PING_INTERVAL_MS = 3_000;

/** The body of a doorbell message. */
export interface DoorbellMessage {
  id: string;
  attempt: number;
  queue: string;
  task: string;
  recovery: boolean;
}

export class NatsLink {
  private nc?: NatsConnection;
  private js?: JetStreamClient;
  private jsm?: JetStreamManager;
  private up = false;
  private closed = false;
  private streamReady = false;
  private readonly listeners = new Set<(up: boolean) => void>();
  private readonly connecting: Promise<void>;

  constructor(
    readonly options: ResolvedNatsOptions,
    private readonly logger: Logger,
    private readonly metrics: Metrics,
    readonly name: string,
  ) {
    this.connecting = this.connectInBackground();
  }

  get stream(): string {
    return this.options.stream;
  }

  /** Whether the connection is up now (publishing and consuming may work). */
  get connected(): boolean {
    return this.up && !this.closed;
  }

  /** Called with true when the connection comes up (again), false when it goes down. */
  onState(fn: (up: boolean) => void): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  /** Waits up to `ms` for the connection; true if it is up. */
  async waitConnected(ms: number): Promise<boolean> {
    if (this.connected) return true;
    await new Promise<void>((resolve) => {
      const timer = setTimeout(done, ms);
      const off = this.onState((up) => up && done());
      function done() {
        clearTimeout(timer);
        off();
        resolve();
      }
    });
    return this.connected;
  }

  private setUp(up: boolean): void {
    if (this.up === up) return;
    this.up = up;
    if (!up) this.streamReady = false;
    for (const fn of this.listeners) fn(up);
  }

  private async connectInBackground(): Promise<void> {
    let logged = false;
    for (let delay = 250; !this.closed; delay = Math.min(delay * 2, 2_000)) {
      try {
        const nc = await connect({
          servers: this.options.servers,
          name: this.name,
          reconnect: true,
          maxReconnectAttempts: -1,
          reconnectTimeWait: 500,
          pingInterval: PING_INTERVAL_MS,
          maxPingOut: 2,
          timeout: 5_000,
        });
        if (this.closed) {
          await nc.close();
          return;
        }
        this.nc = nc;
        this.js = jetstream(nc, { timeout: PUBLISH_TIMEOUT_MS });
        this.jsm = await jetstreamManager(nc, { timeout: PUBLISH_TIMEOUT_MS });
        void this.followStatus(nc);
        this.setUp(true);
        if (logged) this.logger.info({ servers: this.options.servers.length }, "NATS reachable");
        return;
      } catch (err) {
        await this.nc?.close().catch(() => {});
        this.nc = undefined;
        if (!logged) {
          logged = true;
          this.logger.warn({ err: String(err) }, "NATS unreachable; retrying in the background (logged again when it is up)");
        }
        await new Promise((r) => setTimeout(r, delay).unref());
      }
    }
  }

  private async followStatus(nc: NatsConnection): Promise<void> {
    for await (const s of nc.status()) {
      if (s.type === "disconnect") this.setUp(false);
      else if (s.type === "reconnect") this.setUp(true);
    }
    this.setUp(false);
  }

  /** The stream, created if missing: work-queue retention (a message is gone once acknowledged). */
  async ensureStream(): Promise<void> {
    if (this.streamReady) return;
    const jsm = this.manager();
    try {
      await jsm.streams.info(this.stream);
    } catch (err) {
      if (!isNotFound(err)) throw err;
      await jsm.streams.add({
        name: this.stream,
        subjects: [`${this.stream}.>`],
        retention: RetentionPolicy.Workqueue,
        storage: StorageType.File,
        num_replicas: this.options.replicas,
        discard: DiscardPolicy.Old,
        duplicate_window: nanos(DUPLICATE_WINDOW_MS),
        max_age: nanos(STREAM_MAX_AGE_MS),
      });
      this.logger.info({ stream: this.stream }, "created the NATS stream");
    }
    this.streamReady = true;
  }

  /**
   * The durable pull consumer of one queue and task, created if missing with `ackWaitMs`.
   * An existing one must wait longer than `leaseMs` before redelivering (ConfigError
   * otherwise); one that waits less than `ackWaitMs` is raised to it (never lowered: workers
   * with longer leases may share it).
   */
  async ensureConsumer(queue: string, task: string, ackWaitMs: number, leaseMs: number): Promise<Consumer> {
    await this.ensureStream();
    const jsm = this.manager();
    const name = consumerOf(queue, task);
    let info: ConsumerInfo | undefined;
    try {
      info = await jsm.consumers.info(this.stream, name);
    } catch (err) {
      if (!isNotFound(err)) throw err;
    }
    if (!info) {
      // Another worker may create it at the same moment (with another ack_wait): then use theirs.
      const created = await jsm.consumers
        .add(this.stream, {
          durable_name: name,
          filter_subject: subjectOf(this.stream, queue, task),
          ack_policy: AckPolicy.Explicit,
          ack_wait: nanos(ackWaitMs),
          deliver_policy: DeliverPolicy.All,
          max_deliver: -1,
          max_ack_pending: MAX_ACK_PENDING,
          max_waiting: 4_096,
          description: `Leasehold doorbells of queue ${queue}, task ${task}`,
        })
        .catch(async (err: unknown) => {
          const other = await jsm.consumers.info(this.stream, name).catch(() => undefined);
          if (!other) throw err;
          return other;
        });
      if (created.config.ack_wait !== nanos(ackWaitMs)) info = created;
    }
    if (info) {
      const existing = Math.round((info.config.ack_wait ?? 0) / 1_000_000);
      checkAckWait(existing, leaseMs, `the NATS consumer ${this.stream}/${name}`);
      if (existing < ackWaitMs) await jsm.consumers.update(this.stream, name, { ack_wait: nanos(ackWaitMs) });
    }
    return this.client().consumers.get(this.stream, name);
  }

  /** Messages waiting for a consumer, delivered or not (a lost doorbell shows as none). */
  async pendingOf(queue: string, task: string): Promise<number> {
    const info = await this.manager().consumers.info(this.stream, consumerOf(queue, task));
    return info.num_pending + info.num_ack_pending;
  }

  /**
   * Publishes doorbells and waits for JetStream to store each. Rejects if any publish fails.
   *
   * Each publish gets a message id of its own that no one can guess: JetStream drops a message
   * whose id it stored within its duplicate window, so an id the same spell (job id and
   * attempt) had before, or anyone could predict, would let a cancelled-and-retried job's
   * doorbell, or one whose id an outsider published first, be swallowed for up to two
   * minutes. A doorbell published twice is harmless: the second claims nothing.
   */
  async publish(doorbells: Doorbell[]): Promise<void> {
    if (doorbells.length === 0) return;
    if (!this.connected) throw new NatsUnavailableError();
    await this.ensureStream();
    const js = this.client();
    const acks = await Promise.allSettled(
      doorbells.map((d) => {
        const body: DoorbellMessage = { id: d.id, attempt: d.attempt, queue: d.queue, task: d.task, recovery: d.recovery };
        return js.publish(subjectOf(this.stream, d.queue, d.task), JSON.stringify(body), {
          msgID: `${d.id}:${d.attempt}:${randomUUID()}`,
          timeout: PUBLISH_TIMEOUT_MS,
        });
      }),
    );
    let recovery = 0;
    let failed: unknown;
    for (const [i, a] of acks.entries()) {
      if (a.status === "rejected") failed ??= a.reason;
      else if (doorbells[i]!.recovery) recovery++;
    }
    const ok = acks.filter((a) => a.status === "fulfilled").length;
    if (ok - recovery > 0) this.metrics.natsPublished.inc({ kind: "new" }, ok - recovery);
    if (recovery > 0) this.metrics.natsPublished.inc({ kind: "recovery" }, recovery);
    if (failed !== undefined) {
      this.metrics.natsPublishFailures.inc(doorbells.length - ok);
      throw failed;
    }
  }

  private manager(): JetStreamManager {
    if (!this.jsm || !this.connected) throw new NatsUnavailableError();
    return this.jsm;
  }

  private client(): JetStreamClient {
    if (!this.js || !this.connected) throw new NatsUnavailableError();
    return this.js;
  }

  async close(): Promise<void> {
    this.closed = true;
    this.setUp(false);
    const nc = this.nc;
    this.nc = undefined;
    await nc?.drain().catch(() => nc.close().catch(() => {}));
    await this.connecting;
  }
}

export class NatsUnavailableError extends Error {
  constructor() {
    super("NATS is not connected");
    this.name = "NatsUnavailableError";
  }
}

function isNotFound(err: unknown): boolean {
  return err instanceof JetStreamApiError && (err.status === 404 || /not found/i.test(err.message));
}
