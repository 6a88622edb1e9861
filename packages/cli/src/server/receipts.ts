/**
 * Claim receipts. The worker id in a request is whatever the client says, so the fence
 * (job id, attempt, worker id) alone would let any client holding a token beat, finish or
 * release another worker's attempts by naming them. A claim therefore hands out, per job, a
 * receipt: an HMAC-SHA256 over (job id, attempt, worker id) with a server key. Every later
 * request about that attempt must carry it; a missing or wrong receipt refuses that attempt
 * before the database is asked. Only the claimer ever saw the receipt.
 *
 * The key is derived (HKDF-SHA256) from the configured receipt key, else from the operator
 * token, so replicas configured alike accept each other's receipts with no shared state.
 */
import { createHmac, hkdfSync, timingSafeEqual } from "node:crypto";

const SALT = "leasehold";
const INFO = "leasehold claim receipts v1";

/** A reference to one attempt, as requests carry it. */
export interface ReceiptRef {
  id: string;
  attempt: number;
  receipt?: string;
}

export class Receipts {
  private readonly key: Buffer;

  constructor(secret: string) {
    this.key = Buffer.from(hkdfSync("sha256", secret, SALT, INFO, 32));
  }

  sign(id: string, attempt: number, workerId: string): string {
    // id and attempt are digits, so the colon-joined text is unambiguous with the worker id last.
    return createHmac("sha256", this.key).update(`${id}:${attempt}:${workerId}`).digest("base64url");
  }

  verify(ref: ReceiptRef, workerId: string): boolean {
    const expected = Buffer.from(this.sign(ref.id, ref.attempt, workerId));
    const given = Buffer.from(typeof ref.receipt === "string" ? ref.receipt : "");
    // The length is public (every receipt has the same); the content is compared in constant time.
    return given.length === expected.length && timingSafeEqual(given, expected);
  }

  /** Splits a request's attempts into those with a valid receipt and those without. */
  check<T extends ReceiptRef>(items: T[], workerId: string): { valid: T[]; invalid: T[] } {
    const valid: T[] = [];
    const invalid: T[] = [];
    for (const item of items) (this.verify(item, workerId) ? valid : invalid).push(item);
    return { valid, invalid };
  }
}

export const INVALID_RECEIPT = "invalid_receipt";
export const INVALID_RECEIPT_MESSAGE = "missing or wrong receipt: send the receipt the claim returned for this attempt";
