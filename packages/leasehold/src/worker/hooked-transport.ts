/**
 * A worker's transport with its claim and report batches wrapped in the aroundClaim and
 * aroundSettle hooks (src/hooks.ts). Used only when such a hook is registered: otherwise the
 * worker talks to its transport directly. Everything else is passed through unchanged.
 */
import type * as store from "../store/index.js";
import type { ComposedHooks, SettleBatch } from "../hooks.js";
import type { AttachParams, Attachment, CompleteWithinParams, CompleteWithinResult, WorkerTransport } from "./transport.js";

export function withBatchHooks(transport: WorkerTransport, hooks: ComposedHooks): WorkerTransport {
  const { aroundClaim, aroundSettle } = hooks;
  if (!aroundClaim && !aroundSettle) return transport;
  return new HookedTransport(transport, hooks);
}

class HookedTransport implements WorkerTransport {
  readonly maxClaimBatch?: number;
  // Durable steps' records and suspensions go straight through: none is a claim or a report batch.
  readonly loadSteps?: WorkerTransport["loadSteps"];
  readonly recordSteps?: WorkerTransport["recordSteps"];
  readonly stepFate?: WorkerTransport["stepFate"];
  readonly recordStepWithin?: WorkerTransport["recordStepWithin"];
  readonly sleep?: WorkerTransport["sleep"];
  readonly waitForEvent?: WorkerTransport["waitForEvent"];
  readonly children?: WorkerTransport["children"];
  readonly callbackBaseUrl?: string;

  constructor(
    private readonly inner: WorkerTransport,
    private readonly hooks: ComposedHooks,
  ) {
    this.maxClaimBatch = inner.maxClaimBatch;
    // Optional capabilities stay optional: the worker checks for them.
    if (!inner.completeWithin) this.completeWithin = undefined;
    if (!inner.interrupt) this.interrupt = undefined;
    if (!inner.recordRefusals) this.recordRefusals = undefined;
    if (!inner.parents) this.parents = undefined;
    if (!inner.dependencies) this.dependencies = undefined;
    this.loadSteps = inner.loadSteps?.bind(inner);
    this.recordSteps = inner.recordSteps?.bind(inner);
    this.stepFate = inner.stepFate?.bind(inner);
    this.recordStepWithin = inner.recordStepWithin?.bind(inner);
    this.sleep = inner.sleep?.bind(inner);
    this.waitForEvent = inner.waitForEvent?.bind(inner);
    this.children = inner.children?.bind(inner);
    this.callbackBaseUrl = inner.callbackBaseUrl;
  }

  private settle<M extends Map<string, string>>(kind: SettleBatch["kind"], jobs: store.AttemptRef[], write: () => Promise<M>): Promise<M> {
    const around = this.hooks.aroundSettle;
    if (!around) return write();
    return around({ kind, jobs: jobs.map((j) => ({ id: j.id, attempt: j.attempt })) }, write) as Promise<M>;
  }

  get notifiesQueueSettings(): boolean | undefined {
    return this.inner.notifiesQueueSettings;
  }
  claim(p: store.ClaimParams): Promise<store.ClaimedJobs> {
    const around = this.hooks.aroundClaim;
    if (!around) return this.inner.claim(p);
    return around({ queues: p.queues, limit: p.limit }, () => this.inner.claim(p));
  }
  queueSettings(): Promise<store.QueueSettings[]> {
    return this.inner.queueSettings();
  }
  rateLimit(p: { workerId: string; jobs: store.RateLimited[]; message?: string }): Promise<Map<string, store.EndState>> {
    return this.settle("rate_limit", p.jobs, () => this.inner.rateLimit(p));
  }
  complete(p: { workerId: string; jobs: store.Completion[] }): Promise<Map<string, "succeeded" | "cancelled" | "dead">> {
    return this.settle("complete", p.jobs, () => this.inner.complete(p));
  }
  fail(p: { workerId: string; failures: store.Failure[] }): Promise<Map<string, store.EndState>> {
    return this.settle("fail", p.failures, () => this.inner.fail(p));
  }
  supersede(p: { workerId: string; jobs: store.Supersession[] }): Promise<Map<string, "superseded" | "cancelled">> {
    return this.settle("supersede", p.jobs, () => this.inner.supersede(p));
  }

  attach(p: AttachParams): Promise<Attachment> {
    return this.inner.attach(p);
  }
  heartbeat(p: store.HeartbeatParams): Promise<store.BeatResult> {
    return this.inner.heartbeat(p);
  }
  release(p: { workerId: string; jobs: store.AttemptRef[]; reason: string }): Promise<Map<string, store.EndState>> {
    return this.inner.release(p);
  }
  describeLost(attempts: store.AttemptRef[]): Promise<Map<string, store.LostLease>> {
    return this.inner.describeLost(attempts);
  }
  reconcile(p: { workerName: string; currentWorkerId: string; backoff: store.BackoffPolicy }): Promise<number> {
    return this.inner.reconcile(p);
  }
  completeWithin?<T>(p: CompleteWithinParams<T>): Promise<CompleteWithinResult<T>> {
    return this.inner.completeWithin!(p);
  }
  interrupt?(): void {
    this.inner.interrupt!();
  }
  parents?(p: { workerId: string; job: store.AttemptRef }): Promise<store.ParentRecord[]> {
    return this.inner.parents!(p);
  }
  dependencies?(p: { workerId: string; job: store.AttemptRef }): Promise<store.DependencyCounts> {
    return this.inner.dependencies!(p);
  }
  recordRefusals?(refusals: store.StaleRefusal[]): Promise<void> {
    return this.inner.recordRefusals!(refusals);
  }
}
