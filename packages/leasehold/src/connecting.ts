/**
 * Reaching the database at `connect()`: a failure to connect becomes one DatabaseUnavailableError
 * naming the host and port (the driver's error is its cause), and the optional `connectRetry`
 * waits, visibly, for a database that is not up yet (a container started beside it, a restart).
 */
import { ConfigError, DatabaseUnavailableError } from "./errors.js";
import { integerIn } from "./jobs/validate.js";
import type { Logger } from "./logger.js";

export interface ConnectRetryOptions {
  /** Keep trying for up to this long (ms, 1 to 3,600,000); then connect fails with DatabaseUnavailableError. */
  timeoutMs: number;
  /** Called before each wait (besides a `warn` on the client's logger). */
  onRetry?: (retry: ConnectRetry) => void;
}

export interface ConnectRetry {
  /** 1 for the wait after the first failed try. */
  attempt: number;
  /** How long connect now waits before trying again. */
  delayMs: number;
  /** Since connect began trying. */
  elapsedMs: number;
  /** Why the last try failed. */
  error: DatabaseUnavailableError;
}

const FIRST_DELAY_MS = 100;
const MAX_DELAY_MS = 2_000;

export function checkConnectRetry(value: unknown): ConnectRetryOptions | undefined {
  if (value === undefined) return undefined;
  const given = value as Partial<ConnectRetryOptions> | null;
  if (typeof given !== "object" || given === null) throw new ConfigError("connectRetry must be an object like { timeoutMs: 30_000 }");
  const timeoutMs = integerIn(given.timeoutMs, 1, 3_600_000, "connectRetry.timeoutMs");
  if (given.onRetry !== undefined && typeof given.onRetry !== "function") throw new ConfigError("connectRetry.onRetry must be a function");
  return { timeoutMs, onRetry: given.onRetry };
}

/**
 * Runs `fn` (connect's first use of the database). A failure to reach the database is tried
 * again while `retry` allows and only if it may pass (refused, reset, the server starting or
 * shutting down); it ends as a DatabaseUnavailableError. Other errors pass through unchanged.
 */
export async function reachingDatabase<T>(url: string, retry: ConnectRetryOptions | undefined, logger: Logger, fn: () => Promise<T>): Promise<T> {
  const target = describeTarget(url);
  const started = Date.now();
  for (let attempt = 1, delayMs = FIRST_DELAY_MS; ; attempt++, delayMs = Math.min(delayMs * 2, MAX_DELAY_MS)) {
    try {
      return await fn();
    } catch (err) {
      if (!isUnreachable(err)) throw err;
      const elapsedMs = Date.now() - started;
      const waitMs = retry ? Math.min(delayMs, started + retry.timeoutMs - Date.now()) : 0;
      if (!retry || !mayPass(err) || waitMs <= 0) {
        const gaveUp = retry && mayPass(err) ? ` (still failing after ${elapsedMs} ms of connectRetry)` : "";
        throw unavailable(target, err, gaveUp);
      }
      const error = unavailable(target, err, "");
      logger.warn({ target, attempt, delayMs: waitMs, elapsedMs, err: error.message }, "database not reachable yet; connect tries again");
      retry.onRetry?.({ attempt, delayMs: waitMs, elapsedMs, error });
      await new Promise((r) => setTimeout(r, waitMs));
    }
  }
}

function unavailable(target: string, err: unknown, suffix: string): DatabaseUnavailableError {
  return new DatabaseUnavailableError(target, `cannot reach the database at ${target}: ${oneLine(err)}${suffix}`, { cause: err });
}

/** host:port (or the socket directory) of a postgres:// URL; never its user or password. */
export function describeTarget(url: string): string {
  if (url.startsWith("/")) return url;
  try {
    const parsed = new URL(url);
    const host = parsed.searchParams.get("host") ?? (decodeURIComponent(parsed.hostname) || "localhost");
    if (host.startsWith("/")) return host;
    return `${host}:${parsed.searchParams.get("port") ?? (parsed.port || "5432")}`;
  } catch {
    return "the database URL";
  }
}

/** Could not connect at all: the network, DNS, or the server refusing the login or database. */
function isUnreachable(err: unknown): boolean {
  const code = (err as { code?: unknown })?.code;
  return mayPass(err) || code === "ENOTFOUND" || code === "EAI_AGAIN" || code === "28P01" || code === "28000" || code === "3D000";
}

/**
 * A server down, going down or coming up: refused, reset or timed-out connections, shutdown and
 * start-up (57P01-57P03). Not a protocol error (a pooler refusing a start-up parameter answers
 * 08P01), a wrong password, nor a host that does not resolve: waiting would not help.
 */
function mayPass(err: unknown): boolean {
  const { code, message } = (err ?? {}) as { code?: unknown; message?: unknown };
  if (typeof code === "string" && /^(ECONNREFUSED|ECONNRESET|EPIPE|ETIMEDOUT|EHOSTUNREACH|ENETUNREACH|57P0[1-3])$/.test(code)) return true;
  return typeof message === "string" && /Connection terminated|timeout exceeded when trying to connect/.test(message);
}

function oneLine(err: unknown): string {
  const e = err as { message?: string; errors?: { message?: string }[] };
  // An AggregateError (ECONNREFUSED on both ::1 and 127.0.0.1) has an empty message of its own.
  const text = e?.message || e?.errors?.map((x) => x.message).join("; ") || String(err);
  return text.split("\n")[0]!.trim();
}

/**
 * libpq-style URLs (postgres://, postgresql://) or a socket path. Anything else fails here with
 * a usage error rather than later as a connection failure. The value is not echoed: it may
 * hold a password.
 */
export function checkDatabaseUrl(url: string, what = "the database URL"): void {
  if (!/^(postgres|postgresql|socket):\/\/|^\//i.test(url)) {
    throw new ConfigError(`${what} must look like postgres://user:password@host:5432/database (the value given does not)`);
  }
}
