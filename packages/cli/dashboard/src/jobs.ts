/**
 * Jobs: search by state, queue, task and time (the dead letter is this view with state=dead),
 * newest first, a page at a time; and bulk retry (dead jobs) or cancel (unfinished jobs) of
 * everything matching the filter, after a confirmation that says how many. The filter lives in
 * the address, so a search is a link too.
 */
import { ApiError, type BulkCount, type BulkResult, type JobPage, type JobState } from "./api.js";
import { badge, button, h, jobLink, replace, table } from "./dom.js";
import { count, short, time } from "./format.js";
import { confirmChange, type View, type ViewContext } from "./view.js";

const STATES: JobState[] = ["blocked", "waiting", "suspended", "running", "succeeded", "dead", "cancelled"];
const FILTER_KEYS = ["state", "queue", "task", "time", "from", "to"] as const;
const PAGE_SIZE = 50;

type Filter = Partial<Record<(typeof FILTER_KEYS)[number], string>>;

/** A datetime-local input's value (local time) as ISO, and back. */
const toIso = (local: string) => (local ? new Date(local).toISOString() : "");
const toLocal = (iso: string | undefined) => {
  if (!iso) return "";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return "";
  return new Date(d.getTime() - d.getTimezoneOffset() * 60_000).toISOString().slice(0, 16);
};

function describe(f: Filter): string {
  const parts = [
    f.queue && `queue ${f.queue}`,
    f.task && `task ${f.task}`,
    f.from && `${f.time ?? "created"} from ${time(f.from)}`,
    f.to && `until ${time(f.to)}`,
  ];
  return parts.filter(Boolean).join(", ") || "no other filter";
}

export function jobsView(ctx: ViewContext): View {
  const filter: Filter = {};
  for (const k of FILTER_KEYS) {
    const v = ctx.params.get(k);
    if (v) filter[k] = v;
  }
  const before = ctx.params.get("before") ?? undefined;
  const list = h("div");
  const bulk = h("div", { class: "bulk" });
  ctx.root.append(h("h1", {}, filter.state === "dead" ? "Dead letter" : "Jobs"), searchForm(ctx, filter), bulk, list);
  if (!ctx.readOnly) renderBulk(ctx, bulk, filter);

  return {
    async refresh() {
      const page = await ctx.api.get<JobPage>("/v1/jobs", { ...filter, before, limit: String(PAGE_SIZE) });
      const route = (extra: Record<string, string>) => `#/jobs?${new URLSearchParams({ ...(filter as Record<string, string>), ...extra })}`;
      replace(
        list,
        page.jobs.length === 0
          ? h("p", { class: "empty" }, before ? "No older jobs match." : "No job matches.")
          : table(
              ["Job", "State", "Queue", "Task", "Attempts made", "Budget spent", "Created", "Finished", "Last error"],
              page.jobs.map((j) => [
                jobLink(j.id),
                badge(j.state, j.state),
                j.queue,
                j.task,
                String(j.attempt),
                `${j.spentAttempts} / ${j.maxAttempts}`,
                time(j.createdAt),
                time(j.finishedAt),
                h("span", { class: "error-text" }, short(j.lastError, 100)),
              ]),
              { "data-table": "jobs" },
            ),
        h(
          "p",
          { class: "pager" },
          before && button("Newest", () => ctx.navigate(route({}))),
          page.next && button("Older", () => ctx.navigate(route({ before: page.next! }))),
        ),
      );
    },
  };
}

