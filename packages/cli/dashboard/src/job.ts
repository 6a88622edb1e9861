/**
 * One job (#/jobs/ID, a link to share): its record, payload, checkpoint, progress and last
 * error, shown as text; and its attempts on a timeline, from the audit trail: which worker held
 * each, when, and how it ended (succeeded, failed, lease expired, worker lost, stalled, timed
 * out, released, cancelled). Its result once it succeeded, and its parents and children in a
 * flow (links, with their states); a durable job's steps and what it waits for. Retry, cancel
 * and re-run from a step, each after a confirmation, and the job's re-runs.
 */
import { ApiError, type AttemptRecord, type JobDetail, type JobLink } from "./api.js";
import { badge, button, h, jobLink, jsonBlock, progressBar, replace, table } from "./dom.js";
import { duration, time } from "./format.js";
import { confirmChange, type View, type ViewContext } from "./view.js";
import { rerunForm, rerunsTable } from "./reruns.js";
import { stepsBlock, waitField } from "./job-steps.js";

const OUTCOME_TEXT: Record<string, string> = {
  succeeded: "succeeded",
  failed: "failed",
  lease_expired: "lease expired (reaped)",
  worker_lost: "worker lost",
  stalled: "stalled",
  timed_out: "timed out",
  released: "released",
  cancelled: "cancelled",
  superseded: "superseded (a newer job wrote first)",
  suspended: "suspended (sleeping or waiting)",
  running: "running now",
};

export function jobView(ctx: ViewContext): View {
  const id = ctx.path[1]!;
  let shown = "";
  return {
    async refresh() {
      let detail: JobDetail;
      try {
        detail = await ctx.api.get<JobDetail>(`/v1/jobs/${id}`);
      } catch (err) {
        // Not a failure to read: the job finished and its queue keeps no record of it (or retention forgot it).
        if (!(err instanceof ApiError && err.status === 410)) throw err;
        if (shown !== "not kept") replace(ctx.root, h("h1", {}, `Job ${id}`), h("p", { class: "empty", "data-job": "not-kept" }, `${err.message}.`));
        shown = "not kept";
        return;
      }
      if (stopping.has(id) && detail.job.state !== "running") {
        stopping.delete(id);
        ctx.flash(`Job ${id} stopped: it is ${detail.job.state} now.`);
      }
      // Redraw only when something changed, so a selection in the payload survives the refresh.
      const text = JSON.stringify(detail);
      if (text === shown) return;
      shown = text;
      replace(ctx.root, ...render(ctx, detail));
    },
  };
}

function render(
  ctx: ViewContext,
  {
    job,
    attempts,
    progressFraction,
    parents = [],
    children = [],
    parentCount = 0,
    childCount = 0,
    steps = [],
    stepCount = 0,
    wait = null,
    reruns = [],
  }: JobDetail,
): Node[] {
  const actions = h("div", { class: "actions" });
  if (!ctx.readOnly) {
    if (job.state === "dead" || job.state === "cancelled") {
      actions.append(
        button("Retry", () => void act(ctx, "retry", job.id, `Retry job ${job.id}?`, "It goes back to waiting with a fresh retry budget."), {
          "data-action": "retry",
        }),
      );
    }
    if (job.state === "succeeded" || job.state === "dead" || job.state === "cancelled") actions.append(rerunForm(ctx, job.id));
    if ((job.state === "waiting" || job.state === "blocked" || job.state === "suspended" || job.state === "running") && !job.cancelRequestedAt) {
      const detail =
        job.state === "running"
          ? "Its handler is aborted now."
          : job.state === "blocked"
            ? "It ends now, without running; the jobs that depend on it are cancelled too (or run, if they run on failure)."
            : "It ends now, without running.";
      actions.append(
        button("Cancel", () => void act(ctx, "cancel", job.id, `Cancel job ${job.id}?`, detail), { class: "danger", "data-action": "cancel" }),
      );
    }
  }
  const field = (label: string, value: Node | string) => [h("dt", {}, label), h("dd", {}, value)];
  const fields = h(
    "dl",
    { class: "fields" },
    ...field("queue", job.queue),
    ...field("task", job.task),
    ...field("attempts made", String(job.attempt)),
    ...field("budget spent", `${job.spentAttempts} of ${job.maxAttempts}`),
    ...field("priority", String(job.priority)),
    ...field("created", time(job.createdAt)),
    ...(job.state === "waiting" ? field("runs at", time(job.runAt)) : []),
    ...(wait ? field("suspended", waitField(wait)) : []),
    ...field("started", time(job.startedAt)),
    ...(job.finishedAt ? field("finished", time(job.finishedAt)) : []),
    ...(job.state === "running"
      ? [
          ...field("worker", h("span", { class: "mono" }, job.lockedBy ?? "–")),
          ...field("last heartbeat", time(job.heartbeatAt)),
          ...field("lease until", time(job.leaseUntil)),
        ]
      : []),
    ...(job.cancelRequestedAt ? field("cancel requested", time(job.cancelRequestedAt)) : []),
    ...(job.uniqueKey ? field("unique key", job.uniqueKey) : []),
    ...(job.key ? field("key", h("span", { "data-field": "key" }, job.key)) : []),
  );
  const block = (title: string, content: Node) => h("section", {}, h("h2", {}, title), content);
  return [
    h("h1", {}, `Job ${job.id} `, badge(job.state, job.state), job.cancelRequestedAt && badge("cancel requested", "cancelled")),
    actions,
    fields,
    block(
      "Progress",
      h(
        "div",
        { "data-field": "progress" },
        // A bar only while it runs: a finished job's last report (88 %) is not where it stands.
        job.state === "succeeded"
          ? progressBar(1, { "aria-label": "progress" })
          : job.state === "running" && progressFraction !== null && progressBar(progressFraction, { "aria-label": "progress" }),
        job.state === "succeeded" && h("p", { class: "note" }, "Complete."),
        job.progress === null && job.state !== "succeeded" && h("p", { class: "empty" }, "None reported."),
        job.progress !== null && job.state !== "running" && h("p", { class: "note" }, "Last reported:"),
        job.progress !== null && jsonBlock(job.progress),
      ),
    ),
    block(
      "Last error",
      job.lastError ? h("pre", { class: "error-text", "data-field": "last-error" }, job.lastError) : h("p", { class: "empty" }, "None."),
    ),
    block("Attempts", timeline(job.state === "running" ? [...attempts, current(job)] : attempts)),
    ...(stepCount > 0 ? [block("Steps", stepsBlock(steps, stepCount))] : []),
    ...(job.state === "succeeded" || (job.result !== undefined && job.result !== null)
      ? [
          block(
            "Result",
            job.result === null || job.result === undefined
              ? h("p", { class: "empty", "data-field": "result" }, "None returned.")
              : jsonBlock(job.result, { "data-field": "result" }),
          ),
        ]
      : []),
    ...(parentCount > 0 ? [block("Parents", links(parents, parentCount, "parents"))] : []),
    ...(childCount > 0 ? [block("Children", links(children, childCount, "children"))] : []),
    ...(reruns.length > 0 ? [block("Re-runs", rerunsTable(reruns))] : []),
    block("Payload", jsonBlock(job.payload, { "data-field": "payload" })),
    block(
      "Checkpoint",
      job.checkpoint === null ? h("p", { class: "empty" }, "None saved.") : jsonBlock(job.checkpoint, { "data-field": "checkpoint" }),
    ),
  ];
}

