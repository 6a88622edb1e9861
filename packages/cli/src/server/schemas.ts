/**
 * JSON schemas of the API: fastify validates every request body and query against them
 * (unknown fields are refused, not dropped), and @fastify/swagger builds the OpenAPI
 * document from the same objects, so the document cannot drift from what is enforced.
 */
export const NAME = { type: "string", pattern: "^[A-Za-z0-9_.:\\-/]{1,128}$" } as const;
export const JOB_ID = { type: "string", pattern: "^[1-9][0-9]{0,18}$", description: "job id (a PostgreSQL bigint, as a string)" } as const;
const ATTEMPT = { type: "integer", minimum: 1, maximum: 2147483647, description: "the fencing token of the claim" } as const;
/**
 * Worker ids are stored and compared in PostgreSQL, which cannot hold a NUL: control
 * characters are refused here, once, for every route that takes one (a 400 naming the field).
 */
export const WORKER_ID = {
  type: "string",
  pattern: "^[^\\u0000-\\u001f\\u007f]{1,300}$",
  description: "the worker process's id, unique per process (no control characters)",
} as const;
const LEASE_MS = { type: "integer", minimum: 1000, maximum: 86400000 } as const;
const LIMIT_MS = { type: "integer", minimum: 1000, maximum: 604800000 } as const;
const NULLABLE_LIMIT = { type: ["integer", "null"], minimum: 1000, maximum: 604800000 } as const;
const WORKER_NAME = { type: "string", pattern: "^[A-Za-z0-9_.:-]{1,100}$" } as const;
const BACKOFF = (): Record<string, unknown> =>
  object(
    {
      baseMs: { type: "integer", minimum: 0, maximum: 86400000 },
      factor: { type: "number", minimum: 1, maximum: 100 },
      maxMs: { type: "integer", minimum: 0, maximum: 2592000000 },
      jitter: { type: "number", minimum: 0, maximum: 1 },
    },
    ["baseMs", "factor", "maxMs", "jitter"],
  );
const OUTCOMES = [
  "succeeded",
  "failed",
  "lease_expired",
  "worker_lost",
  "stalled",
  "timed_out",
  "released",
  "cancelled",
  "superseded",
  "rate_limited",
  "suspended",
];
/** Most attempts one worker request may carry (a worker holds at most its concurrency). */
const MAX_BATCH = 10_000;
/** Most jobs one enqueue request may carry; larger imports go in several requests. */
export const MAX_ENQUEUE_BATCH = 5_000;
export const MAX_WAIT_MS = 60_000;

export const object = (properties: Record<string, unknown>, required: string[] = []) => ({
  type: "object",
  properties,
  required,
  additionalProperties: false,
});

/** Optional in the schema so that a missing one is refused for its attempt alone, not the whole request. */
const RECEIPT = {
  type: "string",
  maxLength: 128,
  description: "the receipt the claim returned for this attempt; without it the attempt is refused",
} as const;
/** Optional in the schema so that an older worker, which has none, gets the route's own answer (docs/upgrading.md). */
const IDENTITY = {
  type: "string",
  maxLength: 200,
  description: "the identity proof attach returned to this worker process; proves the caller is the worker it names",
} as const;
export const ATTEMPT_REF = object({ id: JOB_ID, attempt: ATTEMPT, receipt: RECEIPT }, ["id", "attempt"]);
/** An attempt refused before the database was asked, and why. */
const INVALID_ITEM = {
  type: "object",
  properties: {
    id: JOB_ID,
    attempt: ATTEMPT,
    code: { type: "string", description: "invalid_receipt, or invalid_input (a progress or checkpoint value that cannot be stored)" },
    message: { type: "string" },
  },
};

export const errorSchema = {
  type: "object",
  properties: {
    error: {
      type: "object",
      properties: {
        code: {
          type: "string",
          description:
            "stable code: invalid_input, unauthorized, forbidden, job_not_found, job_not_kept, unknown_queue, invalid_state, stale_lease, name_in_use, worker_id_in_use, invalid_identity, unique_key_conflict, callback_not_found, callback_gone, payload_too_large, answer_too_large, server_unavailable, internal_error, not_found",
        },
        message: { type: "string" },
        jobs: { type: "array", description: "stale_lease only: the refused attempts and why", items: { type: "object", additionalProperties: true } },
      },
      required: ["code", "message"],
      additionalProperties: true,
    },
  },
  required: ["error"],
};

export const errors = (...statuses: number[]) => Object.fromEntries(statuses.map((s) => [s, { description: ERROR_TEXT[s], ...errorSchema }]));
const ERROR_TEXT: Record<number, string> = {
  400: "invalid request",
  401: "missing or wrong bearer token",
  403:
    "the worker token may only use the /v1/worker/* routes; a read-only server (--dashboard read-only) changes nothing for the operator token; " +
    "invalid_identity: the worker identity proof is missing or not the one attach returned to this worker",
  404: "no such job",
  409: "the operation does not apply: stale lease (nothing changed), wrong job state, or a worker name or id already in use",
  410: "callback_gone: the callback was completed already, its wait timed out, or its job finished; job_not_kept: the job finished and no record of it is kept",
  413: "request body too large",
  503: "the server cannot reach its database",
};
export const COMMON_ERRORS = [400, 401, 413, 503];

