/**
 * The CLI's job and queue operations over a `leasehold serve` API instead of a database
 * connection (`--server URL --token T`), for operators who can reach the server but not the
 * database. Same shapes and the same typed errors as the `Leasehold` client's methods.
 */
import type { Leasehold, ListJobsOptions, Stats } from "leasehold/internal/client";
import { checkJobId } from "leasehold/internal/jobs/ids";
import { JobNotFoundError, JobNotKeptError, JobStateError, ValidationError, WaitTimeoutError } from "leasehold/internal/errors";
import type { JobRelations } from "leasehold/internal/store/admin";
import type { JobRerun } from "leasehold/internal/store/reruns";
import type { Rerun, RerunOptions } from "leasehold/internal/durable-admin";
import { checkCallbackToken } from "leasehold/internal/jobs/callbacks";
import type { JobStep, JobSteps, JobWait } from "leasehold/internal/store/step-views";
import type { WaitOptions } from "leasehold/internal/waiters";
import type { AttemptRecord, EnqueueOptions, EnqueuedJob, JobRecord, ListedJob, NewJob } from "leasehold/internal/jobs/types";
import type { BatchInput, FlowNode } from "leasehold/internal/jobs/flow-graph";
import type { ClearedHolds, QueueDepth, QueueHistory, QueueInfo, QueueLimits, QueueSettings } from "leasehold/internal/store/index";
import { ServerError, ServerUnavailableError } from "leasehold/internal/worker/remote-transport";

/** What the job and queue commands need: the `Leasehold` client has it, and so does this API client. */
export type JobOperations = Pick<
  Leasehold,
  | "enqueue"
  | "enqueueMany"
  | "enqueueFlow"
  | "enqueueBatch"
  | "getJob"
  | "waitFor"
  | "listJobs"
  | "cancel"
  | "retry"
  | "completeCallback"
  | "rerunFromStep"
  | "stats"
  | "listQueues"
  | "queueDepth"
  | "pauseQueue"
  | "resumeQueue"
  | "setQueueLimits"
  | "setQueueHistory"
  | "clearQueueHolds"
  | "sendEvent"
>;

/** Jobs per batch request: 1,000 payloads of up to a few KiB stay under the server's body limit. */
export const REMOTE_ENQUEUE_BATCH = 1_000;
const TIMEOUT_MS = 30_000;
/** One long poll's wait at most (the server's cap, MAX_WAIT_MS). */
const MAX_JOB_WAIT_MS = 60_000;

type Wire<T> = { [K in keyof T]: T[K] extends Date ? string : T[K] extends Date | null ? string | null : T[K] };

export class RemoteOperations implements JobOperations {
  private readonly base: URL;

  constructor(
    serverUrl: string,
    private readonly token: string,
  ) {
    try {
      this.base = new URL(serverUrl);
    } catch {
      throw new ValidationError(`server URL ${JSON.stringify(serverUrl)} is not a URL`);
    }
  }

  async enqueue(task: string, payload?: unknown, options: EnqueueOptions = {}): Promise<EnqueuedJob> {
    return this.call<EnqueuedJob>("POST", "/v1/jobs", { ...options, task, payload });
  }

  async enqueueMany(jobs: NewJob[]): Promise<EnqueuedJob[]> {
    const out: EnqueuedJob[] = [];
    for (let i = 0; i < jobs.length; i += REMOTE_ENQUEUE_BATCH) {
      const { jobs: created } = await this.call<{ jobs: EnqueuedJob[] }>("POST", "/v1/jobs/batch", { jobs: jobs.slice(i, i + REMOTE_ENQUEUE_BATCH) });
      out.push(...created);
    }
    return out;
  }

  /** One request, one transaction on the server: the whole graph or nothing. */
  async enqueueFlow(nodes: FlowNode[]): Promise<{ jobs: Record<string, string> }> {
    return this.call<{ jobs: Record<string, string> }>("POST", "/v1/flows", { nodes });
  }

  async enqueueBatch(batch: BatchInput): Promise<{ callbackId: string; jobIds: string[] }> {
    return this.call<{ callbackId: string; jobIds: string[] }>("POST", "/v1/batches", batch);
  }