/** A job's parents or children: each a link with its ref, task and state. */
function links(list: JobLink[], total: number, what: string): Node {
  return h(
    "div",
    {},
    table(
      ["Job", "Ref", "Task", "State"],
      list.map((l) => [jobLink(l.id), l.ref ?? "–", l.task ?? "–", badge(l.state, l.state)]),
      { "data-table": what },
    ),
    total > list.length && h("p", { class: "note" }, `The first ${list.length} of ${total}.`),
  );
}

/** The attempt running now is the job row itself (its audit row is written when it ends). */
function current(job: JobDetail["job"]): AttemptRecord {
  return {
    jobId: job.id,
    attempt: job.attempt,
    workerId: job.lockedBy ?? "",
    startedAt: job.startedAt!,
    endedAt: new Date().toISOString(),
    outcome: "running",
    error: null,
  };
}

function timeline(attempts: AttemptRecord[]): Node {
  if (attempts.length === 0) return h("p", { class: "empty" }, "No attempt yet.");
  const start = Math.min(...attempts.map((a) => new Date(a.startedAt).getTime()));
  const end = Math.max(...attempts.map((a) => new Date(a.endedAt).getTime()));
  const span = Math.max(1, end - start);
  const rows = attempts.map((a) => {
    const from = new Date(a.startedAt).getTime();
    const to = new Date(a.endedAt).getTime();
    const bar = h("span", { class: `bar ${a.outcome}`, title: `${OUTCOME_TEXT[a.outcome] ?? a.outcome}, ${duration(to - from)}` });
    // Positions through the style object (allowed by the page's policy), never a style attribute.
    bar.style.left = `${((from - start) / span) * 100}%`;
    bar.style.width = `${Math.max(0.5, ((to - from) / span) * 100)}%`;
    return h(
      "li",
      { "data-outcome": a.outcome },
      h("span", { class: "label" }, `#${a.attempt} `, badge(OUTCOME_TEXT[a.outcome] ?? a.outcome, a.outcome)),
      h("span", { class: "track" }, bar),
    );
  });
  return h(
    "div",
    { class: "attempts" },
    h("ol", { class: "timeline", "aria-label": "attempts over time" }, ...rows),
    h("p", { class: "note" }, `From ${time(new Date(start).toISOString())} to ${time(new Date(end).toISOString())} (${duration(span)}).`),
    table(
      ["#", "Outcome", "Worker", "Started", "Took", "Error"],
      attempts.map((a) => [
        String(a.attempt),
        OUTCOME_TEXT[a.outcome] ?? a.outcome,
        h("span", { class: "mono" }, a.workerId),
        time(a.startedAt),
        duration(new Date(a.endedAt).getTime() - new Date(a.startedAt).getTime()),
        a.error ? h("pre", { class: "error-text" }, a.error) : "",
      ]),
      { "data-table": "attempts" },
    ),
  );
}

/** Jobs this page asked to stop: the "will stop" message is replaced once they have. */
const stopping = new Set<string>();

async function act(ctx: ViewContext, action: "retry" | "cancel", id: string, question: string, detail: string): Promise<void> {
  if (!(await confirmChange(question, detail, action === "retry" ? "Retry" : "Cancel job"))) return;
  try {
    const r = await ctx.api.post<{ result: string }>(`/v1/jobs/${id}/${action}`);
    if (r.result === "retried") ctx.flash(`Job ${id} is waiting again.`);
    else if (r.result === "cancelled") ctx.flash(`Job ${id} cancelled.`);
    else {
      ctx.flash(`Job ${id} will stop: its handler is aborted now.`);
      stopping.add(id);
    }
  } catch (err) {
    ctx.flash(err instanceof Error ? err.message : String(err), "error");
  }
  ctx.refresh();
}
