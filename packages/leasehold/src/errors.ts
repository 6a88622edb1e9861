/**
 * Typed errors users can branch on: each has a stable `code`.
 */
export class LeaseholdError extends Error {
  readonly code: string;
  constructor(code: string, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
  }
}

/** Bad input: a payload that is not JSON, an unknown option, a value out of range. Nothing was written. */
export class ValidationError extends LeaseholdError {
  constructor(message: string) {
    super("invalid_input", message);
  }
}

/**
 * A heartbeat, completion or failure from an attempt that no longer holds the job's lease
 * (it was reaped, re-claimed or finished). It changed nothing.
 */
export class StaleLeaseError extends LeaseholdError {
  constructor(
    readonly jobId: string,
    readonly attempt: number,
    readonly reason: LostLeaseReason,
  ) {
    super("stale_lease", `job ${jobId} attempt ${attempt} no longer holds the lease (${reason}); the report was refused`);
  }
}

export class UnknownTaskError extends LeaseholdError {
  constructor(
    readonly task: string,
    known: string[],
  ) {
    super("unknown_task", `no handler for task "${task}" (this worker handles: ${known.join(", ") || "nothing"})`);
  }
}

/**
 * Enqueue refused (the client's `unknownTasks: "refuse"`): no worker is known to run the job's
 * task in its queue, so it would wait forever. Nothing was enqueued.
 */
export class NoWorkerForTaskError extends LeaseholdError {
  constructor(
    readonly task: string,
    readonly queue: string,
    message: string,
  ) {
    super("no_worker_for_task", message);
  }
}

export class JobNotFoundError extends LeaseholdError {
  constructor(readonly jobId: string) {
    super("job_not_found", `job ${jobId} does not exist`);
  }
}

/**
 * The id names a job that existed and has finished, but no record of it is kept: its queue keeps
 * no record of succeeded jobs (setQueueHistory), or retention forgot it. A JobNotFoundError, so
 * code that catches "not found" still does; `code` tells the two apart.
 */
export class JobNotKeptError extends JobNotFoundError {
  override readonly code: string = "job_not_kept";
  constructor(jobId: string) {
    super(jobId);
    this.message = `job ${jobId} has finished and its record is not kept (its queue keeps no record of succeeded jobs, or retention forgot it)`;
  }
}

/** `waitFor` gave up: the job had not finished within the time given. Nothing was changed. */
export class WaitTimeoutError extends LeaseholdError {
  constructor(
    readonly jobId: string,
    readonly timeoutMs: number,
  ) {
    super("wait_timeout", `job ${jobId} did not finish within ${timeoutMs} ms`);
  }
}

/** An operation that does not apply to the job in its current state (e.g. retrying a succeeded job). */
export class JobStateError extends LeaseholdError {
  constructor(message: string) {
    super("invalid_state", message);
  }
}

/**
 * An enqueue's unique key is held by an unfinished job outside the enqueue's `uniqueScope` (of
 * another task, or in another queue): that job is not its duplicate, so it is neither answered,
 * replaced nor cancelled, and nothing was written.
 */
export class UniqueKeyConflictError extends LeaseholdError {
  constructor(
    readonly uniqueKey: string,
    readonly heldBy: { id: string; task: string; queue: string },
    readonly scope: "task" | "queue",
  ) {
    super(
      "unique_key_conflict",
      `uniqueKey ${JSON.stringify(uniqueKey)} is held by unfinished job ${heldBy.id} of task ${JSON.stringify(heldBy.task)} in queue ` +
        `${JSON.stringify(heldBy.queue)}: unique keys are matched within the ${scope} (uniqueScope), and a key is held by one ` +
        `unfinished job at a time; use a key that names the ${scope}, or uniqueScope "global" to share it`,
    );
  }
}

/**
 * A worker's stable name is held by another live process: a name stands for one process at a
 * time (two with one name would each take the other for a dead predecessor).
 */
export class WorkerNameInUseError extends LeaseholdError {
  constructor(readonly workerName: string) {
    super(
      "name_in_use",
      `worker name "${workerName}" is held by another live process; a stable name stands for one process at a time ` +
        "(stop the other, choose another name, or start with waitForName / --wait-for-name to take over when it ends)",
    );
  }
}

/** A queue nobody has used: no settings, no jobs, no worker. Nothing was changed. */
export class UnknownQueueError extends LeaseholdError {
  constructor(
    readonly queue: string,
    known: string[],
    didYouMean?: string,
  ) {
    super(
      "unknown_queue",
      `queue "${queue}" is unknown: no job, worker or setting names it` +
        (didYouMean ? ` (did you mean "${didYouMean}"?)` : known.length > 0 ? ` (known: ${known.slice(0, 10).join(", ")})` : "") +
        "; to configure a queue before its first job, pass { create: true } (CLI: --create)",
    );
  }
}

export class ConfigError extends LeaseholdError {
  constructor(message: string) {
    super("invalid_config", message);
  }
}

