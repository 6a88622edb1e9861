/**
 * What a live view reads (GET /v1/overview (with the queues' flow-control settings), /v1/running, /v1/running-long, /v1/activity,
 * /v1/recoveries) and the bulk actions (/v1/bulk/retry, /v1/bulk/cancel). Every read is
 * bounded; only /v1/running-long reads finished jobs, a few hundred of each running task's
 * latest successes through an index (see store/running-long.ts). Several
 * dashboards open on one server share each answer for a moment, so viewers do not multiply
 * the statements.
 */
import type { FastifyInstance } from "fastify";
import type { Leasehold } from "leasehold/internal/client";
import { ValidationError } from "leasehold/internal/errors";
import { progressFraction } from "leasehold/internal/jobs/progress";
import { DEFAULT_SAMPLE_INTERVAL_MS } from "leasehold/internal/maintenance/throughput";
import { handlerGaps } from "leasehold/internal/maintenance/handler-gaps";
import * as store from "leasehold/internal/store/index";
import { errorBody } from "./errors.js";
import { filterFromWire, type WireFilter } from "./job-routes.js";
import { monitorRoutes as routes } from "./monitor-schemas.js";

/** The window of the activity charts and the Recoveries view. */
export const MONITOR_WINDOW_MS = 3_600_000;
const DEFAULT_RUNNING_LIMIT = 100;
const DEFAULT_RECOVERIES_LIMIT = 200;
/** How long one answer is shared by every viewer asking the same thing. */
const SHARE_MS = 1_000;

export interface MonitorOptions {
  /** The throughput sampler's interval, to tell a gap in the samples from a slot. */
  sampleIntervalMs?: number;
}

