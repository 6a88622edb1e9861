/**
 * A payload checked against its task's schema, through the Standard Schema interface: at
 * enqueue (a refusal is a PayloadValidationError naming the field) and again before the handler
 * runs (a job enqueued from SQL, the CLI or HTTP can carry anything).
 */
import { ValidationError } from "../errors.js";
import type { StandardSchemaV1 } from "./standard-schema.js";

/** Issues named in an error message; the rest are counted ("and 3 more"), all are on `issues`. */
const ISSUES_IN_MESSAGE = 5;

export interface PayloadIssue {
  /** Where in the payload: `payload.items[2].sku`, or `payload` for the whole value. */
  path: string;
  message: string;
}

/** A payload its task's schema refused. `issues` lists every field, with its path. */
export class PayloadValidationError extends ValidationError {
  constructor(
    readonly task: string,
    readonly issues: PayloadIssue[],
    where = `task "${task}"`,
  ) {
    super(`${where}: invalid payload: ${describeIssues(issues)}`);
  }
}

function describeIssues(issues: PayloadIssue[]): string {
  const shown = issues.slice(0, ISSUES_IN_MESSAGE).map((i) => `${i.path}: ${i.message}`);
  if (issues.length > ISSUES_IN_MESSAGE) shown.push(`and ${issues.length - ISSUES_IN_MESSAGE} more`);
  return shown.join("; ");
}

/** `payload.a.b[0]["odd key"]` from a Standard Schema issue path. */
export function formatPath(path: StandardSchemaV1.Issue["path"]): string {
  let out = "payload";
  for (const segment of path ?? []) {
    const key = typeof segment === "object" && segment !== null ? segment.key : segment;
    if (typeof key === "number") out += `[${key}]`;
    else if (typeof key === "symbol") out += `[${String(key)}]`;
    else if (/^[A-Za-z_$][\w$]*$/.test(key)) out += `.${key}`;
    else if (/^\d+$/.test(key)) out += `[${key}]`;
    else out += `[${JSON.stringify(key)}]`;
  }
  return out;
}

export type Checked<T> = { ok: true; value: T } | { ok: false; issues: PayloadIssue[] };

/**
 * Runs the schema on a payload. Synchronous schemas answer synchronously (a batch of 10,000
 * jobs does not wait 10,000 microtasks); an async one (`validate` returning a promise, e.g. a
 * zod refinement with an async check) answers with a promise.
 */
export function checkPayload<S extends StandardSchemaV1>(
  schema: S,
  payload: unknown,
): Checked<StandardSchemaV1.InferOutput<S>> | Promise<Checked<StandardSchemaV1.InferOutput<S>>> {
  const result = schema["~standard"].validate(payload);
  return isThenable(result) ? Promise.resolve(result).then(toChecked) : toChecked(result);
}

function isThenable<T>(value: T | PromiseLike<T>): value is PromiseLike<T> {
  return typeof (value as { then?: unknown } | null)?.then === "function";
}

function toChecked<T>(result: StandardSchemaV1.Result<T>): Checked<T> {
  if (result.issues) {
    const issues = result.issues.map((i) => ({ path: formatPath(i.path), message: i.message }));
    // A failure with no issue listed still fails; say so rather than print nothing.
    return { ok: false, issues: issues.length > 0 ? issues : [{ path: "payload", message: "refused by the schema" }] };
  }
  return { ok: true, value: result.value };
}
