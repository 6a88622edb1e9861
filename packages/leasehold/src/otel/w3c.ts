/**
 * The W3C trace context (https://www.w3.org/TR/trace-context/), written and read directly
 * when no OpenTelemetry propagator is registered (the API's default propagator does nothing):
 * a job's trace context is carried either way.
 */
import { createTraceState, type SpanContext } from "@opentelemetry/api";

const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

export function formatTraceparent(sc: SpanContext): string {
  return `00-${sc.traceId}-${sc.spanId}-${(sc.traceFlags & 0xff).toString(16).padStart(2, "0")}`;
}

/** The span context a `traceparent` (and `tracestate`) header names; undefined if malformed or all zeros. */
export function parseTraceparent(traceparent: string, tracestate?: string): SpanContext | undefined {
  const m = TRACEPARENT.exec(traceparent.trim());
  if (!m || /^0+$/.test(m[1]!) || /^0+$/.test(m[2]!)) return undefined;
  return {
    traceId: m[1]!,
    spanId: m[2]!,
    traceFlags: parseInt(m[3]!, 16),
    isRemote: true,
    ...(tracestate ? { traceState: createTraceState(tracestate) } : {}),
  };
}
