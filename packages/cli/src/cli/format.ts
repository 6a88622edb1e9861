/** Human-readable output: aligned tables and job details. */
import type { AttemptRecord, JobLink, JobRecord, ListedJob } from "leasehold/internal/jobs/types";
import type { JobRelations } from "leasehold/internal/store/admin";
import type { JobRerun } from "leasehold/internal/store/reruns";
import type { JobSteps } from "leasehold/internal/store/step-views";
import type { Stats } from "leasehold/internal/client";
import { stepsText } from "./format-steps.js";
import { describeGap, type HandlerGap } from "leasehold/internal/maintenance/handler-gaps";

export function table(headers: string[], rows: string[][]): string {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (cells: string[]) =>
    cells
      .map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i]!)))
      .join("  ")
      .trimEnd();
  return [line(headers), ...rows.map(line)].join("\n");
}

export function ago(date: Date | null): string {
  if (!date) return "-";
  const s = Math.round((Date.now() - date.getTime()) / 1000);
  const abs = Math.abs(s);
  const text =
    abs < 60 ? `${abs}s` : abs < 3600 ? `${Math.round(abs / 60)}m` : abs < 86400 ? `${Math.round(abs / 3600)}h` : `${Math.round(abs / 86400)}d`;
  return s >= 0 ? `${text} ago` : `in ${text}`;
}

function short(text: string | null, max = 60): string {
  if (!text) return "";
  const first = text.split("\n")[0]!;
  return first.length > max ? first.slice(0, max - 1) + "…" : first;
}

export function jobsTable(jobs: ListedJob[]): string {
  if (jobs.length === 0) return "no jobs";
  return table(
    // Attempts made (a job that succeeded first time: 1) and, apart, the retry budget: failed
    // and lost attempts spend it, a success or a release does not.
    ["ID", "STATE", "QUEUE", "TASK", "ATTEMPTS MADE", "BUDGET SPENT", "CREATED", "LAST ERROR"],
    jobs.map((j) => [j.id, j.state, j.queue, j.task, String(j.attempt), `${j.spentAttempts}/${j.maxAttempts}`, ago(j.createdAt), short(j.lastError)]),
  );
}

export function jobDetails(job: JobRecord, attempts: AttemptRecord[], relations?: JobRelations & { reruns?: JobRerun[] }, steps?: JobSteps): string {
  const iso = (d: Date | null) => (d ? `${d.toISOString()} (${ago(d)})` : "-");
  const fields: [string, string][] = [
    ["id", job.id],
    ["state", job.state + (job.cancelRequestedAt ? " (cancel requested)" : "")],
    ["queue", job.queue],
    ["task", job.task],
    ["priority", String(job.priority)],
    ["attempts made", `${job.attempt} (the latest one's number is its fencing token)`],
    ["budget spent", `${job.spentAttempts} of ${job.maxAttempts} (failed and lost attempts spend it)`],
    ["created", iso(job.createdAt)],
    ["run at", iso(job.runAt)],
    ["started", iso(job.startedAt)],
    ["finished", iso(job.finishedAt)],
    ["lease until", iso(job.leaseUntil)],
    ["locked by", job.lockedBy ?? "-"],
    ["unique key", job.uniqueKey ?? "-"],
    ["key", job.key ?? "-"],
    ["payload", JSON.stringify(job.payload)],
    ["progress", job.progress === null ? "-" : JSON.stringify(job.progress)],
    ["checkpoint", job.checkpoint === null ? "-" : JSON.stringify(job.checkpoint)],
    ["last error", short(job.lastError, 200) || "-"],
    ["result", job.result === null ? "-" : JSON.stringify(job.result)],
  ];
  const width = Math.max(...fields.map(([k]) => k.length));
  const head = fields.map(([k, v]) => `${k.padEnd(width)}  ${v}`).join("\n");
  const history =
    attempts.length === 0
      ? "no finished attempts yet"
      : table(
          ["ATTEMPT", "OUTCOME", "WORKER", "STARTED", "TOOK", "ERROR"],
          attempts.map((a) => [
            String(a.attempt),
            a.outcome,
            a.workerId,
            a.startedAt.toISOString(),
            `${((a.endedAt.getTime() - a.startedAt.getTime()) / 1000).toFixed(2)}s`,
            short(a.error),
          ]),
        );
  return `${head}\n\nattempt history:\n${history}${relations ? flowText(relations) : ""}${steps ? stepsText(steps) : ""}${relations?.reruns?.length ? rerunsText(relations.reruns) : ""}`;
}

