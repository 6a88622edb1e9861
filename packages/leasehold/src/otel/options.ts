/**
 * The tracing options a client takes (`Leasehold.connect({ tracing })`). Kept apart from
 * tracing.ts so that the client's types never name `@opentelemetry/api`, an optional peer.
 */
export interface TracingOptions {
  /**
   * An attempt's span is a child of its enqueue's span (default), with a link to it as well;
   * true: it starts a trace of its own and only links to the enqueue (for jobs that run long
   * after they were enqueued, or many times, where one trace per request grows unwieldy).
   */
  linkOnly?: boolean;
}
