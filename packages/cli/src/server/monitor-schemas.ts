/**
 * Schemas of the routes a live view reads (overview, running jobs, activity, recoveries), the
 * bulk actions, and the dashboard's own page and assets. Like schemas.ts: fastify validates
 * requests against them and the OpenAPI document is built from them.
 */
import { MAX_BULK_JOBS } from "leasehold/internal/store/bulk";
import { HANDLER_GAPS, JOB_FILTER, JOB_ID, NAME, PROGRESS_FRACTION, TIME, errors, object, queueSettingsSchema, secured } from "./schemas.js";

const MS = { type: "number", description: "milliseconds, by the database's clock" } as const;
const NULLABLE_MS = { type: ["number", "null"], description: "milliseconds, by the database's clock" } as const;
const COUNT = { type: "integer" } as const;
const READ_ERRORS = errors(400, 401, 403, 503);
const STRING_LIST = { type: "array", items: { type: "string" } } as const;
const RECOVERY_EVENTS = ["lease_expired", "worker_lost", "stalled", "timed_out", "released", "refused"];

const queueOverview = {
  type: "object",
  properties: {
    queue: NAME,
    waiting: { ...COUNT, description: "ready to run now" },
    scheduled: { ...COUNT, description: "waiting for a later time: delayed, or backing off before a retry" },
    blocked: { ...COUNT, description: "waiting for their parents to end (docs/flows.md)" },
    suspended: { ...COUNT, description: "durable jobs sleeping or waiting for an event, woken by the watchdog or the event (docs/durable.md)" },
    running: COUNT,
    expired: { ...COUNT, description: "running with a lease that ran out, not yet reaped by a watchdog" },
    dead: COUNT,
    oldestWaitingMs: { ...NULLABLE_MS, description: "how long the oldest job ready to run has waited" },
  },
};

const processRecord = {
  type: "object",
  properties: {
    id: { type: "string" },
    name: { type: ["string", "null"] },
    kind: { type: "string", enum: ["worker", "watchdog"] },
    host: { type: ["string", "null"] },
    pid: { type: ["integer", "null"] },
    queues: STRING_LIST,
    tasks: STRING_LIST,
    concurrency: { type: ["integer", "null"] },
    inFlight: { ...COUNT, description: "leases it holds, as of its last beat" },
    leaseMs: { type: ["integer", "null"] },
    heartbeatMs: { type: ["integer", "null"] },
    lastSeenMsAgo: { ...MS, description: "since its last beat (a worker) or run (a watchdog)" },
    upMs: MS,
    lost: { type: "boolean", description: "its liveness lock is gone: the process died" },
  },
};

const runningJob = {
  type: "object",
  properties: {
    id: JOB_ID,
    queue: NAME,
    task: NAME,
    attempt: COUNT,
    spentAttempts: COUNT,
    maxAttempts: COUNT,
    workerId: { type: "string" },
    startedAt: TIME,
    heartbeatAt: TIME,
    runningMs: MS,
    heartbeatMsAgo: MS,
    leaseLeftMs: { ...MS, description: "negative: the lease ran out and is not reaped yet" },
    progress: { description: "as the handler last reported it; null when it is larger than 2 KiB (progressTooLarge)" },
    progressTooLarge: { type: "boolean" },
    progressFraction: PROGRESS_FRACTION,
    cancelRequested: { type: "boolean" },
  },
};

const runningLongJob = {
  type: "object",
  properties: {
    id: JOB_ID,
    queue: NAME,
    task: NAME,
    attempt: COUNT,
    workerId: { type: "string" },
    startedAt: TIME,
    runningMs: MS,
    usualP99Ms: { ...MS, description: "the 99th percentile run time of the task's latest successes" },
    samples: { ...COUNT, description: "how many successes usualP99Ms is taken from" },
  },
};

const bulkQuery = (action: "retry" | "cancel") =>
  object(
    action === "retry"
      ? { ...JOB_FILTER, state: { type: "string", enum: ["dead"], description: "retry takes dead jobs only" } }
      : { ...JOB_FILTER, state: { type: "string", enum: ["waiting", "running"] }, time: { type: "string", enum: ["created"] } },
  );

const bulkBody = (action: "retry" | "cancel") => {
  const query = bulkQuery(action);
  return object(
    {
      ...query.properties,
      confirmed: {
        type: "integer",
        minimum: 0,
        maximum: MAX_BULK_JOBS,
        description: "how many jobs the operator was told match (GET); if more match now, nothing changes (409 count_changed)",
      },
    },
    ["confirmed"],
  );
};

const bulkRoutes = (action: "retry" | "cancel") => {
  const what =
    action === "retry"
      ? "dead jobs back to waiting with a fresh retry budget"
      : "jobs: the waiting ones end now, the running ones have their handlers aborted at once";
  return {
    count: {
      ...secured,
      tags: ["jobs"],
      summary: `How many jobs a bulk ${action} with this filter would take now`,
      querystring: bulkQuery(action),
      response: {
        200: {
          type: "object",
          properties: { action: { type: "string" }, matched: COUNT, max: { ...COUNT, description: "most jobs one bulk action takes" } },
        },
        ...READ_ERRORS,
      },
    },
    act: {
      ...secured,
      tags: ["jobs"],
      summary: `Bulk ${action}: ${what}`,
      description:
        `Acts on every job matching the filter, if no more than \`confirmed\` match (at most ${MAX_BULK_JOBS}). ` +
        "Ask first with GET for the number to confirm.",
      body: bulkBody(action),
      response: {
        200: {
          type: "object",
          properties: {
            action: { type: "string" },
            matched: COUNT,
            changed: { ...COUNT, description: action === "retry" ? "jobs back to waiting" : "waiting jobs ended as cancelled" },
            requested: { ...COUNT, description: "cancel: running jobs whose cancel was requested" },
            skipped: { ...COUNT, description: "retry: dead jobs whose unique key an unfinished job holds" },
          },
        },
        ...errors(400, 401, 403, 409, 503),
      },
    },
  };
};

