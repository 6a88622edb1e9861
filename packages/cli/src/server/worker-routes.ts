/**
 * The API a remote worker uses after a claim: the worker runtime's transport calls, one
 * route each. Every attempt must carry the receipt its claim returned (receipts.ts); one
 * without a valid receipt is refused on its own and never reaches the database. The rest
 * are fenced by the store's SQL, exactly as for a worker on a database connection: a stale
 * heartbeat or report changes nothing and, when nothing in the request applied and every
 * attempt was refused by the fence, is answered 409 with
 * `{ error: { code: "stale_lease", jobs: [{ id, attempt, reason }] } }`.
 *
 * Attach hands the worker an identity proof (identity.ts); the routes that act on a worker
 * rather than on an attempt (detach, reconcile) require it.
 */
import type { FastifyInstance, FastifyReply } from "fastify";
import type { Leasehold } from "leasehold/internal/client";
import { ValidationError, WorkerNameInUseError, type LostLeaseReason } from "leasehold/internal/errors";
import { sanitizeText, serializeResult } from "leasehold/internal/jobs/validate";
import * as store from "leasehold/internal/store/index";
import { DEFAULT_BACKOFF } from "leasehold/internal/worker/backoff";
import { renewBeats } from "./beats.js";
import { errorBody } from "./errors.js";
import { InvalidIdentityError, provenIdentity, WorkerIdInUseError, type WorkerIdentities } from "./identity.js";
import type { ServerMetrics } from "./http-metrics.js";
import { checkLease, type LeaseBounds } from "./limits.js";
import { INVALID_RECEIPT, INVALID_RECEIPT_MESSAGE, type ReceiptRef, type Receipts } from "./receipts.js";
import { routes } from "./schemas.js";

interface Deps {
  leasehold: Leasehold;
  receipts: Receipts;
  identities: WorkerIdentities;
  metrics: ServerMetrics;
  leases: LeaseBounds;
  /** The largest result a remote worker may report (its own cap may be larger). */
  maxResultBytes: number;
}

/** A remote worker's failure: its task's retry policy rides along (the delay is computed in SQL). */
type WireFailure = ReceiptRef & { error: string; backoff?: store.BackoffPolicy; outcome?: store.FailureOutcome; giveUp?: boolean };

interface AttachBody {
  workerId: string;
  name?: string;
  queues: string[];
  concurrency: number;
  leaseMs: number;
  heartbeatMs?: number;
  policies: store.TaskPolicy[];
}

/**
 * A remote worker holds no database session, so its liveness is its beats: another worker
 * of the same name counts as live while it beats within this many leases.
 */
const REMOTE_NAME_HELD_LEASES = 2;

type Ref = { id: string; attempt: number };
type Beat = ReceiptRef & { progress?: unknown; checkpoint?: unknown };
type Kind = store.RefusedKind | "lost" | "rate_limited";
type RefusedKind = store.RefusedKind;

/** Route config: the worker token may use these routes too. */
const worker = { scope: "worker" } as const;

