/**
 * OpenTelemetry tracing, built on the hooks (src/hooks.ts) and following OpenTelemetry's
 * messaging conventions (docs/tracing.md):
 *
 *   - an enqueue call: a PRODUCER span `create <queue>` (operation type create), whose trace
 *     context is written into every job's headers (`traceparent`, `tracestate`);
 *   - an attempt: a CONSUMER span `process <queue>`, a child of the enqueue's span and linked
 *     to it, ended when the attempt's end is known, with its outcome and an error status when
 *     the attempt failed;
 *   - a claim batch that received jobs: a CLIENT span `claim [<queue>]` (receive);
 *   - a report batch: a CLIENT span `complete`, `fail` or `supersede` (settle);
 *   - a durable step: an INTERNAL span `step <name>`, a child of the attempt's span (or of the
 *     span active where the handler called it), run or replayed, with an error status when it
 *     threw (a suspension is no error).
 *
 * This module imports `@opentelemetry/api` (an optional peer dependency): it is loaded only
 * when tracing is asked for (`tracing: true`, or this entry, `leasehold/otel`).
 */
import {
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  context,
  propagation,
  trace,
  type Attributes,
  type Context,
  type Link,
  type Span,
  type TextMapGetter,
  type TracerProvider,
} from "@opentelemetry/api";
import type { LeaseholdHooks } from "../hooks.js";
import type { ClaimedJob, JobHeaders, NewJob } from "../jobs/types.js";
import type { TracingOptions } from "./options.js";
import { formatTraceparent, parseTraceparent } from "./w3c.js";

export type { TracingOptions } from "./options.js";

export interface TracingHooksOptions extends TracingOptions {
  /** Where spans go; default the global tracer provider (the one your OpenTelemetry SDK registers). */
  tracerProvider?: TracerProvider;
}

const SYSTEM = "leasehold";
/** Outcomes that end an attempt without finishing its job as intended: the span's status is an error. */
const FAILED_OUTCOMES = new Set(["waiting", "dead", "stale", "lost", "report_failed"]);
/** Header names the trace context is carried under (W3C); replaced at each enqueue. */
const TRACE_HEADERS = ["traceparent", "tracestate"];

const headerGetter: TextMapGetter<JobHeaders> = {
  keys: (carrier) => Object.keys(carrier),
  get: (carrier, key) => carrier[key],
};

/** The context a job's headers carry, by the registered propagator, else read as W3C directly. */
export function extractJobContext(headers: JobHeaders, base: Context = ROOT_CONTEXT): Context | undefined {
  const extracted = propagation.extract(base, headers, headerGetter);
  if (trace.getSpanContext(extracted)) return extracted;
  const sc = headers.traceparent === undefined ? undefined : parseTraceparent(headers.traceparent, headers.tracestate);
  return sc && trace.setSpanContext(base, sc);
}

/** The headers with `ctx`'s trace context written in, by the registered propagator, else as W3C. */
function injectJobContext(ctx: Context, headers: JobHeaders | undefined): JobHeaders {
  const carrier: JobHeaders = { ...headers };
  for (const key of TRACE_HEADERS) delete carrier[key];
  propagation.inject(ctx, carrier);
  const sc = trace.getSpanContext(ctx);
  if (carrier.traceparent === undefined && sc) {
    carrier.traceparent = formatTraceparent(sc);
    const state = sc.traceState?.serialize();
    if (state) carrier.tracestate = state;
  }
  return carrier;
}

function errorMessage(err: unknown): string {
  return err instanceof Error ? `${err.name}: ${err.message}` : String(err);
}

function recordError(span: Span, err: unknown): void {
  span.recordException(err instanceof Error ? err : { message: String(err) });
  span.setStatus({ code: SpanStatusCode.ERROR, message: errorMessage(err) });
}

/** Milliseconds since the epoch, finer than Date.now(): a span's start time. */
const now = () => performance.timeOrigin + performance.now();

