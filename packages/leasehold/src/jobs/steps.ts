/**
 * Durable steps' vocabulary and their limits, checked at the edge (docs/durable.md#limits): a
 * value that breaks one fails the handler's call with an error naming it, before anything is
 * written.
 */
import { ValidationError } from "../errors.js";
import { MAX_DELAY_MS, serializePayload, serializeResult } from "./validate.js";
import type { JsonValue } from "./types.js";

/** step and transaction: ctx.step and ctx.step.transaction; sleep, event, callback, children: waits. */
export type StepKind = "step" | "transaction" | "sleep" | "event" | "children" | "callback";
/** "waiting": a wait that began and is not over; "failed": a step that threw (a later attempt runs it again). */
export type StepState = "succeeded" | "failed" | "waiting";

/** A recorded step, as a replay and `getJobSteps` read it. */
export interface StepRecord {
  /** Its place in the order the handler called its steps (from 0). */
  seq: number;
  name: string;
  /** The how-many-th call of this name in the handler (from 0): a step in a loop. */
  occurrence: number;
  kind: StepKind;
  state: StepState;
  /** The attempt that recorded it. */
  attempt: number;
  /** Its result (a step's return value, a wait's event data); undefined when the step returned undefined. */
  result: JsonValue | undefined;
  error: string | null;
  durationMs: number | null;
  /** A sleep's end, a wait's deadline. */
  wakeAt: Date | null;
  /** The event a wait is for. */
  event: string | null;
  recordedAt: Date;
}

/** The most steps (and waits) one job may record. */
export const MAX_STEPS_PER_JOB = 1_000;
/** The largest result one step may record, as JSON: a replay reads every recorded result. */
export const MAX_STEP_RESULT_BYTES = 256 * 1024;
/** The largest event data, as JSON (send_event() checks it too). */
export const MAX_EVENT_DATA_BYTES = 256 * 1024;
/** The longest event name (send_event() checks it too). */
export const MAX_EVENT_NAME_LENGTH = 255;
/** The longest step name. */
export const MAX_STEP_NAME_LENGTH = 255;

// eslint-disable-next-line no-control-regex
const CONTROL = /[\u0000-\u001f\u007f-\u009f]/;
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

function checkLabel(value: unknown, what: string, maxLength: number): asserts value is string {
  if (typeof value !== "string" || value.length === 0) throw new ValidationError(`${what} must be a non-empty string, got ${describe(value)}`);
  if (value.length > maxLength) throw new ValidationError(`${what} is ${value.length} characters; the limit is ${maxLength}`);
  if (CONTROL.test(value)) throw new ValidationError(`${what} ${JSON.stringify(value.slice(0, 80))} contains a control character`);
  if (LONE_SURROGATE.test(value)) throw new ValidationError(`${what} ${JSON.stringify(value.slice(0, 80))} is not well-formed Unicode`);
}

function describe(value: unknown): string {
  return typeof value === "string" ? JSON.stringify(value) : value === null ? "null" : typeof value;
}

export function checkStepName(name: unknown, call: string): asserts name is string {
  checkLabel(name, `${call}: the step name`, MAX_STEP_NAME_LENGTH);
}

export function checkEventName(name: unknown, where = "event"): asserts name is string {
  checkLabel(name, `${where}: the event name`, MAX_EVENT_NAME_LENGTH);
}

/** Event data as JSON (null: none), within MAX_EVENT_DATA_BYTES. */
export function serializeEventData(data: unknown, where = "event"): string | null {
  if (data === undefined) return null;
  const json = serializePayload(data, where, "event data");
  const bytes = Buffer.byteLength(json);
  if (bytes > MAX_EVENT_DATA_BYTES)
    throw new ValidationError(`${where}: event data is ${bytes} bytes as JSON; the limit is ${MAX_EVENT_DATA_BYTES} (256 KiB)`);
  return json;
}

/**
 * A step's return value as JSON to record: undefined records SQL NULL (a replay returns
 * undefined), anything else must be JSON within MAX_STEP_RESULT_BYTES.
 */
export function serializeStepResult(value: unknown, step: string): string | undefined {
  if (value === undefined) return undefined;
  if (value === null) return "null";
  const json = serializeResult(value, MAX_STEP_RESULT_BYTES);
  if (typeof json === "object")
    throw new ValidationError(`step "${step}": its result was refused: ${json.problem.replace("maxResultBytes", "the step result limit")}`);
  return json ?? "null";
}

const UNITS: Record<string, number> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000, w: 7 * 86_400_000 };
const DURATION = /^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)$/;

/** A duration: milliseconds, or a string such as "90s", "15m", "3d". */
export type Duration = number | `${number}${"ms" | "s" | "m" | "h" | "d" | "w"}`;

/** Milliseconds from a Duration, within 0..3650 days; the error names `what`. */
export function durationMs(value: unknown, what: string): number {
  let ms: number;
  if (typeof value === "number") ms = value;
  else if (typeof value === "string" && DURATION.test(value.trim())) {
    const [, n, unit] = DURATION.exec(value.trim())!;
    ms = Number(n) * UNITS[unit!]!;
  } else throw new ValidationError(`${what} must be milliseconds or a duration such as "90s", "15m" or "3d", got ${describe(value)}`);
  if (!Number.isFinite(ms) || ms < 0 || ms > MAX_DELAY_MS) throw new ValidationError(`${what} must be from 0 to 3650 days, got ${String(value)}`);
  return Math.ceil(ms);
}

/** A sleep's end: a Date (checked), or a Duration from now on the database's clock. */
export function sleepTarget(value: unknown, what: string): { until: Date } | { ms: number } {
  if (value instanceof Date) {
    if (Number.isNaN(value.getTime())) throw new ValidationError(`${what}: the date is invalid`);
    if (value.getTime() > Date.now() + MAX_DELAY_MS) throw new ValidationError(`${what}: the date is more than 3650 days ahead`);
    return { until: value };
  }
  return { ms: durationMs(value, what) };
}
