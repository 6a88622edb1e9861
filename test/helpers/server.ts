/**
 * Helpers for tests of `leasehold serve`: HTTP calls with a bearer token, raw sockets for
 * what fetch cannot do (slow bodies, half-sent headers), remote workers, and TCP proxies
 * that lose a claim response or count the statements the server sends to PostgreSQL.
 */
import http from "node:http";
import net from "node:net";
import { Registry } from "prom-client";
import { RemoteTransport } from "../../packages/leasehold/src/worker/remote-transport.js";
import { Worker } from "../../packages/leasehold/src/worker/worker.js";
import type { TaskHandlers } from "../../packages/leasehold/src/worker/context.js";
import { silent } from "./db.js";
import { startCli } from "./cli.js";

export const TOKEN = "test-token-0123456789abcdef";

export interface ApiResult {
  status: number;
  json: any;
  text: string;
  headers: Headers;
}

export async function api(
  base: string,
  method: string,
  path: string,
  body?: unknown,
  headers: Record<string, string> = { authorization: `Bearer ${TOKEN}` },
): Promise<ApiResult> {
  const res = await fetch(base + path, {
    method,
    headers: { ...headers, ...(body !== undefined && { "content-type": "application/json" }) },
    body: body === undefined ? undefined : typeof body === "string" ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json: any;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, json, text, headers: res.headers };
}

/**
 * Announces a body of `bytes` and sends only its headers: the server must refuse on the
 * announced length (a real client that kept writing could see its connection reset instead).
 */
export function postAnnouncing(base: string, path: string, bytes: number): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request(base + path, {
      method: "POST",
      headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json", "content-length": String(bytes) },
    });
    req.on("response", (res) => {
      let text = "";
      res.on("data", (b: Buffer) => (text += b.toString()));
      res.on("end", () => {
        req.destroy();
        resolve({ status: res.statusCode!, text });
      });
    });
    req.on("error", reject);
    req.flushHeaders();
  });
}

export function remoteWorker(
  serverUrl: string,
  handlers: TaskHandlers,
  extra: { leaseMs?: number; concurrency?: number; requestTimeoutMs?: number; token?: string } = {},
): Worker {
  return new Worker({
    handlers,
    leaseMs: extra.leaseMs ?? 3_000,
    concurrency: extra.concurrency ?? 5,
    logger: silent,
    metricsRegistry: new Registry(),
    transport: new RemoteTransport({ serverUrl, token: extra.token ?? TOKEN, waitMs: 500, requestTimeoutMs: extra.requestTimeoutMs ?? 5_000 }),
  });
}

/** A `leasehold serve` on a free port of this schema; `env` may override the token and DATABASE_URL. */
export function startServe(schema: string, extra: string[] = [], env: Record<string, string | undefined> = {}) {
  return startCli(["serve", "--port", "0", "--watchdog-interval", "200", ...extra], {
    schema,
    env: { LEASEHOLD_TOKEN: TOKEN, LEASEHOLD_LOG_LEVEL: "warn", ...env },
    ready: /listening on (http:\/\/[^\s]+)/,
  });
}