/** The tracing hooks: register them with `lh.use(tracingHooks())` or `new Worker({ hooks: [tracingHooks()] })`. */
export function tracingHooks(options: TracingHooksOptions = {}): LeaseholdHooks {
  const tracer = (options.tracerProvider ?? trace).getTracer(SYSTEM);
  const linkOnly = options.linkOnly ?? false;
  /** Each running attempt's span, from its handler's start to its end's report. */
  const attempts = new WeakMap<ClaimedJob, { span: Span; error?: unknown }>();

  return {
    async aroundEnqueue(jobs, info, next) {
      let parent = context.active();
      // No span is active: a trace context the jobs carry in (an HTTP enqueue's traceparent) is the parent.
      if (!trace.getSpanContext(parent)) {
        const carried = jobs.find((j) => typeof j?.headers?.traceparent === "string")?.headers;
        parent = (carried && extractJobContext(carried, parent)) ?? parent;
      }
      const queues = new Set(jobs.map((j) => j?.queue ?? "default"));
      const queue = queues.size === 1 ? [...queues][0]! : undefined;
      const attributes: Attributes = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "create",
        "messaging.operation.name": "create",
        "leasehold.in_transaction": info.db !== undefined,
      };
      if (queue !== undefined) attributes["messaging.destination.name"] = queue;
      if (jobs.length !== 1) attributes["messaging.batch.message_count"] = jobs.length;
      const tasks = new Set(jobs.map((j) => j?.task));
      if (tasks.size === 1 && typeof jobs[0]?.task === "string") attributes["leasehold.task"] = jobs[0].task;
      const span = tracer.startSpan(queue === undefined ? "create" : `create ${queue}`, { kind: SpanKind.PRODUCER, attributes }, parent);
      const ctx = trace.setSpan(parent, span);
      for (const job of jobs as NewJob[]) {
        if (job !== null && typeof job === "object") job.headers = injectJobContext(ctx, job.headers);
      }
      try {
        const enqueued = await context.with(ctx, next);
        if (enqueued.length === 1) span.setAttribute("messaging.message.id", enqueued[0]!.id);
        span.setAttribute("leasehold.created", enqueued.filter((j) => j.created).length);
        return enqueued;
      } catch (err) {
        recordError(span, err);
        throw err;
      } finally {
        span.end();
      }
    },

    async aroundHandler(job, _ctx, next) {
      const creation = job.headers ? extractJobContext(job.headers) : undefined;
      const creationSpan = creation && trace.getSpanContext(creation);
      const links: Link[] | undefined = creationSpan ? [{ context: creationSpan }] : undefined;
      const parent = !linkOnly && creation ? creation : ROOT_CONTEXT;
      const span = tracer.startSpan(
        `process ${job.queue}`,
        {
          kind: SpanKind.CONSUMER,
          links,
          attributes: {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": job.queue,
            "messaging.message.id": job.id,
            "leasehold.task": job.task,
            "leasehold.attempt": job.attempt,
          },
        },
        parent,
      );
      const attempt: { span: Span; error?: unknown } = { span };
      attempts.set(job, attempt);
      try {
        return await context.with(trace.setSpan(parent, span), next);
      } catch (err) {
        attempt.error = err; // the status waits for the outcome (a cancelled job's abort is no failure)
        throw err;
      }
    },

    afterAttempt(job, end) {
      const attempt = attempts.get(job);
      if (!attempt) return;
      attempts.delete(job);
      const { span } = attempt;
      const { outcome } = end;
      span.setAttribute("leasehold.outcome", outcome.state);
      if (outcome.state === "lost") span.setAttribute("leasehold.lost_reason", outcome.reason);
      const error = attempt.error ?? end.error;
      if (error !== undefined) span.recordException(error instanceof Error ? error : { message: String(error) });
      if (FAILED_OUTCOMES.has(outcome.state)) {
        span.setStatus({
          code: SpanStatusCode.ERROR,
          message: error !== undefined ? errorMessage(error) : `attempt ended ${outcome.state}`,
        });
      }
      span.end();
    },

    async aroundClaim(batch, next) {
      const startTime = now();
      const queue = batch.queues.length === 1 ? batch.queues[0]! : undefined;
      const attributes: Attributes = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "receive",
        "messaging.operation.name": "claim",
        "leasehold.claim.limit": batch.limit,
      };
      if (queue !== undefined) attributes["messaging.destination.name"] = queue;
      const name = queue === undefined ? "claim" : `claim ${queue}`;
      let jobs;
      try {
        jobs = await next();
      } catch (err) {
        const span = tracer.startSpan(name, { kind: SpanKind.CLIENT, startTime, attributes }, ROOT_CONTEXT);
        recordError(span, err);
        span.end();
        throw err;
      }
      // A claim that found nothing is no span: an idle worker polls, and would fill the traces.
      if (jobs.length > 0) {
        attributes["messaging.batch.message_count"] = jobs.length;
        tracer.startSpan(name, { kind: SpanKind.CLIENT, startTime, attributes }, ROOT_CONTEXT).end();
      }
      return jobs;
    },

    async aroundStep(job, step, next) {
      let parent = context.active();
      const attempt = attempts.get(job);
      if (!trace.getSpan(parent) && attempt) parent = trace.setSpan(parent, attempt.span);
      const span = tracer.startSpan(
        `step ${step.name}`,
        {
          kind: SpanKind.INTERNAL,
          attributes: {
            "messaging.system": SYSTEM,
            "messaging.message.id": job.id,
            "leasehold.attempt": job.attempt,
            "leasehold.step.name": step.name,
            "leasehold.step.kind": step.kind,
            "leasehold.step.seq": step.seq,
            "leasehold.step.occurrence": step.occurrence,
            "leasehold.step.replayed": step.replayed,
          },
        },
        parent,
      );
      try {
        return await context.with(trace.setSpan(parent, span), next);
      } catch (err) {
        // A sleep or a wait ends its attempt by suspending the job: its step's outcome, no failure.
        if ((err as { code?: unknown } | null)?.code === "job_suspended") span.setAttribute("leasehold.step.suspended", true);
        else recordError(span, err);
        throw err;
      } finally {
        span.end();
      }
    },

    async aroundSettle(batch, next) {
      const span = tracer.startSpan(
        batch.kind,
        {
          kind: SpanKind.CLIENT,
          attributes: {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "settle",
            "messaging.operation.name": batch.kind,
            "messaging.batch.message_count": batch.jobs.length,
          },
        },
        ROOT_CONTEXT,
      );
      try {
        const applied = await context.with(trace.setSpan(ROOT_CONTEXT, span), next);
        span.setAttribute("leasehold.settle.applied", applied.size);
        return applied;
      } catch (err) {
        recordError(span, err);
        throw err;
      } finally {
        span.end();
      }
    },
  };
}