export const TIME = { type: ["string", "null"], format: "date-time" } as const;
export const claimedJobSchema = {
  type: "object",
  properties: {
    id: JOB_ID,
    queue: NAME,
    task: NAME,
    payload: {},
    attempt: ATTEMPT,
    spentAttempts: { type: "integer" },
    maxAttempts: { type: "integer" },
    leaseMs: { type: "integer" },
    checkpoint: {},
    fence: { type: "string", description: "the claim's token across all jobs (a bigint): greater than every earlier claim's" },
    previousOutcome: { type: ["string", "null"], enum: [...OUTCOMES, null], description: "how the previous attempt ended" },
    lastError: { type: ["string", "null"] },
    progressTimeoutMs: NULLABLE_LIMIT,
    maxRunMs: NULLABLE_LIMIT,
    maxRunUnlimited: { type: "boolean", description: "enqueued with maxRunMs null: no time limit, whatever its task's" },
    headers: {
      type: ["object", "null"],
      additionalProperties: { type: "string" },
      description: "the headers the job was enqueued with (a trace context, metadata); null when none",
    },
    receipt: { type: "string", description: "proof of this claim: every heartbeat and report about this attempt must carry it" },
    key: { type: ["string", "null"], description: "the job's flow-control key, if it was enqueued with one" },
  },
  required: ["id", "queue", "task", "payload", "attempt", "fence", "spentAttempts", "maxAttempts", "leaseMs", "receipt"],
};

export const jobRecordSchema = {
  type: "object",
  properties: {
    id: JOB_ID,
    queue: NAME,
    task: NAME,
    payload: { description: "lists leave it out unless asked for" },
    priority: { type: "integer" },
    state: { type: "string", enum: ["blocked", "waiting", "suspended", "running", "succeeded", "dead", "cancelled"] },
    attempt: { type: "integer" },
    spentAttempts: { type: "integer" },
    maxAttempts: { type: "integer" },
    runAt: TIME,
    leaseUntil: TIME,
    lockedBy: { type: ["string", "null"] },
    heartbeatAt: TIME,
    cancelRequestedAt: TIME,
    progress: {},
    checkpoint: {},
    lastError: { type: ["string", "null"] },
    uniqueKey: { type: ["string", "null"] },
    key: { type: ["string", "null"], description: "its flow-control key while it is unfinished (finished jobs do not keep it)" },
    createdAt: { type: "string", format: "date-time" },
    startedAt: TIME,
    finishedAt: TIME,
    result: { description: "what its handler returned, kept with the attempt that succeeded; null when none (lists: with payload=true)" },
  },
};

/** A job's parent or child in a flow. */
const JOB_LINK = {
  type: "object",
  properties: {
    id: JOB_ID,
    ref: { type: ["string", "null"], description: "the child's name for the parent (null for a parent named by id)" },
    task: { type: ["string", "null"] },
    state: { type: "string", description: "its state; unknown: forgotten by retention" },
  },
} as const;

/** A durable job's recorded step, as readers see it (store/step-views.ts). */
const JOB_STEP = {
  type: "object",
  properties: {
    seq: { type: "integer", description: "its place in the order the handler called its steps (from 0)" },
    name: { type: "string" },
    occurrence: { type: "integer", description: "the how-many-th call of this name (from 0)" },
    kind: { type: "string", enum: ["step", "transaction", "sleep", "event", "children", "callback"] },
    state: { type: "string", enum: ["succeeded", "failed", "waiting"] },
    attempt: { type: "integer", description: "the attempt that recorded it" },
    durationMs: { type: ["integer", "null"] },
    resultBytes: { type: ["integer", "null"], description: "its result's size as JSON; null: none" },
    result: { description: "its result; absent past the listed results' 1 MiB, hidden from read-only callers" },
    error: { type: ["string", "null"] },
    wakeAt: { ...TIME, description: "a sleep's end, a wait's deadline" },
    event: { type: ["string", "null"], description: "the event a wait is for" },
    recordedAt: { type: "string", format: "date-time" },
  },
} as const;

/** Why a suspended job waits. */
const JOB_WAIT = {
  type: ["object", "null"],
  description: "a suspended job's wait; null in any other state",
  properties: {
    kind: { type: "string", enum: ["sleep", "event", "callback", "children"] },
    step: { type: "string" },
    until: { ...TIME, description: "when it wakes anyway" },
    event: { type: ["string", "null"] },
    match: { description: "what the event's data must contain; null: any" },
  },
} as const;

export const attemptRecordSchema = {
  type: "object",
  properties: {
    jobId: JOB_ID,
    attempt: { type: "integer" },
    workerId: { type: "string" },
    startedAt: { type: "string", format: "date-time" },
    endedAt: { type: "string", format: "date-time" },
    outcome: { type: "string", enum: OUTCOMES },
    error: { type: ["string", "null"] },
  },
};

/** Per-attempt results of a batch report: what applied, and what the fence refused. */
const reportResult = {
  type: "object",
  properties: {
    applied: { type: "array", items: { type: "object", properties: { id: JOB_ID, state: { type: "string" } } } },
    refused: {
      type: "array",
      description:
        "attempts that did not apply: refused by the fence (lease_expired, reclaimed, cancelled, finished, missing) or for a missing or wrong receipt (invalid_receipt)",
      items: { type: "object", properties: { id: JOB_ID, attempt: ATTEMPT, reason: { type: "string" } } },
    },
  },
};

