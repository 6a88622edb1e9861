/**
 * Flow control on the overview: each queue's paused state, limits, a handler's hold of the
 * whole queue and whether it keeps records of succeeded jobs, and (unless the server is
 * read-only) pause / resume, lifting the hold, a small limits form and switching the records,
 * each change after a confirmation. The changes go through the operators' routes
 * (POST /v1/queues/NAME/pause|resume, DELETE /v1/queues/NAME/hold, PATCH /v1/queues/NAME/limits
 * and /history), whose checks and messages are the library's.
 */
import type { QueueLimits, QueueSettings, Rate } from "./api.js";
import { badge, button, h, jobLink } from "./dom.js";
import { time } from "./format.js";
import { confirmChange, type ViewContext } from "./view.js";

const UNITS: [number, string][] = [
  [86_400_000, "d"],
  [3_600_000, "h"],
  [60_000, "m"],
  [1_000, "s"],
];

/** 50/1s, 100/1m, 5/250ms: as the CLI writes a rate. */
export function rateText(rate: Rate): string {
  const unit = UNITS.find(([ms]) => rate.windowMs % ms === 0);
  return `${rate.limit}/${unit ? `${rate.windowMs / unit[0]}${unit[1]}` : `${rate.windowMs}ms`}`;
}

function windowText(ms: number): string {
  return rateText({ limit: 1, windowMs: ms }).slice(2);
}

function weightsText(weights: Record<string, number>): string {
  return Object.entries(weights)
    .map(([k, w]) => `${k}=${w}`)
    .join(", ");
}

/** The limits in a line: "concurrency 5 · rate 50/1s"; "" when none. */
export function limitsText(q: QueueLimits): string {
  return [
    q.concurrency !== null && `concurrency ${q.concurrency}`,
    q.keyConcurrency !== null && `per key ${q.keyConcurrency}`,
    q.rate !== null && `rate ${rateText(q.rate)}`,
    q.keyRate !== null && `key rate ${rateText(q.keyRate)}`,
    q.keyWeights !== null && `weights ${weightsText(q.keyWeights)}`,
  ]
    .filter(Boolean)
    .join(" · ");
}

/** Whether a handler's hold of the whole queue is in force. */
function isHeld(q: QueueSettings | undefined): boolean {
  return q?.heldUntil != null && new Date(q.heldUntil).getTime() > Date.now();
}

/** What the overview's "Flow control" cell shows for a queue. */
export function flowCell(q: QueueSettings | undefined): HTMLElement {
  if (!q) return h("span", { "data-flow": "none" }, "–");
  const limits = limitsText(q);
  const held = isHeld(q);
  const noRecords = q.keepSucceeded === false;
  return h(
    "span",
    { "data-flow": q.paused ? "paused" : "active", "data-records": noRecords ? "not-kept" : "kept" },
    q.paused && badge("paused", "paused"),
    held && badge("held", "held"),
    noRecords &&
      h("span", { title: "succeeded jobs keep no record (no result, not listed), unless their result is needed" }, badge("no records", "no-records")),
    (q.paused || held || noRecords) && " ",
    limits || (q.paused || held || noRecords ? "" : "–"),
    q.paused && q.pausedAt && h("span", { class: "sub" }, ` since ${time(q.pausedAt)}`),
    held &&
      h(
        "span",
        { class: "sub", "data-hold": "queue" },
        ` held until ${time(q.heldUntil!)}`,
        q.heldByJob !== null && h("span", {}, " by job ", jobLink(q.heldByJob)),
      ),
  );
}

/** Called with a queue's settings as a change stored them, so the view shows them before its next read does. */
export type OnQueueChange = (settings: QueueSettings) => void;