export function registerMonitorRoutes(app: FastifyInstance, lh: Leasehold, options: MonitorOptions = {}): void {
  const db = lh.pool;
  const sampleIntervalMs = options.sampleIntervalMs ?? DEFAULT_SAMPLE_INTERVAL_MS;
  const shared = new SharedAnswers(SHARE_MS);

  app.get("/v1/overview", { schema: routes.overview }, () =>
    shared.get("overview", async () => {
      const [queues, processes, withoutHandler, flow] = await Promise.all([
        store.queueOverview(db),
        store.liveProcesses(db),
        handlerGaps(db),
        store.queueSettings(db),
      ]);
      return { queues, processes, withoutHandler, flow };
    }),
  );

  app.get<{ Querystring: { queue?: string; limit?: string } }>("/v1/running", { schema: routes.running }, (request) => {
    const { queue } = request.query;
    const limit = request.query.limit === undefined ? DEFAULT_RUNNING_LIMIT : Number(request.query.limit);
    if (limit < 1 || limit > 1_000) throw new ValidationError(`limit must be an integer from 1 to 1000 (got ${limit})`);
    return shared.get(`running:${queue ?? ""}:${limit}`, async () => {
      const jobs = await store.runningJobs(db, { queue, limit: limit + 1 });
      return {
        jobs: jobs.slice(0, limit).map((j) => ({ ...j, progressFraction: progressFraction(j.progress) })),
        more: jobs.length > limit,
      };
    });
  });

  app.get<{ Querystring: { queue?: string; limit?: string } }>("/v1/running-long", { schema: routes.runningLong }, (request) => {
    const { queue } = request.query;
    const limit = request.query.limit === undefined ? DEFAULT_RUNNING_LIMIT : Number(request.query.limit);
    if (limit < 1 || limit > 1_000) throw new ValidationError(`limit must be an integer from 1 to 1000 (got ${limit})`);
    return shared.get(`running-long:${queue ?? ""}:${limit}`, async () => {
      const jobs = await store.runningLongerThanUsual(db, { queue, limit: limit + 1 });
      return {
        jobs: jobs.slice(0, limit),
        more: jobs.length > limit,
        samples: store.RUN_TIME_SAMPLES,
        minSamples: store.MIN_RUN_TIME_SAMPLES,
        factor: store.RUNNING_LONG_FACTOR,
        minExcessMs: store.RUNNING_LONG_MIN_EXCESS_MS,
      };
    });
  });

  app.get("/v1/activity", { schema: routes.activity }, () =>
    shared.get("activity", async () => {
      const [throughput, recoveries] = await Promise.all([
        // Three missed samples in a row is a gap (no sampler ran), not a slow slot.
        store.throughputSeries(db, { windowMs: MONITOR_WINDOW_MS, maxGapMs: 3 * sampleIntervalMs }),
        store.recoverySeries(db, { windowMs: MONITOR_WINDOW_MS }),
      ]);
      return { windowMs: MONITOR_WINDOW_MS, sampleIntervalMs, counting: throughput.counting, throughput: throughput.points, recoveries };
    }),
  );

  app.get<{ Querystring: { limit?: string } }>("/v1/recoveries", { schema: routes.recoveries }, (request) => {
    const limit = request.query.limit === undefined ? DEFAULT_RECOVERIES_LIMIT : Number(request.query.limit);
    if (limit < 1 || limit > 1_000) throw new ValidationError(`limit must be an integer from 1 to 1000 (got ${limit})`);
    return shared.get(`recoveries:${limit}`, async () => ({
      windowMs: MONITOR_WINDOW_MS,
      events: await store.recentRecoveries(db, { windowMs: MONITOR_WINDOW_MS, limit }),
    }));
  });

  for (const action of ["retry", "cancel"] as const) {
    const schema = action === "retry" ? routes.bulkRetry : routes.bulkCancel;
    app.get<{ Querystring: WireFilter }>(`/v1/bulk/${action}`, { schema: schema.count }, async (request) => ({
      action,
      matched: await store.countMatching(db, action, checkedFilter(request.query)),
      max: store.MAX_BULK_JOBS,
    }));
    app.post<{ Body: WireFilter & { confirmed: number } }>(`/v1/bulk/${action}`, { schema: schema.act }, async (request, reply) => {
      const { confirmed, ...filter } = request.body;
      const result = await store.actOnMatching(db, action, checkedFilter(filter), confirmed);
      if (!result.applied) {
        if (result.matched > store.MAX_BULK_JOBS) {
          throw new ValidationError(`more than ${store.MAX_BULK_JOBS} jobs match; a bulk ${action} takes at most that many: narrow the filter`);
        }
        return reply
          .status(409)
          .send(
            errorBody(
              "count_changed",
              `${result.matched} jobs match now, more than the ${confirmed} confirmed; nothing changed: confirm the new number`,
              { matched: result.matched },
            ),
          );
      }
      const skipped = action === "retry" ? result.matched - result.changed : 0;
      return { action, matched: result.matched, changed: result.changed, requested: result.requested, skipped };
    });
  }
}

/** A time range must be a range (the schema has checked the formats). */
function checkedFilter(wire: WireFilter): store.JobFilter {
  const filter = filterFromWire(wire);
  if (filter.from && filter.to && filter.from >= filter.to) throw new ValidationError("from must be before to");
  return filter;
}

/** Answers shared for `ttlMs` by every caller asking the same key (and one query in flight per key). */
class SharedAnswers {
  private readonly answers = new Map<string, { at: number; value: Promise<unknown> }>();

  constructor(private readonly ttlMs: number) {}

  get<T>(key: string, compute: () => Promise<T>): Promise<T> {
    const now = performance.now();
    for (const [k, a] of this.answers) if (now - a.at > this.ttlMs) this.answers.delete(k);
    const cached = this.answers.get(key);
    if (cached) return cached.value as Promise<T>;
    const value = compute();
    this.answers.set(key, { at: now, value });
    // A failure is not shared: the next caller asks again.
    value.catch(() => this.answers.delete(key));
    return value;
  }
}
