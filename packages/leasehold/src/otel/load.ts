/** The client's way to tracing: @opentelemetry/api is an optional peer, so ./tracing.ts is imported only when tracing is asked for. */
import { ConfigError } from "../errors.js";
import type { LeaseholdHooks } from "../hooks.js";
import type { TracingOptions } from "./options.js";

/** The tracing hooks, loaded only when asked for: without tracing, OpenTelemetry is never imported. */
export async function loadTracing(options: true | TracingOptions): Promise<LeaseholdHooks> {
  let otel: typeof import("./tracing.js");
  try {
    otel = await import("./tracing.js");
  } catch (err) {
    if ((err as { code?: string }).code === "ERR_MODULE_NOT_FOUND" && /@opentelemetry\/api/.test(String(err))) {
      throw new ConfigError("tracing needs the @opentelemetry/api package, an optional peer dependency: npm install @opentelemetry/api");
    }
    throw err;
  }
  return otel.tracingHooks(options === true ? {} : options);
}
