/**
 * A durable job's steps on its page (#/jobs/ID): what a suspended job waits for, and its recorded
 * steps (the latest 100, as the API lists them) with their state, attempt, duration, result size
 * and error. Results and errors read "[hidden]" for read-only viewers unless the server shows payloads.
 */
import type { JobStep, JobWait } from "./api.js";
import { badge, h, table } from "./dom.js";
import { duration, time } from "./format.js";

/** "sleeping until ..." or "waiting for event ... until ...". */
export function waitField(wait: JobWait): Node {
  const until = wait.until ? time(wait.until) : "no deadline";
  const text =
    wait.kind === "sleep"
      ? `sleeping at step “${wait.step}” until ${until}`
      : `waiting at step “${wait.step}” for ${wait.kind} “${wait.event}”` +
        (wait.match === null || wait.match === undefined ? "" : ` matching ${JSON.stringify(wait.match)}`) +
        `, until ${until}`;
  return h("span", { "data-field": "wait" }, text);
}

export function stepsBlock(steps: JobStep[], total: number): Node {
  if (total === 0) return h("p", { class: "empty" }, "No steps recorded.");
  return h(
    "div",
    {},
    table(
      ["#", "Name", "Kind", "State", "Attempt", "Took", "Result", "Wake at / event", "Error"],
      steps.map((s) => [
        String(s.seq),
        s.occurrence > 0 ? `${s.name} (${s.occurrence + 1})` : s.name,
        s.kind,
        badge(s.state, s.state),
        String(s.attempt),
        s.durationMs === null ? "–" : duration(s.durationMs),
        s.resultBytes === null ? "–" : `${s.resultBytes} B`,
        [s.wakeAt ? time(s.wakeAt) : "", s.event ?? ""].filter(Boolean).join(" ") || "–",
        s.error ? h("pre", { class: "error-text" }, s.error) : "",
      ]),
      { "data-table": "steps" },
    ),
    total > steps.length && h("p", { class: "note" }, `The latest ${steps.length} of ${total}.`),
  );
}
