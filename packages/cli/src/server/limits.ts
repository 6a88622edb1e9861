/**
 * What one client may cost the server: how long a request may take to arrive, how long an
 * idle connection is kept, how many connections and waiting long polls there may be, and
 * how large an answer may grow. Defaults are named here; `leasehold serve` has flags for the
 * ones an operator may need to change.
 */
import type http from "node:http";
import { ConfigError, ValidationError } from "leasehold/internal/errors";
import { DEFAULT_MAX_RESULT_BYTES, MAX_RESULT_BYTES_LIMIT } from "leasehold/internal/jobs/validate";
import { boundIdleConnections } from "./idle-connections.js";
import { PARENTS_PAGE_BYTES } from "leasehold/internal/store/index";
import { MAX_WAIT_MS } from "./schemas.js";

/** Default request body limit: a batch of jobs; one payload may be up to 1 MiB. */
export const DEFAULT_BODY_LIMIT_BYTES = 4 * 1024 * 1024;
/** A request's headers and body must have arrived within this (a slow sender is cut with 408). */
export const DEFAULT_REQUEST_TIMEOUT_MS = 30_000;
/**
 * The headers alone must have arrived within this (or the request timeout, if shorter): a
 * connection that sent no complete request in this time is closed. Any real client sends its
 * headers at once; only a silent or trickling one, which has shown no token, waits here.
 */
export const DEFAULT_HEADERS_TIMEOUT_MS = 5_000;
/** An idle kept-alive connection is closed after this. */
export const DEFAULT_KEEP_ALIVE_TIMEOUT_MS = 10_000;
/**
 * A connection on which nothing moves for this long is closed (e.g. a client that stopped
 * reading its answer). A long poll is silent while it waits, so this is longer than the
 * longest wait a claim may ask for.
 */
export const SOCKET_IDLE_TIMEOUT_MS = MAX_WAIT_MS + 30_000;
/** Open connections beyond this are closed as they arrive. */
export const DEFAULT_MAX_CONNECTIONS = 1_000;
/**
 * Idle connections one client address may hold (none being answered: silent, or kept alive
 * between requests); opening more closes its oldest idle one. See idle-connections.ts.
 */
export const DEFAULT_MAX_IDLE_PER_ADDRESS = 64;
/** Claims waiting at once; beyond this a claim answers at once with what it finds. */
export const DEFAULT_MAX_LONG_POLLS = 500;
/** Largest claim answer: the claim stops at it, in its statement (always at least one job). */
export const MAX_CLAIM_RESPONSE_BYTES = 8 * 1024 * 1024;
/** Largest list answer: the page ends early and `next` continues it (always at least one job). */
export const MAX_LIST_RESPONSE_BYTES = 8 * 1024 * 1024;
/** Largest page of a job's parents (ctx.parents()): `next` continues it (always at least one parent). */
export const MAX_PARENTS_RESPONSE_BYTES = PARENTS_PAGE_BYTES;
/** Largest page of a job's recorded steps (a remote replay's load): `next` continues it (always at least one step). */
export const MAX_STEPS_RESPONSE_BYTES = 8 * 1024 * 1024;

/**
 * Leases remote workers may ask for, fleet-wide: a worker cannot hold a job for 24 hours
 * without a word (too long a lease delays recovery when it dies) nor ask for a lease shorter
 * than its beats can keep alive across this network.
 */
export const DEFAULT_MIN_LEASE_MS = 2_000;
export const DEFAULT_MAX_LEASE_MS = 3_600_000;

export interface LeaseBounds {
  minLeaseMs: number;
  maxLeaseMs: number;
}

/** A remote worker's lease outside the server's bounds is refused (400), naming them. */
export function checkLease(leaseMs: number, bounds: LeaseBounds): void {
  if (leaseMs < bounds.minLeaseMs || leaseMs > bounds.maxLeaseMs) {
    throw new ValidationError(
      `leaseMs ${leaseMs} is outside this server's bounds for remote workers: ${bounds.minLeaseMs} to ${bounds.maxLeaseMs} ms ` +
        "(leasehold serve --min-lease/--max-lease)",
    );
  }
}