  async getJob(id: string): Promise<{ job: JobRecord; attempts: AttemptRecord[] } & JobRelations & { reruns: JobRerun[] } & JobSteps> {
    checkJobId(id);
    const r = await this.call<
      {
        job: Wire<JobRecord>;
        attempts: Wire<AttemptRecord>[];
        steps?: Wire<JobStep>[];
        stepCount?: number;
        wait?: Wire<JobWait> | null;
        reruns?: Wire<JobRerun>[];
      } & JobRelations
    >("GET", `/v1/jobs/${id}`, undefined, id);
    const date = (v: string | null) => (v === null ? null : new Date(v));
    return {
      job: jobFromWire(r.job) as JobRecord,
      attempts: r.attempts.map((a) => ({ ...a, startedAt: new Date(a.startedAt), endedAt: new Date(a.endedAt) })),
      parents: r.parents ?? [],
      children: r.children ?? [],
      parentCount: r.parentCount ?? 0,
      childCount: r.childCount ?? 0,
      reruns: (r.reruns ?? []).map((x) => ({ ...x, requestedAt: new Date(x.requestedAt) })),
      // A server of an earlier release has no steps to tell.
      steps: (r.steps ?? []).map((s) => ({ ...s, wakeAt: date(s.wakeAt), recordedAt: new Date(s.recordedAt) })),
      stepCount: r.stepCount ?? 0,
      wait: r.wait ? { ...r.wait, until: date(r.wait.until) } : null,
    };
  }

  /**
   * As `Leasehold.waitFor`, over the server's long poll: each request waits at most the
   * server's cap, and is made again until the job finishes or `timeoutMs` has passed.
   */
  async waitFor(id: string, options: WaitOptions = {}): Promise<JobRecord> {
    checkJobId(id);
    const deadline = options.timeoutMs === undefined ? Infinity : Date.now() + options.timeoutMs;
    for (;;) {
      const left = deadline - Date.now();
      const wait = Math.max(0, Math.min(MAX_JOB_WAIT_MS, left));
      const r = await this.call<{ finished: boolean; job: Wire<JobRecord> }>(
        "GET",
        `/v1/jobs/${id}/wait?timeoutMs=${Math.floor(wait)}`,
        undefined,
        id,
        wait + TIMEOUT_MS,
      );
      if (r.finished) return jobFromWire(r.job) as JobRecord;
      if (Date.now() >= deadline) throw new WaitTimeoutError(id, options.timeoutMs!);
    }
  }

  /** As `Leasehold.listJobs`: follows the server's pages (each at most a few MiB) up to `limit` jobs. */
  async listJobs(filter: ListJobsOptions = {}): Promise<ListedJob[]> {
    const limit = filter.limit ?? 50;
    const jobs: ListedJob[] = [];
    let before = filter.before;
    do {
      const query = new URLSearchParams({ limit: String(limit - jobs.length), payload: String(filter.includePayload ?? true) });
      if (filter.state !== undefined) query.set("state", filter.state);
      if (filter.queue !== undefined) query.set("queue", filter.queue);
      if (before !== undefined) query.set("before", before);
      const page = await this.call<{ jobs: Wire<ListedJob>[]; next: string | null }>("GET", `/v1/jobs?${query}`);
      jobs.push(...page.jobs.map(jobFromWire));
      before = page.next ?? undefined;
    } while (before !== undefined && jobs.length < limit);
    return jobs;
  }

  async cancel(id: string): Promise<"cancelled" | "cancel_requested"> {
    return (await this.call<{ result: "cancelled" | "cancel_requested" }>("POST", `/v1/jobs/${encodeURIComponent(id)}/cancel`, undefined, id)).result;
  }

  async retry(id: string): Promise<void> {
    await this.call("POST", `/v1/jobs/${encodeURIComponent(id)}/retry`, undefined, id);
  }

  async rerunFromStep(id: string, step: string, options: RerunOptions = {}): Promise<Rerun> {
    checkJobId(id);
    const body = { fromStep: step, ...(options.occurrence !== undefined && { occurrence: options.occurrence }) };
    const r = await this.call<Wire<Rerun>>("POST", `/v1/jobs/${encodeURIComponent(id)}/rerun`, body, id);
    return { ...r, requestedAt: new Date(r.requestedAt) };
  }

  /** As `Leasehold.completeCallback`: the token is the credential (POST /v1/callbacks/:token needs no API token). */
  async completeCallback(token: string, data?: unknown): Promise<void> {
    checkCallbackToken(token, "completeCallback");
    await this.call("POST", `/v1/callbacks/${token}`, data);
  }

  async stats(): Promise<Stats> {
    const s = await this.call<Wire<Stats>>("GET", "/v1/stats");
    return { ...s, oldestReadyAt: s.oldestReadyAt === null ? null : new Date(s.oldestReadyAt) };
  }

  async listQueues(): Promise<QueueInfo[]> {
    const { queues } = await this.call<{ queues: Wire<QueueInfo>[] }>("GET", "/v1/queues");
    return queues.map((q) => ({ ...settingsFromWire(q), holds: q.holds.map((h) => ({ ...h, until: new Date(h.until) })) }));
  }

