/**
 * Overview: counts by queue and state, the oldest ready job's wait, each queue's flow control
 * (paused, limits: changed from here, see queues.ts), throughput and recoveries over the last
 * hour, and the live workers and watchdogs. Warnings first: no watchdog, leases that ran out
 * unreaped, workers lost, waiting jobs no live worker can run, paused queues with jobs waiting.
 */
import type { Activity, HandlerGap, Overview, ProcessRecord, QueueOverview, QueueSettings, RecoveryEventKind } from "./api.js";
import { TimeChart } from "./charts.js";
import { h, link, replace, table } from "./dom.js";
import { ago, count, duration, rate } from "./format.js";
import { flowCell, queueActions } from "./queues.js";
import type { View, ViewContext } from "./view.js";

/** The charts change with each sample (10 s): read them less often than the counts. */
const ACTIVITY_EVERY_MS = 10_000;

export const RECOVERY_SERIES: { kind: RecoveryEventKind; label: string; color: string }[] = [
  { kind: "lease_expired", label: "reaped (lease expired)", color: "#d9822b" },
  { kind: "worker_lost", label: "worker lost", color: "#c23030" },
  { kind: "stalled", label: "stalled", color: "#8f398f" },
  { kind: "timed_out", label: "timed out", color: "#5642a6" },
  { kind: "released", label: "released", color: "#2b95d6" },
  { kind: "refused", label: "stale refused", color: "#738091" },
];

/** Recoveries per minute over the window, every minute present (zero where none). */
export function recoveryChartData(activity: Activity): { x: number[]; ys: number[][] } {
  const end = Math.floor(Date.now() / 60_000);
  const minutes = Math.round(activity.windowMs / 60_000);
  const x = Array.from({ length: minutes }, (_, i) => (end - minutes + 1 + i) * 60);
  const index = new Map(x.map((t, i) => [t, i]));
  const ys = RECOVERY_SERIES.map(() => new Array<number>(x.length).fill(0));
  for (const m of activity.recoveries) {
    const i = index.get(Math.floor(new Date(m.minute).getTime() / 60_000) * 60);
    if (i === undefined) continue;
    RECOVERY_SERIES.forEach((s, k) => (ys[k]![i] = m.counts[s.kind] ?? 0));
  }
  return { x, ys };
}

export function isLive(p: ProcessRecord): boolean {
  return !p.lost && p.lastSeenMsAgo < 60_000;
}

/** Waiting jobs no live worker can run: they wait forever unless one starts (a typo'd task name, a missing deploy). */
function gapAlert(g: HandlerGap): HTMLElement {
  const n = g.waiting + g.scheduled;
  const hint =
    g.didYouMeanTask !== null
      ? ` Did you mean task “${g.didYouMeanTask}”?`
      : g.didYouMeanQueue !== null
        ? ` Did you mean queue “${g.didYouMeanQueue}”?`
        : "";
  const filter = new URLSearchParams({ queue: g.queue, task: g.task, state: "waiting" });
  return h(
    "p",
    { class: "warning", "data-alert": "without-handler" },
    `${count(n)} waiting job(s) of task “${g.task}” in queue “${g.queue}”: no live worker runs this task in this queue, so they wait until one starts.${hint} `,
    link(`#/jobs?${filter}`, "See them"),
  );
}

