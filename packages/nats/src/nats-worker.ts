/**
 * NATS dispatch inside a worker (docs/nats.md), loaded with a dynamic import() only when NATS
 * is configured. Two parts, both run by every NATS worker:
 *
 * - Consuming: one fetch loop per (queue, task) the worker serves, on that pair's durable pull
 *   consumer, asking for no more messages than the worker can take now. A pair whose last pull
 *   brought nothing asks for one message without reserving capacity, so every pair always has
 *   a pull waiting and an idle pair never holds the capacity a busy one needs. Each batch of messages
 *   is claimed by (id, attempt) with the usual lease-granting claim, and acked once the claim
 *   has committed. A message that claims nothing (a duplicate, a job already claimed, finished,
 *   cancelled or not due) is acked and skipped; one whose job is still waiting (its row was
 *   locked by another claim for a moment) is given back for redelivery.
 * - Publishing: the doorbells owed in dispatch_outbox (jobs enqueued on an application's
 *   client or by SQL, retries, recoveries, releases, delayed jobs once due, publishes that
 *   failed) are taken, published and deleted in one transaction, so a failed publish leaves
 *   them owed. Several workers share the work (SKIP LOCKED); a NOTIFY wakes them.
 *
 * NATS unavailable: the worker falls back to polling the database (a log line, the
 * leasehold_nats_fallback gauge and leasehold_nats_fallbacks_total), and returns to NATS when
 * the connection is back.
 */
import type pg from "pg";
import type { JsMsg, Consumer, ConsumerMessages } from "@nats-io/jetstream";
import type { ClaimedJob } from "leasehold/internal/jobs/types";
import * as store from "leasehold/internal/store/index";
import { withTransaction } from "leasehold/internal/store/db";
import { Listener } from "leasehold/internal/worker/listener";
import type { DispatchHost, WorkerDispatch } from "leasehold/internal/worker/dispatch";
import { NatsUnavailableError, type DoorbellMessage, type NatsLink } from "./nats.js";
import { checkAckWait, defaultAckWaitMs, DISPATCH_ACTIVE_TTL_MS } from "./options.js";

/** A fetch waits this long for messages before asking again. */
const FETCH_EXPIRES_MS = 1_000;
const FETCH_MAX = 500;
/** After a pull's expiry, how long to wait for the server's word that it ended before pulling again. */
const EXPIRY_GRACE_MS = 100;
/** Doorbells published per transaction. */
const PUBLISH_BATCH = 500;
/** The publisher looks for due doorbells at least this often (a NOTIFY may be missed). */
const PUBLISH_POLL_MS = 1_000;
/** How long a worker starting waits for NATS before it starts by polling. */
const START_WAIT_MS = 2_000;
/** A message whose job's row was locked for a moment comes back after this. */
const REDELIVER_DELAY_MS = 200;
/** A message a worker had no room for when it came (an idle pair's pull) goes back for this long. */
const NO_ROOM_DELAY_MS = 250;
/** Lost doorbells (a purged stream, a message past its limits) are looked for this often. */
const LOST_CHECK_MS = 10_000;
/** A job ready this long with nothing pending on its consumer has lost its doorbell. */
const LOST_AFTER_MS = 5_000;

/** One fetch: how many jobs it still holds capacity for, whether it reserved any, what came. */
interface Pull {
  owed: number;
  reserved: boolean;
  came: number;
  noRoom: number;
}

export interface NatsWorkerDispatchOptions {
  link: NatsLink;
  pool: pg.Pool;
  connectionString: string;
  schema: string;
}