  async queueDepth(): Promise<QueueDepth[]> {
    return (await this.call<{ queues: QueueDepth[] }>("GET", "/v1/queues/depth")).queues;
  }

  async pauseQueue(name: string, options: { create?: boolean } = {}): Promise<QueueSettings> {
    return this.queueCall("POST", name, "pause", options);
  }

  async resumeQueue(name: string, options: { create?: boolean } = {}): Promise<QueueSettings> {
    return this.queueCall("POST", name, "resume", options);
  }

  async setQueueLimits(name: string, limits: Partial<QueueLimits>, options: { create?: boolean } = {}): Promise<QueueSettings> {
    return this.queueCall("PATCH", name, "limits", options, limits);
  }

  async setQueueHistory(name: string, history: QueueHistory, options: { create?: boolean } = {}): Promise<QueueSettings> {
    return this.queueCall("PATCH", name, "history", options, history);
  }

  async clearQueueHolds(name: string): Promise<ClearedHolds> {
    return (await this.call<{ cleared: ClearedHolds }>("DELETE", `/v1/queues/${encodeURIComponent(name)}/hold`)).cleared;
  }

  /** As `Leasehold.sendEvent` (no `db`: the server sends it in its own transaction). */
  async sendEvent(event: string, data?: unknown): Promise<{ id: string }> {
    return this.call<{ id: string }>("POST", "/v1/events", { event, ...(data !== undefined && { data }) });
  }

  private async queueCall(method: "POST" | "PATCH", name: string, action: string, options: { create?: boolean }, body?: unknown) {
    const query = options.create ? "?create=true" : "";
    const { queue } = await this.call<{ queue: Wire<QueueSettings> }>(method, `/v1/queues/${encodeURIComponent(name)}/${action}${query}`, body);
    return settingsFromWire(queue);
  }

  /** A read of the API for views the job operations do not cover (`jobs watch`). */
  get<T>(path: string): Promise<T> {
    return this.call<T>("GET", path);
  }

  private async call<T>(
    method: "GET" | "POST" | "PATCH" | "DELETE",
    path: string,
    body?: unknown,
    jobId?: string,
    timeoutMs = TIMEOUT_MS,
  ): Promise<T> {
    let response: Response;
    let text: string;
    try {
      response = await fetch(new URL(path, this.base), {
        method,
        headers: { authorization: `Bearer ${this.token}`, ...(body !== undefined && { "content-type": "application/json" }) },
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.timeout(timeoutMs),
      });
      text = await response.text();
    } catch (err) {
      const cause = (err as { cause?: { code?: string } }).cause?.code ?? (err as Error).message;
      throw new ServerUnavailableError(`cannot reach the Leasehold server at ${this.base.origin} (${cause})`);
    }
    let parsed: { error?: { code?: string; message?: string } } = {};
    try {
      parsed = JSON.parse(text);
    } catch {
      // not JSON: described by the status below
    }
    if (response.ok) return parsed as T;
    const code = parsed.error?.code ?? "server_error";
    const message = parsed.error?.message ?? `server answered ${response.status}`;
    if (code === "job_not_found" && jobId) throw new JobNotFoundError(jobId);
    if (code === "job_not_kept" && jobId) throw new JobNotKeptError(jobId);
    if (code === "invalid_state") throw new JobStateError(message);
    // The library's own message (did you mean, how to create it), with its code for the exit status.
    if (code === "unknown_queue") throw new ServerError(code, message, response.status);
    if (response.status === 400) throw new ValidationError(message);
    if (response.status >= 502 && response.status <= 504) throw new ServerUnavailableError(`server answered ${response.status}: ${message}`);
    throw new ServerError(code, `server answered ${response.status}: ${message}`, response.status);
  }
}

/** A queue's settings from the wire (dates as strings). */
function settingsFromWire<T extends QueueSettings>(q: Wire<T>): T {
  const wire = q as Wire<QueueSettings>;
  const date = (v: string | null) => (v === null ? null : new Date(v));
  return { ...q, pausedAt: date(wire.pausedAt), heldUntil: date(wire.heldUntil), updatedAt: date(wire.updatedAt) } as unknown as T;
}

/** A record from the wire (dates as strings); getJob's always has its payload. */
function jobFromWire(j: Wire<ListedJob>): ListedJob {
  const date = (v: string | null) => (v === null ? null : new Date(v));
  return {
    ...j,
    runAt: date(j.runAt),
    leaseUntil: date(j.leaseUntil),
    heartbeatAt: date(j.heartbeatAt),
    cancelRequestedAt: date(j.cancelRequestedAt),
    createdAt: new Date(j.createdAt),
    startedAt: date(j.startedAt),
    finishedAt: date(j.finishedAt),
  };
}
