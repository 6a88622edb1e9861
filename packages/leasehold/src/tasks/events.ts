/**
 * Typed events: an event defined once, with its name and its data's schema (any Standard
 * Schema), types both sides (docs/typescript.md#typed-events). `lh.sendEvent(event, data)` checks
 * the data against the schema before it is sent (a refusal is an EventValidationError naming the
 * field); `ctx.waitForEvent(step, { event })` returns the schema's output. The event is stored
 * as it was sent (the schema's input), so a transform runs on every receipt, never on its own output.
 */
import { ConfigError, ValidationError } from "../errors.js";
import { checkEventName, serializeEventData } from "../jobs/steps.js";
import { PermanentJobError } from "../worker/context.js";
import type { StandardSchemaV1 } from "./standard-schema.js";
import { checkPayload, type PayloadIssue } from "./validate.js";

/** Marks what defineEvent made (Symbol.for: two copies of the package still recognise each other's). */
const DEFINED_EVENT: unique symbol = Symbol.for("leasehold.definedEvent");

/** What defineEvent returns: the event's name and the schema its data must pass. */
export interface DefinedEvent<N extends string = string, S extends StandardSchemaV1 = StandardSchemaV1> {
  readonly name: N;
  readonly schema: S;
  readonly [DEFINED_EVENT]: true;
}

export type AnyEvent = DefinedEvent<string, StandardSchemaV1>;
/** What `sendEvent` takes for an event: its schema's input type. */
export type EventInput<E extends AnyEvent> = StandardSchemaV1.InferInput<E["schema"]>;
/** What `ctx.waitForEvent` returns for it: its schema's output type. */
export type EventData<E extends AnyEvent> = StandardSchemaV1.InferOutput<E["schema"]>;

/** Event data its event's schema refused. `issues` lists every field, with its path (`data.amount`). */
export class EventValidationError extends ValidationError {
  constructor(
    readonly event: string,
    readonly issues: PayloadIssue[],
    where: string,
  ) {
    super(`${where}: invalid data for event "${event}": ${issues.map((i) => `${i.path}: ${i.message}`).join("; ")}`);
  }
}

/**
 * Defines an event; the name is kept as a literal type, the data typed by the schema:
 *
 *   export const paymentSucceeded = defineEvent("payment.succeeded", z.object({ orderId: z.string(), amount: z.number() }));
 *
 * Throws a ConfigError for a bad name or a schema that is not a Standard Schema.
 */
export function defineEvent<const N extends string, S extends StandardSchemaV1>(name: N, schema: S): DefinedEvent<N, S> {
  try {
    checkEventName(name, "defineEvent");
  } catch (err) {
    throw new ConfigError((err as Error).message);
  }
  const standard = (schema as Partial<StandardSchemaV1> | undefined)?.["~standard"];
  if (!standard || standard.version !== 1 || typeof standard.validate !== "function") {
    throw new ConfigError(`event "${name}": schema must implement Standard Schema v1 (zod 3.24+, valibot 1.0+, arktype 2.0+, ...)`);
  }
  return Object.freeze({ name, schema, [DEFINED_EVENT]: true as const });
}

export function isDefinedEvent(value: unknown): value is AnyEvent {
  return typeof value === "object" && value !== null && (value as Record<symbol, unknown>)[DEFINED_EVENT] === true;
}

/** The name of an event given by name or as a defined event, checked. */
export function eventName(event: unknown, where: string): string {
  const name = isDefinedEvent(event) ? event.name : event;
  checkEventName(name, where);
  return name;
}

/** An event to send: its name, and its data as JSON, checked against a defined event's schema first. */
export async function eventToSend(event: unknown, data: unknown, where: string): Promise<{ name: string; dataJson: string | null }> {
  const name = eventName(event, where);
  if (isDefinedEvent(event)) await checked(event, data, where);
  return { name, dataJson: serializeEventData(data, where) };
}

/**
 * What a wait for a defined event returns: the received data through its schema. Data the
 * schema refuses (sent by name, from SQL or HTTP) fails the job for good: the wait recorded
 * it, so every later attempt would receive the same data.
 */
export async function receivedData(event: AnyEvent, data: unknown, where: string): Promise<unknown> {
  try {
    return await checked(event, data, where);
  } catch (err) {
    if (err instanceof EventValidationError) throw new PermanentJobError(err.message, { cause: err });
    throw err;
  }
}

async function checked(event: AnyEvent, data: unknown, where: string): Promise<unknown> {
  const result = await checkPayload(event.schema, data);
  if (result.ok) return result.value;
  const issues = result.issues.map((i) => ({ ...i, path: i.path.replace(/^payload/, "data") }));
  throw new EventValidationError(event.name, issues, where);
}
