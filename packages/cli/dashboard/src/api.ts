/**
 * The server's API, as the page calls it: the token goes in the Authorization header of each
 * request (never a cookie: `credentials: "omit"`), and changes are POSTs (a queue's limits: a PATCH).
 */

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly body: Record<string, unknown> = {},
  ) {
    super(message);
  }
}

const TIMEOUT_MS = 10_000;

export class Api {
  constructor(private readonly token: string) {}

  get<T>(path: string, query: Record<string, string | undefined> = {}): Promise<T> {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) if (v !== undefined && v !== "") q.set(k, v);
    const qs = q.toString();
    return this.call<T>("GET", qs ? `${path}?${qs}` : path);
  }

  post<T>(path: string, body?: unknown): Promise<T> {
    return this.call<T>("POST", path, body);
  }

  patch<T>(path: string, body: unknown): Promise<T> {
    return this.call<T>("PATCH", path, body);
  }

  delete<T>(path: string): Promise<T> {
    return this.call<T>("DELETE", path);
  }

  private async call<T>(method: string, path: string, body?: unknown): Promise<T> {
    let response: Response;
    try {
      response = await fetch(path.replace(/^\//, ""), {
        method,
        headers: {
          authorization: `Bearer ${this.token}`,
          accept: "application/json",
          ...(body !== undefined && { "content-type": "application/json" }),
        },
        body: body === undefined ? undefined : JSON.stringify(body),
        credentials: "omit",
        cache: "no-store",
        signal: AbortSignal.timeout(TIMEOUT_MS),
      });
    } catch (err) {
      throw new ApiError(0, "unreachable", `cannot reach the server (${(err as Error).message})`);
    }
    const text = await response.text();
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = undefined;
    }
    if (response.ok) return parsed as T;
    const error = (parsed as { error?: { code?: string; message?: string } } | undefined)?.error;
    throw new ApiError(
      response.status,
      error?.code ?? "http_error",
      error?.message ?? `the server answered ${response.status}`,
      (error ?? {}) as Record<string, unknown>,
    );
  }
}

// What the routes answer (dates are ISO strings, durations milliseconds by the database's clock).

export type JobState = "blocked" | "waiting" | "suspended" | "running" | "succeeded" | "dead" | "cancelled";

export interface QueueOverview {
  queue: string;
  waiting: number;
  scheduled: number;
  blocked: number;
  /** Durable jobs sleeping or waiting for an event (a server of an earlier release sends none). */
  suspended?: number;
  running: number;
  expired: number;
  dead: number;
  oldestWaitingMs: number | null;
}

export interface ProcessRecord {
  id: string;
  name: string | null;
  kind: "worker" | "watchdog";
  host: string | null;
  pid: number | null;
  queues: string[];
  tasks: string[];
  concurrency: number | null;
  inFlight: number;
  leaseMs: number | null;
  heartbeatMs: number | null;
  lastSeenMsAgo: number;
  upMs: number;
  lost: boolean;
}

/** Waiting jobs whose task, in their queue, no live worker runs. */
export interface HandlerGap {
  queue: string;
  task: string;
  waiting: number;
  scheduled: number;
  oldestWaitingMs: number | null;
  didYouMeanTask: string | null;
  didYouMeanQueue: string | null;
}

/** A rate: at most `limit` starts in any window of `windowMs`. */
export interface Rate {
  limit: number;
  windowMs: number;
}

/** The limits of a queue (null: none), as PATCH /v1/queues/NAME/limits takes them. */
export interface QueueLimits {
  concurrency: number | null;
  keyConcurrency: number | null;
  rate: Rate | null;
  keyRate: Rate | null;
  keyWeights: Record<string, number> | null;
}

/** A queue's flow-control settings. */
export interface QueueSettings extends QueueLimits {
  name: string;
  paused: boolean;
  pausedAt: string | null;
  keyed: boolean;
  /** A handler's RateLimitedError holds the whole queue until then (in force while in the future), set by this job. */
  heldUntil: string | null;
  heldByJob: string | null;
  /** The longest hold a handler may set (null: the default, 5 minutes), and whether it may hold the whole queue. */
  maxHoldMs: number | null;
  allowQueueHold: boolean;
  flow: boolean;
  /** false: the queue keeps no record of its succeeded jobs (PATCH /v1/queues/NAME/history); absent from an earlier release's server. */
  keepSucceeded?: boolean;
  updatedAt: string | null;
}

export interface Overview {
  queues: QueueOverview[];
  processes: ProcessRecord[];
  withoutHandler: HandlerGap[];
  flow: QueueSettings[];
}

