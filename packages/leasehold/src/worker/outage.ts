/**
 * One view of "is the database (or server) reachable" for a worker's loops: the claim loop,
 * heartbeats, reports and the listener each report failures and successes here, so an
 * outage is logged once when it starts and once when it ends, not every second by every loop.
 */
import type { Logger } from "../logger.js";
import { isConnectionError } from "../store/db.js";

export class Outage {
  private since?: number;
  private failures = 0;

  constructor(private readonly logger: Logger) {}

  /** Whether the last word from the database was a connection failure. */
  get down(): boolean {
    return this.since !== undefined;
  }

  failed(what: string, err: unknown): void {
    if (!isConnectionError(err)) {
      this.logger.warn({ err: String(err), during: what }, "database error; retrying");
      return;
    }
    this.failures++;
    if (this.since !== undefined) return;
    this.since = performance.now();
    this.logger.warn({ err: String(err), during: what }, "database unreachable; retrying every second (logged again when it is back)");
  }

  ok(): void {
    if (this.since === undefined) return;
    const downMs = Math.round(performance.now() - this.since);
    this.logger.info({ downMs, failedCalls: this.failures }, "database reachable again");
    this.since = undefined;
    this.failures = 0;
  }
}
