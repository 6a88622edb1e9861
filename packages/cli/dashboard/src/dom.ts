/**
 * Building the page: elements are made with createElement and filled with text nodes only.
 * Nothing a job holds (payload, error, progress, names, worker ids) is ever parsed as HTML:
 * there is no innerHTML, insertAdjacentHTML or document.write in the dashboard, and links
 * point only within the page.
 */

type Child = Node | string | number | null | undefined | false;
type Attributes = Record<string, string | number | boolean | undefined>;

/** Attributes that would run or load something: never set from here. */
const REFUSED = /^(on|style$|href$|src$|srcdoc$|action$|formaction$)/i;

/** An element with attributes (never event handlers, styles or URLs) and children (text is text). */
export function h<K extends keyof HTMLElementTagNameMap>(tag: K, attrs: Attributes = {}, ...children: Child[]): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === false) continue;
    if (REFUSED.test(name)) throw new Error(`h(): attribute ${name} is not set this way`);
    el.setAttribute(name, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

export function append(el: Node, children: Child[]): void {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    el.appendChild(typeof child === "object" ? child : document.createTextNode(String(child)));
  }
}

/** A link to a place in the dashboard: `#/...` only. */
export function link(route: string, ...children: Child[]): HTMLAnchorElement {
  if (!route.startsWith("#/")) throw new Error(`link(): ${route} is not a dashboard route`);
  const a = h("a", {}, ...children);
  a.href = route;
  return a;
}

/** A link to a job's page; the id comes from the API and is checked to be one. */
export function jobLink(id: string): HTMLAnchorElement | string {
  return /^[1-9][0-9]{0,18}$/.test(id) ? link(`#/jobs/${id}`, id) : id;
}

/** Replaces an element's children. */
export function replace(el: Element, ...children: Child[]): void {
  el.replaceChildren();
  append(el, children);
}

/** A button that runs `action` on click. */
export function button(label: string, action: () => void, attrs: Attributes = {}): HTMLButtonElement {
  const b = h("button", { type: "button", ...attrs }, label);
  b.addEventListener("click", action);
  return b;
}

/** A table whose rows scroll sideways on a narrow screen instead of widening the page. */
export function table(headers: string[], rows: Child[][], attrs: Attributes = {}): HTMLElement {
  return h(
    "div",
    { class: "table-scroll" },
    h(
      "table",
      attrs,
      h("thead", {}, h("tr", {}, ...headers.map((t) => h("th", {}, t)))),
      h("tbody", {}, ...rows.map((cells) => h("tr", {}, ...cells.map((c) => h("td", {}, c))))),
    ),
  );
}

/** A JSON value shown as text, indented. */
export function jsonBlock(value: unknown, attrs: Attributes = {}): HTMLPreElement {
  return h("pre", { class: "json", ...attrs }, value === undefined ? "" : JSON.stringify(value, null, 2));
}

/** A progress bar for a fraction from 0 to 1, with its percentage as text. */
export function progressBar(fraction: number, attrs: Attributes = {}): HTMLElement {
  const bar = h("progress", { max: 1000, value: Math.round(fraction * 1000), ...attrs });
  return h("span", { class: "progress" }, bar, h("span", { class: "pct" }, `${Math.round(fraction * 100)}%`));
}

export function badge(text: string, kind: string): HTMLElement {
  return h("span", { class: `badge ${kind}` }, text);
}
