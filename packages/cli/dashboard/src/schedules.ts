/** Schedules (periodic jobs): each pattern, its task and queue, its next tick and its last job. */
import type { Schedule } from "./api.js";
import { h, jobLink, replace, table } from "./dom.js";
import { time } from "./format.js";
import type { View, ViewContext } from "./view.js";

export function schedulesView(ctx: ViewContext): View {
  const list = h("div");
  ctx.root.append(h("h1", {}, "Schedules"), h("p", { class: "note" }, "Edit them with `leasehold schedules` or lh.schedule()."), list);
  return {
    async refresh() {
      const { schedules } = await ctx.api.get<{ schedules: Schedule[] }>("/v1/schedules");
      replace(
        list,
        schedules.length === 0
          ? h("p", { class: "empty" }, "No schedule.")
          : table(
              ["Name", "Cron", "Task", "Queue", "Next run", "Last run", "Last job"],
              schedules.map((s) => [
                s.name,
                h("span", { class: "mono" }, `${s.cron}${s.timezone === "UTC" ? "" : ` (${s.timezone})`}`),
                s.task,
                s.queue,
                time(s.nextRunAt),
                time(s.lastRunAt),
                s.lastJobId ? jobLink(s.lastJobId) : "–",
              ]),
              { "data-table": "schedules" },
            ),
      );
    },
  };
}