/**
 * A handler broke out of the transaction `ctx.transaction` gave it: it sent COMMIT, ROLLBACK,
 * BEGIN (or the like) on `tx`, called `tx.release()`, or used `tx` after its callback
 * returned. Its transaction was rolled back and the attempt fails (through the retry policy):
 * the job's completion never commits apart from the handler's writes.
 */
export class TransactionMisuseError extends LeaseholdError {
  constructor(message: string) {
    super("transaction_misuse", message);
  }
}

/**
 * The schema is not one this code can run against (docs/upgrading.md): `not_migrated`,
 * `schema_behind` (it lacks migrations this release needs: run `leasehold migrate` first) or
 * `schema_too_new` (a newer release applied a breaking migration). Nothing was changed.
 */
export class SchemaVersionError extends LeaseholdError {
  constructor(
    readonly reason: "not_migrated" | "schema_behind" | "schema_too_new",
    message: string,
  ) {
    super("schema_version", message);
  }
}

/**
 * `connect()` could not reach the database (refused, reset, a host that does not resolve, a
 * login or database refused), at once or when its `connectRetry` ran out. The message is one
 * line naming the host and port (never the password); `cause` holds the driver's error.
 */
export class DatabaseUnavailableError extends LeaseholdError {
  constructor(
    readonly target: string,
    message: string,
    options: { cause: unknown },
  ) {
    super("database_unavailable", message, options);
  }
}

/**
 * The embedded PostgreSQL could not be set up or started. The message is one line saying
 * what is wrong and, where we know it, what to do; it never contains the password.
 */
export class EmbeddedPostgresError extends LeaseholdError {
  constructor(message: string) {
    super("embedded_postgres", message);
  }
}

/** Why an attempt lost its lease; the handler's abort reason says which. */
export type LostLeaseReason =
  | "lease_expired" // the watchdog reaped it; the job waits for a retry or is dead
  | "reclaimed" // another claim (possibly this worker's own, later) holds it now
  | "cancelled" // a user cancelled the job
  | "finished" // the job already finished
  | "missing"; // the job no longer exists (retention removed it)

/**
 * A replay met a recorded step other than the one the code now reaches at that place: the code
 * changed under a running job (a deploy renamed, removed or reordered steps). The attempt fails
 * (and is retried by the job's policy: a deploy rolled back lets it resume); the wrong step never
 * runs. Both steps are named.
 */
export class StepMismatchError extends LeaseholdError {
  constructor(
    readonly jobId: string,
    readonly seq: number,
    readonly recorded: { name: string; occurrence: number; kind: string } | undefined,
    readonly reached: { name: string; occurrence: number; kind: string } | undefined,
  ) {
    const at = (s: { name: string; occurrence: number; kind: string }) =>
      `${s.kind} "${s.name}"${s.occurrence > 0 ? ` (call ${s.occurrence + 1} of that name)` : ""}`;
    super(
      "step_mismatch",
      reached === undefined
        ? `job ${jobId}: the handler returned without reaching its recorded ${at(recorded!)} at place ${seq}; ` +
            "the code changed under a running job (docs/durable.md#replay-rules-and-what-a-deploy-may-change)"
        : `job ${jobId}: at place ${seq} the code reached ${at(reached)}, but ${at(recorded!)} is recorded there; ` +
            "the code changed under a running job (docs/durable.md#replay-rules-and-what-a-deploy-may-change)",
    );
  }
}

/**
 * Thrown by ctx.sleep and ctx.waitForEvent (and children, callbacks) once they suspended the
 * job: the attempt is over, and the job resumes later from the top, replaying its recorded steps.
 * Let it end the handler; a handler that catches it and goes on changes nothing (the worker no
 * longer holds the job, so nothing it does later is recorded).
 */
export class JobSuspendedError extends LeaseholdError {
  constructor(
    readonly jobId: string,
    readonly step: string,
    readonly until: Date | null,
  ) {
    super("job_suspended", `job ${jobId} suspended at "${step}"${until ? ` until ${until.toISOString()}` : ""}; it resumes from its recorded steps`);
  }
}

/** Why a callback token was refused: never handed out (or dropped by a re-run), or no longer usable. */
export type CallbackRefusal = "unknown" | "used" | "timed_out" | "finished";

/**
 * A callback token that cannot complete its wait (docs/durable-callbacks.md): code
 * `callback_not_found` when it was never handed out, `callback_gone` when it was used already,
 * its wait timed out, or its job finished. Nothing was sent.
 */
export class CallbackRefusedError extends LeaseholdError {
  constructor(readonly reason: CallbackRefusal) {
    const why: Record<CallbackRefusal, string> = {
      unknown: "no callback was handed out with this token",
      used: "this callback was completed already; a token completes its wait once",
      timed_out: "this callback's wait timed out; the job went on without it",
      finished: "this callback's job has finished",
    };
    super(reason === "unknown" ? "callback_not_found" : "callback_gone", why[reason]);
  }
}