export interface ServerLimits extends LeaseBounds {
  bodyLimitBytes: number;
  requestTimeoutMs: number;
  headersTimeoutMs: number;
  keepAliveTimeoutMs: number;
  maxConnections: number;
  maxIdlePerAddress: number;
  maxLongPolls: number;
  /** The largest result a remote worker may report (serialised); a larger one ends its job dead. */
  maxResultBytes: number;
}

export function resolveLimits(given: Partial<ServerLimits> = {}): ServerLimits {
  const limits: ServerLimits = {
    bodyLimitBytes: given.bodyLimitBytes ?? DEFAULT_BODY_LIMIT_BYTES,
    requestTimeoutMs: given.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS,
    headersTimeoutMs: given.headersTimeoutMs ?? DEFAULT_HEADERS_TIMEOUT_MS,
    keepAliveTimeoutMs: given.keepAliveTimeoutMs ?? DEFAULT_KEEP_ALIVE_TIMEOUT_MS,
    maxConnections: given.maxConnections ?? DEFAULT_MAX_CONNECTIONS,
    maxIdlePerAddress: given.maxIdlePerAddress ?? DEFAULT_MAX_IDLE_PER_ADDRESS,
    maxLongPolls: given.maxLongPolls ?? DEFAULT_MAX_LONG_POLLS,
    minLeaseMs: given.minLeaseMs ?? DEFAULT_MIN_LEASE_MS,
    maxLeaseMs: given.maxLeaseMs ?? DEFAULT_MAX_LEASE_MS,
    maxResultBytes: given.maxResultBytes ?? DEFAULT_MAX_RESULT_BYTES,
  };
  const check = (name: keyof ServerLimits, min: number, max: number) => {
    const v = limits[name];
    if (!Number.isInteger(v) || v < min || v > max) throw new ConfigError(`${name} must be an integer from ${min} to ${max} (got ${v})`);
  };
  check("bodyLimitBytes", 1024, 256 * 1024 * 1024);
  check("requestTimeoutMs", 100, 600_000);
  check("headersTimeoutMs", 100, 600_000);
  check("keepAliveTimeoutMs", 100, 600_000);
  check("maxConnections", 1, 1_000_000);
  check("maxIdlePerAddress", 1, 1_000_000);
  check("maxLongPolls", 0, 1_000_000);
  check("minLeaseMs", 1_000, 86_400_000);
  check("maxLeaseMs", limits.minLeaseMs, 86_400_000);
  check("maxResultBytes", 1, MAX_RESULT_BYTES_LIMIT);
  return limits;
}

function headersTimeoutOf(limits: ServerLimits): number {
  return Math.min(limits.headersTimeoutMs, limits.requestTimeoutMs);
}

/** The fastify (and node:http) options that enforce the limits above. */
export function serverOptions(limits: ServerLimits) {
  const headersTimeout = headersTimeoutOf(limits);
  return {
    bodyLimit: limits.bodyLimitBytes,
    // Counts until the whole request has arrived; a long poll waits after that, so it is not cut.
    requestTimeout: limits.requestTimeoutMs,
    keepAliveTimeout: limits.keepAliveTimeoutMs,
    connectionTimeout: SOCKET_IDLE_TIMEOUT_MS,
    http: {
      headersTimeout,
      // node checks the two timeouts above only this often (30 s by default).
      connectionsCheckingInterval: Math.min(1_000, Math.ceil(headersTimeout / 2)),
    } satisfies http.ServerOptions,
  };
}

/**
 * Closes connections beyond the cap as they arrive (`onDrop` counts them), and an address's
 * oldest idle connection when it holds more than its share (`onEvict`).
 */
export function capConnections(server: http.Server, limits: ServerLimits, onDrop: () => void, onEvict: () => void): void {
  server.maxConnections = limits.maxConnections;
  server.on("drop", onDrop);
  boundIdleConnections(server, { firstRequestMs: headersTimeoutOf(limits), maxIdlePerAddress: limits.maxIdlePerAddress }, onEvict);
}
