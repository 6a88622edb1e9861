/**
 * The API a remote worker uses: the worker runtime's transport calls, one route each. The
 * fence is the store's SQL, exactly as for a worker on a database connection: a stale
 * heartbeat or report changes nothing and, when nothing in the request applied, is answered
 * 409 with `{ error: { code: "stale_lease", jobs: [{ id, attempt, reason }] } }`.
 */
import type { FastifyInstance, FastifyReply } from "fastify";
import type { Leasehold } from "../client.js";
import { serializePayload } from "../jobs/validate.js";
import * as store from "../store/index.js";
import { errorBody } from "./errors.js";
import { routes } from "./schemas.js";


type Ref = { id: string; attempt: number };

export function registerWorkerRoutes(app: FastifyInstance, lh: Leasehold): void {
  const pool = lh.pool;

  app.post<{ Body: { workerId: string; leaseMs: number; beats: (Ref & { progress?: unknown; checkpoint?: unknown })[] } }>(
    "/v1/worker/heartbeat",
    { schema: routes.heartbeat },
    async (request, reply) => {
      const { workerId, leaseMs, beats } = request.body;
      const result = await store.extendLeases(pool, {
        workerId,
        leaseMs,
        beats: beats.map((b) => ({
          id: b.id,
          attempt: b.attempt,
          progressJson: b.progress === undefined ? null : serializePayload(b.progress, `job ${b.id}: progress`),
          checkpointJson: b.checkpoint === undefined ? null : serializePayload(b.checkpoint, `job ${b.id}: checkpoint`),
        })),
      });
      if (result.renewed.size === 0) {
        return refuse(reply, "heartbeat", beats, lh);
      }
      return {
        renewed: [...result.renewed].map(([id, r]) => ({ id, cancelRequested: r.cancelRequested })),
        lost: result.lost,
      };
    },
  );

  app.post<{ Body: { workerId: string; jobs: Ref[] } }>("/v1/worker/succeed", { schema: routes.succeed }, async (request, reply) => {
    const applied = await store.completeJobs(pool, request.body);
    return answerReport(reply, "complete", request.body.jobs, applied, lh);
  });

  app.post<{ Body: { workerId: string; failures: store.Failure[] } }>("/v1/worker/fail", { schema: routes.fail }, async (request, reply) => {
    const applied = await store.failJobs(pool, request.body);
    return answerReport(reply, "fail", request.body.failures, applied, lh);
  });

  app.post<{ Body: { workerId: string; jobs: Ref[]; reason: string } }>("/v1/worker/release", { schema: routes.release }, async (request, reply) => {
    const applied = await store.releaseJobs(pool, request.body);
    return answerReport(reply, "release", request.body.jobs, applied, lh);
  });

  app.post<{ Body: { attempts: Ref[] } }>("/v1/worker/lost", { schema: routes.lost }, async (request) => {
    const lost = await store.describeLostLeases(pool, request.body.attempts);
    return { lost: [...lost].map(([id, l]) => ({ id, reason: l.reason, endedAs: l.endedAs })) };
  });

  app.post<{ Body: { workerName: string; currentWorkerId: string } }>("/v1/worker/reconcile", { schema: routes.reconcile }, async (request) => {
    const released = await store.releaseJobsOfEarlierProcess(pool, request.body);
    if (released.size > 0) lh.metrics.released.inc({ cause: "reconciliation" }, released.size);
    return { released: released.size };
  });
}

async function answerReport(
  reply: FastifyReply,
  kind: string,
  sent: Ref[],
  applied: Map<string, string>,
  lh: Leasehold,
): Promise<unknown> {
  const refusedRefs = sent.filter((r) => !applied.has(r.id));
  if (applied.size === 0) return refuse(reply, kind, sent, lh);
  const reasons = refusedRefs.length > 0 ? await store.describeLostLeases(lh.pool, refusedRefs) : new Map();
  for (const r of refusedRefs) lh.metrics.staleReports.inc({ kind, reason: reasons.get(r.id)?.reason ?? "missing" });
  return {
    applied: [...applied].map(([id, state]) => ({ id, state })),
    refused: refusedRefs.map((r) => ({ id: r.id, attempt: r.attempt, reason: reasons.get(r.id)?.reason ?? "missing" })),
  };
}

/** Nothing in the request held its lease: 409, naming each attempt and why. */
async function refuse(reply: FastifyReply, kind: string, refs: Ref[], lh: Leasehold): Promise<FastifyReply> {
  const reasons = await store.describeLostLeases(lh.pool, refs);
  const jobs = refs.map((r) => ({ id: r.id, attempt: r.attempt, reason: reasons.get(r.id)?.reason ?? "missing" }));
  for (const j of jobs) lh.metrics.staleReports.inc({ kind, reason: j.reason });
  const what = refs.length === 1 ? `job ${refs[0]!.id} attempt ${refs[0]!.attempt} no longer holds the lease (${jobs[0]!.reason})` : `none of these ${refs.length} attempts holds its lease`;
  return reply.status(409).send(errorBody("stale_lease", `${what}; the ${kind === "heartbeat" ? "heartbeat" : "report"} was refused and changed nothing`, { jobs }));
}