export function overviewView(ctx: ViewContext): View {
  const alerts = h("div", { class: "alerts" });
  const cards = h("div", { class: "cards" });
  const queues = h("div");
  const processes = h("div");
  const chartNote = h("p", { class: "note" });
  const throughput = new TimeChart("Throughput (jobs per second)", [
    { label: "finished", color: "#0f9960", format: rate },
    { label: "dead", color: "#c23030", format: rate },
    { label: "requeued", color: "#d9822b", format: rate },
    { label: "enqueued", color: "#2b95d6", format: rate },
  ]);
  const recoveries = new TimeChart(
    "Recoveries and refusals (per minute)",
    RECOVERY_SERIES.map((s) => ({ label: s.label, color: s.color })),
    "bars",
  );
  ctx.root.append(
    alerts,
    cards,
    h("section", {}, h("h2", {}, "Last hour"), h("div", { class: "charts" }, throughput.el, recoveries.el), chartNote),
    h("section", {}, h("h2", {}, "Queues"), queues),
    h("section", {}, h("h2", {}, "Workers and watchdogs"), processes),
  );
  let activityReadAt = -Infinity;
  // Settings a change from this page stored, shown until the overview (shared by viewers for a
  // second) has caught up with them: a paused queue never shows as running after its Pause.
  const changed = new Map<string, QueueSettings>();
  const onChange = (q: QueueSettings) => {
    changed.set(q.name, q);
    if (last) render(last);
  };
  let last: Overview | undefined;

  const renderActivity = (a: Activity) => {
    const x = a.throughput.map((p) => Math.round(new Date(p.at).getTime() / 1000));
    throughput.update(x, [
      a.throughput.map((p) => p.finished),
      a.throughput.map((p) => p.dead),
      a.throughput.map((p) => p.requeued),
      a.throughput.map((p) => p.enqueued),
    ]);
    const r = recoveryChartData(a);
    recoveries.update(r.x, r.ys);
    replace(
      chartNote,
      !a.counting
        ? "PostgreSQL's track_counts is off: its row counters do not move, so there is no throughput to show."
        : a.throughput.length === 0
          ? `No throughput samples yet: the server stores one every ${a.sampleIntervalMs / 1000} s.`
          : `Throughput from PostgreSQL's row counters, sampled every ${a.sampleIntervalMs / 1000} s (all queues). `,
      link("#/recoveries", "Recoveries in detail"),
    );
  };

  const render = (o: Overview) => {
    last = o;
    const sum = (k: "waiting" | "scheduled" | "blocked" | "running" | "expired" | "dead") => o.queues.reduce((n, q) => n + q[k], 0);
    const workers = o.processes.filter((p) => p.kind === "worker");
    const watchdogs = o.processes.filter((p) => p.kind === "watchdog" && isLive(p));
    const lost = workers.filter((p) => p.lost);
    const warnings: string[] = [];
    if (watchdogs.length === 0 && (sum("running") > 0 || sum("expired") > 0))
      warnings.push("No watchdog is running: leases that run out are not recovered (start `leasehold watchdog`, or a worker with its watchdog).");
    if (sum("expired") > 0) warnings.push(`${count(sum("expired"))} running job(s) have a lease that ran out and wait for a watchdog to reap them.`);
    if (lost.length > 0) warnings.push(`${lost.length} worker(s) lost in the last hour (their process died): their jobs were recovered.`);
    const flow = new Map(o.flow.map((f) => [f.name, f]));
    for (const c of [...changed.values()]) {
      const read = flow.get(c.name);
      if (read && (read.updatedAt ?? "") >= (c.updatedAt ?? "")) changed.delete(c.name);
      else flow.set(c.name, c);
    }
    const pausedAlerts = o.queues
      .filter((r) => flow.get(r.queue)?.paused && r.waiting > 0)
      .map((r) =>
        h("p", { class: "warning", "data-alert": "paused" }, `Queue “${r.queue}” is paused: ${count(r.waiting)} job(s) wait until it is resumed.`),
      );
    replace(alerts, ...warnings.map((w) => h("p", { class: "warning" }, w)), ...pausedAlerts, ...o.withoutHandler.map(gapAlert));

    const card = (label: string, value: number, route?: string, note?: string) => {
      const parts = [h("span", { class: "value" }, count(value)), h("span", { class: "label" }, label), note && h("span", { class: "sub" }, note)];
      return route ? link(route, ...parts) : h("div", {}, ...parts);
    };
    replace(
      cards,
      card("waiting", sum("waiting"), "#/jobs?state=waiting"),
      card("scheduled", sum("scheduled"), "#/jobs?state=waiting"),
      card("blocked", sum("blocked"), "#/jobs?state=blocked", "waiting for parents"),
      card(
        "suspended",
        o.queues.reduce((n, r) => n + (r.suspended ?? 0), 0),
        "#/jobs?state=suspended",
        "sleeping or waiting for events",
      ),
      card("running", sum("running"), "#/running", sum("expired") > 0 ? `${sum("expired")} expired` : undefined),
      card("dead", sum("dead"), "#/jobs?state=dead"),
      card("workers", workers.filter(isLive).length, undefined, lost.length > 0 ? `${lost.length} lost` : undefined),
      card("watchdogs", watchdogs.length),
    );

    const q = (name: string) => encodeURIComponent(name);
    // Queues with jobs, and those configured before (or after) having any: a paused empty queue is still listed.
    const rows: QueueOverview[] = [...o.queues];
    for (const f of flow.values()) {
      if (!o.queues.some((r) => r.queue === f.name))
        rows.push({ queue: f.name, waiting: 0, scheduled: 0, blocked: 0, running: 0, expired: 0, dead: 0, oldestWaitingMs: null });
    }
    rows.sort((a, b) => (a.queue < b.queue ? -1 : a.queue > b.queue ? 1 : 0));
    replace(
      queues,
      rows.length === 0
        ? h("p", { class: "empty" }, "No unfinished or dead jobs, and no queue settings.")
        : table(
            ["Queue", "Waiting", "Scheduled", "Blocked", "Running", "Dead", "Oldest waiting", "Flow control", ...(ctx.readOnly ? [] : [""])],
            rows.map((r) => [
              link(`#/jobs?queue=${q(r.queue)}`, r.queue),
              link(`#/jobs?queue=${q(r.queue)}&state=waiting`, count(r.waiting)),
              count(r.scheduled),
              r.blocked > 0 ? link(`#/jobs?queue=${q(r.queue)}&state=blocked`, count(r.blocked)) : "0",
              h("span", {}, count(r.running), r.expired > 0 && h("span", { class: "bad" }, ` (${r.expired} expired)`)),
              r.dead > 0 ? link(`#/jobs?queue=${q(r.queue)}&state=dead`, count(r.dead)) : "0",
              r.oldestWaitingMs === null ? "–" : duration(r.oldestWaitingMs),
              flowCell(flow.get(r.queue)),
              ...(ctx.readOnly ? [] : [queueActions(ctx, r.queue, flow.get(r.queue), onChange)]),
            ]),
            { class: "numbers", "data-table": "queues" },
          ),
    );

    replace(
      processes,
      o.processes.length === 0
        ? h("p", { class: "empty" }, "No worker or watchdog has been seen in the last hour.")
        : table(
            ["Process", "Kind", "Host", "Queues", "Tasks", "In flight", "Last beat", "Up"],
            o.processes.map((p) => [
              h("span", { class: "mono" }, p.name ?? p.id),
              p.kind,
              p.host ?? "–",
              p.queues.join(", ") || "–",
              p.tasks.join(", ") || "–",
              p.kind === "worker" ? `${p.inFlight}${p.concurrency === null ? "" : ` / ${p.concurrency}`}` : "–",
              h(
                "span",
                { class: p.lost ? "bad" : isLive(p) ? "" : "warn" },
                // Silent but not marked lost (killed with no liveness lock, cut off): said so, and
                // dropped from the list after ten minutes. A stopped process is not listed at all.
                p.lost ? `lost (last beat ${ago(p.lastSeenMsAgo)})` : isLive(p) ? ago(p.lastSeenMsAgo) : `silent: last beat ${ago(p.lastSeenMsAgo)}`,
              ),
              duration(p.upMs),
            ]),
            { "data-table": "processes" },
          ),
    );
  };

  return {
    async refresh() {
      const readActivity = performance.now() - activityReadAt > ACTIVITY_EVERY_MS;
      const [overview, activity] = await Promise.all([
        ctx.api.get<Overview>("/v1/overview"),
        readActivity ? ctx.api.get<Activity>("/v1/activity") : undefined,
      ]);
      render(overview);
      if (activity) {
        activityReadAt = performance.now();
        renderActivity(activity);
      }
    },
    unmount() {
      throughput.destroy();
      recoveries.destroy();
    },
  };
}
