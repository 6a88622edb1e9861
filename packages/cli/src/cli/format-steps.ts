/** `leasehold jobs show`: a durable job's steps and what it waits for, as text. */
import type { JobStep, JobSteps, JobWait } from "leasehold/internal/store/step-views";
import { ago, table } from "./format.js";

/** The steps table and the wait, under headings; "" for a job with neither. */
export function stepsText(s: JobSteps): string {
  return (s.wait ? `\n\nsuspended: ${waitText(s.wait)}` : "") + (s.stepCount === 0 ? "" : `\n\n${stepsHeading(s)}:\n${stepsTable(s.steps)}`);
}

function stepsHeading(s: JobSteps): string {
  return s.stepCount > s.steps.length ? `steps (the latest ${s.steps.length} of ${s.stepCount})` : "steps";
}

function stepsTable(steps: JobStep[]): string {
  return table(
    ["#", "NAME", "KIND", "STATE", "ATTEMPT", "TOOK", "RESULT", "WAKE AT / EVENT", "ERROR"],
    steps.map((s) => [
      String(s.seq),
      s.occurrence > 0 ? `${s.name} (${s.occurrence + 1})` : s.name,
      s.kind,
      s.state,
      String(s.attempt),
      s.durationMs === null ? "-" : `${(s.durationMs / 1000).toFixed(3)}s`,
      s.resultBytes === null ? "-" : `${s.resultBytes} B`,
      [s.wakeAt ? s.wakeAt.toISOString() : "", s.event ?? ""].filter(Boolean).join(" ") || "-",
      firstLine(s.error),
    ]),
  );
}

export function waitText(w: JobWait): string {
  const until = w.until ? `${w.until.toISOString()} (${ago(w.until)})` : "no deadline";
  if (w.kind === "sleep") return `sleeping at step ${JSON.stringify(w.step)} until ${until}`;
  const match = w.match === null ? "" : ` matching ${JSON.stringify(w.match)}`;
  return `waiting at step ${JSON.stringify(w.step)} for ${w.kind} ${JSON.stringify(w.event)}${match}, until ${until}`;
}

function firstLine(text: string | null, max = 60): string {
  if (!text) return "";
  const first = text.split("\n")[0]!;
  return first.length > max ? first.slice(0, max - 1) + "…" : first;
}
