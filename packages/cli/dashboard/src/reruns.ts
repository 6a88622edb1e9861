/**
 * A finished durable job's re-runs on its page (docs/durable-callbacks.md#re-run): a form that
 * re-runs it from a recorded step (after a confirmation), and the audit trail of its re-runs.
 */
import type { JobRerun } from "./api.js";
import { h, table } from "./dom.js";
import { time } from "./format.js";
import { confirmChange, type ViewContext } from "./view.js";

/** "Re-run from step": the step's name, and which call of that name (from 0). */
export function rerunForm(ctx: ViewContext, id: string): HTMLFormElement {
  const step = h("input", { name: "from-step", placeholder: "step name", required: true, "aria-label": "step to re-run from" });
  const occurrence = h("input", {
    type: "number",
    name: "occurrence",
    min: 0,
    value: 0,
    "aria-label": "occurrence (which call of that name, from 0)",
  });
  const form = h("form", { class: "rerun" }, step, occurrence, h("button", { type: "submit", "data-action": "rerun" }, "Re-run from step"));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    void rerun(ctx, id, step.value.trim(), Number(occurrence.value || 0));
  });
  return form;
}

async function rerun(ctx: ViewContext, id: string, fromStep: string, occurrence: number): Promise<void> {
  const detail = "The steps before it keep their records and replay; it and the steps after it run again, with a fresh retry budget.";
  if (!(await confirmChange(`Re-run job ${id} from step "${fromStep}"?`, detail, "Re-run"))) return;
  try {
    const r = await ctx.api.post<{ fromSeq: number; stepsDropped: number }>(`/v1/jobs/${id}/rerun`, { fromStep, occurrence });
    ctx.flash(`Job ${id} is waiting again from step "${fromStep}" (place ${r.fromSeq}); ${r.stepsDropped} step record(s) dropped.`);
  } catch (err) {
    ctx.flash(err instanceof Error ? err.message : String(err), "error");
  }
  ctx.refresh();
}

/** The audit trail: each re-run, who asked, and the step records it dropped. */
export function rerunsTable(reruns: JobRerun[]): Node {
  return table(
    ["At", "From step", "Had finished", "By", "Step records dropped"],
    reruns.map((r) => [
      time(r.requestedAt),
      `${r.fromStep}${r.fromOccurrence > 0 ? ` #${r.fromOccurrence}` : ""} (place ${r.fromSeq})`,
      r.previousState,
      r.requestedBy ?? "–",
      r.stepsDropped.map((s) => s.name).join(", ") || "–",
    ]),
    { "data-table": "reruns" },
  );
}