function searchForm(ctx: ViewContext, filter: Filter): HTMLElement {
  const state = h(
    "select",
    { name: "state", "aria-label": "state" },
    h("option", { value: "" }, "any state"),
    ...STATES.map((s) => h("option", { value: s }, s)),
  );
  state.value = filter.state ?? "";
  const queue = h("input", { name: "queue", placeholder: "queue", value: filter.queue ?? "", "aria-label": "queue" });
  const task = h("input", { name: "task", placeholder: "task", value: filter.task ?? "", "aria-label": "task" });
  const timeField = h(
    "select",
    { name: "time", "aria-label": "time" },
    h("option", { value: "created" }, "created"),
    h("option", { value: "finished" }, "finished"),
  );
  timeField.value = filter.time ?? "created";
  const from = h("input", { type: "datetime-local", name: "from", value: toLocal(filter.from), "aria-label": "from" });
  const to = h("input", { type: "datetime-local", name: "to", value: toLocal(filter.to), "aria-label": "to" });
  const jobId = h("input", { name: "id", placeholder: "job id", inputmode: "numeric", "aria-label": "job id" });
  const form = h(
    "form",
    { class: "search" },
    state,
    queue,
    task,
    h("label", {}, timeField, " from ", from),
    h("label", {}, "to ", to),
    h("button", { type: "submit" }, "Search"),
    h("span", { class: "go" }, jobId, h("button", { type: "button", "data-action": "open" }, "Open")),
  );
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const next: Record<string, string> = {};
    if (state.value) next.state = state.value;
    if (queue.value.trim()) next.queue = queue.value.trim();
    if (task.value.trim()) next.task = task.value.trim();
    if (from.value || to.value) next.time = timeField.value;
    if (from.value) next.from = toIso(from.value);
    if (to.value) next.to = toIso(to.value);
    ctx.navigate(`#/jobs?${new URLSearchParams(next)}`);
  });
  form.querySelector('[data-action="open"]')!.addEventListener("click", () => {
    const id = jobId.value.trim();
    if (/^[1-9][0-9]{0,18}$/.test(id)) ctx.navigate(`#/jobs/${id}`);
    else ctx.flash("A job id is a whole number.", "error");
  });
  return form;
}

function renderBulk(ctx: ViewContext, el: HTMLElement, filter: Filter): void {
  const { state } = filter;
  const base = { queue: filter.queue, task: filter.task, from: filter.from, to: filter.to, time: filter.time };
  if (state === "dead") {
    el.append(button("Retry all matching…", () => void bulk(ctx, "retry", { ...base, state: "dead" }), { "data-action": "bulk-retry" }));
  }
  if (
    (state === undefined || state === "waiting" || state === "blocked" || state === "suspended" || state === "running") &&
    (filter.time ?? "created") === "created"
  ) {
    el.append(button("Cancel all matching…", () => void bulk(ctx, "cancel", { ...base, state }), { class: "danger", "data-action": "bulk-cancel" }));
  }
}

async function bulk(ctx: ViewContext, action: "retry" | "cancel", filter: Filter): Promise<void> {
  const query = Object.fromEntries(Object.entries(filter).filter(([, v]) => v !== undefined)) as Record<string, string>;
  try {
    const { matched, max } = await ctx.api.get<BulkCount>(`/v1/bulk/${action}`, query);
    if (matched === 0) return ctx.flash(`No job matches: nothing to ${action}.`);
    if (matched > max) return ctx.flash(`${count(matched)} jobs match; one bulk ${action} takes at most ${count(max)}: narrow the filter.`, "error");
    const what =
      action === "retry"
        ? [`Retry ${count(matched)} dead job${matched === 1 ? "" : "s"}?`, `They go back to waiting with a fresh retry budget (${describe(filter)}).`]
        : [
            `Cancel ${count(matched)} job${matched === 1 ? "" : "s"}?`,
            `Waiting ones end now; running ones are aborted at their next heartbeat (${filter.state ?? "waiting and running"}, ${describe(filter)}).`,
          ];
    if (!(await confirmChange(what[0]!, what[1]!, `${action === "retry" ? "Retry" : "Cancel"} ${count(matched)}`))) return;
    const r = await ctx.api.post<BulkResult>(`/v1/bulk/${action}`, { ...query, confirmed: matched });
    ctx.flash(
      action === "retry"
        ? `${count(r.changed)} job(s) retried${r.skipped > 0 ? `; ${count(r.skipped)} skipped: an unfinished job holds their unique key` : ""}.`
        : `${count(r.changed)} waiting job(s) cancelled; ${count(r.requested)} running job(s) asked to stop.`,
    );
    ctx.refresh();
  } catch (err) {
    if (err instanceof ApiError && err.code === "count_changed") {
      return ctx.flash(
        `${count(Number(err.body.matched))} jobs match now, more than you confirmed; nothing changed. Press again to see the new number.`,
        "error",
      );
    }
    ctx.flash(err instanceof Error ? err.message : String(err), "error");
  }
}