/** Pause or resume, and the limits form: the buttons of a queue's row. */
export function queueActions(ctx: ViewContext, name: string, q: QueueSettings | undefined, onChange: OnQueueChange): HTMLElement {
  const paused = q?.paused ?? false;
  return h(
    "span",
    { class: "row-actions" },
    paused
      ? button("Resume", () => void setPaused(ctx, name, false, onChange), { class: "secondary", "data-action": "resume-queue", "data-queue": name })
      : button("Pause", () => void setPaused(ctx, name, true, onChange), { class: "secondary", "data-action": "pause-queue", "data-queue": name }),
    isHeld(q) && button("Clear hold", () => void clearHold(ctx, name), { class: "secondary", "data-action": "clear-hold", "data-queue": name }),
    button("Limits…", () => void editLimits(ctx, name, q, onChange), { class: "secondary", "data-action": "edit-limits", "data-queue": name }),
    button(q?.keepSucceeded === false ? "Keep records" : "Keep no records", () => void setHistory(ctx, name, q?.keepSucceeded === false, onChange), {
      class: "secondary",
      "data-action": "queue-history",
      "data-queue": name,
    }),
  );
}

async function setHistory(ctx: ViewContext, name: string, keepSucceeded: boolean, onChange: OnQueueChange): Promise<void> {
  const confirmed = keepSucceeded
    ? await confirmChange(
        `Keep records of succeeded jobs in queue “${name}”?`,
        "Jobs that succeed from now on keep their record: result, last attempt, times.",
        "Keep records",
      )
    : await confirmChange(
        `Keep no record of succeeded jobs in queue “${name}”?`,
        "Jobs that succeed from now on leave no record: no result, no details page, not listed. Failed, dead and cancelled jobs keep theirs, and so do jobs whose result is needed (dependents, a waiter, a durable parent).",
        "Keep no records",
      );
  if (!confirmed) return;
  try {
    const { queue } = await ctx.api.patch<{ queue: QueueSettings }>(`/v1/queues/${encodeURIComponent(name)}/history?create=true`, { keepSucceeded });
    onChange(queue);
    ctx.flash(queue.keepSucceeded ? `Queue ${name} keeps records of succeeded jobs.` : `Queue ${name} keeps no record of succeeded jobs.`);
  } catch (err) {
    ctx.flash(err instanceof Error ? err.message : String(err), "error");
  }
  ctx.refresh();
}

async function clearHold(ctx: ViewContext, name: string): Promise<void> {
  const confirmed = await confirmChange(
    `Clear the hold on queue “${name}”?`,
    "A handler said the queue is rate-limited (RateLimitedError). Workers start its jobs again at once, the rate-limited ones too; if what they call still refuses them, a handler may hold it again.",
    "Clear hold",
  );
  if (!confirmed) return;
  try {
    const { cleared } = await ctx.api.delete<{ cleared: { queue: boolean; keys: number; jobs: number } }>(
      `/v1/queues/${encodeURIComponent(name)}/hold`,
    );
    ctx.flash(cleared.queue || cleared.keys > 0 || cleared.jobs > 0 ? `Queue ${name}: hold cleared.` : `Queue ${name} was no longer held.`);
  } catch (err) {
    ctx.flash(err instanceof Error ? err.message : String(err), "error");
  }
  ctx.refresh();
}

async function setPaused(ctx: ViewContext, name: string, pause: boolean, onChange: OnQueueChange): Promise<void> {
  const confirmed = pause
    ? await confirmChange(
        `Pause queue “${name}”?`,
        "No worker starts its jobs until it is resumed; jobs workers hold but have not started go back to waiting. Running jobs finish, and enqueueing goes on.",
        "Pause queue",
      )
    : await confirmChange(`Resume queue “${name}”?`, "Workers start its jobs again at once.", "Resume queue");
  if (!confirmed) return;
  try {
    // The queue is listed, so it is known: create=true only spares a race with its last job's removal.
    const { queue } = await ctx.api.post<{ queue: QueueSettings }>(
      `/v1/queues/${encodeURIComponent(name)}/${pause ? "pause" : "resume"}?create=true`,
    );
    onChange(queue);
    ctx.flash(pause ? `Queue ${name} paused.` : `Queue ${name} resumed.`);
  } catch (err) {
    ctx.flash(err instanceof Error ? err.message : String(err), "error");
  }
  ctx.refresh();
}

