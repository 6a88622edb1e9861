/**
 * Running jobs, longest running first: how long each has run, its last heartbeat, the time
 * left on its lease (by the database's clock, as the watchdog sees it), its progress (a bar
 * when the handler reports a fraction), attempt and worker. Above them, the jobs running much
 * longer than their task usually takes (a handler stuck on something that never answers), and
 * in the table those jobs' run times are marked.
 */
import type { RunningJob, RunningLong } from "./api.js";
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
  const long = h("section", { "data-section": "running-long" });
  const list = h("div");
  const queue = ctx.params.get("queue") ?? undefined;
  ctx.root.append(h("h1", {}, "Running jobs", queue && ` in ${queue}`), long, list);
  return {
    async refresh() {
      const [{ jobs, more }, slow] = await Promise.all([
        ctx.api.get<{ jobs: RunningJob[]; more: boolean }>("/v1/running", { queue }),
        ctx.api.get<RunningLong>("/v1/running-long", { queue }),
      ]);
      const usual = new Map(slow.jobs.map((j) => [j.id, j.usualP99Ms]));
      replace(
        long,
        slow.jobs.length > 0 &&
          h(
            "div",
            {},
            h("h2", {}, "Running longer than usual"),
            h(
              "p",
              { class: "note" },
              `Past ${slow.factor}× the p99 run time of their task's latest ${slow.samples} successes (and by ${duration(slow.minExcessMs)} at least); ` +
                `tasks with fewer than ${slow.minSamples} successes are not judged. A handler may be stuck: open the job.`,
            ),
            table(
              ["Job", "Task", "Queue", "Running for", "Usually (p99)", "Attempt", "Worker"],
              slow.jobs.map((j) => [
                jobLink(j.id),
                j.task,
                j.queue,
                h("span", { class: "warn" }, duration(j.runningMs)),
                `${duration(j.usualP99Ms)} (of ${j.samples})`,
                String(j.attempt),
                h("span", { class: "mono" }, j.workerId),
              ]),
              { "data-table": "running-long" },
            ),
            slow.more && h("p", { class: "note" }, "More jobs run long than are listed here."),
          ),
      );
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
                runningFor(j.runningMs, usual.get(j.id)),
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

/** A run time, marked when it is far past its task's usual one. */
function runningFor(ms: number, usualP99Ms: number | undefined): Node | string {
  if (usualP99Ms === undefined) return duration(ms);
  return h("span", { class: "warn", title: `usually at most ${duration(usualP99Ms)} (p99)` }, `${duration(ms)} (long)`);
}
