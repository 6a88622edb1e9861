/**
 * Exit codes and the one-line error every command failure becomes. No stack traces: the
 * user gets what went wrong and, where we know it, what to do.
 *
 *   0 success · 1 unexpected error · 2 bad usage or input · 3 job (or queue) not found, or a job's record not kept
 *   4 the job's state does not allow it · 5 database or server unreachable
 *   `jobs wait` also: 6 the job ended dead or cancelled · 7 it did not finish within --timeout
 */
import { LeaseholdError } from "leasehold/internal/errors";
import { isConnectionError } from "leasehold/internal/worker/transport";

export const EXIT = { ok: 0, failure: 1, usage: 2, notFound: 3, invalidState: 4, unavailable: 5, jobFailed: 6, waitTimeout: 7 } as const;

/** A failure the CLI itself detected, with its exit code. */
export class CliError extends Error {
  constructor(
    message: string,
    readonly exitCode: number = EXIT.usage,
  ) {
    super(message);
  }
}

const EXIT_BY_CODE: Record<string, number> = {
  invalid_input: EXIT.usage,
  invalid_config: EXIT.usage,
  unknown_task: EXIT.usage,
  no_worker_for_task: EXIT.usage,
  job_not_found: EXIT.notFound,
  job_not_kept: EXIT.notFound,
  callback_not_found: EXIT.notFound,
  callback_gone: EXIT.invalidState,
  unknown_queue: EXIT.notFound,
  invalid_state: EXIT.invalidState,
  name_in_use: EXIT.invalidState,
  server_unavailable: EXIT.unavailable,
  database_unavailable: EXIT.unavailable,
  wait_timeout: EXIT.waitTimeout,
  unauthorized: EXIT.usage,
  forbidden: EXIT.usage,
  not_found: EXIT.usage,
};

export function describeFailure(err: unknown): { message: string; exitCode: number } {
  if (err instanceof CliError) return { message: err.message, exitCode: err.exitCode };
  if (err instanceof LeaseholdError) return { message: err.message, exitCode: EXIT_BY_CODE[err.code] ?? EXIT.failure };
  if (isConnectionError(err) || isConnectFailure(err)) {
    return { message: `cannot reach the database: ${oneLine(err)}`, exitCode: EXIT.unavailable };
  }
  const pgError = err as { code?: string; severity?: string };
  if (pgError && typeof pgError.severity === "string") {
    // A PostgreSQL error: its message is about the database (permissions, a missing schema), not our internals.
    return {
      message: `database error: ${oneLine(err)}`,
      exitCode: pgError.code === "28P01" || pgError.code === "3D000" ? EXIT.unavailable : EXIT.failure,
    };
  }
  return { message: `unexpected error: ${oneLine(err)} (set LEASEHOLD_DEBUG=1 for details)`, exitCode: EXIT.failure };
}

/** DNS and authentication failures while connecting, which isConnectionError does not count. */
function isConnectFailure(err: unknown): boolean {
  const code = (err as { code?: string })?.code;
  return code === "EAI_AGAIN" || code === "ENOTFOUND" || code === "28P01" || code === "3D000";
}

function oneLine(err: unknown): string {
  const e = err as { message?: string; errors?: { message?: string }[] };
  // AggregateError (e.g. ECONNREFUSED on both ::1 and 127.0.0.1) has an empty message.
  const text = e?.message || e?.errors?.map((x) => x.message).join("; ") || String(err);
  return text.split("\n")[0]!.trim();
}