export const monitorRoutes = {
  overview: {
    ...secured,
    tags: ["monitor"],
    summary: "Queues with counts by state and the oldest ready job's wait; live workers and watchdogs (never reads finished jobs)",
    response: {
      200: {
        type: "object",
        properties: {
          queues: { type: "array", items: queueOverview },
          processes: { type: "array", items: processRecord, description: "seen in the last hour and not stopped; at most 500" },
          withoutHandler: HANDLER_GAPS,
          flow: {
            type: "array",
            items: queueSettingsSchema,
            description: "flow-control settings of every configured queue (paused, limits), also of queues with no unfinished job",
          },
        },
      },
      ...READ_ERRORS,
    },
  },
  running: {
    ...secured,
    tags: ["monitor"],
    summary: "Running jobs, longest running first: lease time left, last heartbeat, progress, attempt, worker",
    querystring: object({ queue: NAME, limit: { type: "string", pattern: "^[0-9]{1,4}$", description: "1..1000, default 100" } }),
    response: {
      200: {
        type: "object",
        properties: { jobs: { type: "array", items: runningJob }, more: { type: "boolean", description: "more jobs run than were listed" } },
      },
      ...READ_ERRORS,
    },
  },
  runningLong: {
    ...secured,
    tags: ["monitor"],
    summary:
      "Running jobs past twice their task's usual run time (the p99 of its latest successes) and by at least 10 s, furthest past first; tasks with too few successes are not judged",
    querystring: object({ queue: NAME, limit: { type: "string", pattern: "^[0-9]{1,4}$", description: "1..1000, default 100" } }),
    response: {
      200: {
        type: "object",
        properties: {
          jobs: { type: "array", items: runningLongJob },
          more: { type: "boolean", description: "more jobs run long than were listed" },
          samples: { ...COUNT, description: "successes per task the usual run time is taken from (the latest)" },
          minSamples: { ...COUNT, description: "a task with fewer successes is not judged" },
          factor: { type: "number", description: "running long: past this multiple of the usual p99 ..." },
          minExcessMs: { ...MS, description: "... and by at least this much" },
        },
      },
      ...READ_ERRORS,
    },
  },
  activity: {
    ...secured,
    tags: ["monitor"],
    summary: "The last hour: throughput (rows per second, from sampled table counters) and recoveries per minute",
    response: {
      200: {
        type: "object",
        properties: {
          windowMs: MS,
          sampleIntervalMs: MS,
          counting: { type: "boolean", description: "PostgreSQL's track_counts; off, there is no throughput to show" },
          throughput: {
            type: "array",
            items: {
              type: "object",
              properties: {
                at: TIME,
                finished: { type: ["number", "null"], description: "jobs that succeeded or were cancelled, per second" },
                dead: { type: ["number", "null"], description: "jobs that went to the dead letter, per second" },
                requeued: { type: ["number", "null"], description: "attempts that ended without finishing their job, per second" },
                enqueued: { type: ["number", "null"], description: "jobs enqueued, per second" },
              },
            },
          },
          recoveries: {
            type: "array",
            description: "minutes with at least one event",
            items: {
              type: "object",
              properties: {
                minute: TIME,
                counts: { type: "object", properties: Object.fromEntries(RECOVERY_EVENTS.map((e) => [e, COUNT])) },
              },
            },
          },
        },
      },
      ...READ_ERRORS,
    },
  },
  recoveries: {
    ...secured,
    tags: ["monitor"],
    summary: "The last hour's reaped, recovered and released attempts and stale refusals, newest first",
    querystring: object({ limit: { type: "string", pattern: "^[0-9]{1,4}$", description: "1..1000, default 200" } }),
    response: {
      200: {
        type: "object",
        properties: {
          windowMs: MS,
          events: {
            type: "array",
            items: {
              type: "object",
              properties: {
                at: TIME,
                event: { type: "string", enum: RECOVERY_EVENTS },
                jobId: JOB_ID,
                attempt: COUNT,
                workerId: { type: "string" },
                detail: { type: ["string", "null"] },
                wentDead: { type: "boolean" },
                via: { type: ["string", "null"], enum: ["database", "server", null] },
                queue: { type: ["string", "null"] },
                task: { type: ["string", "null"] },
              },
            },
          },
        },
      },
      ...READ_ERRORS,
    },
  },
  bulkRetry: bulkRoutes("retry"),
  bulkCancel: bulkRoutes("cancel"),
  page: {
    tags: ["dashboard"],
    summary: "The dashboard (a page that calls this API with the token you give it); no token needed, it holds no data",
    response: { 200: { description: "HTML", type: "string" } },
  },
  favicon: {
    tags: ["dashboard"],
    summary: "The dashboard's icon (SVG); no token needed",
    response: { 200: { description: "SVG", type: "string" } },
  },
  asset: {
    tags: ["dashboard"],
    summary: "The dashboard's scripts and styles",
    params: object({ name: { type: "string", pattern: "^[A-Za-z0-9_.-]{1,64}$" } }, ["name"]),
    response: { 200: { description: "JavaScript, CSS or SVG", type: "string" }, 404: { description: "no such asset", type: "object" } },
  },
};
