/**
 * A dedicated session that survives terminated backends and database restarts: it LISTENs
 * for wake-ups and (for a worker) holds session-level state, such as its liveness lock,
 * which `onConnect` sets up again on every new session. Notifications sent while it was
 * disconnected are lost, so after every (re)connect it calls `onNotify(undefined)` (and each
 * of `also`'s handlers with undefined): the worker polls (and checks its cancels) at once.
 *
 * Reconnects back off from 100 ms to at most a second, so a worker is back within about a
 * second of the database, and an outage costs one attempt per second.
 */
import pg from "pg";
import { LeaseholdError } from "../errors.js";
import { isConnectionError } from "../store/db.js";

const RECONNECT_MIN_MS = 100;
/** A first session that cannot be had for this long (the database is down) fails start(). */
const FIRST_CONNECT_MAX_MS = 30_000;
export const RECONNECT_MAX_MS = 1_000;

export interface ListenerOptions {
  connectionString: string;
  channel: string;
  onNotify: (payload: string | undefined) => void;
  /** More channels heard on the same session, each with its own handler (undefined: notices may have been missed). */
  also?: Record<string, (payload: string | undefined) => void>;
  /**
   * Runs on every new session before LISTEN. A LeaseholdError it throws (e.g. the worker's
   * name is taken) stops the listener: reconnecting cannot help.
   */
  onConnect?: (client: pg.Client) => Promise<void>;
  onFatal?: (err: Error) => void;
  /** Session state changes, for outage logging: up after a (re)connect, down on loss. */
  /**
   * The session went down or came back. `lateByMs`: how long before now it may already have
   * ended unnoticed (a silent session; or this process was stopped, so its pings stopped too).
   */
  onState?: (state: "up" | "down", err?: unknown, lateByMs?: number) => void;
  applicationName?: string;
  /** Session settings, e.g. the search_path `onConnect` needs. */
  sessionOptions?: string;
  /**
   * Proves the session alive while `when()` says it matters: a session can end on the server
   * (its backend terminated, its lock released) while this end hears nothing (a proxy or NAT
   * that stopped forwarding). A ping unanswered within `timeoutMs` ends the session as down
   * with a SilentSessionError, and a new one is made.
   */
  ping?: { everyMs: number; timeoutMs: number; when: () => boolean };
}

/** The session did not answer a ping in time: it may have ended on the server long before. */
export class SilentSessionError extends Error {
  /** The session may have ended this long before it was found silent (a ping interval and its timeout). */
  readonly lateByMs: number;
  constructor(ping: { everyMs: number; timeoutMs: number }) {
    super(`the session did not answer a ping within ${ping.timeoutMs} ms`);
    this.lateByMs = ping.everyMs + ping.timeoutMs;
    this.name = "SilentSessionError";
  }
}

export class Listener {
  private client?: pg.Client;
  private stopped = false;
  private reconnectTimer?: NodeJS.Timeout;
  private pingTimer?: NodeJS.Timeout;
  private delayMs = RECONNECT_MIN_MS;
  /** When the session last proved alive (connected, or answered a ping): monotonic ms. */
  private heardAt = performance.now();
  private firstConnect?: { resolve: () => void; reject: (err: unknown) => void; since: number };

  constructor(private readonly options: ListenerOptions) {}

  /** Resolves once the first session is set up; rejects if `onConnect` fails fatally. */
  start(): Promise<void> {
    return new Promise((resolve, reject) => {
      this.firstConnect = { resolve, reject, since: Date.now() };
      void this.connect();
    });
  }