export interface RunningJob {
  id: string;
  queue: string;
  task: string;
  attempt: number;
  spentAttempts: number;
  maxAttempts: number;
  workerId: string;
  startedAt: string;
  heartbeatAt: string;
  runningMs: number;
  heartbeatMsAgo: number;
  leaseLeftMs: number;
  progress: unknown;
  progressTooLarge: boolean;
  progressFraction: number | null;
  cancelRequested: boolean;
}

/** A running job past twice its task's usual run time (GET /v1/running-long). */
export interface RunningLongJob {
  id: string;
  queue: string;
  task: string;
  attempt: number;
  workerId: string;
  startedAt: string;
  runningMs: number;
  usualP99Ms: number;
  samples: number;
}

export interface RunningLong {
  jobs: RunningLongJob[];
  more: boolean;
  samples: number;
  minSamples: number;
  factor: number;
  minExcessMs: number;
}

export type RecoveryEventKind = "lease_expired" | "worker_lost" | "stalled" | "timed_out" | "released" | "refused";

export interface Activity {
  windowMs: number;
  sampleIntervalMs: number;
  counting: boolean;
  throughput: { at: string; finished: number | null; dead: number | null; requeued: number | null; enqueued: number | null }[];
  recoveries: { minute: string; counts: Partial<Record<RecoveryEventKind, number>> }[];
}

export interface RecoveryEvent {
  at: string;
  event: RecoveryEventKind;
  jobId: string;
  attempt: number;
  workerId: string;
  detail: string | null;
  wentDead: boolean;
  via: "database" | "server" | null;
  queue: string | null;
  task: string | null;
}

export interface JobRecord {
  id: string;
  queue: string;
  task: string;
  payload?: unknown;
  priority: number;
  state: JobState;
  attempt: number;
  spentAttempts: number;
  maxAttempts: number;
  runAt: string | null;
  leaseUntil: string | null;
  lockedBy: string | null;
  heartbeatAt: string | null;
  cancelRequestedAt: string | null;
  progress: unknown;
  checkpoint: unknown;
  lastError: string | null;
  uniqueKey: string | null;
  /** Its flow-control key while it is unfinished. */
  key: string | null;
  createdAt: string;
  startedAt: string | null;
  finishedAt: string | null;
  /** What its handler returned (the attempt that succeeded); null when none. */
  result?: unknown;
}

/** A job's parent or child in a flow. */
export interface JobLink {
  id: string;
  ref: string | null;
  task: string | null;
  /** "unknown": forgotten by retention. */
  state: string;
}

export interface AttemptRecord {
  jobId: string;
  attempt: number;
  workerId: string;
  startedAt: string;
  endedAt: string;
  outcome: string;
  error: string | null;
}

/** A durable job's recorded step. */
export interface JobStep {
  seq: number;
  name: string;
  occurrence: number;
  kind: string;
  state: "succeeded" | "failed" | "waiting";
  attempt: number;
  durationMs: number | null;
  resultBytes: number | null;
  result?: unknown;
  error: string | null;
  wakeAt: string | null;
  event: string | null;
  recordedAt: string;
}

/** Why a suspended job waits. */
export interface JobWait {
  kind: "sleep" | "event" | "callback" | "children";
  step: string;
  until: string | null;
  event: string | null;
  match: unknown;
}

export interface JobDetail {
  job: JobRecord;
  attempts: AttemptRecord[];
  progressFraction: number | null;
  parents?: JobLink[];
  children?: JobLink[];
  parentCount?: number;
  childCount?: number;
  /** Its durable steps, the latest 100 (a server of an earlier release sends none). */
  steps?: JobStep[];
  stepCount?: number;
  wait?: JobWait | null;
  reruns?: JobRerun[];
}

/** A re-run from a step, from the job's audit trail. */
export interface JobRerun {
  id: string;
  fromStep: string;
  fromOccurrence: number;
  fromSeq: number;
  previousState: string;
  requestedBy: string | null;
  requestedAt: string;
  stepsDropped: { name: string; seq: number }[];
}

export interface JobPage {
  jobs: JobRecord[];
  next: string | null;
}

export interface Schedule {
  name: string;
  cron: string;
  timezone: string;
  task: string;
  queue: string;
  payload: unknown;
  nextRunAt: string | null;
  lastRunAt: string | null;
  lastJobId: string | null;
}

export interface BulkCount {
  action: "retry" | "cancel";
  matched: number;
  max: number;
}

export interface BulkResult {
  action: "retry" | "cancel";
  matched: number;
  changed: number;
  requested: number;
  skipped: number;
}
