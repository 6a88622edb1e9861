/**
 * A WorkerTransport that wraps the real one and logs every claim and report the worker
 * sends and what the database answered, so the invariant checker can compare each accepted report
 * with the audit rows afterwards.
 */
import type { WorkerTransport } from "../packages/leasehold/src/index.js";
import type {
  AttachParams,
  Attachment,
  CompleteWithinParams,
  CompleteWithinResult,
  RecordStepWithinParams,
  RecordStepWithinResult,
  SuspensionAnswer,
} from "../packages/leasehold/src/worker/transport.js";
import type { StepRecord } from "../packages/leasehold/src/jobs/steps.js";
import type { JsonValue } from "../packages/leasehold/src/jobs/types.js";
import type * as store from "../packages/leasehold/src/store/index.js";
import type { ProcessLog } from "./process-log.js";

export class RecordingTransport implements WorkerTransport {
  constructor(
    private readonly inner: WorkerTransport,
    private readonly log: ProcessLog,
    private readonly workerId: () => string,
  ) {}

  private async record<R>(
    kind: "claim" | "heartbeat" | "complete" | "fail" | "release" | "supersede",
    sent: store.AttemptRef[],
    call: () => Promise<R>,
    acceptedOf: (r: R) => string[],
  ): Promise<R> {
    const sentAt = Date.now();
    const pairs = sent.map((s) => [s.id, s.attempt] as [string, number]);
    try {
      const result = await call();
      this.log.write({ ev: "report", kind, t: Date.now(), sentAt, w: this.workerId(), sent: pairs, accepted: acceptedOf(result) });
      return result;
    } catch (err) {
      this.log.write({ ev: "report", kind, t: Date.now(), sentAt, w: this.workerId(), sent: pairs, accepted: null, error: String(err) });
      throw err;
    }
  }

  claim(p: store.ClaimParams): Promise<store.ClaimedJobs> {
    return this.record(
      "claim",
      [],
      () => this.inner.claim(p),
      (jobs) => jobs.map((j) => j.id),
    );
  }
  attach(p: AttachParams): Promise<Attachment> {
    return this.inner.attach(p);
  }
  heartbeat(p: store.HeartbeatParams): Promise<store.BeatResult> {
    return this.record(
      "heartbeat",
      p.beats,
      () => this.inner.heartbeat(p),
      (r) => [...r.renewed.keys()],
    );
  }
  complete(p: { workerId: string; jobs: store.Completion[] }): Promise<Map<string, "succeeded" | "cancelled" | "dead">> {
    return this.record(
      "complete",
      p.jobs,
      () => this.inner.complete(p),
      // a "dead" answer is a success the far end refused (its result), not an accepted completion
      (r) => [...r].filter(([, state]) => state !== "dead").map(([id]) => id),
    );
  }
  /** ctx.transaction's completion: logged as a completion, accepted if it committed. */
  completeWithin<T>(p: CompleteWithinParams<T>): Promise<CompleteWithinResult<T>> {
    const inner = this.inner;
    if (!inner.completeWithin) throw new Error("the wrapped transport cannot complete inside a transaction");
    return this.record(
      "complete",
      [p.job],
      () => inner.completeWithin!(p),
      (r) => (r.completed ? [p.job.id] : []),
    );
  }
  fail(p: { workerId: string; failures: store.Failure[] }): Promise<Map<string, store.EndState>> {
    return this.record(
      "fail",
      p.failures,
      () => this.inner.fail(p),
      (r) => [...r.keys()],
    );
  }
  supersede(p: { workerId: string; jobs: store.Supersession[] }): Promise<Map<string, "superseded" | "cancelled">> {
    return this.record(
      "supersede",
      p.jobs,
      () => this.inner.supersede(p),
      (r) => [...r.keys()],
    );
  }
  get notifiesQueueSettings(): boolean | undefined {
    return this.inner.notifiesQueueSettings;
  }
  queueSettings(): Promise<store.QueueSettings[]> {
    return this.inner.queueSettings();
  }
  rateLimit(p: { workerId: string; jobs: store.RateLimited[]; message?: string }): Promise<Map<string, store.EndState>> {
    return this.record(
      "release",
      p.jobs,
      () => this.inner.rateLimit(p),
      (r) => [...r.keys()],
    );
  }
  release(p: { workerId: string; jobs: store.AttemptRef[]; reason: string }): Promise<Map<string, store.EndState>> {
    return this.record(
      "release",
      p.jobs,
      () => this.inner.release(p),
      (r) => [...r.keys()],
    );
  }
  /** ctx.parents() and ctx.dependencies(): reads, passed through unlogged. */
  parents(p: { workerId: string; job: store.AttemptRef }): Promise<store.ParentRecord[]> {
    if (!this.inner.parents) throw new Error("the wrapped transport cannot read a job's parents");
    return this.inner.parents(p);
  }
  dependencies(p: { workerId: string; job: store.AttemptRef }): Promise<store.DependencyCounts> {
    if (!this.inner.dependencies) throw new Error("the wrapped transport cannot read a job's parents");
    return this.inner.dependencies(p);
  }
  /** Durable steps: passed through unlogged (the checker reads job_steps and the step rows instead). */
  loadSteps(p: { workerId: string; job: store.AttemptRef }): Promise<StepRecord[]> {
    return this.need("loadSteps").call(this.inner, p);
  }
  recordSteps(p: { workerId: string; steps: store.StepOutcome[] }): Promise<Set<string>> {
    return this.need("recordSteps").call(this.inner, p);
  }
  stepFate(p: { workerId: string; id: string; attempt: number; seq: number }): Promise<store.StepFate> {
    return this.need("stepFate").call(this.inner, p);
  }
  recordStepWithin<T>(p: RecordStepWithinParams<T>): Promise<RecordStepWithinResult> {
    const inner = this.inner;
    if (!inner.recordStepWithin) throw new Error("the wrapped transport has no recordStepWithin (durable steps)");
    return inner.recordStepWithin(p);
  }
  sleep(p: store.SuspendingStep & ({ until: Date } | { ms: number })): Promise<SuspensionAnswer | "due"> {
    return this.need("sleep").call(this.inner, p);
  }
  waitForEvent(p: store.EventWait): Promise<{ received: boolean; data: JsonValue | null } | SuspensionAnswer> {
    return this.need("waitForEvent").call(this.inner, p);
  }
  private need<K extends "loadSteps" | "recordSteps" | "stepFate" | "sleep" | "waitForEvent">(method: K): NonNullable<WorkerTransport[K]> {
    const f = this.inner[method];
    if (!f) throw new Error(`the wrapped transport has no ${method} (durable steps)`);
    return f as NonNullable<WorkerTransport[K]>;
  }
  describeLost(attempts: store.AttemptRef[]): Promise<Map<string, store.LostLease>> {
    return this.inner.describeLost(attempts);
  }
  reconcile(p: { workerName: string; currentWorkerId: string; backoff: store.BackoffPolicy }): Promise<number> {
    return this.inner.reconcile(p);
  }
}