export function registerWorkerRoutes(app: FastifyInstance, { leasehold: lh, receipts, identities, metrics, leases, maxResultBytes }: Deps): void {
  const pool = lh.pool;
  /** Attempts with a valid receipt; the others are counted and answered as refused. */
  const checked = <T extends ReceiptRef>(kind: Kind, items: T[], workerId: string) => {
    const { valid, invalid } = receipts.check(items, workerId);
    if (invalid.length > 0) metrics.invalidReceipts.inc({ kind }, invalid.length);
    return { valid, invalid };
  };
  const invalidEntry = (r: Ref) => ({ id: r.id, attempt: r.attempt, code: INVALID_RECEIPT, message: INVALID_RECEIPT_MESSAGE });

  app.post<{ Body: AttachBody }>("/v1/worker/attach", { schema: routes.attach, config: worker }, async (request) => {
    const a = request.body;
    checkLease(a.leaseMs, leases);
    const tasks = new Set<string>();
    for (const p of a.policies) {
      if (tasks.has(p.task)) throw new ValidationError(`policies: task ${JSON.stringify(p.task)} is declared twice`);
      tasks.add(p.task);
    }
    if (a.name !== undefined) {
      const held = await store.workerNameHeldElsewhere(pool, { name: a.name, workerId: a.workerId, withinMs: REMOTE_NAME_HELD_LEASES * a.leaseMs });
      if (held) throw new WorkerNameInUseError(a.name);
    }
    // A new id only: re-attaching a known one would let a token holder speak for that worker.
    const attached = await store.attachRemoteWorker(pool, {
      workerId: a.workerId,
      name: a.name,
      host: request.ip,
      queues: a.queues,
      concurrency: a.concurrency,
      leaseMs: a.leaseMs,
      heartbeatMs: a.heartbeatMs,
      policies: a.policies,
    });
    if (!attached) throw new WorkerIdInUseError(a.workerId);
    return { ok: true, identity: identities.issue(a.workerId, a.name) };
  });

  app.post<{ Body: { workerId: string; graceful?: boolean; identity?: string } }>(
    "/v1/worker/detach",
    { schema: routes.detach, config: worker },
    async (request) => {
      const { workerId, graceful, identity } = request.body;
      if (!provenIdentity(identities, identity, workerId)) throw new InvalidIdentityError(workerId, "no identity proof");
      if (graceful !== false) await store.markWorkerStopped(pool, workerId);
      return { ok: true };
    },
  );

  app.post<{ Body: { workerId: string; leaseMs: number; beats: Beat[]; inFlight?: number; beatDelays?: number[] } }>(
    "/v1/worker/heartbeat",
    { schema: routes.heartbeat, config: worker },
    async (request, reply) => {
      const { workerId, leaseMs, beats, inFlight, beatDelays } = request.body;
      checkLease(leaseMs, leases);
      const { valid, invalid } = checked("heartbeat", beats, workerId);
      // Each beat's values are judged on their own: a bad one is refused, the others renewed.
      const { result, invalid: badValues } = await renewBeats(pool, {
        workerId,
        leaseMs,
        beats: valid,
        inFlight: inFlight ?? beats.length,
        beatDelays,
      });
      if (badValues.length > 0) metrics.invalidBeats.inc(badValues.length);
      if (beats.length > 0 && result.renewed.size === 0 && invalid.length === 0 && badValues.length === 0)
        return refuse(reply, "heartbeat", valid, workerId, lh);
      if (result.lost.length > 0) {
        const lost = new Set(result.lost);
        await recordRefused("heartbeat", valid.filter((b) => lost.has(b.id)).map(ref), workerId, lh);
      }
      return {
        renewed: [...result.renewed].map(([id, r]) => ({ id, cancelRequested: r.cancelRequested })),
        lost: result.lost,
        invalid: [...invalid.map(invalidEntry), ...badValues],
      };
    },
  );

  app.post<{ Body: { workerId: string; jobs: (ReceiptRef & { result?: unknown })[] } }>(
    "/v1/worker/succeed",
    { schema: routes.succeed, config: worker },
    async (request, reply) => {
      const { workerId, jobs } = request.body;
      const { valid, invalid } = checked("complete", jobs, workerId);
      // Each result is checked here as the worker checks it (a client may be another
      // runtime, or run with a larger cap): a bad one ends its attempt failed, without retries.
      const completions: store.Completion[] = [];
      const refused: store.Failure[] = [];
      for (const j of valid) {
        const json = serializeResult(j.result, maxResultBytes);
        if (typeof json === "object") {
          refused.push({
            id: j.id,
            attempt: j.attempt,
            error: `the handler's result was refused by the server: ${json.problem}`,
            backoff: DEFAULT_BACKOFF,
            giveUp: true,
          });
        } else completions.push(json === undefined ? ref(j) : { ...ref(j), resultJson: json });
      }
      const [completed, failed] = await Promise.all([
        store.completeJobs(pool, { workerId, jobs: completions }),
        store.failJobs(pool, { workerId, failures: refused }),
      ]);
      const applied = new Map<string, string>([...completed, ...failed]);
      return answerReport(reply, "complete", workerId, valid, invalid, applied, lh);
    },
  );

  app.post<{ Body: { workerId: string; failures: WireFailure[] } }>(
    "/v1/worker/fail",
    { schema: routes.fail, config: worker },
    async (request, reply) => {
      const { workerId, failures } = request.body;
      const { valid, invalid } = checked("fail", failures, workerId);
      const applied = await store.failJobs(pool, {
        workerId,
        failures: valid.map((f) => ({
          id: f.id,
          attempt: f.attempt,
          // A client's error text may hold what PostgreSQL refuses (NUL, lone surrogates).
          error: sanitizeText(f.error, 10_000),
          backoff: f.backoff ?? DEFAULT_BACKOFF,
          outcome: f.outcome,
          giveUp: f.giveUp,
        })),
      });
      return answerReport(reply, "fail", workerId, valid, invalid, applied, lh);
    },
  );

  app.post<{ Body: { workerId: string; jobs: (ReceiptRef & { reason: string })[] } }>(
    "/v1/worker/supersede",
    { schema: routes.supersede, config: worker },
    async (request, reply) => {
      const { workerId, jobs } = request.body;
      const { valid, invalid } = checked("supersede", jobs, workerId);
      const applied = await store.supersedeJobs(pool, {
        workerId,
        // A client's text may hold what PostgreSQL refuses (NUL, lone surrogates).
        jobs: valid.map((j) => ({ id: j.id, attempt: j.attempt, reason: sanitizeText(j.reason, 2_000) })),
      });
      return answerReport(reply, "supersede", workerId, valid, invalid, applied, lh);
    },
  );

  app.post<{ Body: { workerId: string; jobs: ReceiptRef[]; reason: string } }>(
    "/v1/worker/release",
    { schema: routes.release, config: worker },
    async (request, reply) => {
      const { workerId, jobs, reason } = request.body;
      const { valid, invalid } = checked("release", jobs, workerId);
      // A live worker gives these back on purpose: free (no retry budget spent).
      const applied = await store.releaseJobs(pool, {
        workerId,
        jobs: valid.map(ref),
        reason: sanitizeText(reason, 1_000),
        backoff: DEFAULT_BACKOFF,
      });
      return answerReport(reply, "release", workerId, valid, invalid, applied, lh);
    },
  );

  app.post<{ Body: { workerId: string; jobs: (ReceiptRef & { delayMs: number; scope: store.RateLimited["scope"] })[]; message?: string } }>(
    "/v1/worker/rate-limited",
    { schema: routes.rateLimited, config: worker },
    async (request, reply) => {
      const { workerId, jobs, message } = request.body;
      const { valid, invalid } = checked("rate_limited", jobs, workerId);
      // Given back like a release (no retry budget spent), after a delay, holding back its key or queue.
      const applied = await store.rateLimitJobs(pool, {
        workerId,
        jobs: valid.map((j) => ({ ...ref(j), delayMs: j.delayMs, scope: j.scope })),
        ...(message !== undefined && { message: sanitizeText(message, 1_000) }),
      });
      // Refusals are kept as a release's: the record's kinds are the fence's reports, and this is a release with a delay.
      return answerReport(reply, "release", workerId, valid, invalid, applied, lh);
    },
  );

  // A worker's view of flow control: which queues to claim under limits, which are paused.
  app.get("/v1/worker/queues", { schema: routes.workerQueues, config: worker }, async () => ({ queues: await store.queueSettings(pool) }));

  app.post<{ Body: { workerId: string; attempts: ReceiptRef[] } }>("/v1/worker/lost", { schema: routes.lost, config: worker }, async (request) => {
    const { workerId, attempts } = request.body;
    const { valid, invalid } = checked("lost", attempts, workerId);
    const lost = valid.length > 0 ? await store.describeLostLeases(pool, valid.map(ref)) : new Map<string, store.LostLease>();
    return {
      lost: [...lost].map(([id, l]) => ({ id, reason: l.reason, endedAs: l.endedAs, finishedState: l.finishedState ?? null })),
      invalid: invalid.map(invalidEntry),
    };
  });

  app.post<{ Body: { workerName: string; currentWorkerId: string; identity?: string } }>(
    "/v1/worker/reconcile",
    { schema: routes.reconcile, config: worker },
    async (request) => {
      const { workerName, currentWorkerId, identity } = request.body;
      const proven = provenIdentity(identities, identity, currentWorkerId);
      // An older worker sends no proof: it starts as before, and what its earlier process held
      // is recovered when the leases run out.
      if (!proven) return { released: 0, skipped: "no identity proof was sent: nothing recovered (the jobs are recovered when their leases expire)" };
      if (proven.name !== workerName)
        throw new InvalidIdentityError(currentWorkerId, `the identity proof was not issued for worker name ${JSON.stringify(workerName)}`);
      // Attach refused a second live worker of this name, so what its earlier processes
      // still hold was left by a process that died: recovered, spending an attempt each. The
      // caller's backoff is not taken: each job backs off by its holder's or task's policy,
      // else the server's default.
      const recovered = await store.recoverJobsOfEarlierProcess(pool, { workerName, currentWorkerId, backoff: DEFAULT_BACKOFF });
      if (recovered.size > 0) lh.metrics.recoveries.inc({ cause: "reconciliation" }, recovered.size);
      return { released: recovered.size };
    },
  );
}