const NO_LIMITS: QueueLimits = { concurrency: null, keyConcurrency: null, rate: null, keyRate: null, keyWeights: null };
const LABELS: Record<keyof QueueLimits, string> = {
  concurrency: "concurrency",
  keyConcurrency: "concurrency per key",
  rate: "rate",
  keyRate: "rate per key",
  keyWeights: "key weights",
};

function describe(key: keyof QueueLimits, value: QueueLimits[keyof QueueLimits]): string {
  if (value === null) return `no ${LABELS[key]} limit`;
  if (typeof value === "number") return `${LABELS[key]} ${value}`;
  if ("windowMs" in value) return `${LABELS[key]} ${rateText(value as Rate)}`;
  return `${LABELS[key]} ${weightsText(value as Record<string, number>)}`;
}

/** 500ms, 1s, 1m, 2h, 1d; a bare number is seconds. */
function parseWindow(text: string): number | undefined {
  const m = /^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?$/.exec(text.trim());
  if (!m) return undefined;
  const unit = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 }[m[2] ?? "s"]!;
  return Math.round(Number(m[1]) * unit);
}

/** The form's values as limits; empty fields: no limit. Throws with a message naming the field. */
function readForm(form: HTMLFormElement): QueueLimits {
  const field = (name: string) => (form.elements.namedItem(name) as HTMLInputElement).value.trim();
  const whole = (name: string, label: string): number | null => {
    const v = field(name);
    if (v === "") return null;
    if (!/^\d+$/.test(v)) throw new Error(`${label} must be a whole number, or empty for no limit (got “${v}”)`);
    return Number(v);
  };
  const rate = (limitName: string, windowName: string, label: string): Rate | null => {
    const limit = whole(limitName, `${label}: starts`);
    const windowText = field(windowName);
    if (limit === null && windowText === "") return null;
    if (limit === null) throw new Error(`${label}: give the number of starts per window, or clear both fields`);
    const windowMs = parseWindow(windowText === "" ? "1s" : windowText);
    if (windowMs === undefined) throw new Error(`${label}: the window must be a duration like 500ms, 1s or 1m (got “${windowText}”)`);
    return { limit, windowMs };
  };
  const weights = (): Record<string, number> | null => {
    const v = field("keyWeights");
    if (v === "") return null;
    const out: Record<string, number> = {};
    for (const part of v
      .split(",")
      .map((s) => s.trim())
      .filter(Boolean)) {
      const at = part.lastIndexOf("=");
      const weight = part.slice(at + 1).trim();
      if (at <= 0 || !/^\d+$/.test(weight)) throw new Error(`key weights are key=weight pairs separated by commas (got “${part}”)`);
      out[part.slice(0, at).trim()] = Number(weight);
    }
    return out;
  };
  return {
    concurrency: whole("concurrency", "concurrency"),
    keyConcurrency: whole("keyConcurrency", "concurrency per key"),
    rate: rate("rateLimit", "rateWindow", "rate"),
    keyRate: rate("keyRateLimit", "keyRateWindow", "rate per key"),
    keyWeights: weights(),
  };
}

/** The limits that differ from the current ones: only those are sent, so a change made meanwhile elsewhere stays. */
function changes(from: QueueLimits, to: QueueLimits): Partial<QueueLimits> {
  const out: Record<string, unknown> = {};
  for (const key of Object.keys(LABELS) as (keyof QueueLimits)[]) {
    if (JSON.stringify(from[key]) !== JSON.stringify(to[key])) out[key] = to[key];
  }
  return out as Partial<QueueLimits>;
}

