/**
 * The worker runtime over HTTP: the same `Worker`, talking to `leasehold serve` instead of
 * PostgreSQL. The fence is the server's SQL, so the guarantees are the database transport's:
 *
 *   const worker = new Worker({ handlers, transport: new RemoteTransport({ serverUrl, token }) });
 *
 * There is no LISTEN over HTTP: a claim is a long poll that the server holds until a job is
 * ready (or `waitMs` passes), and after each one the worker is told to poll again at once.
 * A request that fails in transit (connection refused or reset, timeout, 502-504) throws an
 * error with code "server_unavailable", which the reporter treats as an ambiguous commit
 * and retries; a claim whose answer is lost leaves its jobs to expire and be reaped.
 *
 * A claim returns a receipt per job, which the server requires on every later request about
 * that attempt. This transport keeps them (by "id:attempt") and attaches them, so the
 * runtime never sees them. One is dropped when its attempt's end was reported and applied,
 * when it was released, or when a report was refused and the attempt then found lost. An
 * attempt found lost by a heartbeat keeps its receipt: a report of it may still be in
 * flight (its retry, after an ambiguous commit, must carry it); unused receipts age out.
 *
 * Instant cancel: while the worker holds jobs, a second long poll stays open
 * (POST /v1/worker/cancels), answered by the server as soon as its LISTEN session hears a cancel
 * of one of this worker's attempts. Each poll names the attempts held (with their receipts) so
 * the server first checks for a cancel requested between polls. With `waitMs` 0 (polling, no
 * long polls) there is no cancel poll: cancels come with heartbeats.
 */
import type { ClaimedJob } from "../jobs/types.js";
import { ConfigError, LeaseholdError, ValidationError } from "../errors.js";
import type * as store from "../store/index.js";
import type { StepRecord } from "../jobs/steps.js";
import type { JsonValue } from "../jobs/types.js";
import type { AttachParams, Attachment, ChildrenCall, SuspensionAnswer, WorkerTransport } from "./transport.js";

export const DEFAULT_LONG_POLL_MS = 20_000;
export const DEFAULT_REQUEST_TIMEOUT_MS = 15_000;
/**
 * Receipts kept at most: far beyond what a worker holds (twice its concurrency). The least
 * recently used go first, so receipts of attempts the worker no longer mentions age out.
 */
const MAX_RECEIPTS = 100_000;
/** After a failed or refused cancel poll (server unreachable, at its long-poll cap), wait this long before the next. */
const CANCEL_POLL_RETRY_MS = 1_000;
/** Most attempts a cancel poll may name (the server's schema); a worker holds far fewer. */
const MAX_CANCEL_CHECKS = 10_000;
/** The longest reason a superseded report may carry (the server's schema). */
const SUPERSEDED_REASON_MAX = 2_000;

export interface RemoteTransportOptions {
  /** e.g. http://127.0.0.1:7070 */
  serverUrl: string;
  token: string;
  /** How long the server may hold a claim open when no job is ready; 0 polls instead. */
  waitMs?: number;
  /** Every other request (and a claim, beyond its wait) fails after this long. */
  requestTimeoutMs?: number;
}

/** The server could not be reached or could not reach its database: the call may or may not have applied. */
export class ServerUnavailableError extends LeaseholdError {
  constructor(message: string, options?: { cause?: unknown }) {
    super("server_unavailable", message, options);
  }
}

/** The server answered with an error this transport cannot act on. */
export class ServerError extends LeaseholdError {
  constructor(
    code: string,
    message: string,
    readonly status: number,
  ) {
    super(code, message);
  }
}

interface ErrorBody {
  error?: { code?: string; message?: string };
}

type Ref = { id: string; attempt: number };
type WireStepRecord = Omit<StepRecord, "wakeAt" | "recordedAt"> & { wakeAt: string | null; recordedAt: string };
type WireJob = ClaimedJob & { receipt?: string };