const newJob = object(
  {
    task: NAME,
    payload: { description: "any JSON value (default {})" },
    queue: NAME,
    priority: { type: "integer", minimum: -32768, maximum: 32767 },
    runAt: { type: "string", format: "date-time" },
    delayMs: { type: "integer", minimum: 0 },
    maxAttempts: { type: "integer", minimum: 1, maximum: 1000 },
    uniqueKey: { type: "string", minLength: 1, maxLength: 512 },
    onDuplicate: {
      type: "string",
      description:
        "what to do when an unfinished job holds uniqueKey (needs one; docs/flows.md): keep (default) answers that job; replace gives a " +
        "waiting one this payload and run time (debounce), or frees the key from a running one and enqueues this job; replace_payload " +
        "as replace but a waiting job keeps its time; cancel_running as replace, and a running holder's cancel is requested",
    },
    uniqueScope: {
      type: "string",
      description:
        "which unfinished job holding uniqueKey is this job's duplicate (needs one; docs/api.md): task (default) one of the same task, " +
        "queue one in the same queue, global any; a holder outside the scope is left alone and the enqueue refused (409 unique_key_conflict)",
    },
    key: {
      type: "string",
      minLength: 1,
      maxLength: 512,
      description: "the job's flow-control key (a tenant, a customer): its queue's per-key limits count it, and keys take turns",
    },
    leaseMs: LEASE_MS,
    progressTimeoutMs: LIMIT_MS,
    maxRunMs: { ...NULLABLE_LIMIT, description: "null: no time limit for this job, whatever its task's (absent: the task's, 15 minutes by default)" },
    headers: {
      type: "object",
      additionalProperties: { type: "string" },
      description:
        "string values carried with the job to its handler (ctx.headers): at most 32, names of letters, digits and _ . -, 8 KiB in all. " +
        "Without a traceparent here, the request's traceparent and tracestate headers are used (docs/tracing.md)",
    },
  },
  ["task"],
);

/** Why an enqueued job may wait forever (the server's --unknown-tasks warn, the default). */
const ENQUEUE_WARNING = {
  type: "object",
  properties: {
    code: { type: "string", enum: ["unknown_task", "task_not_in_queue"] },
    queue: { type: "string" },
    task: { type: "string" },
    message: { type: "string" },
    didYouMean: { type: "string", description: "the closest known task (unknown_task) or queue of that task (task_not_in_queue)" },
  },
} as const;
const WARNINGS = {
  type: "array",
  items: ENQUEUE_WARNING,
  description:
    "present when no worker seen in the last 24 h runs the job's task in its queue: the job was enqueued, and waits until such a " +
    "worker starts (with --unknown-tasks refuse the server answers 400 no_worker_for_task instead)",
} as const;
const enqueued = {
  type: "object",
  properties: {
    id: JOB_ID,
    created: { type: "boolean" },
    replaced: { type: "boolean", description: "present (true) when the unfinished job holding uniqueKey took this payload (onDuplicate)" },
    cancelled: { ...JOB_ID, description: "onDuplicate cancel_running: the running job that held uniqueKey, whose cancel was requested" },
    warnings: WARNINGS,
  },
};

/** Waiting jobs whose task no live worker runs in their queue (src/maintenance/handler-gaps.ts). */
export const HANDLER_GAPS = {
  type: "array",
  description: "waiting jobs whose task, in their queue, no live worker runs: they wait until one starts (at most 100 pairs)",
  items: {
    type: "object",
    properties: {
      queue: { type: "string" },
      task: { type: "string" },
      waiting: { type: "integer", description: "ready to run now" },
      scheduled: { type: "integer", description: "due later" },
      oldestWaitingMs: { type: ["number", "null"], description: "how long the oldest ready one has waited" },
      didYouMeanTask: { type: ["string", "null"], description: "the closest task a worker announced, when this task is not one" },
      didYouMeanQueue: { type: ["string", "null"], description: "the closest queue of this task's recent workers" },
    },
  },
} as const;

/** How far along the job is, read from its progress (see src/jobs/progress.ts); null when its progress does not say. */
export const PROGRESS_FRACTION = { type: ["number", "null"], minimum: 0, maximum: 1 } as const;

/** What a job list or a bulk action selects (query strings carry everything as text). */
export const JOB_FILTER = {
  state: { type: "string", enum: ["blocked", "waiting", "suspended", "running", "succeeded", "dead", "cancelled"] },
  queue: NAME,
  task: NAME,
  from: { type: "string", format: "date-time", description: "only jobs whose time (see `time`) is at or after this" },
  to: { type: "string", format: "date-time", description: "only jobs whose time (see `time`) is before this" },
  time: { type: "string", enum: ["created", "finished"], description: "which time from and to bound (default created)" },
} as const;
const idParams = object({ id: JOB_ID }, ["id"]);

/** A re-run from a step, as the audit trail keeps it (docs/durable-callbacks.md#re-run-from-a-step). */
const JOB_RERUN = {
  type: "object",
  properties: {
    id: { type: "string" },
    jobId: JOB_ID,
    fromStep: { type: "string" },
    fromOccurrence: { type: "integer" },
    fromSeq: { type: "integer", description: "the step's place in the handler's order (from 0)" },
    previousState: { type: "string", description: "how the job had finished: succeeded, cancelled or dead" },
    requestedBy: { type: ["string", "null"] },
    requestedAt: TIME,
    stepsDropped: { type: "array", items: { type: "object", additionalProperties: true }, description: "the records dropped, as they were" },
  },
} as const;

/** A rate as the API carries it: at most `limit` starts in any window of `windowMs`. */
const RATE = (what: string) => ({
  type: ["object", "null"],
  properties: {
    limit: { type: "integer", description: "1 to 1,000,000" },
    windowMs: { type: "integer", description: "10 ms to 86,400,000 ms (a day)" },
  },
  description: `${what}; null: none`,
});
const COUNT_LIMIT = (what: string) => ({ type: ["integer", "null"], description: `${what} (1 to 100,000); null: none` });
const KEY_WEIGHTS = {
  type: ["object", "null"],
  additionalProperties: { type: "integer" },
  description: "round-robin weights of some keys (1 to 100 turns per round; the others weigh 1), at most 1,000 keys; null: none",
} as const;
const LIMIT_FIELDS = {
  concurrency: COUNT_LIMIT("attempts holding leases in the queue at once, across every worker"),
  keyConcurrency: COUNT_LIMIT("attempts holding leases at once per key (1: one at a time, in order)"),
  rate: RATE("starts of the whole queue"),
  keyRate: RATE("starts per key"),
  keyWeights: KEY_WEIGHTS,
  maxHoldMs: {
    type: ["integer", "null"],
    description:
      "the longest hold a handler's RateLimitedError may set in the queue, 1,000 to 86,400,000 ms; longer ones are clamped (null: 300,000, 5 minutes)",
  },
  allowQueueHold: {
    type: "boolean",
    description: "a handler may hold the whole queue (scope queue, or a keyless job); false (the default): only its own key",
  },
};

