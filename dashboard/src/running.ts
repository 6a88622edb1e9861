/**
 * Running jobs, longest running first: how long each has run, its last heartbeat, the time
 * left on its lease (by the database's clock, as the watchdog sees it), its progress (a bar
 * when the handler reports a fraction), attempt and worker.
 */
import type { RunningJob } from "./api.js";
import { h, jobLink, progressBar, replace, table } from "./dom.js";
import { ago, duration, short } from "./format.js";
import type { View, ViewContext } from "./view.js";

export function progressCell(j: { progress: unknown; progressFraction: number | null; progressTooLarge?: boolean }): Node | string {
  if (j.progressFraction !== null) return progressBar(j.progressFraction, { "aria-label": "progress" });
  if (j.progressTooLarge) return "(large: see the job)";
  if (j.progress === null || j.progress === undefined) return "–";
  return h("span", { class: "mono" }, short(JSON.stringify(j.progress), 60));
}

export function leaseCell(leaseLeftMs: number): Node {
  return leaseLeftMs < 0
    ? h("span", { class: "bad" }, `expired ${duration(-leaseLeftMs)} ago`)
    : h("span", { class: leaseLeftMs < 2_000 ? "warn" : "" }, duration(leaseLeftMs));
}

export function runningView(ctx: ViewContext): View {
  const list = h("div");
  const queue = ctx.params.get("queue") ?? undefined;
  ctx.root.append(h("h1", {}, "Running jobs", queue && ` in ${queue}`), list);
  return {
    async refresh() {
      const { jobs, more } = await ctx.api.get<{ jobs: RunningJob[]; more: boolean }>("/v1/running", { queue });
      replace(
        list,
        jobs.length === 0
          ? h("p", { class: "empty" }, "No job is running.")
          : table(
              ["Job", "Task", "Queue", "Progress", "Running for", "Last beat", "Lease left", "Attempt", "Worker"],
              jobs.map((j) => [
                jobLink(j.id),
                j.task,
                j.queue,
                progressCell(j),
                duration(j.runningMs),
                ago(j.heartbeatMsAgo),
                leaseCell(j.leaseLeftMs),
                `${j.attempt}${j.cancelRequested ? " (cancel requested)" : ""}`,
                h("span", { class: "mono" }, j.workerId),
              ]),
              { "data-table": "running" },
            ),
        more && h("p", { class: "note" }, "More jobs run than are listed here (the first 100 by start time)."),
      );
    },
  };
}
