/**
 * Bearer-token authentication. Both sides are hashed first so the comparison runs over
 * equal-length digests in constant time: neither the token's content nor its length leaks
 * through response timing.
 */
import { createHash, timingSafeEqual } from "node:crypto";
import { ConfigError } from "leasehold/internal/errors";

/** A token shorter than this is refused at start-up: it could be guessed. */
export const MIN_TOKEN_LENGTH = 16;

/**
 * A bearer token travels in an HTTP header as one word: whitespace would split it, control
 * characters are not allowed in headers, and other bytes than ASCII arrive differently
 * depending on the client. Such a token would start a server nobody can authenticate to.
 */
const SENDABLE = /^[\x21-\x7e]+$/;

export function checkToken(token: string | undefined, what = "the API token", source = "LEASEHOLD_TOKEN or pass --token"): string {
  if (!token) throw new ConfigError(`the server needs ${what}: set ${source}`);
  if (token.length < MIN_TOKEN_LENGTH) {
    throw new ConfigError(`${what} must be at least ${MIN_TOKEN_LENGTH} characters long`);
  }
  if (!SENDABLE.test(token)) {
    throw new ConfigError(`${what} must be printable ASCII without spaces or control characters (it is sent as one word in a header)`);
  }
  return token;
}

const digest = (s: string) => createHash("sha256").update(s).digest();

/**
 * Three scopes: the operator token may use every route; the optional worker token only the
 * remote workers' routes (/v1/worker/*), so a worker host cannot enqueue, cancel or read jobs;
 * the optional viewer token may only read the operator's routes (GET and HEAD), and is not
 * shown what users put in jobs (user-data.ts), for a dashboard shown to a wide audience.
 */
export type Scope = "operator" | "worker" | "viewer";

/** Returns the scope an `Authorization` header value grants, if any. */
export function scopeMatcher(tokens: { operator: string; worker?: string; viewer?: string }): (header: string | undefined) => Scope | undefined {
  const operator = digest(tokens.operator);
  const worker = tokens.worker === undefined ? undefined : digest(tokens.worker);
  const viewer = tokens.viewer === undefined ? undefined : digest(tokens.viewer);
  return (header) => {
    const match = /^Bearer\s+(\S+)\s*$/i.exec(header ?? "");
    // Hash and compare against every token even when the header is missing, so every path costs the same.
    const given = digest(match?.[1] ?? "");
    const isOperator = timingSafeEqual(given, operator);
    const isWorker = worker !== undefined && timingSafeEqual(given, worker);
    const isViewer = viewer !== undefined && timingSafeEqual(given, viewer);
    if (match === null) return undefined;
    return isOperator ? "operator" : isWorker ? "worker" : isViewer ? "viewer" : undefined;
  };
}

declare module "fastify" {
  interface FastifyContextConfig {
    /** No token needed (GET /healthz). */
    public?: boolean;
    /** "worker": the worker token may use this route too; otherwise only the operator token. */
    scope?: Scope;
  }
}