export class RemoteTransport implements WorkerTransport {
  /** The server's claim limit (its schema). */
  readonly maxClaimBatch = 500;
  private readonly base: URL;
  private readonly waitMs: number;
  private readonly timeoutMs: number;
  private wake?: () => void;
  private claiming?: AbortController;
  /** The cancel poll's loop, while attached; its request in flight; a wake for it once jobs are held. */
  private cancelLoop?: Promise<void>;
  private cancelPoll?: AbortController;
  private kickCancels?: () => void;
  private attachedAs?: string;
  /** The identity proof attach returned: detach, reconcile and the cancel poll send it. */
  private identity?: string;
  /** "id:attempt" of attempts whose cancel the worker was told of (not named in later polls). */
  private readonly cancelsTold = new Set<string>();
  /** "id:attempt" → the claim's receipt, the worker id it was issued to, and whether a report of it was refused. */
  private readonly receipts = new Map<string, { receipt: string; workerId: string; refused?: boolean }>();

  /** Whoever can reach this worker's server completes callbacks there (POST /v1/callbacks/:token). */
  get callbackBaseUrl(): string {
    return this.base.href;
  }

  constructor(private readonly options: RemoteTransportOptions) {
    try {
      this.base = new URL(options.serverUrl);
    } catch {
      throw new ConfigError(`server URL ${JSON.stringify(options.serverUrl)} is not a URL`);
    }
    if (!options.token) throw new ConfigError("a remote worker needs the server's API token");
    this.waitMs = options.waitMs ?? DEFAULT_LONG_POLL_MS;
    this.timeoutMs = options.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
  }

  async claim(p: store.ClaimParams): Promise<store.ClaimedJobs> {
    if (p.limit <= 0) return [];
    const controller = new AbortController();
    this.claiming = controller;
    try {
      const res = await this.post<{ jobs: WireJob[]; waited?: boolean; retryInMs?: number; paused?: string[] }>(
        "/v1/worker/claim",
        { ...p, waitMs: this.waitMs },
        this.waitMs + this.timeoutMs,
        controller.signal,
      );
      // The server already waited for work: poll again at once instead of sleeping. If it
      // answered without waiting (at its long-poll cap, or stopping), the worker's poll
      // interval paces the next claim instead.
      if (this.waitMs > 0 && (res.body.waited !== false || res.body.jobs.length > 0)) this.wake?.();
      const claimed: store.ClaimedJobs = res.body.jobs.map(({ receipt, ...j }) => {
        if (receipt) this.keepReceipt(j, receipt, p.workerId);
        return {
          ...j,
          checkpoint: j.checkpoint ?? null,
          previousOutcome: j.previousOutcome ?? null,
          lastError: j.lastError ?? null,
          progressTimeoutMs: j.progressTimeoutMs ?? null,
          maxRunMs: j.maxRunMs ?? null,
          maxRunUnlimited: j.maxRunUnlimited ?? false,
          headers: j.headers ?? null,
          key: j.key ?? null,
        };
      });
      if (claimed.length > 0) this.kickCancels?.();
      if (res.body.retryInMs !== undefined) claimed.retryInMs = res.body.retryInMs;
      if (res.body.paused !== undefined) claimed.paused = res.body.paused;
      return claimed;
    } catch (err) {
      if (controller.signal.aborted) return []; // interrupted by stop()
      throw err;
    } finally {
      this.claiming = undefined;
    }
  }

  async attach(p: AttachParams): Promise<Attachment> {
    this.wake = p.wake;
    const res = await this.post<{ identity?: string }>(
      "/v1/worker/attach",
      {
        workerId: p.workerId,
        name: p.name,
        queues: p.queues,
        concurrency: p.concurrency,
        leaseMs: p.leaseMs,
        heartbeatMs: p.heartbeatMs,
        policies: p.policies,
      },
      this.timeoutMs,
    );
    this.attachedAs = p.workerId;
    this.identity = res.body.identity;
    if (this.waitMs > 0 && p.onCancelRequested) this.cancelLoop = this.pollCancels(p.workerId, p.onCancelRequested);
    return {
      detach: async (graceful) => {
        this.wake = undefined;
        this.attachedAs = undefined;
        this.cancelPoll?.abort();
        this.kickCancels?.();
        await this.cancelLoop;
        await this.post("/v1/worker/detach", { workerId: p.workerId, graceful, identity: this.identity }, this.timeoutMs).catch(() => {});
      },
    };
  }

