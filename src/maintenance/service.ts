/**
 * The contract every maintenance service shares (watchdog, retention, ...): `start()` runs
 * `runOnce()` every interval, the first run after a random part of one interval so that
 * many processes started together do not run in step; `stop()` waits for a run in progress.
 * A failing run is logged and counted, never fatal. A started service keeps its process
 * alive until stopped (a standalone watchdog must not exit when idle). Tests call
 * `runOnce()` directly.
 */
import type { Logger } from "pino";

export abstract class MaintenanceService<R> {
  private timer?: NodeJS.Timeout;
  private current?: Promise<unknown>;
  private stopped = true;
  /** Runs that threw; the next run goes on as usual. */
  failures = 0;

  constructor(
    readonly name: string,
    readonly intervalMs: number,
    protected readonly logger: Logger,
  ) {}

  abstract runOnce(): Promise<R>;

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
      this.current = this.runOnce().catch((err) => {
        this.failures++;
        this.logger.warn({ service: this.name, err: String(err) }, "maintenance run failed");
      });
      await this.current;
      this.current = undefined;
      this.schedule(this.intervalMs);
    }, ms);
  }
}