/** A job's parents and children, when it has any. */
function flowText(r: JobRelations): string {
  const links = (what: string, list: JobLink[], total: number) =>
    total === 0
      ? ""
      : `\n\n${what}${total > list.length ? ` (first ${list.length} of ${total})` : ""}:\n` +
        table(
          ["ID", "REF", "TASK", "STATE"],
          list.map((l) => [l.id, l.ref ?? "-", l.task ?? "-", l.state]),
        );
  return links("parents", r.parents, r.parentCount) + links("children", r.children, r.childCount);
}

const STATES = ["waiting", "running", "suspended", "succeeded", "dead", "cancelled", "blocked"] as const;

export function statsText(stats: Stats): string {
  const byQueue = new Map<string, Record<string, number>>();
  for (const c of stats.counts) {
    const row = byQueue.get(c.queue) ?? {};
    row[c.state] = (row[c.state] ?? 0) + c.count;
    byQueue.set(c.queue, row);
  }
  const counts =
    byQueue.size === 0
      ? "no jobs"
      : table(
          ["QUEUE", ...STATES.map((s) => s.toUpperCase())],
          [...byQueue].map(([q, row]) => [q, ...STATES.map((s) => String(row[s] ?? 0))]),
        );
  const oldest =
    stats.oldestReadyAt === null
      ? "none (no job is waiting to run)"
      : `ready for ${stats.oldestReadyAgeSeconds!.toFixed(1)}s (since ${stats.oldestReadyAt.toISOString()})`;
  const watchdogs =
    stats.watchdogs > 0
      ? `${stats.watchdogs} running`
      : `none running${stats.expiredLeases > 0 ? ": expired leases are not being recovered (start `leasehold watchdog`; `leasehold doctor` says more)" : ""}`;
  return (
    `${counts}\n\nactive leases   ${stats.activeLeases} (expired, awaiting the watchdog: ${stats.expiredLeases})\n` +
    `oldest waiting  ${oldest}\nworkers         ${stats.workers} running\nwatchdogs       ${watchdogs}` +
    gapsText(stats.withoutHandler)
  );
}

/** Waiting jobs no live worker runs, one line each, under a heading; "" when there are none. */
export function gapsText(gaps: readonly HandlerGap[]): string {
  if (gaps.length === 0) return "";
  return `\n\nNO WORKER CAN RUN THESE (start a worker that handles them, or cancel them)\n${gaps.map((g) => `! ${describeGap(g)}`).join("\n")}`;
}

/** A job's re-runs from a step: the audit trail (docs/durable-callbacks.md#re-run-from-a-step). */
function rerunsText(reruns: JobRerun[]): string {
  const rows = reruns.map((r) => [
    r.requestedAt.toISOString(),
    `"${r.fromStep}"${r.fromOccurrence > 0 ? ` #${r.fromOccurrence}` : ""} (place ${r.fromSeq})`,
    r.previousState,
    r.requestedBy ?? "-",
    (r.stepsDropped as { name?: string }[]).map((s) => s.name).join(", ") || "-",
  ]);
  return `\n\nre-runs:\n${table(["AT", "FROM STEP", "HAD FINISHED", "BY", "STEP RECORDS DROPPED"], rows)}`;
}
