/**
 * How the server offers its dashboard. Apart from dashboard.ts so that the CLI can check the
 * flag without loading the server.
 *   on         the page at `/`, with the buttons that change jobs;
 *   read-only  the page without them, and the operator token may only read (any other method is
 *              refused with 403 read_only): for a server that shows the queue to a wide audience;
 *   off        no page (the API is the same).
 */
export type DashboardMode = "on" | "read-only" | "off";
export const DASHBOARD_MODES: readonly DashboardMode[] = ["on", "read-only", "off"];