function ref(r: Ref): Ref {
  return { id: r.id, attempt: r.attempt };
}

async function answerReport(
  reply: FastifyReply,
  kind: RefusedKind,
  workerId: string,
  sent: Ref[],
  invalid: Ref[],
  applied: Map<string, string>,
  lh: Leasehold,
): Promise<unknown> {
  if (applied.size === 0 && invalid.length === 0) return refuse(reply, kind, sent, workerId, lh);
  const refusedRefs = sent.filter((r) => !applied.has(r.id));
  const reasons = await recordRefused(kind, refusedRefs, workerId, lh);
  return {
    applied: [...applied].map(([id, state]) => ({ id, state })),
    refused: [
      ...refusedRefs.map((r) => ({ id: r.id, attempt: r.attempt, reason: reasons.get(r.id) ?? "missing" })),
      ...invalid.map((r) => ({ id: r.id, attempt: r.attempt, reason: INVALID_RECEIPT })),
    ],
  };
}

/**
 * Attempts the fence refused: why each was (by job id), counted and kept on record (the
 * dashboard's Recoveries view). Only on the refusal path: a request that applied costs nothing.
 */
export async function recordRefused(kind: RefusedKind, refs: Ref[], workerId: string, lh: Leasehold): Promise<Map<string, LostLeaseReason>> {
  if (refs.length === 0) return new Map();
  const described = await store.describeLostLeases(lh.pool, refs);
  const reasons = new Map(refs.map((r) => [r.id, described.get(r.id)?.reason ?? ("missing" as const)]));
  for (const reason of reasons.values()) lh.metrics.fencingRejections.inc({ kind, reason });
  // The record is for operators: failing to write it must not change the worker's answer.
  await store
    .recordStaleRefusals(
      lh.pool,
      refs.map((r) => ({ jobId: r.id, attempt: r.attempt, workerId, kind, reason: reasons.get(r.id)! })),
      "server",
    )
    .catch((err: unknown) => lh.logger.warn({ err: String(err) }, "could not record stale refusals"));
  return reasons;
}

/** Nothing in the request held its lease: 409, naming each attempt and why. */
export async function refuse(reply: FastifyReply, kind: RefusedKind, refs: Ref[], workerId: string, lh: Leasehold): Promise<FastifyReply> {
  const reasons = await recordRefused(kind, refs, workerId, lh);
  const jobs = refs.map((r) => ({ id: r.id, attempt: r.attempt, reason: reasons.get(r.id)! }));
  const what =
    refs.length === 1
      ? `job ${refs[0]!.id} attempt ${refs[0]!.attempt} no longer holds the lease (${jobs[0]!.reason})`
      : `none of these ${refs.length} attempts holds its lease`;
  return reply
    .status(409)
    .send(errorBody("stale_lease", `${what}; the ${kind === "heartbeat" ? "heartbeat" : "report"} was refused and changed nothing`, { jobs }));
}
