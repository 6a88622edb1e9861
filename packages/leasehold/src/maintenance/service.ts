/**
 * The contract every maintenance service shares (watchdog, retention, ...): `start()` runs
 * `tick()` (by default `runOnce()`) every interval, the first run after a random part of one
 * interval so that many processes started together do not run in step; `stop()` waits for a
 * run in progress. A failing run is counted, never fatal, and logged when failures start and
 * when they end (not once per interval while the database is down). A started service keeps
 * its process alive until stopped (a standalone watchdog must not exit when idle). Tests call
 * `runOnce()` directly.
 */
import type { Logger } from "../logger.js";
import { ConfigError } from "../errors.js";

export abstract class MaintenanceService<R> {
  private timer?: NodeJS.Timeout;
  private current?: Promise<unknown>;
  private stopped = true;
  private failingSince?: number;
  /** Runs that threw; the next run goes on as usual. */
  failures = 0;

  constructor(
    readonly name: string,
    readonly intervalMs: number,
    protected readonly logger: Logger,
  ) {
    if (!Number.isInteger(intervalMs) || intervalMs < 10) {
      throw new ConfigError(`${name}: the interval must be a whole number of milliseconds, at least 10 (got ${intervalMs})`);
    }
  }

  abstract runOnce(): Promise<R>;

  /** One scheduled run; a service with parts on slower cadences overrides it. */
  protected tick(): Promise<unknown> {
    return this.runOnce();
  }

  start(): this {
    if (!this.stopped) return this;
    this.stopped = false;
    this.schedule(Math.random() * this.intervalMs);
    return this;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    await this.current;
  }

  private schedule(ms: number): void {
    if (this.stopped) return;
    this.timer = setTimeout(async () => {
      this.current = this.tick().then(
        () => {
          if (this.failingSince === undefined) return;
          this.logger.info({ service: this.name, failedForMs: Math.round(performance.now() - this.failingSince) }, "maintenance runs work again");
          this.failingSince = undefined;
        },
        (err) => {
          this.failures++;
          if (this.failingSince !== undefined) return;
          this.failingSince = performance.now();
          this.logger.warn({ service: this.name, err: String(err) }, "maintenance run failed; retrying every interval (logged again when it works)");
        },
      );
      await this.current;
      this.current = undefined;
      this.schedule(this.intervalMs);
    }, ms);
  }
}