/** A TCP proxy that loses the first claim response carrying jobs: the server sent it, the worker never gets it. */
export async function claimDroppingProxy(port: number) {
  let dropped = 0;
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const upstream = net.connect(port, "127.0.0.1");
    sockets.add(client).add(upstream);
    let dropping = false;
    client.on("data", (d) => upstream.write(d));
    upstream.on("data", (d) => {
      if (dropped === 0 && d.toString().includes('"jobs":[{')) {
        dropping = true;
        dropped++;
      }
      if (!dropping) client.write(d);
    });
    client.on("error", () => upstream.destroy());
    upstream.on("error", () => client.destroy());
    client.on("close", () => upstream.destroy());
    upstream.on("close", () => client.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`,
    dropped: () => dropped,
    close: () => {
      for (const socket of sockets) socket.destroy();
      return new Promise((r) => server.close(r));
    },
  };
}

/** A raw TCP connection to the server: what arrives, and when it closed. */
export function rawConnection(base: string) {
  const url = new URL(base);
  const socket = net.connect(Number(url.port), url.hostname);
  const opened = Date.now();
  let received = "";
  let closedAfterMs: number | undefined;
  socket.on("data", (b: Buffer) => (received += b.toString("latin1")));
  socket.on("error", () => {});
  const closed = new Promise<number>((resolve) =>
    socket.on("close", () => {
      closedAfterMs = Date.now() - opened;
      resolve(closedAfterMs);
    }),
  );
  return {
    socket,
    received: () => received,
    isClosed: () => closedAfterMs !== undefined,
    closed,
    /** Writes `text` one character every `everyMs` until it is all sent or the socket closes. */
    trickle(text: string, everyMs: number): Promise<void> {
      return new Promise((resolve) => {
        let i = 0;
        const timer = setInterval(() => {
          if (socket.destroyed || i >= text.length) {
            clearInterval(timer);
            return resolve();
          }
          socket.write(text[i++]!);
        }, everyMs);
      });
    },
  };
}

/**
 * A TCP proxy in front of PostgreSQL that counts the statements its clients run: simple
 * queries ('Q') and extended-protocol executions ('E'), read from the client's byte stream.
 * Each is also named (`ranSince`), so a count that is too high says what ran. It also counts
 * the bytes PostgreSQL sends its clients (`bytesFromDatabase`): what a client read, whatever it kept.
 */
export async function statementCountingProxy(databaseUrl: string) {
  const target = new URL(databaseUrl);
  let statements = 0;
  let fromDatabase = 0;
  const ran: string[] = [];
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const upstream = net.connect(Number(target.port || 5432), target.hostname);
    sockets.add(client).add(upstream);
    let pending = Buffer.alloc(0);
    let parsed: string[] = [];
    let started = false; // the startup message has no type byte
    client.on("data", (chunk: Buffer) => {
      upstream.write(chunk);
      pending = Buffer.concat([pending, chunk]);
      for (;;) {
        if (!started) {
          if (pending.length < 4 || pending.length < pending.readInt32BE(0)) break;
          pending = pending.subarray(pending.readInt32BE(0));
          started = true;
          continue;
        }
        if (pending.length < 5 || pending.length < 1 + pending.readInt32BE(1)) break;
        const type = String.fromCharCode(pending[0]!);
        if (type === "Q" || type === "E") statements++;
        // What ran, for a failing count's message: a simple query's text, or the prepared
        // statement a Bind names (the unnamed one: its Parse's text).
        const body = pending.subarray(5, 1 + pending.readInt32BE(1));
        if (type === "Q") ran.push(body.toString("utf8", 0, Math.min(body.length - 1, 80)));
        if (type === "P") parsed = body.toString("utf8").split("\0");
        if (type === "B") ran.push(body.toString("utf8").split("\0")[1] || parsed[1]!.slice(0, 80));
        pending = pending.subarray(1 + pending.readInt32BE(1));
      }
    });
    upstream.on("data", (d: Buffer) => {
      fromDatabase += d.length;
      client.write(d);
    });
    const close = () => {
      client.destroy();
      upstream.destroy();
    };
    client.on("error", close).on("close", close);
    upstream.on("error", close).on("close", close);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const proxied = new URL(databaseUrl);
  proxied.hostname = "127.0.0.1";
  proxied.port = String((server.address() as net.AddressInfo).port);
  return {
    url: proxied.toString(),
    statements: () => statements,
    bytesFromDatabase: () => fromDatabase,
    /** What ran since the `from`-th statement: each one's text (cut short) or prepared statement's name. */
    ranSince: (from: number) => ran.slice(from),
    close: () => {
      for (const socket of sockets) socket.destroy();
      return new Promise((r) => server.close(r));
    },
  };
}