  private async connect(): Promise<void> {
    if (this.stopped) return;
    const o = this.options;
    const client = new pg.Client({
      connectionString: o.connectionString,
      application_name: o.applicationName ?? "leasehold-listen",
      options: o.sessionOptions,
    });
    this.client = client;
    client.on("notification", (msg) => {
      if (msg.channel === o.channel) o.onNotify(msg.payload);
      else o.also?.[msg.channel]?.(msg.payload);
    });
    client.on("error", (err) => this.scheduleReconnect(client, err));
    client.on("end", () => this.scheduleReconnect(client));
    try {
      await client.connect();
      await o.onConnect?.(client);
      // One round trip for every channel (the simple protocol runs them in order).
      await client.query([o.channel, ...Object.keys(o.also ?? {})].map((c) => `LISTEN ${pg.escapeIdentifier(c)}`).join("; "));
    } catch (err) {
      const first = this.firstConnect;
      // At start, a wrong password or database is not worth retrying, nor a long outage.
      const giveUp = first && (!isConnectionError(err) || Date.now() - first.since > FIRST_CONNECT_MAX_MS);
      if (err instanceof LeaseholdError || giveUp) {
        this.stopped = true;
        await client.end().catch(() => {});
        this.firstConnect = undefined;
        if (first) first.reject(err);
        else o.onFatal?.(err as Error);
        return;
      }
      this.scheduleReconnect(client, err);
      return;
    }
    this.delayMs = RECONNECT_MIN_MS;
    this.heardAt = performance.now();
    this.schedulePing(client);
    o.onState?.("up");
    this.firstConnect?.resolve();
    this.firstConnect = undefined;
    o.onNotify(undefined);
    for (const handler of Object.values(o.also ?? {})) handler(undefined);
  }

  private schedulePing(client: pg.Client): void {
    const ping = this.options.ping;
    if (!ping) return;
    this.pingTimer = setTimeout(() => {
      if (this.stopped || client !== this.client) return;
      if (!ping.when()) return this.schedulePing(client);
      let answered = false;
      // A failed query ends the session through the client's own error event.
      client.query("SELECT 1").then(
        () => {
          answered = true;
          this.heardAt = performance.now();
        },
        () => {},
      );
      // Judged after the event loop's next I/O phase (setImmediate): when a long synchronous
      // handler blocked this process, the answer waits unread in the socket while the timer is
      // already due, and must not be taken for silence.
      this.pingTimer = setTimeout(
        () =>
          setImmediate(() => {
            if (this.stopped || client !== this.client) return;
            if (!answered) return this.scheduleReconnect(client, new SilentSessionError(ping));
            this.schedulePing(client);
          }),
        ping.timeoutMs,
      );
      this.pingTimer.unref();
    }, ping.everyMs);
    this.pingTimer.unref();
  }

  private scheduleReconnect(client: pg.Client, err?: unknown): void {
    if (this.stopped || client !== this.client || this.reconnectTimer) return;
    // Pinged every everyMs, a live session is heard from at least that often (plus the answer's
    // time): a longer silence means this process was stopped (SIGSTOP, a VM pause) and the
    // session may have ended any time since it was last heard from.
    const ping = this.options.ping;
    const silentFor = ping && ping.when() ? performance.now() - this.heardAt - ping.everyMs - ping.timeoutMs : 0;
    const late = err instanceof SilentSessionError ? err.lateByMs : Math.max(0, silentFor);
    this.options.onState?.("down", err, late);
    client.end().catch(() => {});
    this.reconnectTimer = setTimeout(() => {
      this.reconnectTimer = undefined;
      void this.connect();
    }, this.delayMs);
    this.delayMs = Math.min(this.delayMs * 2, RECONNECT_MAX_MS);
  }

  /** Runs a statement on the session (e.g. a graceful goodbye before stop). */
  async query(text: string, values?: unknown[]): Promise<void> {
    await this.client?.query(text, values);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.reconnectTimer) clearTimeout(this.reconnectTimer);
    clearTimeout(this.pingTimer);
    // A start still connecting ends now (the caller stops before it was ever up).
    this.firstConnect?.resolve();
    this.firstConnect = undefined;
    await this.client?.end().catch(() => {});
  }
}
