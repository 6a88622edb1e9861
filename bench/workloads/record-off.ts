/**
 * Leasehold with its queue keeping no record of succeeded jobs (lh.setQueueHistory): the drain
 * rows "leasehold (record off)" next to the same drain with the record kept. The setting is
 * stored after the reset and checked after the fill, so a row never measures what its label
 * does not say.
 */
import { withLeasehold } from "../systems/leasehold.js";
import { DEFAULT_QUEUE } from "../../packages/leasehold/src/jobs/validate.js";
import type { DrainSetup } from "./throughput.js";

export const RECORD_OFF: DrainSetup = {
  prepare: (url) => withLeasehold(url, (lh) => lh.setQueueHistory(DEFAULT_QUEUE, { keepSucceeded: false }, { create: true })),
  verify: (url) =>
    withLeasehold(url, async (lh) => {
      const { rows } = await lh.pool.query<{ queue: string; keep: boolean }>(
        `SELECT j.queue, coalesce(q.keep_succeeded, true) AS keep FROM (SELECT DISTINCT queue FROM jobs) AS j LEFT JOIN queues AS q ON q.name = j.queue`,
      );
      if (rows.length !== 1 || rows[0]!.queue !== DEFAULT_QUEUE || rows[0]!.keep) {
        throw new Error(
          `setup is not as labelled: expected every job in queue "${DEFAULT_QUEUE}", which keeps no record, found ${JSON.stringify(rows)}`,
        );
      }
    }),
};