/** A queue's flow-control settings (docs/flow-control.md). */
export const queueSettingsSchema = {
  type: "object",
  properties: {
    name: NAME,
    paused: { type: "boolean" },
    pausedAt: TIME,
    ...LIMIT_FIELDS,
    keyed: { type: "boolean", description: "keyed jobs were enqueued in it: its claims go round-robin between keys" },
    heldUntil: { ...TIME, description: "a handler asked the whole queue to hold back until then (RateLimitedError); in force while in the future" },
    heldByJob: { type: ["string", "null"], description: "the job whose RateLimitedError set that hold" },
    flow: { type: "boolean", description: "claimed under flow control (paused, limited, keyed or held)" },
    keepSucceeded: {
      type: "boolean",
      description:
        "succeeded jobs keep their record (result, last attempt, times); false: the queue keeps none, except of jobs whose result is needed",
    },
    updatedAt: TIME,
  },
};
const queueInfoSchema = {
  ...queueSettingsSchema,
  properties: {
    ...queueSettingsSchema.properties,
    waiting: { type: "integer", description: "jobs waiting, due or not" },
    running: { type: "integer", description: "jobs holding leases (running, or buffered by a worker)" },
    holds: {
      type: "array",
      description: "the holds handlers set that are in force: the queue's (key null) first, then its keys' (the 10 ending last)",
      items: {
        type: "object",
        properties: {
          key: { type: ["string", "null"], description: "the held key; null: the whole queue" },
          until: { type: "string", format: "date-time" },
          jobId: { type: ["string", "null"], description: "the job whose RateLimitedError set the hold" },
        },
      },
    },
    heldKeys: { type: "integer", description: "keys held now, listed in holds or not" },
  },
};
/** One queue's depth: the queue_depth view's row (docs/deployment.md#autoscaling). */
const queueDepthSchema = {
  type: "object",
  properties: {
    queue: NAME,
    paused: { type: "boolean", description: "paused: its ready jobs wait however many workers run (leave them out when scaling)" },
    ready: { type: "integer", description: "waiting jobs due now" },
    oldestReadyAgeSeconds: { type: "number", description: "how long the oldest ready job has been due, in seconds; 0 when none is ready" },
    running: { type: "integer", description: "jobs holding leases (running, or buffered by a worker)" },
    delayed: { type: "integer", description: "waiting jobs not yet due" },
    blocked: { type: "integer", description: "jobs waiting for their parents" },
    concurrencyLimit: {
      type: ["integer", "null"],
      description: "the queue's fleet-wide concurrency limit (null: none): more workers than it lets run only wait",
    },
    limited: {
      type: "boolean",
      description: "a start rate, per-key limit or hold applies: more workers help only as far as it lets jobs start",
    },
    suspended: { type: "integer", description: "durable jobs sleeping or waiting for an event: they hold no worker and wake by themselves" },
  },
};
const queueParams = object({ name: NAME }, ["name"]);
const CREATE_QUERY = object({
  create: { type: "string", enum: ["true", "false"], description: "true: configure a queue no job, worker or setting names yet" },
});
const queueAnswer = { type: "object", properties: { queue: queueSettingsSchema } };
const QUEUE_ERRORS = {
  ...errors(400, 401, 403, 503),
  404: { description: "unknown queue (no job, worker or setting names it; pass create=true to configure it anyway)", ...errorSchema },
};
export const secured = { security: [{ bearerAuth: [] }] };
/** Operators' routes: a worker token is refused with 403. */
const OPERATOR_ERRORS = [...COMMON_ERRORS, 403];