export class NatsWorkerDispatch implements WorkerDispatch {
  private host!: DispatchHost;
  private stopped = false;
  /** true while the worker claims by polling because NATS is unavailable. */
  private polling = false;
  private ackWaitMs = 0;
  private readonly consumers = new Map<string, Consumer>();
  private readonly fetches = new Set<ConsumerMessages>();
  private readonly loops: Promise<void>[] = [];
  /** Pulls whose messages are still being taken (one per loop, and one that expired unannounced). */
  private readonly pulls = new Set<Promise<void>>();
  /** Jobs asked for by fetches and claims in flight. */
  private asked = 0;
  private wakeConsumers: (() => void)[] = [];
  private wakePublisher?: () => void;
  private publisherKicked = false;
  private listener?: Listener;
  private offState?: () => void;
  private timers: NodeJS.Timeout[] = [];

  constructor(private readonly o: NatsWorkerDispatchOptions) {}

  private get pairs(): { queue: string; task: string }[] {
    return this.host.settings.queues.flatMap((queue) => this.host.tasks.map((task) => ({ queue, task })));
  }

  async start(host: DispatchHost): Promise<void> {
    this.host = host;
    const { link } = this.o;
    const leaseMs = host.settings.leaseMs;
    this.ackWaitMs = link.options.ackWaitMs ?? defaultAckWaitMs(leaseMs);
    checkAckWait(this.ackWaitMs, leaseMs, "NATS dispatch");
    await this.activate();
    if (await link.waitConnected(START_WAIT_MS)) {
      // An existing consumer that would redeliver before a lease runs out is refused here.
      for (const { queue, task } of this.pairs) await this.consumerFor(queue, task);
    }
    this.offState = link.onState((up) => this.linkChanged(up));
    this.linkChanged(link.connected);
    this.listener = new Listener({
      connectionString: this.o.connectionString,
      channel: store.dispatchChannel(this.o.schema),
      applicationName: "leasehold-dispatch",
      onNotify: () => this.kickPublisher(),
    });
    await this.listener.start();
    this.loops.push(this.publishLoop());
    for (const { queue, task } of this.pairs) this.loops.push(this.consumeLoop(queue, task));
    const renew = setInterval(() => void this.activate().catch(() => {}), DISPATCH_ACTIVE_TTL_MS / 4);
    const lost = setInterval(() => void this.findLostDoorbells().catch(() => {}), LOST_CHECK_MS);
    renew.unref();
    lost.unref();
    this.timers.push(renew, lost);
  }

  /** Keeps NATS dispatch on in the database (every producer owes doorbells while it is). */
  private async activate(): Promise<void> {
    try {
      const r = await store.keepNatsDispatchActive(this.o.pool, DISPATCH_ACTIVE_TTL_MS);
      if (r === "activated") this.host.logger.info("NATS dispatch activated: waiting jobs owe doorbells");
    } catch (err) {
      // Retried at the next renewal; meanwhile this worker's jobs still come by the outbox of
      // active dispatch, or by polling.
      this.host.logger.warn({ err: String(err) }, "could not activate NATS dispatch in the database; retrying");
      const retry = setTimeout(() => void this.activate(), 5_000);
      retry.unref();
      this.timers.push(retry);
    }
  }

  private linkChanged(up: boolean): void {
    if (this.stopped) return;
    const { metrics, logger } = this.host;
    if (!up && !this.polling) {
      this.polling = true;
      metrics.natsFallback.inc();
      metrics.natsFallbacks.inc();
      logger.warn("NATS unavailable: claiming from the database by polling until it is back");
      for (const f of this.fetches) f.stop();
      this.host.setPolling(true);
    } else if (up && this.polling) {
      this.polling = false;
      metrics.natsFallback.dec();
      logger.info("NATS reachable: dispatch by NATS again");
      this.host.setPolling(false);
      this.kick();
      this.kickPublisher();
    }
  }

  kick(): void {
    for (const wake of this.wakeConsumers.splice(0)) wake();
  }

  private kickPublisher(): void {
    this.publisherKicked = true;
    this.wakePublisher?.();
  }

  private async consumerFor(queue: string, task: string): Promise<Consumer> {
    const key = `${queue}\u0000${task}`;
    let c = this.consumers.get(key);
    if (!c) {
      c = await this.o.link.ensureConsumer(queue, task, this.ackWaitMs, this.host.settings.leaseMs);
      this.consumers.set(key, c);
    }
    return c;
  }

