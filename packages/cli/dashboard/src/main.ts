/**
 * The dashboard's shell: the token, the routes (#/, #/running, #/jobs, #/jobs/ID,
 * #/recoveries, #/schedules: a job's page is a link anyone can share), and the refresh loop.
 * The current view re-reads the API every two seconds while the tab is visible; the header
 * says how old what is shown is, and a banner says so when the server cannot be read, so a
 * page that stopped updating never looks live.
 */
import { Api, ApiError } from "./api.js";
import { button, h, link, replace } from "./dom.js";
import { duration } from "./format.js";
import { jobView } from "./job.js";
import { jobsView } from "./jobs.js";
import { overviewView } from "./overview.js";
import { recoveriesView } from "./recoveries.js";
import { runningView } from "./running.js";
import { schedulesView } from "./schedules.js";
import type { View, ViewContext, ViewFactory } from "./view.js";

const REFRESH_MS = 2_000;
/** Older than this, what the page shows is called stale in the header and the banner. */
const STALE_MS = 3 * REFRESH_MS + 1_000;
const TOKEN_KEY = "leasehold.token";

const ROUTES: [RegExp, ViewFactory, string][] = [
  [/^\/$/, overviewView, "overview"],
  [/^\/running$/, runningView, "running"],
  [/^\/jobs$/, jobsView, "jobs"],
  [/^\/jobs\/[1-9][0-9]{0,18}$/, jobView, "job"],
  [/^\/recoveries$/, recoveriesView, "recoveries"],
  [/^\/schedules$/, schedulesView, "schedules"],
];

const readOnly = document.documentElement.dataset.mode === "read-only";
const viewEl = document.getElementById("view")!;
const statusEl = document.getElementById("status")!;
const bannerEl = document.getElementById("banner")!;
const navEl = document.getElementById("nav")!;

/** `leasehold dev` prints a link with the token in the fragment (never sent to the server): keep it, then drop it from the address. */
function takeTokenFromAddress(): void {
  const m = /^#token=([^&]+)/.exec(location.hash);
  if (!m) return;
  sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1]!));
  history.replaceState(null, "", `${location.pathname}${location.search}#/`);
}

/** The token lives in this tab's sessionStorage only: gone when the tab closes, never a cookie. */
function storedToken(): string | null {
  return sessionStorage.getItem(TOKEN_KEY);
}

function forgetToken(): void {
  sessionStorage.removeItem(TOKEN_KEY);
}

function showSignIn(message?: string): void {
  statusEl.replaceChildren();
  bannerEl.hidden = true;
  navEl.hidden = true;
  const input = h("input", { type: "password", name: "token", autocomplete: "current-password", required: true, "aria-label": "API token" });
  const error = h("p", { class: "error", role: "alert" }, message ?? "");
  const form = h(
    "form",
    { class: "sign-in" },
    h("h1", {}, "Leasehold"),
    h(
      "p",
      {},
      (readOnly
        ? "The viewer token you were given for this read-only dashboard (LEASEHOLD_VIEWER_TOKEN)."
        : "The server's API token (LEASEHOLD_TOKEN; `leasehold dev` prints it).") +
        " It is sent with each request in a header, and kept only in this tab until it closes.",
    ),
    h("label", {}, "API token ", input),
    h("button", { type: "submit" }, "Sign in"),
    error,
  );
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const token = input.value.trim();
    new Api(token).get("/v1/overview").then(
      () => {
        sessionStorage.setItem(TOKEN_KEY, token);
        start(token);
      },
      (err: unknown) =>
        replace(error, err instanceof ApiError && err.status === 401 ? "The server refused that token." : String((err as Error).message)),
    );
  });
  replace(viewEl, form);
  input.focus();
}

class App {
  private view?: View;
  private generation = 0;
  private timer?: number;
  private lastOk?: number;
  private lastError?: string;
  private flashEl = h("div", { class: "flash", role: "status" });

  constructor(private readonly api: Api) {}

  start(): void {
    navEl.hidden = false;
    window.addEventListener("hashchange", () => this.route());
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden) void this.tick();
    });
    window.setInterval(() => this.renderStatus(), 1_000);
    this.route();
  }

  private route(): void {
    this.view?.unmount?.();
    this.generation++;
    const [pathPart, query = ""] = (location.hash.replace(/^#/, "") || "/").split("?");
    const path = pathPart || "/";
    const match = ROUTES.find(([re]) => re.test(path));
    for (const a of navEl.querySelectorAll("a"))
      a.classList.toggle("active", a.getAttribute("href") === `#${location.hash.replace(/^#/, "") || "/"}`);
    if (!match) {
      this.view = undefined;
      replace(viewEl, h("p", {}, "No such page. ", link("#/", "Back to the overview")));
      return;
    }
    const root = h("div", { class: `view view-${match[2]}` });
    replace(this.flashEl);
    replace(viewEl, this.flashEl, root);
    const ctx: ViewContext = {
      api: this.api,
      readOnly,
      root,
      path: path.split("/").filter(Boolean),
      params: new URLSearchParams(query),
      navigate: (route) => {
        location.hash = route.replace(/^#/, "");
      },
      refresh: () => void this.tick(),
      flash: (text, kind = "ok") => replace(this.flashEl, h("p", { class: kind }, text)),
    };
    this.view = match[1](ctx);
    void this.tick();
  }

  private async tick(): Promise<void> {
    window.clearTimeout(this.timer);
    const generation = this.generation;
    const view = this.view;
    if (!view) return;
    try {
      await view.refresh();
      if (generation !== this.generation) return;
      this.lastOk = Date.now();
      this.lastError = undefined;
    } catch (err) {
      if (generation !== this.generation) return;
      if (err instanceof ApiError && err.status === 401) {
        forgetToken();
        return showSignIn("The server no longer accepts the token: sign in again.");
      }
      this.lastError = err instanceof Error ? err.message : String(err);
    }
    this.renderStatus();
    if (!document.hidden) this.timer = window.setTimeout(() => void this.tick(), REFRESH_MS);
  }

  private renderStatus(): void {
    const age = this.lastOk === undefined ? undefined : Date.now() - this.lastOk;
    const stale = this.lastError !== undefined || age === undefined || age > STALE_MS;
    const text = age === undefined ? (this.lastError ? "not loaded" : "loading…") : age < 1_500 ? "live" : `updated ${duration(age)} ago`;
    replace(
      statusEl,
      // Green only when what is shown is fresh; grey while the first read is under way.
      h("span", { class: `dot ${!stale ? "live" : age === undefined && this.lastError === undefined ? "loading" : "stale"}`, "data-dot": "" }),
      h("span", { class: "freshness", "data-fresh": stale ? "no" : "yes" }, text),
      readOnly && h("span", { class: "badge read-only", title: "this server changes nothing (--dashboard read-only)" }, "read-only"),
      button(
        "Sign out",
        () => {
          forgetToken();
          location.reload();
        },
        { class: "link" },
      ),
    );
    if (this.lastError !== undefined) {
      bannerEl.hidden = false;
      replace(
        bannerEl,
        `Cannot read the server: ${this.lastError}. `,
        age === undefined ? "Nothing to show yet." : `What you see is from ${duration(age)} ago; retrying every ${REFRESH_MS / 1000} s.`,
      );
    } else {
      bannerEl.hidden = true;
    }
  }
}

function start(token: string): void {
  new App(new Api(token)).start();
}

takeTokenFromAddress();
const token = storedToken();
if (token) start(token);
else showSignIn();
