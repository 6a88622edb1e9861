/**
 * NATS dispatch settings (docs/nats.md): defaults as named constants, validated where they
 * enter (Leasehold.connect, the CLI's --nats), and the JetStream names derived from them.
 * Nothing here loads the NATS client: a library without NATS never does.
 */
import { createHash } from "node:crypto";
import { ConfigError } from "leasehold/internal/errors";
import type { NatsOptions } from "leasehold/internal/worker/dispatch";

export type { NatsOptions };

export interface ResolvedNatsOptions {
  servers: string[];
  stream: string;
  ackWaitMs?: number;
  replicas: number;
}

export const DEFAULT_ACK_WAIT_MIN_MS = 60_000;
/** A message a worker received waits for its claim at most this long before it is given back. */
export const INBOX_MAX_AGE_MS = 5_000;
/** JetStream drops a second message with the same id within this window (each doorbell's id is its own). */
export const DUPLICATE_WINDOW_MS = 120_000;
/** The client publishes its new jobs itself; the dispatchers leave their doorbells alone this long. */
export const PUBLISH_GRACE_MS = 5_000;
/** A publish that gets no acknowledgement within this is a failure (the doorbell stays owed). */
export const PUBLISH_TIMEOUT_MS = 2_000;
/** NATS dispatch stays active this long after a NATS worker last renewed it. */
export const DISPATCH_ACTIVE_TTL_MS = 10 * 60_000;

const STREAM_NAME = /^[A-Za-z0-9_-]{1,64}$/;

/** The ack wait a worker with this lease uses when none is set. */
export function defaultAckWaitMs(leaseMs: number): number {
  return Math.max(DEFAULT_ACK_WAIT_MIN_MS, 2 * leaseMs);
}

export function resolveNatsOptions(input: string | NatsOptions, schema: string): ResolvedNatsOptions {
  const o: NatsOptions = typeof input === "string" ? { url: input } : input;
  if (!o || typeof o !== "object") throw new ConfigError("nats must be a URL or { url, stream?, ackWaitMs?, replicas? }");
  for (const key of Object.keys(o)) {
    if (!["url", "stream", "ackWaitMs", "replicas"].includes(key)) throw new ConfigError(`unknown nats option "${key}"`);
  }
  const stream = o.stream ?? `leasehold_${schema}`;
  if (typeof stream !== "string" || !STREAM_NAME.test(stream)) {
    throw new ConfigError(`nats stream must be 1-64 letters, digits, _ or - (got ${JSON.stringify(o.stream)})`);
  }
  if (o.ackWaitMs !== undefined && (!Number.isInteger(o.ackWaitMs) || o.ackWaitMs < 1_000 || o.ackWaitMs > 7 * 24 * 3600_000)) {
    throw new ConfigError(`nats ackWaitMs must be a whole number of milliseconds from 1000 to a week (got ${JSON.stringify(o.ackWaitMs)})`);
  }
  const replicas = o.replicas ?? 1;
  if (!Number.isInteger(replicas) || replicas < 1 || replicas > 5)
    throw new ConfigError(`nats replicas must be 1 to 5 (got ${JSON.stringify(o.replicas)})`);
  return { servers: parseNatsUrl(o.url), stream, ackWaitMs: o.ackWaitMs, replicas };
}

/**
 * nats:// or tls:// URLs, comma-separated. A bad value is refused here, not later as a
 * connection that never comes up; it is not echoed (it may hold a password).
 */
export function parseNatsUrl(url: unknown): string[] {
  const bad = () =>
    new ConfigError("the NATS URL must look like nats://host:4222 (or tls://, several separated by commas); the value given does not");
  if (typeof url !== "string" || url.trim() === "") throw bad();
  const servers = url.split(",").map((s) => s.trim());
  for (const s of servers) {
    let u: URL;
    try {
      u = new URL(s);
    } catch {
      throw bad();
    }
    if (!["nats:", "tls:"].includes(u.protocol) || !u.hostname || u.pathname.replace(/^\/$/, "") !== "" || u.search || u.hash) throw bad();
    if (u.port !== "" && !(Number(u.port) > 0 && Number(u.port) < 65536)) throw bad();
  }
  return servers;
}

/**
 * The rule that lets database recovery win over redelivery: JetStream must not deliver a
 * message again before the lease of a claim made from it could have run out.
 */
export function checkAckWait(ackWaitMs: number, leaseMs: number, where: string): void {
  if (ackWaitMs <= leaseMs) {
    throw new ConfigError(
      `${where}: ack_wait (${ackWaitMs} ms) must be longer than the lease (${leaseMs} ms), so that database recovery always wins over redelivery`,
    );
  }
}

/** A queue or task name as one subject token: letters, digits, _ and - as they are, the rest as ~XX. */
export function subjectToken(name: string): string {
  return name.replace(/[^A-Za-z0-9_-]/g, (c) => `~${c.charCodeAt(0).toString(16).toUpperCase().padStart(2, "0")}`);
}

/** The subject of one queue and task's doorbells. */
export function subjectOf(stream: string, queue: string, task: string): string {
  return `${stream}.${subjectToken(queue)}.${subjectToken(task)}`;
}

/**
 * The durable consumer of one queue and task. "~~" cannot occur inside a token (every ~
 * starts an escape of two hex digits), so the pair is unambiguous; names past what a file
 * name holds are shortened with a hash.
 */
export function consumerOf(queue: string, task: string): string {
  const name = `${subjectToken(queue)}~~${subjectToken(task)}`;
  if (name.length <= 200) return name;
  return `${name.slice(0, 100)}~~${createHash("sha256").update(`${queue}\n${task}`).digest("hex").slice(0, 32)}`;
}