  private waitForKick(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(done, ms);
      this.wakeConsumers.push(done);
      function done() {
        clearTimeout(timer);
        resolve();
      }
    });
  }

  /**
   * Pulls of one (queue, task). A pull that reserves capacity (its size counts against what the
   * worker can take until its messages come or it expires) is made only while the pair's last
   * pull brought messages. Otherwise the pair asks for one message and reserves nothing: a pull
   * that reserved capacity and expired empty gave it back, and the loop that gave it took it
   * again at once, so with idle and busy pairs the busy pair's consumer could go unpulled for
   * good, its messages pending (seen in a chaos run: a worker serving six queues).
   */
  private async consumeLoop(queue: string, task: string): Promise<void> {
    let idle = false;
    while (!this.stopped) {
      if (this.polling || !this.o.link.connected) {
        await this.waitForKick(500);
        continue;
      }
      const free = Math.min(FETCH_MAX, this.host.capacity() - this.asked);
      if (!idle && free <= 0) {
        await this.waitForKick(250);
        continue;
      }
      const want = idle ? 1 : free;
      let messages: ConsumerMessages;
      try {
        const consumer = await this.consumerFor(queue, task);
        messages = await consumer.fetch({ max_messages: want, expires: FETCH_EXPIRES_MS });
      } catch (err) {
        if (!(err instanceof NatsUnavailableError)) this.host.logger.debug({ err: String(err), queue, task }, "NATS fetch failed; retrying");
        this.consumers.delete(`${queue}\u0000${task}`);
        await this.waitForKick(500);
        continue;
      }
      // Asked-for jobs count against capacity until their message arrives (then it is claimed).
      const pull: Pull = { owed: idle ? 0 : want, reserved: !idle, came: 0, noRoom: 0 };
      this.asked += pull.owed;
      const taken = this.takeMessages(messages, pull, queue, task).catch((err: unknown) => {
        this.host.logger.warn({ err: String(err), queue, task }, "taking NATS messages failed; unclaimed ones are redelivered");
      });
      this.pulls.add(taken);
      void taken.finally(() => this.pulls.delete(taken));
      // Now and then the server's word that a pull expired does not reach the client, whose
      // iterator then waits for its heartbeat check, a second more, while new messages wait
      // for a pull (measured: ~1 % of jobs a second late in some runs). Past the expiry,
      // stop counting on that pull and pull again beside it; it still takes what it gets.
      if (await this.expiresFirst(taken)) {
        this.asked -= pull.owed;
        pull.owed = 0;
      }
      idle = pull.came === 0;
      // Capacity this pull gave back goes to the loops waiting for it first (woken now, they
      // run before this loop's next turn).
      if (pull.reserved && pull.came < want) {
        this.kick();
        await new Promise((r) => setImmediate(r));
      }
      // A message there was no room for went back: wait for room before asking again.
      if (pull.noRoom > 0) await this.waitForKick(NO_ROOM_DELAY_MS);
    }
  }

  /** Resolves true if `taken` has not ended by the time its pull expired on the server. */
  private expiresFirst(taken: Promise<void>): Promise<boolean> {
    return new Promise((resolve) => {
      const timer = setTimeout(() => resolve(true), FETCH_EXPIRES_MS + EXPIRY_GRACE_MS);
      void taken.then(() => {
        clearTimeout(timer);
        resolve(false);
      });
    });
  }

  /** Takes one pull's messages as they arrive; those that arrive together are claimed together. */
  private async takeMessages(messages: ConsumerMessages, pull: Pull, queue: string, task: string): Promise<void> {
    this.fetches.add(messages);
    // A batch is cut per event-loop turn.
    let batch: JsMsg[] = [];
    let claims = Promise.resolve();
    let cut = false;
    try {
      for await (const m of messages) {
        pull.came++;
        if (pull.owed > 0) {
          pull.owed--;
          this.asked--;
        } else if (!pull.reserved && this.host.capacity() - this.asked <= 0) {
          // An unreserved pull's message with no room here: another worker (or this one,
          // once a handler ends) takes it.
          pull.noRoom++;
          m.nak(NO_ROOM_DELAY_MS);
          this.host.metrics.natsMessages.inc({ result: "redelivered", kind: doorbellKind(m) });
          continue;
        }
        batch.push(m);
        if (!cut) {
          cut = true;
          setImmediate(() => {
            cut = false;
            const taken = batch;
            batch = [];
            claims = claims.then(() => this.claim(taken, queue, task));
          });
        }
      }
    } catch (err) {
      this.host.logger.debug({ err: String(err), queue, task }, "NATS fetch ended with an error");
    } finally {
      this.fetches.delete(messages);
      await new Promise((r) => setImmediate(r));
      await claims;
      if (batch.length > 0) await this.claim(batch.splice(0), queue, task);
      this.asked -= pull.owed;
      pull.owed = 0;
    }
  }

  /**
   * Claims the jobs of a batch of messages that came on the consumer of (queue, task), by
   * (id, attempt) and only if the job is of that queue and task; acks each once its fate is known.
   */
  private async claim(messages: JsMsg[], queue: string, task: string): Promise<void> {
    const { metrics, host } = { metrics: this.host.metrics, host: this.host };
    const spells = new Map<string, { msgs: JsMsg[]; recovery: boolean; attempt: number; id: string }>();
    for (const m of messages) {
      let body: DoorbellMessage;
      try {
        body = m.json<DoorbellMessage>();
        if (!isDoorbell(body)) throw new Error("bad doorbell");
      } catch {
        m.term(); // not a Leasehold doorbell: never deliver it again
        metrics.natsMessages.inc({ result: "skipped", kind: "invalid" });
        continue;
      }
      const key = `${body.id}:${body.attempt}`;
      const s = spells.get(key);
      if (s) s.msgs.push(m);
      else spells.set(key, { msgs: [m], recovery: body.recovery === true, attempt: body.attempt, id: body.id });
    }
    if (spells.size === 0) return;
    const wanted = [...spells.values()];
    const sentAt = performance.now();
    let claimed: ClaimedJob[];
    try {
      claimed = await store.claimJobsById(this.o.pool, {
        spells: wanted.map((s) => ({ id: s.id, attempt: s.attempt })),
        workerId: host.workerId,
        leaseMs: host.settings.leaseMs,
        queues: [queue],
        tasks: [task],
      });
    } catch (err) {
      // Nothing was claimed (or the claim's lease will run out unseen, and the watchdog
      // republishes): the messages come back.
      host.logger.debug({ err: String(err) }, "claim by id failed; messages given back");
      for (const s of wanted) for (const m of s.msgs) m.nak(1_000);
      return;
    }
    // The claim has committed: the job rows now say who owns them.
    if (claimed.length > 0) host.deliver(claimed, sentAt);
    const took = new Set(claimed.map((j) => `${j.id}:${j.attempt - 1}`));
    const missed = wanted.filter((s) => !took.has(`${s.id}:${s.attempt}`));
    const { waiting, foreign } = await store
      .missedSpells(this.o.pool, { spells: missed, queue, task })
      .catch(() => ({ waiting: new Set(missed.map((s) => s.id)), foreign: new Set<string>() }));
    if (foreign.size > 0) {
      host.logger.warn(
        { queue, task, jobs: [...foreign].slice(0, 10) },
        "refused NATS messages naming jobs of another queue or task (not published by Leasehold there); the jobs are left alone",
      );
    }
    for (const s of wanted) {
      const kind = s.recovery ? "recovery" : "new";
      if (took.has(`${s.id}:${s.attempt}`)) {
        for (const m of s.msgs) m.ack();
        metrics.natsMessages.inc({ result: "claimed", kind });
        if (s.msgs.length > 1) metrics.natsMessages.inc({ result: "skipped", kind }, s.msgs.length - 1);
      } else if (foreign.has(s.id)) {
        // Acked, not given back: redelivered, it would be refused again for ever.
        for (const m of s.msgs) m.ack();
        metrics.natsMessages.inc({ result: "refused", kind }, s.msgs.length);
      } else if (waiting.has(s.id)) {
        for (const m of s.msgs) m.nak(REDELIVER_DELAY_MS);
        metrics.natsMessages.inc({ result: "redelivered", kind }, s.msgs.length);
      } else {
        for (const m of s.msgs) m.ack();
        metrics.natsMessages.inc({ result: "skipped", kind }, s.msgs.length);
      }
    }
  }

  private async publishLoop(): Promise<void> {
    while (!this.stopped) {
      let taken = 0;
      this.publisherKicked = false;
      if (this.o.link.connected) {
        try {
          taken = await withTransaction(this.o.pool, async (client) => {
            const { taken, due } = await store.takeDueDoorbells(client, PUBLISH_BATCH);
            await this.o.link.publish(due);
            return taken;
          });
        } catch (err) {
          if (!(err instanceof NatsUnavailableError)) this.host.logger.debug({ err: String(err) }, "publishing doorbells failed; they stay owed");
        }
      }
      if (taken >= PUBLISH_BATCH || this.publisherKicked) continue;
      let sleep = PUBLISH_POLL_MS;
      if (this.o.link.connected) {
        const next = await store.nextDoorbellIn(this.o.pool).catch(() => null);
        if (next !== null) sleep = Math.min(sleep, Math.max(10, next));
      }
      await new Promise<void>((resolve) => {
        const done = () => {
          clearTimeout(timer);
          this.wakePublisher = undefined;
          resolve();
        };
        const timer = setTimeout(done, sleep);
        this.wakePublisher = done;
      });
    }
  }

  /**
   * Doorbells lost inside NATS (a stream purged or recreated, a message past its limits):
   * when a consumer has nothing left to deliver but its jobs have been ready for a while,
   * they are owed again. A doorbell still in flight is at worst published twice: harmless.
   */
  private async findLostDoorbells(): Promise<void> {
    if (this.polling || !this.o.link.connected) return;
    for (const { queue, task } of this.pairs) {
      if ((await this.o.link.pendingOf(queue, task)) > 0) continue;
      const spells = await store.readySpellsOf(this.o.pool, { queue, task, olderThanMs: LOST_AFTER_MS, limit: PUBLISH_BATCH });
      if (spells.length === 0) continue;
      await store.oweDoorbellsAgain(this.o.pool, spells);
      this.host.logger.info({ queue, task, jobs: spells.length }, "ready jobs without a NATS message: publishing them again");
      this.kickPublisher();
    }
  }

  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    for (const t of this.timers) clearTimeout(t);
    this.offState?.();
    for (const f of this.fetches) f.stop();
    this.kick();
    this.wakePublisher?.();
    await Promise.all(this.loops);
    await Promise.all([...this.pulls]);
    await this.listener?.stop();
    if (this.polling) this.host.metrics.natsFallback.dec();
  }
}

/** The largest job id (ids are bigint): a larger one would fail the whole batch's claim statement. */
const MAX_JOB_ID = 9223372036854775807n;

/** Whether a message's body names a spell a claim can look up: a job id in bigint's range and an attempt. */
function isDoorbell(body: unknown): body is DoorbellMessage {
  if (typeof body !== "object" || body === null) return false;
  const { id, attempt } = body as Partial<DoorbellMessage>;
  return typeof id === "string" && /^[1-9][0-9]{0,18}$/.test(id) && BigInt(id) <= MAX_JOB_ID && Number.isSafeInteger(attempt) && attempt! >= 0;
}

/** A message's kind for the metrics, without judging the message (the claim does that). */
function doorbellKind(m: JsMsg): "new" | "recovery" {
  try {
    return m.json<DoorbellMessage>().recovery === true ? "recovery" : "new";
  } catch {
    return "new";
  }
}
