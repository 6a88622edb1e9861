/**
 * Bearer-token authentication. Both sides are hashed first so the comparison runs over
 * equal-length digests in constant time: neither the token's content nor its length leaks
 * through response timing.
 */
import { createHash, timingSafeEqual } from "node:crypto";
import { ConfigError } from "../errors.js";

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

/** Returns a matcher for `Authorization` header values. */
export function bearerMatcher(token: string): (header: string | undefined) => boolean {
  const expected = digest(token);
  return (header) => {
    const match = /^Bearer\s+(\S+)\s*$/i.exec(header ?? "");
    // Hash something even when the header is missing, so both paths cost the same.
    return timingSafeEqual(digest(match?.[1] ?? ""), expected) && match !== null;
  };
}
