/**
 * The dashboard: one page and its scripts and styles, served at `/` and `/assets/*` on the
 * server's port. The page holds no data and needs no token to load; everything it shows it
 * reads from this server's API with the token the operator gives it, sent in the
 * Authorization header (never a cookie, so another site cannot make a browser send it).
 *
 * Files come from the package: dashboard/index.html and dashboard/dashboard.css, the page's
 * compiled scripts in dist/dashboard/, and uPlot (charts) from its npm package. All are read
 * once, when the server is created, and only by `serve` and `dev`: the library never loads
 * this module.
 */
import fs from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";
import type { FastifyInstance, FastifyReply } from "fastify";
import { ConfigError } from "leasehold/internal/errors";
import type { DashboardMode } from "./dashboard-mode.js";
import { errorBody } from "./errors.js";
import { monitorRoutes as routes } from "./monitor-schemas.js";

export { DASHBOARD_MODES, type DashboardMode } from "./dashboard-mode.js";

/**
 * Scripts, styles and connections only from this server; nothing inline (an injected
 * `<script>` or `onerror=` attribute does not run); no plugins, frames, forms or base URL.
 */
export const DASHBOARD_CSP =
  "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
  "base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const PAGE_HEADERS = {
  "content-security-policy": DASHBOARD_CSP,
  "x-content-type-options": "nosniff",
  "x-frame-options": "DENY",
  "referrer-policy": "no-referrer",
  // Small files, revalidated on every load: an upgraded server is never paired with an old page.
  "cache-control": "no-cache",
};

const PACKAGE_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const TYPES: Record<string, string> = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".svg": "image/svg+xml",
};

interface Asset {
  body: Buffer;
  type: string;
}

/** Every file the page may load, by the name it is asked for under /assets/. */
function loadAssets(): Map<string, Asset> {
  const scripts = path.join(PACKAGE_ROOT, "dist", "dashboard");
  if (!fs.existsSync(scripts))
    throw new ConfigError(`the dashboard's scripts are missing (${scripts}): run npm run build, or serve with --dashboard off`);
  const uplot = path.dirname(createRequire(import.meta.url).resolve("uplot"));
  const files: [string, string][] = [
    ["dashboard.css", path.join(PACKAGE_ROOT, "dashboard", "dashboard.css")],
    ["favicon.svg", path.join(PACKAGE_ROOT, "dashboard", "favicon.svg")],
    ["uplot.js", path.join(uplot, "uPlot.esm.js")],
    ["uplot.css", path.join(uplot, "uPlot.min.css")],
    ...fs
      .readdirSync(scripts)
      .filter((f) => f.endsWith(".js"))
      .map((f): [string, string] => [f, path.join(scripts, f)]),
  ];
  return new Map(files.map(([name, file]) => [name, { body: fs.readFileSync(file), type: TYPES[path.extname(file)]! }]));
}

/** The page, marked with the mode so that it shows (or hides) the buttons that change jobs. */
function loadPage(mode: DashboardMode): Buffer {
  const html = fs.readFileSync(path.join(PACKAGE_ROOT, "dashboard", "index.html"), "utf8");
  if (!html.includes('data-mode="on"')) throw new ConfigError("dashboard/index.html has no data-mode attribute");
  return Buffer.from(html.replace('data-mode="on"', `data-mode="${mode}"`));
}

export function registerDashboard(app: FastifyInstance, mode: Exclude<DashboardMode, "off">): void {
  const page = loadPage(mode);
  const assets = loadAssets();
  const send = (reply: FastifyReply, asset: Asset) => reply.headers(PAGE_HEADERS).type(asset.type).send(asset.body);
  app.get("/", { schema: routes.page, config: { public: true } }, async (_request, reply) => send(reply, { body: page, type: TYPES[".html"]! }));
  // Browsers ask for it whatever the page says: answered without a token, like the page.
  app.get("/favicon.ico", { schema: routes.favicon, config: { public: true } }, async (_request, reply) => send(reply, assets.get("favicon.svg")!));
  app.get<{ Params: { name: string } }>("/assets/:name", { schema: routes.asset, config: { public: true } }, async (request, reply) => {
    const asset = assets.get(request.params.name);
    if (!asset) return reply.status(404).send(errorBody("not_found", `no asset ${request.params.name}`));
    return send(reply, asset);
  });
}
