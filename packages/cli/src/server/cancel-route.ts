/**
 * POST /v1/worker/cancels: a remote worker's cancel poll (cancel-waiter.ts). It first checks
 * the attempts the worker names (a cancel requested since its last poll was announced while
 * no poll was open), then waits up to `waitMs` for a notice naming the worker. It takes a slot
 * of the same long-poll cap as claims (--max-long-polls): at the cap it answers at once and
 * the worker's heartbeats carry its cancels, as before.
 *
 * Waiting for notices tells the caller of every cancel of the worker it names, so it requires
 * that worker's identity proof (identity.ts). A poll without one (an older worker) only checks
 * the attempts it proved with receipts and answers at once; a wrong one is refused.
 */
import type { FastifyInstance } from "fastify";
import type { Leasehold } from "leasehold/internal/client";
import * as store from "leasehold/internal/store/index";
import type { CancelWaiter } from "./cancel-waiter.js";
import type { ClaimWaiter } from "./claim-waiter.js";
import { provenIdentity, type WorkerIdentities } from "./identity.js";
import type { ServerMetrics } from "./http-metrics.js";
import type { ReceiptRef, Receipts } from "./receipts.js";
import { routes } from "./schemas.js";

interface Deps {
  leasehold: Leasehold;
  waiter: ClaimWaiter;
  cancels: CancelWaiter;
  receipts: Receipts;
  identities: WorkerIdentities;
  metrics: ServerMetrics;
}

export function registerCancelRoute(app: FastifyInstance, { leasehold: lh, waiter, cancels, receipts, identities, metrics }: Deps): void {
  app.post<{ Body: { workerId: string; attempts: ReceiptRef[]; waitMs?: number; identity?: string } }>(
    "/v1/worker/cancels",
    { schema: routes.cancels, config: { scope: "worker" } },
    async (request, reply) => {
      const { workerId, attempts, identity } = request.body;
      const waitMs = provenIdentity(identities, identity, workerId) ? (request.body.waitMs ?? 0) : 0;
      const deadline = Date.now() + waitMs;
      const gone = new AbortController();
      reply.raw.on("close", () => gone.abort());
      // Only the claimer of an attempt may learn of its cancel.
      const { valid, invalid } = receipts.check(attempts, workerId);
      if (invalid.length > 0) metrics.invalidReceipts.inc({ kind: "cancels" }, invalid.length);
      if (waitMs > 0) await waiter.listen();
      const watch = cancels.watch(workerId);
      try {
        const found = await store.cancelsRequested(
          lh.pool,
          workerId,
          valid.map((a) => ({ id: a.id, attempt: a.attempt })),
        );
        if (found.length > 0 || waitMs === 0 || waiter.closed || gone.signal.aborted || !waiter.enter()) return { cancels: found, waited: false };
        let why;
        try {
          why = await watch.wait(deadline - Date.now(), gone.signal);
        } finally {
          waiter.leave();
        }
        return { cancels: watch.noticed, waited: why !== "closed" };
      } finally {
        watch.stop();
      }
    },
  );
}
