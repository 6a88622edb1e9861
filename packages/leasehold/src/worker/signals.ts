/**
 * `worker.stopOnSignals()`: the shutdown a process needs, in one line. Without a handler,
 * Ctrl-C (SIGINT) kills the process mid-job: the job stays `running` until the watchdog
 * recovers it, and that spends an attempt. With it:
 *
 * - the first SIGINT or SIGTERM stops the worker gracefully (`stop()`: running handlers get
 *   the grace, `shutdownTimeoutMs`, to finish; then they are aborted and their jobs released
 *   without spending an attempt), then runs `afterStop` (e.g. closing the client);
 * - a second one ends the grace at once: running handlers are aborted and released now;
 * - after that the listeners are gone, so a third gets Node's default: the process dies.
 */
import type { Logger } from "../logger.js";

export interface StopOnSignalsOptions {
  /** Default ["SIGINT", "SIGTERM"]. */
  signals?: NodeJS.Signals[];
  /** Runs once the worker has stopped, e.g. `() => lh.close()`, so nothing keeps the process alive. */
  afterStop?: () => unknown;
}

interface Stoppable {
  stop(timeoutMs?: number): Promise<void>;
}

/**
 * A signal this soon after the first is the same Ctrl-C: `npm start` forwards the terminal's
 * SIGINT to its child, which the terminal signalled too, so one Ctrl-C arrives twice.
 */
const SAME_STOP_MS = 500;

/** Installs the listeners; returns a function that removes them. */
export function stopOnSignals(worker: Stoppable, logger: Logger, options: StopOnSignalsOptions = {}): () => void {
  const signals = options.signals ?? ["SIGINT", "SIGTERM"];
  let firstAt: number | undefined;
  const remove = () => {
    for (const s of signals) process.off(s, onSignal);
  };
  function onSignal(signal: NodeJS.Signals): void {
    if (firstAt === undefined) {
      firstAt = performance.now();
      logger.info({ signal }, "stopping: running jobs get the shutdown grace (a second signal ends it at once)");
      void worker
        .stop()
        .then(() => options.afterStop?.())
        .catch((err: unknown) => logger.error({ err: String(err) }, "stopping on a signal failed"))
        .finally(remove);
      return;
    }
    if (performance.now() - firstAt < SAME_STOP_MS) return;
    logger.warn({ signal }, "second signal: aborting running jobs now and releasing them");
    remove();
    void worker.stop(0);
  }
  for (const s of signals) process.on(s, onSignal);
  return remove;
}
