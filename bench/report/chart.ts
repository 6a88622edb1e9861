/**
 * The chart: one horizontal bar panel per headline metric, a bar per system, as SVG. Text,
 * not pixels: no native dependency (a canvas library's prebuilt binaries are per platform),
 * and it renders wherever the Markdown does.
 */
import type { BenchResults } from "./write.js";

const COLORS: Record<string, string> = {
  leasehold: "#2b7a3d",
  "leasehold-defaults": "#2b7a3d",
  "leasehold-nats": "#5a9e6b",
  "pg-boss": "#3b6fb6",
  "graphile-worker": "#c0702a",
  ceiling: "#888888",
  dbos: "#8a4fb0",
  bullmq: "#b8403a",
  "bullmq-defaults": "#b8403a",
};

interface Panel {
  title: string;
  unit: string;
  bars: { label: string; system: string; value: number }[];
}

function panels(results: BenchResults): Panel[] {
  const out: Panel[] = [];
  const add = (id: string, key: string, title: string, unit: string, extra: string[] = []) => {
    const rows = results.workloads.filter((w) => w.id === id || extra.includes(w.id)).flatMap((w) => w.rows);
    const bars = rows
      .filter((r) => r.median[key] !== undefined)
      .map((r) => ({ label: r.system === "ceiling" ? "bare SQL ceiling" : r.label, system: r.system, value: r.median[key]! }));
    if (bars.length) out.push({ title, unit, bars });
  };
  add("enqueue", "jobsPerSecond", "Bulk enqueue (higher is better)", "jobs/s");
  add("drain", "jobsPerSecond", "Drain, 1 worker process (higher is better)", "jobs/s", ["ceiling"]);
  add("sweep", "jobsPerSecond", "Drain at the same handler concurrency (higher is better)", "jobs/s");
  add("drain-multi", "jobsPerSecond", `Drain, ${results.options.processes} worker processes (higher is better)`, "jobs/s");
  add("latency", "p50Ms", "Enqueue → start p50 (lower is better)", "ms");
  add("latency", "p99Ms", "Enqueue → start p99 (lower is better)", "ms");
  add("recovery", "recoverySeconds", "kill -9 → job running again (lower is better; n/a = never)", "s");
  add("durable-steps", "workflowsPerSecond", "Durable five-step workflows (higher is better)", "workflows/s");
  add("durable-steps", "statementsPerStep", "Durable steps: statements per step (lower is better)", "statements");
  add("durable-event", "p50Ms", "Event → resumed step p50 (lower is better)", "ms");
  add("durable-sleep", "createSeconds", "Sleeping workflows: start → all asleep (lower is better)", "s");
  return out;
}

const WIDTH = 1000;
const BAR_H = 26;
const PANEL_PAD = 56;
const LABEL_W = 260;

const escape = (s: string) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");

export function drawChart(results: BenchResults): string {
  const ps = panels(results);
  const height = Math.max(120, 60 + ps.reduce((h, p) => h + PANEL_PAD + p.bars.length * (BAR_H + 6), 0) + 20);
  const parts: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${WIDTH}" height="${height}" viewBox="0 0 ${WIDTH} ${height}" font-family="sans-serif">`,
    `<rect width="100%" height="100%" fill="#ffffff"/>`,
    `<text x="20" y="34" font-size="20" font-weight="bold" fill="#111">${escape(
      `Leasehold vs pg-boss vs graphile-worker — ${results.startedAt.slice(0, 10)}, PostgreSQL ${results.machine.postgres}`,
    )}</text>`,
  ];
  let y = 60;
  for (const p of ps) {
    parts.push(`<text x="20" y="${y + 24}" font-size="15" font-weight="bold" fill="#111">${escape(p.title)}</text>`);
    y += PANEL_PAD - 16;
    const finite = p.bars.map((b) => b.value).filter(Number.isFinite);
    const max = Math.max(...finite, 1e-9);
    const scale = (WIDTH - LABEL_W - 140) / max;
    for (const b of p.bars) {
      const ok = Number.isFinite(b.value);
      const w = ok ? Math.max(2, b.value * scale) : 0;
      const text = ok ? `${b.value.toLocaleString("en-US", { maximumFractionDigits: b.value < 10 ? 2 : 0 })} ${p.unit}` : "n/a";
      parts.push(
        `<text x="20" y="${y + BAR_H - 8}" font-size="14" fill="#333">${escape(b.label)}</text>`,
        `<rect x="${LABEL_W}" y="${y}" width="${w.toFixed(1)}" height="${BAR_H}" fill="${COLORS[b.system] ?? "#666666"}"/>`,
        `<text x="${(LABEL_W + w + 8).toFixed(1)}" y="${y + BAR_H - 8}" font-size="14" fill="#111">${escape(text)}</text>`,
      );
      y += BAR_H + 6;
    }
    y += 16;
  }
  parts.push("</svg>");
  return parts.join("\n") + "\n";
}
