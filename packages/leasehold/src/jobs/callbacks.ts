/**
 * Callback tokens (docs/durable-callbacks.md): the credential that completes one callback's
 * wait. 256 random bits, base64url (43 characters). The wait is for the event named from the
 * token's SHA-256, so events, a job's `wait` and logs never hold the token itself.
 */
import { createHash, randomBytes } from "node:crypto";
import { ValidationError } from "../errors.js";

const TOKEN = /^[A-Za-z0-9_-]{43}$/;

export function newCallbackToken(): string {
  return randomBytes(32).toString("base64url");
}

/** The event a callback's wait is for (complete_callback() in migration 030 names it alike). */
export function callbackEvent(token: string): string {
  return `callback:${createHash("sha256").update(token).digest("hex")}`;
}

export function checkCallbackToken(token: unknown, where: string): asserts token is string {
  if (typeof token !== "string" || !TOKEN.test(token)) {
    throw new ValidationError(`${where}: a callback token is 43 base64url characters (as ctx.callback hands it out)`);
  }
}

/** A token shortened for logs and messages: enough to tell two apart, useless to complete one. */
export function tokenHint(token: string): string {
  return `${token.slice(0, 6)}…`;
}

/** The URL that completes a callback on `leasehold serve` at `baseUrl` (POST /v1/callbacks/:token). */
export function callbackUrl(baseUrl: string, token: string): string {
  const base = baseUrl.endsWith("/") ? baseUrl : `${baseUrl}/`;
  return new URL(`v1/callbacks/${token}`, base).href;
}
