/**
 * Recoveries: what the lease machinery absorbed in the last hour. Attempts a watchdog ended
 * (lease expired, worker lost, stalled, timed out), attempts live workers gave back (released),
 * and heartbeats and reports the fence refused because their attempt no longer held its lease.
 */
import type { Activity, RecoveryEvent } from "./api.js";
import { TimeChart } from "./charts.js";
import { badge, h, jobLink, replace, table } from "./dom.js";
import { short, time } from "./format.js";
import { RECOVERY_SERIES, recoveryChartData } from "./overview.js";
import type { View, ViewContext } from "./view.js";

const LABEL = Object.fromEntries(RECOVERY_SERIES.map((s) => [s.kind, s.label]));

export function recoveriesView(ctx: ViewContext): View {
  const chart = new TimeChart(
    "Per minute",
    RECOVERY_SERIES.map((s) => ({ label: s.label, color: s.color })),
    "bars",
  );
  const list = h("div");
  ctx.root.append(
    h("h1", {}, "Recoveries"),
    h(
      "p",
      { class: "note" },
      "The last hour of what leases absorbed: attempts a watchdog ended because their lease ran out, their worker died, or they stalled or ran too long; " +
        "attempts a live worker released; and heartbeats and reports refused because their attempt no longer held the lease (a zombie's late word changing nothing).",
    ),
    chart.el,
    list,
  );
  return {
    async refresh() {
      const [activity, { events }] = await Promise.all([
        ctx.api.get<Activity>("/v1/activity"),
        ctx.api.get<{ events: RecoveryEvent[] }>("/v1/recoveries"),
      ]);
      const data = recoveryChartData(activity);
      chart.update(data.x, data.ys);
      replace(
        list,
        events.length === 0
          ? h("p", { class: "empty" }, "Nothing to recover in the last hour.")
          : table(
              ["Time", "Event", "Job", "Task", "Queue", "Attempt", "Worker", "Detail"],
              events.map((e) => [
                time(e.at),
                h("span", {}, badge(LABEL[e.event] ?? e.event, e.event), e.wentDead && badge("→ dead letter", "dead")),
                jobLink(e.jobId),
                e.task ?? "–",
                e.queue ?? "–",
                String(e.attempt),
                h("span", { class: "mono" }, e.workerId),
                h(
                  "span",
                  { class: "error-text" },
                  short(e.detail, 120),
                  e.via && ` (${e.via === "server" ? "remote worker, refused by the server" : "refused on the database"})`,
                ),
              ]),
              { "data-table": "recoveries" },
            ),
      );
    },
    unmount() {
      chart.destroy();
    },
  };
}
