/**
 * Bearer-token authentication. Both sides are hashed first so the comparison runs over
 * equal-length digests in constant time: neither the token's content nor its length leaks
 * through response timing.
 */
import { createHash, timingSafeEqual } from "node:crypto";
import { ConfigError } from "../errors.js";

/** A token shorter than this is refused at start-up: it could be guessed. */
export const MIN_TOKEN_LENGTH = 16;

export function checkToken(token: string | undefined): string {
  if (!token) throw new ConfigError("the server needs an API token: set LEASEHOLD_TOKEN or pass --token");
  if (token.length < MIN_TOKEN_LENGTH) {
    throw new ConfigError(`the API token must be at least ${MIN_TOKEN_LENGTH} characters long`);
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