  async heartbeat(p: store.HeartbeatParams): Promise<store.BeatResult> {
    const beats = p.beats.map((b) => ({
      ...this.withReceipt(b),
      ...(b.progressJson != null && { progress: JSON.parse(b.progressJson) }),
      ...(b.checkpointJson != null && { checkpoint: JSON.parse(b.checkpointJson) }),
    }));
    const res = await this.post<{
      renewed: { id: string; cancelRequested: boolean }[];
      lost: string[];
      invalid?: (Ref & { code: string; message?: string })[];
    }>(
      "/v1/worker/heartbeat",
      {
        workerId: p.workerId,
        leaseMs: p.leaseMs,
        beats,
        ...(p.inFlight !== undefined && { inFlight: p.inFlight }),
        ...(p.beatDelays && { beatDelays: p.beatDelays }),
      },
      this.timeoutMs,
      undefined,
      [409],
    );
    if (res.status === 409) return { renewed: new Map(), lost: p.beats.map((b) => b.id) };
    const result: store.BeatResult = {
      renewed: new Map(res.body.renewed.map((r) => [r.id, { cancelRequested: r.cancelRequested }])),
      lost: res.body.lost,
    };
    const invalid = res.body.invalid ?? [];
    // A beat refused for its receipt can never be renewed: the attempt is as good as lost.
    result.lost.push(...invalid.filter((i) => i.code === "invalid_receipt").map((i) => i.id));
    // A beat refused for its progress or checkpoint (a value the server cannot store) would
    // be refused again: renew its lease without the values, which are dropped.
    // The worker fails such an attempt: the value it reported could not be recorded.
    const badValues = p.beats.filter(
      (b) =>
        (b.progressJson != null || b.checkpointJson != null) &&
        invalid.some((i) => i.code !== "invalid_receipt" && i.id === b.id && i.attempt === b.attempt),
    );
    if (badValues.length > 0) {
      const retried = await this.heartbeat({
        workerId: p.workerId,
        leaseMs: p.leaseMs,
        beats: badValues.map((b) => ({ id: b.id, attempt: b.attempt })),
      });
      for (const [id, r] of retried.renewed) result.renewed.set(id, r);
      result.lost.push(...retried.lost);
      result.refused = new Map(
        badValues.map((b) => [
          b.id,
          invalid.find((i) => i.id === b.id && i.code !== "invalid_receipt")?.message ?? "the server refused its progress or checkpoint",
        ]),
      );
    }
    return result;
  }

  /** A success carries its result; the server checks it against its own cap and may end the job dead ("dead"). */
  complete(p: { workerId: string; jobs: store.Completion[] }): Promise<Map<string, "succeeded" | "cancelled" | "dead">> {
    const jobs = p.jobs.map((j) => ({ ...this.withReceipt(j), ...(j.resultJson !== undefined && { result: JSON.parse(j.resultJson) as unknown }) }));
    return this.report("/v1/worker/succeed", { workerId: p.workerId, jobs }, p.jobs);
  }

  fail(p: { workerId: string; failures: store.Failure[] }): Promise<Map<string, store.EndState>> {
    const failures = p.failures.map((f) => ({
      ...this.withReceipt(f),
      error: f.error.slice(0, 10_000),
      backoff: f.backoff,
      outcome: f.outcome ?? "failed",
      giveUp: f.giveUp ?? false,
    }));
    return this.report("/v1/worker/fail", { workerId: p.workerId, failures }, p.failures);
  }

  supersede(p: { workerId: string; jobs: store.Supersession[] }): Promise<Map<string, "superseded" | "cancelled">> {
    const jobs = p.jobs.map((j) => ({ ...this.withReceipt(j), reason: j.reason.slice(0, SUPERSEDED_REASON_MAX) }));
    return this.report("/v1/worker/supersede", { workerId: p.workerId, jobs }, p.jobs);
  }

  async queueSettings(): Promise<store.QueueSettings[]> {
    const res = await this.request<{
      queues: (store.QueueSettings & { pausedAt: string | null; heldUntil: string | null; updatedAt: string | null })[];
    }>("GET", "/v1/worker/queues", undefined, this.timeoutMs);
    const date = (s: string | null) => (s === null ? null : new Date(s));
    return res.body.queues.map((q) => ({ ...q, pausedAt: date(q.pausedAt), heldUntil: date(q.heldUntil), updatedAt: date(q.updatedAt) }));
  }

