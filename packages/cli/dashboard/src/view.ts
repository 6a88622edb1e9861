/** What every view gets from the page, and the confirmation every change goes through. */
import type { Api } from "./api.js";
import { button, h } from "./dom.js";

export interface ViewContext {
  api: Api;
  /** The server refuses changes (--dashboard read-only): views show no buttons that change jobs. */
  readOnly: boolean;
  /** Where the view draws. */
  root: HTMLElement;
  /** The route after "#": "/jobs/42" → ["jobs", "42"]; and its query ("#/jobs?state=dead"). */
  path: string[];
  params: URLSearchParams;
  navigate(route: string): void;
  /** Refresh now (after a change), instead of at the next tick. */
  refresh(): void;
  /** A message at the top of the view until the next route change (or the next message). */
  flash(text: string, kind?: "ok" | "error"): void;
}

export interface View {
  /** Reads what it shows and redraws it; called on arrival and then every tick. Throws when it cannot read. */
  refresh(): Promise<void>;
  unmount?(): void;
}

export type ViewFactory = (ctx: ViewContext) => View;

/**
 * Asks before a change, saying exactly what will happen; resolves true if confirmed. A modal
 * <dialog>: Escape or "Keep" answer no.
 */
export function confirmChange(question: string, detail: string, confirmLabel: string): Promise<boolean> {
  return new Promise((resolve) => {
    const dialog = h("dialog", { class: "confirm", "aria-label": question });
    const done = (answer: boolean) => {
      window.removeEventListener("hashchange", leave);
      dialog.close();
      dialog.remove();
      resolve(answer);
    };
    // A question about this page's job or filter: another page (back, a link, a typed address) answers no.
    const leave = () => done(false);
    window.addEventListener("hashchange", leave);
    dialog.append(
      h("h2", {}, question),
      h("p", {}, detail),
      h(
        "div",
        { class: "actions" },
        button("Keep", () => done(false), { class: "secondary", "data-confirm": "no" }),
        button(confirmLabel, () => done(true), { class: "danger", "data-confirm": "yes" }),
      ),
    );
    dialog.addEventListener("cancel", (e) => {
      e.preventDefault();
      done(false);
    });
    document.body.append(dialog);
    dialog.showModal();
  });
}