/** The limits form in a modal dialog; on save, a confirmation saying what changes, then the PATCH. */
async function editLimits(ctx: ViewContext, name: string, q: QueueSettings | undefined, onChange: OnQueueChange): Promise<void> {
  const current: QueueLimits = q ?? NO_LIMITS;
  const input = (fieldName: string, value: string | number | undefined, attrs: Record<string, string> = {}) =>
    h("input", { name: fieldName, value: value === undefined ? "" : String(value), autocomplete: "off", ...attrs });
  const row = (label: string, ...fields: HTMLElement[]) => h("label", {}, h("span", {}, label), h("span", { class: "fields-row" }, ...fields));
  const error = h("p", { class: "error", role: "alert" });
  const form = h(
    "form",
    { class: "limits", "data-form": "limits" },
    h("h2", {}, `Limits of queue “${name}”`),
    h("p", { class: "note" }, "For every worker, from their next claim. Leave a field empty for no limit."),
    row("Concurrency", input("concurrency", current.concurrency ?? undefined, { inputmode: "numeric", placeholder: "none" })),
    row("Concurrency per key", input("keyConcurrency", current.keyConcurrency ?? undefined, { inputmode: "numeric", placeholder: "none" })),
    row(
      "Rate (starts per window)",
      input("rateLimit", current.rate?.limit, { inputmode: "numeric", placeholder: "none" }),
      h("span", {}, "per"),
      input("rateWindow", current.rate ? windowText(current.rate.windowMs) : "", { placeholder: "1s" }),
    ),
    row(
      "Rate per key",
      input("keyRateLimit", current.keyRate?.limit, { inputmode: "numeric", placeholder: "none" }),
      h("span", {}, "per"),
      input("keyRateWindow", current.keyRate ? windowText(current.keyRate.windowMs) : "", { placeholder: "1s" }),
    ),
    row("Key weights", input("keyWeights", current.keyWeights ? weightsText(current.keyWeights) : "", { placeholder: "acme=3, globex=2" })),
    error,
  );
  const dialog = h("dialog", { class: "confirm", "aria-label": `Limits of queue ${name}` }, form);
  const wanted = await new Promise<Partial<QueueLimits> | undefined>((resolve) => {
    const done = (answer: Partial<QueueLimits> | undefined) => {
      window.removeEventListener("hashchange", leave);
      dialog.close();
      dialog.remove();
      resolve(answer);
    };
    const leave = () => done(undefined);
    window.addEventListener("hashchange", leave);
    form.append(
      h(
        "div",
        { class: "actions" },
        button("Cancel", () => done(undefined), { class: "secondary", "data-action": "cancel-limits" }),
        h("button", { type: "submit", "data-action": "save-limits" }, "Save…"),
      ),
    );
    form.addEventListener("input", () => (error.textContent = ""));
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      try {
        const changed = changes(current, readForm(form));
        if (Object.keys(changed).length === 0) return void (error.textContent = "Nothing changed.");
        done(changed);
      } catch (err) {
        error.textContent = (err as Error).message;
      }
    });
    dialog.addEventListener("cancel", (e) => {
      e.preventDefault();
      done(undefined);
    });
    document.body.append(dialog);
    dialog.showModal();
  });
  if (!wanted) return;
  const what = (Object.entries(wanted) as [keyof QueueLimits, QueueLimits[keyof QueueLimits]][]).map(([k, v]) => describe(k, v)).join(", ");
  if (!(await confirmChange(`Change the limits of queue “${name}”?`, `${what}. Every worker applies it from its next claim.`, "Set limits"))) return;
  try {
    const { queue } = await ctx.api.patch<{ queue: QueueSettings }>(`/v1/queues/${encodeURIComponent(name)}/limits?create=true`, wanted);
    onChange(queue);
    ctx.flash(`Queue ${name}: ${limitsText(queue) || "no limits"}.`);
  } catch (err) {
    ctx.flash(err instanceof Error ? err.message : String(err), "error");
  }
  ctx.refresh();
}
