/**
 * Worker identity proofs. A worker token is shared by a fleet, and a request's worker id is
 * whatever the client says, so the token alone cannot tell one worker from another. Attach
 * therefore hands the attaching worker a proof: an HMAC-SHA256 over its worker id and its
 * name with a server key. The routes that act on a worker as a whole rather than on an
 * attempt (detach, reconcile, the cancel long poll) require it; only the process that
 * attached ever saw it. Attempts are proven by claim receipts (receipts.ts) instead.
 *
 * The key is derived from the same secret as the receipts' key, with its own HKDF info, so a
 * receipt is never a valid proof and replicas configured alike accept each other's proofs.
 */
import { createHmac, hkdfSync, timingSafeEqual } from "node:crypto";
import { LeaseholdError } from "leasehold/internal/errors";

const SALT = "leasehold";
const INFO = "leasehold worker identity v1";

/** What a valid proof says: the worker was attached with this name (undefined: none). */
export interface ProvenIdentity {
  name: string | undefined;
}

export class WorkerIdentities {
  private readonly key: Buffer;

  constructor(secret: string) {
    this.key = Buffer.from(hkdfSync("sha256", secret, SALT, INFO, 32));
  }

  /**
   * The proof for a worker id attached with `name`: "<mac>" or "<mac>.<name>", opaque to the
   * worker, which sends it back as it got it. The name rides along so that the routes need not
   * be told it again; a base64url MAC holds no ".".
   */
  issue(workerId: string, name: string | undefined): string {
    const mac = this.mac(workerId, name);
    return name === undefined ? mac : `${mac}.${name}`;
  }

  /** The identity `proof` was issued for with `workerId`, or undefined if it was not issued by this key for it. */
  verify(proof: string, workerId: string): ProvenIdentity | undefined {
    const dot = proof.indexOf(".");
    const name = dot < 0 ? undefined : proof.slice(dot + 1);
    const expected = Buffer.from(this.mac(workerId, name));
    const given = Buffer.from(dot < 0 ? proof : proof.slice(0, dot));
    // The length is public (every MAC has the same); the content is compared in constant time.
    return given.length === expected.length && timingSafeEqual(given, expected) ? { name } : undefined;
  }

  private mac(workerId: string, name: string | undefined): string {
    // JSON keeps the two apart whatever characters the worker id holds.
    return createHmac("sha256", this.key)
      .update(JSON.stringify([workerId, name ?? null]))
      .digest("base64url");
  }
}

/** 403: the caller did not prove it is the worker it names. */
export class InvalidIdentityError extends LeaseholdError {
  constructor(workerId: string, what: string) {
    super(
      "invalid_identity",
      `${what} for worker ${JSON.stringify(workerId)}: send the identity proof /v1/worker/attach returned to that worker ` +
        "(a worker token does not by itself identify a worker)",
    );
  }
}

/** 409: attach names a worker id some process already attached or announced. */
export class WorkerIdInUseError extends LeaseholdError {
  constructor(workerId: string) {
    super(
      "worker_id_in_use",
      `worker id ${JSON.stringify(workerId)} is already known to the server: a worker id stands for one process, ` +
        "so a new process attaches with a new id",
    );
  }
}

/**
 * The identity a request proves for `workerId`: undefined when it sent no proof (an older
 * worker; each route says what that gets), else the proven identity; a wrong proof throws.
 */
export function provenIdentity(identities: WorkerIdentities, proof: string | undefined, workerId: string): ProvenIdentity | undefined {
  if (proof === undefined) return undefined;
  const proven = identities.verify(proof, workerId);
  if (!proven) throw new InvalidIdentityError(workerId, "wrong identity proof");
  return proven;
}