  async rateLimit(p: { workerId: string; jobs: store.RateLimited[]; message?: string }): Promise<Map<string, store.EndState>> {
    try {
      return await this.report(
        "/v1/worker/rate-limited",
        {
          workerId: p.workerId,
          jobs: p.jobs.map((j) => ({ ...this.withReceipt(j), delayMs: j.delayMs, scope: j.scope })),
          ...(p.message !== undefined && { message: p.message.slice(0, 1000) }),
        },
        p.jobs,
      );
    } finally {
      for (const j of p.jobs) this.receipts.delete(key(j));
    }
  }

  async release(p: { workerId: string; jobs: store.AttemptRef[]; reason: string }): Promise<Map<string, store.EndState>> {
    try {
      return await this.report(
        "/v1/worker/release",
        { workerId: p.workerId, jobs: p.jobs.map((j) => this.withReceipt(j)), reason: p.reason.slice(0, 1000) },
        p.jobs,
      );
    } finally {
      // The worker gives these attempts up whatever the answer: nothing more will be said about them.
      for (const j of p.jobs) this.receipts.delete(key(j));
    }
  }

  async describeLost(attempts: store.AttemptRef[]): Promise<Map<string, store.LostLease>> {
    // Only attempts with a receipt can be asked about; grouped by the worker id they were claimed as.
    const byWorker = new Map<string, { id: string; attempt: number; receipt: string }[]>();
    for (const a of attempts) {
      const kept = this.receipts.get(key(a));
      if (!kept) continue;
      byWorker.set(kept.workerId, [...(byWorker.get(kept.workerId) ?? []), { id: a.id, attempt: a.attempt, receipt: kept.receipt }]);
    }
    const out = new Map<string, store.LostLease>();
    for (const [workerId, refs] of byWorker) {
      const res = await this.post<{ lost: ({ id: string } & store.LostLease)[] }>("/v1/worker/lost", { workerId, attempts: refs }, this.timeoutMs);
      for (const l of res.body.lost) out.set(l.id, { reason: l.reason, endedAs: l.endedAs, finishedState: l.finishedState });
      // The reporter asks after a refused report, and then says nothing more about the attempt.
      for (const r of refs) if (this.receipts.get(key(r))?.refused) this.receipts.delete(key(r));
    }
    return out;
  }

  async reconcile(p: { workerName: string; currentWorkerId: string; backoff: store.BackoffPolicy }): Promise<number> {
    // The backoff is the server's to choose (each job's own policy); the proof says who asks.
    const body = { workerName: p.workerName, currentWorkerId: p.currentWorkerId, identity: this.identity };
    const res = await this.post<{ released: number }>("/v1/worker/reconcile", body, this.timeoutMs);
    return res.body.released;
  }

