/**
 * POST /v1/worker/claim: claim up to `limit` jobs; when none is ready, wait (a long poll)
 * up to `waitMs` for one. The claim is the store's statement, as for a worker on a database
 * connection, bounded by the answer's byte cap; this route adds the waiting and gives back jobs
 * nobody will receive.
 */
import type { FastifyInstance, FastifyReply } from "fastify";
import type { Leasehold } from "leasehold/internal/client";
import type { ClaimedJob } from "leasehold/internal/jobs/types";
import * as store from "leasehold/internal/store/index";
import type { ClaimWaiter } from "./claim-waiter.js";
import { errorBody } from "./errors.js";
import { checkLease, MAX_CLAIM_RESPONSE_BYTES, type LeaseBounds } from "./limits.js";
import { DEFAULT_BACKOFF } from "leasehold/internal/worker/backoff";
import type { Receipts } from "./receipts.js";
import { routes } from "./schemas.js";

type ClaimBody = store.ClaimParams & { waitMs?: number };

/** The shortest wait before a long poll asks again after a flow limit held its claim back. */
const MIN_FLOW_RETRY_MS = 10;

export function registerClaimRoute(app: FastifyInstance, lh: Leasehold, waiter: ClaimWaiter, receipts: Receipts, leases: LeaseBounds): void {
  const pool = lh.pool;

  app.post<{ Body: ClaimBody }>("/v1/worker/claim", { schema: routes.claim, config: { scope: "worker" } }, async (request, reply) => {
    const { waitMs = 0, ...asked } = request.body;
    // The answer's cap is applied by the claim statement itself: payloads past it stay in the database.
    const params: store.ClaimParams = { ...asked, maxBytes: MAX_CLAIM_RESPONSE_BYTES };
    checkLease(params.leaseMs, leases);
    const deadline = Date.now() + waitMs;
    const gone = new AbortController();
    reply.raw.on("close", () => gone.abort());
    let jobs = await store.claimJobs(pool, params);
    // waited: the claim was held open until a job came or waitMs passed. When it was not
    // (the long-poll cap, a stopping server), an empty answer tells the client to back off.
    let waited = false;
    if (jobs.length === 0 && waitMs > 0 && !waiter.closed && !gone.signal.aborted && waiter.enter()) {
      waited = true;
      try {
        for (;;) {
          // A flow limit that held the claim back frees a start in retryInMs: no notification
          // says so, so the wait ends then and the claim is tried again (not sooner than
          // MIN_FLOW_RETRY_MS, so a limit about to free cannot spin the claim).
          const retryAt = jobs.retryInMs === undefined ? deadline : Math.min(deadline, Date.now() + Math.max(jobs.retryInMs, MIN_FLOW_RETRY_MS));
          const woke = await waiter.wait(params, retryAt - Date.now(), gone.signal);
          if (woke === "closed") waited = false;
          if (woke === "aborted" || woke === "closed" || (woke === "timeout" && retryAt >= deadline)) break;
          // The worker's view of flow control is as old as its request: a queue that came under
          // flow control meanwhile would be refused by the plain claim until the poll ends.
          jobs = await store.claimJobs(pool, await withCurrentFlow(pool, params));
          if (jobs.length > 0 || Date.now() >= deadline) break;
        }
      } finally {
        waiter.leave();
      }
    }
    if (jobs.overBudget !== undefined) {
      // Leased by a flow-controlled claim past the cap, read without their payloads: give them
      // back at once. A release spends no retry budget and the job is claimable again.
      await release(lh, params.workerId, jobs.overBudget, "released: the claim's answer would have exceeded the server's response size cap");
      lh.metrics.released.inc({ cause: "response_cap" }, jobs.overBudget.length);
    }
    if (gone.signal.aborted) {
      // Claimed for a client that left while the statement ran (it died, or was cut off):
      // recover the jobs now rather than leave them to the watchdog. Like any recovery of an
      // attempt whose worker is gone, each spends an attempt: a job that kills its client
      // every time still reaches the dead letter.
      if (jobs.length > 0) {
        await release(lh, params.workerId, jobs, "worker lost: the claim's response could not be delivered", true);
        lh.metrics.recoveries.inc({ cause: "undelivered" }, jobs.length);
      }
      return clientGone(reply);
    }
    // Each job's receipt: later requests about this attempt must carry it.
    const answer = jobs.map((j) => ({ ...j, receipt: receipts.sign(j.id, j.attempt, params.workerId) }));
    for (const job of answer) lh.metrics.jobsClaimed.inc({ queue: lh.metrics.queueLabel(job.queue) });
    // Flow control: when a limit held the claim back, and which queues were paused.
    return {
      jobs: answer,
      waited,
      ...(jobs.retryInMs !== undefined && { retryInMs: jobs.retryInMs }),
      ...(jobs.paused !== undefined && { paused: jobs.paused }),
    };
  });
}

/** The claim's queues as the database sees them now: paused ones left out, flow-controlled ones named. */
async function withCurrentFlow(pool: store.Queryable, params: store.ClaimParams): Promise<store.ClaimParams> {
  const settings = await store.queueSettings(pool);
  const paused = new Set(settings.filter((q) => q.paused).map((q) => q.name));
  const flow = new Set(settings.filter((q) => q.flow).map((q) => q.name));
  const queues = params.queues.filter((q) => !paused.has(q));
  // The worker's order first (it rotates it so that each flow queue gets its turn first).
  const named = (params.flowQueues ?? []).filter((q) => queues.includes(q));
  return { ...params, queues, flowQueues: [...named, ...queues.filter((q) => flow.has(q) && !named.includes(q))] };
}

async function release(lh: Leasehold, workerId: string, jobs: Pick<ClaimedJob, "id" | "attempt">[], reason: string, spend = false): Promise<void> {
  await store.releaseJobs(lh.pool, { workerId, jobs: jobs.map((j) => ({ id: j.id, attempt: j.attempt })), reason, spend, backoff: DEFAULT_BACKOFF });
}

/** Nobody will read this answer; it only ends the request. */
function clientGone(reply: FastifyReply): FastifyReply {
  return reply.status(499).send(errorBody("client_closed", "the client closed the request"));
}
