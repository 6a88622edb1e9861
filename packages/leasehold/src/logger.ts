/**
 * The logger Leasehold writes to: a small structural interface that pino, bunyan-style loggers
 * and a few lines of your own all satisfy. The library is quiet unless given one.
 */
export interface LogFn {
  (obj: object, msg?: string): void;
  (msg: string): void;
}

export interface Logger {
  debug: LogFn;
  info: LogFn;
  warn: LogFn;
  error: LogFn;
  child(bindings: Record<string, unknown>): Logger;
}

const nothing: LogFn = () => {};

/** The default: writes nothing. */
export const silentLogger: Logger = { debug: nothing, info: nothing, warn: nothing, error: nothing, child: () => silentLogger };