  /**
   * The cancel poll: open while this worker holds attempts (it has their receipts), each answer
   * handed to the worker at once. A poll that waited is followed at once by the next; one
   * answered without waiting (the server's cap, or stopping) or failed is retried after a
   * second: meanwhile heartbeats still carry cancels. A server without the route (older) ends it.
   */
  private async pollCancels(workerId: string, told: (attempt: store.AttemptRef) => void): Promise<void> {
    while (this.attachedAs === workerId) {
      const held = [...this.receipts].filter(([, r]) => r.workerId === workerId && !r.refused);
      for (const k of this.cancelsTold) if (!this.receipts.has(k)) this.cancelsTold.delete(k);
      if (held.length === 0) {
        await new Promise<void>((resolve) => (this.kickCancels = resolve));
        this.kickCancels = undefined;
        continue;
      }
      // The most recently used last (the receipts' order), within the server's cap on a request's attempts.
      const attempts = held
        .filter(([k]) => !this.cancelsTold.has(k))
        .slice(-MAX_CANCEL_CHECKS)
        .map(([k, r]) => ({ ...parseKey(k), receipt: r.receipt }));
      const controller = new AbortController();
      this.cancelPoll = controller;
      let pause = 0;
      try {
        const res = await this.post<{ cancels: Ref[]; waited: boolean }>(
          "/v1/worker/cancels",
          { workerId, attempts, waitMs: this.waitMs, identity: this.identity },
          this.waitMs + this.timeoutMs,
          controller.signal,
        );
        for (const c of res.body.cancels) {
          this.cancelsTold.add(key(c));
          told(c);
        }
        if (!res.body.waited && res.body.cancels.length === 0) pause = CANCEL_POLL_RETRY_MS;
      } catch (err) {
        if (controller.signal.aborted) continue;
        if (err instanceof ServerError && err.status === 404) return;
        pause = CANCEL_POLL_RETRY_MS;
      } finally {
        this.cancelPoll = undefined;
      }
      if (pause > 0) {
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, pause);
          this.kickCancels = () => {
            clearTimeout(timer);
            resolve();
          };
        });
        this.kickCancels = undefined;
      }
    }
  }

  /**
   * ctx.parents() of a job this worker runs: the server checks the attempt's receipt and answers
   * in pages of at most its cap; all of them make the list, as on a database connection.
   */
  async parents(p: { workerId: string; job: store.AttemptRef }): Promise<store.ParentRecord[]> {
    const parents: store.ParentRecord[] = [];
    let after: string | null = null;
    do {
      const res: { body: store.ParentsPage } = await this.post<store.ParentsPage>(
        "/v1/worker/parents",
        { workerId: p.workerId, job: this.withReceipt(p.job), after },
        this.timeoutMs,
      );
      parents.push(...res.body.parents);
      after = res.body.next;
    } while (after !== null);
    return parents;
  }

  /** ctx.dependencies() of a job this worker runs. */
  async dependencies(p: { workerId: string; job: store.AttemptRef }): Promise<store.DependencyCounts> {
    const res = await this.post<store.DependencyCounts>(
      "/v1/worker/dependencies",
      { workerId: p.workerId, job: this.withReceipt(p.job) },
      this.timeoutMs,
    );
    return res.body;
  }

  /**
   * Durable steps: the job's recorded steps (the server checks the attempt's receipt), in pages
   * of at most its cap; all of them make the list. The attempt holds its job, so no other writes
   * its steps meanwhile: the pages add up to the whole.
   */
  async loadSteps(p: { workerId: string; job: store.AttemptRef }): Promise<StepRecord[]> {
    const steps: StepRecord[] = [];
    let after: number | null = null;
    do {
      const res: { body: { steps: WireStepRecord[]; next?: number | null } } = await this.post<{ steps: WireStepRecord[]; next?: number | null }>(
        "/v1/worker/steps/load",
        { workerId: p.workerId, job: this.withReceipt(p.job), after },
        this.timeoutMs,
      );
      for (const r of res.body.steps) {
        steps.push({ ...r, result: r.result, wakeAt: r.wakeAt === null ? null : new Date(r.wakeAt), recordedAt: new Date(r.recordedAt) });
      }
      // An earlier release's server answers every step at once, without `next`.
      after = res.body.next ?? null;
    } while (after !== null);
    return steps;
  }

  /**
   * Step records, in requests of at most STEP_BATCH_BYTES of results (each within the server's
   * body limit); a 409 (every attempt stale) records none, and the step host then asks why.
   */
  async recordSteps(p: { workerId: string; steps: store.StepOutcome[] }): Promise<Set<string>> {
    const recorded = new Set<string>();
    for (const chunk of byResultBytes(p.steps)) {
      const steps = chunk.map((s) => ({
        ...this.withReceipt(s),
        seq: s.seq,
        name: s.name,
        occurrence: s.occurrence,
        kind: s.kind,
        state: s.state,
        durationMs: s.durationMs,
        ...(s.resultJson !== undefined && { result: JSON.parse(s.resultJson) as unknown }),
        ...(s.error !== undefined && { error: s.error.slice(0, 10_000) }),
      }));
      const res = await this.post<{ recorded: { id: string; seq: number }[] }>(
        "/v1/worker/steps/record",
        { workerId: p.workerId, steps },
        this.timeoutMs,
        undefined,
        [409],
      );
      if (res.status !== 409) for (const r of res.body.recorded) recorded.add(`${r.id}:${r.seq}`);
    }
    return recorded;
  }

  /** Why a record was refused; an attempt the server refuses for its receipt is as good as lost. */
  async stepFate(p: { workerId: string; id: string; attempt: number; seq: number }): Promise<store.StepFate> {
    const job = this.withReceipt(p);
    const res = await this.post<store.StepFate>("/v1/worker/steps/fate", { workerId: p.workerId, job, seq: p.seq }, this.timeoutMs, undefined, [409]);
    return res.status === 409 ? { held: false } : res.body;
  }

  /** ctx.sleep: a suspension ends the attempt (its receipt is dropped); a 409 means it had lost its job. */
  async sleep(p: store.SuspendingStep & ({ until: Date } | { ms: number })): Promise<SuspensionAnswer | "due"> {
    const target = "until" in p ? { until: p.until.toISOString() } : { ms: p.ms };
    const res = await this.post<{ state: "suspended" | "cancelled" | "due" }>(
      "/v1/worker/sleep",
      { ...this.place(p), ...target },
      this.timeoutMs,
      undefined,
      [409],
    );
    return this.suspension(p, res.status === 409 ? "stale" : res.body.state);
  }

  /** ctx.waitForEvent: the event if the wait is over, else the job suspends (as sleep). */
  async waitForEvent(p: store.EventWait): Promise<{ received: boolean; data: JsonValue | null } | SuspensionAnswer> {
    const body = {
      ...this.place(p),
      kind: p.kind,
      event: p.event,
      ...(p.matchJson !== null && { match: JSON.parse(p.matchJson) as unknown }),
      timeoutMs: p.timeoutMs,
    };
    const res = await this.post<{ state: "received" | "suspended" | "cancelled"; received?: boolean; data?: JsonValue | null }>(
      "/v1/worker/wait-for-event",
      body,
      this.timeoutMs,
      undefined,
      [409],
    );
    if (res.status !== 409 && res.body.state === "received") return { received: res.body.received!, data: res.body.data ?? null };
    return this.suspension(p, res.status === 409 ? "stale" : (res.body.state as "suspended" | "cancelled"));
  }

  /**
   * ctx.children: the server checks the children itself and starts them (the first time; on a
   * replay `given` is null and it only looks), or answers their ends; else the job suspends (as sleep).
   */
  async children(p: ChildrenCall): Promise<{ ends: store.ChildEndRecord[] } | SuspensionAnswer> {
    const body = { ...this.place(p), ...(p.nodes !== null && p.given !== null && { children: p.given }) };
    const res = await this.post<{ state: "ended" | "suspended" | "cancelled"; ends?: store.ChildEndRecord[] }>(
      "/v1/worker/children",
      body,
      this.timeoutMs,
      undefined,
      [409],
    );
    if (res.status !== 409 && res.body.state === "ended") return { ends: res.body.ends ?? [] };
    return this.suspension(p, res.status === 409 ? "stale" : (res.body.state as "suspended" | "cancelled"));
  }

  private place(p: store.SuspendingStep) {
    return { workerId: p.workerId, job: this.withReceipt(p), seq: p.seq, name: p.name, occurrence: p.occurrence };
  }

  /** A suspension ended the attempt: nothing more is said about it. A refused one keeps its receipt for describeLost. */
  private suspension<A extends SuspensionAnswer | "due">(p: Ref, answer: A): A {
    const kept = this.receipts.get(key(p));
    if (answer === "suspended" || answer === "cancelled") this.receipts.delete(key(p));
    else if (answer === "stale" && kept) kept.refused = true;
    return answer;
  }

  /** Checks that the server answers and accepts the token (a worker should fail fast, not retry forever). */
  async check(): Promise<void> {
    await this.request("GET", "/v1/worker/check", undefined, this.timeoutMs);
  }

  interrupt(): void {
    this.claiming?.abort();
  }

  /**
   * A fenced batch report: applied attempts map to their end state; a 409 means none applied.
   * An applied attempt has ended, so its receipt is dropped; a refused one keeps it for the
   * describeLost that follows.
   */
  private async report<S extends string>(path: string, body: unknown, sent: Ref[]): Promise<Map<string, S>> {
    if (sent.length === 0) return new Map();
    const res = await this.post<{ applied: { id: string; state: S }[] }>(path, body, this.timeoutMs, undefined, [409]);
    const applied = new Map(res.status === 409 ? [] : res.body.applied.map((a) => [a.id, a.state]));
    for (const r of sent) {
      const kept = this.receipts.get(key(r));
      if (applied.has(r.id)) this.receipts.delete(key(r));
      else if (kept) kept.refused = true;
    }
    return applied;
  }

  private keepReceipt(job: Ref, receipt: string, workerId: string): void {
    if (this.receipts.size >= MAX_RECEIPTS) this.receipts.delete(this.receipts.keys().next().value!);
    this.receipts.set(key(job), { receipt, workerId });
  }

  /** The attempt as the server wants it: with its receipt (left out if this transport has none; the server then refuses it). */
  private withReceipt(r: Ref): Ref & { receipt?: string } {
    const k = key(r);
    const kept = this.receipts.get(k);
    if (!kept) return { id: r.id, attempt: r.attempt };
    // Used again: move it to the end of the map's order (least recently used first).
    this.receipts.delete(k);
    this.receipts.set(k, kept);
    return { id: r.id, attempt: r.attempt, receipt: kept.receipt };
  }

  private post<T>(path: string, body: unknown, timeoutMs: number, signal?: AbortSignal, accept: number[] = []): Promise<{ status: number; body: T }> {
    return this.request("POST", path, body, timeoutMs, signal, accept);
  }

  private async request<T>(
    method: "GET" | "POST",
    path: string,
    body: unknown,
    timeoutMs: number,
    signal?: AbortSignal,
    accept: number[] = [],
  ): Promise<{ status: number; body: T }> {
    const url = new URL(path, this.base);
    const signals = [AbortSignal.timeout(timeoutMs), ...(signal ? [signal] : [])];
    let response: Response;
    let text: string;
    try {
      response = await fetch(url, {
        method,
        headers: { authorization: `Bearer ${this.options.token}`, ...(body !== undefined && { "content-type": "application/json" }) },
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.any(signals),
      });
      text = await response.text();
    } catch (err) {
      const why = (err as Error).name === "TimeoutError" ? `no answer within ${timeoutMs} ms` : describeCause(err);
      throw new ServerUnavailableError(`cannot reach the Leasehold server at ${this.base.origin} (${why})`, { cause: err });
    }
    let parsed: unknown;
    try {
      parsed = text ? JSON.parse(text) : {};
    } catch {
      parsed = {};
    }
    if (response.ok || accept.includes(response.status)) return { status: response.status, body: parsed as T };
    const e = (parsed as ErrorBody).error ?? {};
    const message = `server answered ${response.status} to ${path}: ${e.message ?? (text.slice(0, 200) || response.statusText)}`;
    if (response.status === 502 || response.status === 503 || response.status === 504) throw new ServerUnavailableError(message);
    if (response.status === 400) throw new ValidationError(message);
    throw new ServerError(e.code ?? "server_error", message, response.status);
  }
}

/** Results one step-record request may carry at most; one step's (256 KiB at most) always goes. */
const STEP_BATCH_BYTES = 1024 * 1024;

/** Step outcomes in order, split so that each request's results stay within STEP_BATCH_BYTES. */
function byResultBytes(steps: store.StepOutcome[]): store.StepOutcome[][] {
  const chunks: store.StepOutcome[][] = [];
  let bytes = Infinity;
  for (const s of steps) {
    const size = (s.resultJson?.length ?? 0) + (s.error?.length ?? 0);
    if (bytes + size > STEP_BATCH_BYTES) {
      chunks.push([]);
      bytes = 0;
    }
    chunks.at(-1)!.push(s);
    bytes += size;
  }
  return chunks;
}

function key(r: Ref): string {
  return `${r.id}:${r.attempt}`;
}

function parseKey(k: string): Ref {
  const at = k.indexOf(":");
  return { id: k.slice(0, at), attempt: Number(k.slice(at + 1)) };
}

function describeCause(err: unknown): string {
  const cause = (err as { cause?: { code?: string; message?: string } }).cause;
  return cause?.code ?? cause?.message ?? (err as Error).message;
}
