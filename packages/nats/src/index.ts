/**
 * @leasehold/nats: NATS JetStream dispatch for Leasehold (docs/nats.md). Leasehold loads this
 * package itself when a client is given the `nats` option; nothing here needs importing.
 */
import type { NatsPlugin } from "leasehold/internal/worker/dispatch";
import { NatsLink } from "./nats.js";
import { NatsWorkerDispatch } from "./nats-worker.js";
import { PUBLISH_GRACE_MS, resolveNatsOptions, type ResolvedNatsOptions } from "./options.js";

export { NatsLink, NatsWorkerDispatch, resolveNatsOptions, PUBLISH_GRACE_MS };
export { consumerOf, subjectOf, type NatsOptions, type ResolvedNatsOptions } from "./options.js";

const plugin: NatsPlugin = {
  PUBLISH_GRACE_MS,
  resolveNatsOptions,
  connect: (resolved, p) => new NatsLink(resolved as ResolvedNatsOptions, p.logger, p.metrics, p.name),
  workerDispatch: (link, p) => new NatsWorkerDispatch({ link: link as NatsLink, ...p }),
};
export default plugin;