export const routes = {
  claim: {
    ...secured,
    tags: ["worker"],
    summary: "Claim up to `limit` jobs (long poll: waits up to waitMs for one to be ready)",
    body: object(
      {
        workerId: WORKER_ID,
        queues: { type: "array", items: NAME, minItems: 1, maxItems: 100 },
        tasks: { type: "array", items: NAME, minItems: 1, maxItems: 1000 },
        limit: { type: "integer", minimum: 1, maximum: 500 },
        leaseMs: LEASE_MS,
        waitMs: { type: "integer", minimum: 0, maximum: MAX_WAIT_MS },
        flowQueues: {
          type: "array",
          items: NAME,
          maxItems: 100,
          description:
            "those of `queues` under flow control (paused, limited, keyed or held), as GET /v1/worker/queues says: each is claimed " +
            "under its limits; a plain claim of such a queue finds nothing",
        },
      },
      ["workerId", "queues", "tasks", "limit", "leaseMs"],
    ),
    response: {
      200: {
        type: "object",
        properties: {
          jobs: { type: "array", items: claimedJobSchema },
          waited: {
            type: "boolean",
            description:
              "true: the claim was held open until a job came or waitMs passed. false: it was answered at once with what was ready " +
              "(jobs were ready, waitMs was 0, the server is at its long-poll cap or stopping); after an empty answer, wait before polling again",
          },
          retryInMs: {
            type: "integer",
            description:
              "present when a flow limit (concurrency, rate, a hold), not the backlog, held the claim back: claiming again sooner finds nothing",
          },
          paused: { type: "array", items: NAME, description: "present when some of the flow queues were paused" },
        },
      },
      ...errors(...COMMON_ERRORS),
    },
  },
  cancels: {
    ...secured,
    tags: ["worker"],
    summary: "Wait for cancel requests of this worker's attempts (long poll: answered at once when one is requested)",
    body: object(
      {
        workerId: WORKER_ID,
        attempts: {
          type: "array",
          maxItems: MAX_BATCH,
          items: ATTEMPT_REF,
          description:
            "the attempts the worker holds and has not yet been told of: checked at once (a cancel may have been requested between polls); " +
            "attempts without a valid receipt are left out",
        },
        waitMs: { type: "integer", minimum: 0, maximum: MAX_WAIT_MS },
        identity: {
          ...IDENTITY,
          description:
            "the identity proof attach returned: required to wait for cancel notices (without it the poll checks `attempts` and " +
            "answers at once; a wrong one is refused with 403 invalid_identity)",
        },
      },
      ["workerId", "attempts"],
    ),
    response: {
      200: {
        type: "object",
        properties: {
          cancels: {
            type: "array",
            description: "attempts of this worker whose cancel was requested: abort their handlers",
            items: object({ id: JOB_ID, attempt: ATTEMPT }, ["id", "attempt"]),
          },
          waited: {
            type: "boolean",
            description:
              "true: held open until a cancel came, waitMs passed or notices may have been missed (poll again at once). false: answered " +
              "at once (waitMs 0, the long-poll cap, the server stopping); after an empty answer, wait before polling again",
          },
        },
      },
      ...errors(...COMMON_ERRORS, 403),
    },
  },
  heartbeat: {
    ...secured,
    tags: ["worker"],
    summary: "Renew the leases of a worker's attempts, carrying progress and checkpoints",
    body: object(
      {
        workerId: WORKER_ID,
        leaseMs: LEASE_MS,
        beats: {
          type: "array",
          description: "may be empty: a beat with no jobs still says the worker is alive",
          maxItems: MAX_BATCH,
          items: object({ id: JOB_ID, attempt: ATTEMPT, receipt: RECEIPT, progress: {}, checkpoint: {} }, ["id", "attempt"]),
        },
        inFlight: { type: "integer", minimum: 0, description: "leases the worker holds now" },
        beatDelays: {
          type: "array",
          maxItems: 32,
          items: { type: "integer", minimum: 0 },
          description: "the worker's beat-delay histogram (counts per bucket)",
        },
      },
      ["workerId", "leaseMs", "beats"],
    ),
    response: {
      200: {
        description: "renewed leases, and those this worker no longer holds",
        type: "object",
        properties: {
          renewed: { type: "array", items: { type: "object", properties: { id: JOB_ID, cancelRequested: { type: "boolean" } } } },
          lost: { type: "array", items: JOB_ID },
          invalid: { type: "array", description: "beats refused on their own, before the fence: not renewed, nothing stored", items: INVALID_ITEM },
        },
      },
      ...errors(...COMMON_ERRORS, 409),
    },
  },
  succeed: {
    ...secured,
    tags: ["worker"],
    summary: "Report attempts that succeeded (fenced: a stale attempt is refused)",
    body: object(
      {
        workerId: WORKER_ID,
        jobs: {
          type: "array",
          items: object(
            {
              id: JOB_ID,
              attempt: ATTEMPT,
              receipt: RECEIPT,
              result: {
                description:
                  "what the handler returned (any JSON; absent or null: none), stored as the job's result. One the server cannot " +
                  "store or larger than its --max-result-bytes ends the attempt failed without retries: applied with state dead",
              },
            },
            ["id", "attempt"],
          ),
          minItems: 1,
          maxItems: MAX_BATCH,
        },
      },
      ["workerId", "jobs"],
    ),
    response: { 200: reportResult, ...errors(...COMMON_ERRORS, 409) },
  },
  fail: {
    ...secured,
    tags: ["worker"],
    summary: "Report attempts that failed: each is retried after its task's backoff or ends dead",
    body: object(
      {
        workerId: WORKER_ID,
        failures: {
          type: "array",
          minItems: 1,
          maxItems: MAX_BATCH,
          items: object(
            {
              id: JOB_ID,
              attempt: ATTEMPT,
              receipt: RECEIPT,
              error: { type: "string", maxLength: 10000 },
              backoff: { ...BACKOFF(), description: "the task's retry policy (default: the one its workers announced, else the server's)" },
              outcome: { type: "string", enum: ["failed", "stalled", "timed_out"], description: "default failed" },
              giveUp: { type: "boolean" },
            },
            ["id", "attempt", "error"],
          ),
        },
      },
      ["workerId", "failures"],
    ),
    response: { 200: reportResult, ...errors(...COMMON_ERRORS, 409) },
  },
  supersede: {
    ...secured,
    tags: ["worker"],
    summary:
      "Report attempts whose fenced write a newer claim overtook: each job finishes as succeeded with outcome superseded, spending no retry budget and not retried (fenced: a stale attempt is refused)",
    body: object(
      {
        workerId: WORKER_ID,
        jobs: {
          type: "array",
          minItems: 1,
          maxItems: MAX_BATCH,
          items: object(
            {
              id: JOB_ID,
              attempt: ATTEMPT,
              receipt: RECEIPT,
              reason: { type: "string", minLength: 1, maxLength: 2000, description: "which write was refused; kept as the job's last error" },
            },
            ["id", "attempt", "reason"],
          ),
        },
      },
      ["workerId", "jobs"],
    ),
    response: { 200: reportResult, ...errors(...COMMON_ERRORS, 409) },
  },
  release: {
    ...secured,
    tags: ["worker"],
    summary: "Give attempts back without spending the retry budget (graceful shutdown)",
    body: object(
      {
        workerId: WORKER_ID,
        jobs: { type: "array", items: ATTEMPT_REF, minItems: 1, maxItems: MAX_BATCH },
        reason: { type: "string", maxLength: 1000 },
      },
      ["workerId", "jobs", "reason"],
    ),
    response: { 200: reportResult, ...errors(...COMMON_ERRORS, 409) },
  },
  lost: {
    ...secured,
    tags: ["worker"],
    summary: "Why these attempts no longer hold their jobs (and how each ended)",
    body: object({ workerId: WORKER_ID, attempts: { type: "array", items: ATTEMPT_REF, minItems: 1, maxItems: MAX_BATCH } }, [
      "workerId",
      "attempts",
    ]),
    response: {
      200: {
        type: "object",
        properties: {
          lost: {
            type: "array",
            items: {
              type: "object",
              properties: {
                id: JOB_ID,
                reason: { type: "string" },
                endedAs: { type: ["string", "null"] },
                finishedState: { type: ["string", "null"] },
              },
            },
          },
          invalid: { type: "array", description: "attempts not looked up: missing or wrong receipt", items: INVALID_ITEM },
        },
      },
      ...errors(...COMMON_ERRORS),
    },
  },
  reconcile: {
    ...secured,
    tags: ["worker"],
    summary: "At start-up, recover the jobs an earlier (dead) process with this worker name still holds; each spends an attempt",
    body: object(
      {
        workerName: WORKER_NAME,
        currentWorkerId: WORKER_ID,
        identity: {
          ...IDENTITY,
          description:
            "the identity proof attach returned to currentWorkerId, attached with workerName: only the jobs of earlier processes of that " +
            "name are recovered. Without it nothing is recovered (skipped says why); a wrong one is refused with 403 invalid_identity",
        },
        backoff: { ...BACKOFF(), description: "ignored (accepted from older workers): each job backs off by its own policy, else the server's" },
      },
      ["workerName", "currentWorkerId"],
    ),
    response: {
      200: {
        type: "object",
        properties: {
          released: { type: "integer", description: "jobs recovered" },
          skipped: { type: "string", description: "present when nothing was looked for: why (no identity proof was sent)" },
        },
      },
      ...errors(...COMMON_ERRORS, 403),
    },
  },
  attach: {
    ...secured,
    tags: ["worker"],
    summary:
      "Announce a remote worker (a worker id no process used before) and its tasks' policies, which apply to the jobs it holds only; " +
      "a name already used by a live worker is refused",
    body: object(
      {
        workerId: WORKER_ID,
        name: WORKER_NAME,
        queues: { type: "array", items: NAME, minItems: 1, maxItems: 100 },
        concurrency: { type: "integer", minimum: 1, maximum: 10000 },
        leaseMs: LEASE_MS,
        heartbeatMs: { type: "integer", minimum: 100, maximum: 86400000 },
        policies: {
          type: "array",
          maxItems: 1000,
          items: object({ task: NAME, backoff: BACKOFF(), progressTimeoutMs: NULLABLE_LIMIT, maxRunMs: NULLABLE_LIMIT }, ["task", "backoff"]),
        },
      },
      ["workerId", "queues", "concurrency", "leaseMs", "policies"],
    ),
    response: {
      200: {
        type: "object",
        properties: {
          ok: { type: "boolean" },
          identity: { type: "string", description: "this worker's identity proof: send it with detach, reconcile and the cancel poll" },
        },
      },
      ...errors(...COMMON_ERRORS, 409),
    },
  },
  detach: {
    ...secured,
    tags: ["worker"],
    summary: "A remote worker stops; graceful: it gave its jobs back",
    body: object(
      {
        workerId: WORKER_ID,
        graceful: { type: "boolean" },
        identity: {
          ...IDENTITY,
          description: "the identity proof attach returned to this worker: without it (or with a wrong one), 403 invalid_identity",
        },
      },
      ["workerId"],
    ),
    response: { 200: { type: "object", properties: { ok: { type: "boolean" } } }, ...errors(...COMMON_ERRORS, 403) },
  },
  rateLimited: {
    ...secured,
    tags: ["worker"],
    summary:
      "Report attempts whose handlers were rate-limited (RateLimitedError): each job waits delayMs without spending its retry budget, " +
      "and its key or queue starts nothing for that long (fenced: a stale attempt is refused)",
    body: object(
      {
        workerId: WORKER_ID,
        jobs: {
          type: "array",
          minItems: 1,
          maxItems: MAX_BATCH,
          items: object(
            {
              id: JOB_ID,
              attempt: ATTEMPT,
              receipt: RECEIPT,
              delayMs: {
                type: "integer",
                minimum: 1,
                maximum: 86400000,
                description: "how long the job waits; its key or queue waits as long, at most the queue's maxHoldMs",
              },
              scope: {
                type: "string",
                enum: ["key", "queue", "job"],
                description:
                  "what waits: the job's key, the whole queue (only where the queue's allowQueueHold is set; otherwise its key, or a keyless job alone), or the job alone",
              },
            },
            ["id", "attempt", "delayMs", "scope"],
          ),
        },
        message: { type: "string", maxLength: 1000, description: "what the handler said; kept in the job's last error" },
      },
      ["workerId", "jobs"],
    ),
    response: { 200: reportResult, ...errors(...COMMON_ERRORS, 409) },
  },
  workerQueues: {
    ...secured,
    tags: ["worker"],
    summary: "Flow-control settings of every configured queue (a worker's view: which to claim under limits, which are paused)",
    response: {
      200: { type: "object", properties: { queues: { type: "array", items: queueSettingsSchema } } },
      ...errors(401, 403, 503),
    },
  },
  listQueues: {
    ...secured,
    tags: ["queues"],
    summary: "Every queue anyone can name, with its flow-control settings (paused, limits, rates) and counts of waiting and running jobs",
    response: {
      200: { type: "object", properties: { queues: { type: "array", items: queueInfoSchema } } },
      ...errors(401, 403, 503),
    },
  },
  queueDepth: {
    ...secured,
    tags: ["queues"],
    summary:
      "Every queue's depth now (the queue_depth view): ready jobs and the oldest one's age, running, delayed and blocked jobs, paused; the queues with unfinished jobs or settings",
    response: {
      200: { type: "object", properties: { queues: { type: "array", items: queueDepthSchema } } },
      ...errors(401, 403, 503),
    },
  },
  pauseQueue: {
    ...secured,
    tags: ["queues"],
    summary:
      "Pause a queue for the whole fleet: no claim takes its jobs; workers give back what they buffered (enqueue goes on, running jobs finish)",
    params: queueParams,
    querystring: CREATE_QUERY,
    response: { 200: queueAnswer, ...QUEUE_ERRORS },
  },
  resumeQueue: {
    ...secured,
    tags: ["queues"],
    summary: "Resume a paused queue and lift its handlers' holds: waiting workers are woken at once",
    params: queueParams,
    querystring: CREATE_QUERY,
    response: { 200: queueAnswer, ...QUEUE_ERRORS },
  },
  clearQueueHolds: {
    ...secured,
    tags: ["queues"],
    summary:
      "Lift the holds handlers set on a queue with RateLimitedError (the queue's and its keys') and make its rate-limited jobs due now: " +
      "its next claims start jobs again",
    params: queueParams,
    response: {
      200: {
        type: "object",
        properties: {
          cleared: {
            type: "object",
            properties: {
              queue: { type: "boolean", description: "the queue's own hold was lifted" },
              keys: { type: "integer", description: "how many keys' holds were lifted" },
              jobs: { type: "integer", description: "how many rate-limited jobs waiting out their delay were made due now" },
            },
          },
        },
      },
      ...QUEUE_ERRORS,
    },
  },
  setQueueLimits: {
    ...secured,
    tags: ["queues"],
    summary: "Change a queue's limits at run time, for every worker: each given limit takes its value (null: none), the others stay",
    params: queueParams,
    querystring: CREATE_QUERY,
    body: {
      ...object({ ...LIMIT_FIELDS, create: { type: "boolean", description: "as the create query parameter" } }),
      description: "the limits to change; values out of range are refused with 400 naming them",
    },
    response: { 200: queueAnswer, ...QUEUE_ERRORS },
  },
  setQueueHistory: {
    ...secured,
    tags: ["queues"],
    summary: "Set what a queue keeps of its finished jobs, at run time: keepSucceeded false keeps no record of succeeded jobs",
    description:
      "Binds the completions that start after it. Failed, dead and cancelled jobs keep their records, and so does a succeeded job whose " +
      "result is needed (dependents, a waiter, a durable parent); a job whose record is not kept answers 410 job_not_kept.",
    params: queueParams,
    querystring: CREATE_QUERY,
    body: object(
      {
        keepSucceeded: { type: "boolean", description: "false: keep no record of succeeded jobs; true (the default): keep them" },
        create: { type: "boolean", description: "as the create query parameter" },
      },
      ["keepSucceeded"],
    ),
    response: { 200: queueAnswer, ...QUEUE_ERRORS },
  },
  enqueue: {
    ...secured,
    tags: ["jobs"],
    summary: "Enqueue one job",
    body: newJob,
    response: {
      201: { description: "enqueued (created=false: a unique key matched an unfinished job)", ...enqueued },
      ...errors(...OPERATOR_ERRORS),
    },
  },
  enqueueBatch: {
    ...secured,
    tags: ["jobs"],
    summary: "Enqueue many jobs atomically (all or none)",
    body: object({ jobs: { type: "array", items: newJob, minItems: 1, maxItems: MAX_ENQUEUE_BATCH } }, ["jobs"]),
    response: {
      201: {
        type: "object",
        properties: {
          jobs: { type: "array", items: enqueued },
          warnings: { ...WARNINGS, description: "each distinct warning of the batch's jobs once" },
        },
      },
      ...errors(...OPERATOR_ERRORS),
    },
  },
  listJobs: {
    ...secured,
    tags: ["jobs"],
    summary: "List jobs, newest first, a page at a time (payloads only with payload=true)",
    description:
      "A page holds at most `limit` jobs and about 8 MiB of JSON (always at least one job). `next` is the cursor that continues " +
      "the list: pass it as `before`; it is null when the list has ended.",
    querystring: object({
      ...JOB_FILTER,
      limit: { type: "string", pattern: "^[0-9]{1,5}$", description: "1..10000, default 50" },
      before: { ...JOB_ID, description: "only jobs with a smaller id: the `next` of the previous page" },
      payload: { type: "string", enum: ["true", "false"], description: "include each job's payload (default false)" },
    }),
    response: {
      200: {
        type: "object",
        properties: {
          jobs: { type: "array", items: jobRecordSchema },
          next: { type: ["string", "null"], description: "pass as `before` for the next page; null at the end" },
        },
      },
      ...errors(400, 401, 403, 503),
    },
  },
  getJob: {
    ...secured,
    tags: ["jobs"],
    summary: "A job with its attempt history, its flow relations, its durable steps and its wait",
    params: idParams,
    response: {
      200: {
        type: "object",
        properties: {
          job: jobRecordSchema,
          attempts: { type: "array", items: attemptRecordSchema },
          progressFraction: PROGRESS_FRACTION,
          parents: { type: "array", items: JOB_LINK, description: "the jobs this one waits or waited for (lowest ids first, at most 1,000)" },
          children: { type: "array", items: JOB_LINK, description: "the jobs waiting or that waited for this one (lowest ids first, at most 1,000)" },
          parentCount: { type: "integer" },
          childCount: { type: "integer" },
          reruns: { type: "array", items: JOB_RERUN, description: "re-runs from a step, oldest first, with the step records each dropped" },
          steps: { type: "array", items: JOB_STEP, description: "its durable steps, the latest 100 in call order" },
          stepCount: { type: "integer", description: "how many steps it recorded in all" },
          wait: JOB_WAIT,
        },
      },
      ...errors(400, 401, 403, 404, 410, 503),
    },
  },
  waitJob: {
    ...secured,
    tags: ["jobs"],
    summary: "Wait for a job to finish (a long poll)",
    description:
      "Answers once the job has finished (succeeded, dead or cancelled) with finished true and its record (with its result), or " +
      `after timeoutMs (at most ${MAX_WAIT_MS}, the default) with finished false and the job as it is then: ask again to wait longer. ` +
      "Woken by the database's notification; waits beyond the server's --max-long-polls answer at once.",
    params: idParams,
    querystring: object({ timeoutMs: { type: "string", pattern: "^[0-9]{1,9}$", description: `ms to wait, at most ${MAX_WAIT_MS}` } }),
    response: {
      200: { type: "object", properties: { finished: { type: "boolean" }, job: jobRecordSchema } },
      ...errors(400, 401, 403, 404, 410, 503),
    },
  },
  cancel: {
    ...secured,
    tags: ["jobs"],
    summary: "Cancel a job: a waiting one ends now; a running one has its handler aborted at once",
    params: idParams,
    response: {
      200: { type: "object", properties: { result: { type: "string", enum: ["cancelled", "cancel_requested"] } } },
      ...errors(400, 401, 403, 404, 410, 409, 503),
    },
  },
  retry: {
    ...secured,
    tags: ["jobs"],
    summary: "Move a dead or cancelled job back to waiting with a fresh retry budget",
    params: idParams,
    response: {
      200: { type: "object", properties: { result: { type: "string", enum: ["retried"] } } },
      ...errors(400, 401, 403, 404, 410, 409, 503),
    },
  },
  rerun: {
    ...secured,
    tags: ["jobs"],
    summary: "Re-run a finished or dead durable job from a recorded step: the steps before it replay, it and those after run again",
    params: idParams,
    body: object(
      {
        fromStep: { type: "string", description: "the recorded step's name" },
        occurrence: { type: "integer", minimum: 0, description: "which call of that name, from 0 (default 0)" },
      },
      ["fromStep"],
    ),
    response: {
      200: { ...JOB_RERUN, properties: { ...JOB_RERUN.properties, stepsDropped: { type: "integer" } } },
      ...errors(400, 401, 403, 404, 409, 503),
    },
  },
  stats: {
    ...secured,
    tags: ["jobs"],
    summary: "Counts by queue and state, active leases, the oldest ready job",
    response: {
      200: {
        type: "object",
        properties: {
          counts: { type: "array", items: { type: "object", properties: { queue: NAME, state: { type: "string" }, count: { type: "integer" } } } },
          activeLeases: { type: "integer" },
          expiredLeases: { type: "integer" },
          watchdogs: { type: "integer", description: "watchdogs seen within the last minute" },
          workers: { type: "integer", description: "workers seen within the last minute" },
          oldestReadyAt: TIME,
          oldestReadyAgeSeconds: { type: ["number", "null"] },
          withoutHandler: HANDLER_GAPS,
        },
      },
      ...errors(401, 403, 503),
    },
  },
  listSchedules: {
    ...secured,
    tags: ["schedules"],
    summary: "Every schedule (periodic job) with its next and last tick; edit them with `leasehold schedules` or `lh.schedule`",
    response: {
      200: {
        type: "object",
        properties: {
          schedules: {
            type: "array",
            items: {
              type: "object",
              properties: {
                name: NAME,
                cron: { type: "string" },
                timezone: { type: "string" },
                task: NAME,
                queue: NAME,
                payload: {},
                jobOptions: { type: "object", additionalProperties: true },
                backfill: { type: "boolean" },
                backfillLimit: {
                  type: ["integer", "null"],
                  description: "with backfill: the most missed ticks enqueued after downtime (the latest)",
                },
                nextRunAt: TIME,
                lastRunAt: TIME,
                lastJobId: { type: ["string", "null"] },
                createdAt: TIME,
                updatedAt: TIME,
              },
            },
          },
        },
      },
      ...errors(401, 403, 503),
    },
  },
  metrics: {
    ...secured,
    tags: ["operations"],
    summary: "Prometheus metrics (text exposition format)",
    response: { 200: { description: "metrics", type: "string" }, ...errors(401, 403) },
  },
  openapi: {
    ...secured,
    tags: ["operations"],
    summary: "This OpenAPI document",
    response: { 200: { description: "OpenAPI 3 document", type: "object", additionalProperties: true }, ...errors(401, 403) },
  },
  workerCheck: {
    ...secured,
    tags: ["worker"],
    summary: "Check the server and the token before working: answers the token's scope",
    response: { 200: { type: "object", properties: { scope: { type: "string", enum: ["operator", "worker"] } } }, ...errors(401) },
  },
  health: {
    tags: ["operations"],
    summary: "Liveness and database reachability; the only route without a token (it reveals nothing else)",
    response: { 200: { type: "object", properties: { ok: { type: "boolean" } } }, 503: { description: "database unreachable", ...errorSchema } },
  },
};
