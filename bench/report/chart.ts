/**
 * The PNG chart: one horizontal bar panel per headline metric, a bar per system.
 * @napi-rs/canvas ships prebuilt binaries in its npm packages (no install script).
 */
import { createCanvas } from "@napi-rs/canvas";
import type { BenchResults } from "./write.js";

const COLORS: Record<string, string> = {
  leasehold: "#2b7a3d",
  "pg-boss": "#3b6fb6",
  "graphile-worker": "#c0702a",
  ceiling: "#888888",
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
  add("drain-multi", "jobsPerSecond", `Drain, ${results.options.processes} worker processes (higher is better)`, "jobs/s");
  add("latency", "p50Ms", "Enqueue → start p50 (lower is better)", "ms");
  add("latency", "p99Ms", "Enqueue → start p99 (lower is better)", "ms");
  add("recovery", "recoverySeconds", "kill -9 → job running again (lower is better; n/a = never)", "s");
  return out;
}

const WIDTH = 1000;
const BAR_H = 26;
const PANEL_PAD = 56;
const LABEL_W = 220;

export async function drawChart(results: BenchResults): Promise<Buffer> {
  const ps = panels(results);
  const height = 60 + ps.reduce((h, p) => h + PANEL_PAD + p.bars.length * (BAR_H + 6), 0) + 20;
  const canvas = createCanvas(WIDTH, Math.max(height, 120));
  const g = canvas.getContext("2d");
  g.fillStyle = "#ffffff";
  g.fillRect(0, 0, WIDTH, canvas.height);
  g.fillStyle = "#111111";
  g.font = "bold 20px sans-serif";
  g.fillText(`Leasehold vs pg-boss vs graphile-worker — ${results.startedAt.slice(0, 10)}, PostgreSQL ${results.machine.postgres}`, 20, 34);
  let y = 60;
  for (const p of ps) {
    g.fillStyle = "#111111";
    g.font = "bold 15px sans-serif";
    g.fillText(p.title, 20, y + 24);
    y += PANEL_PAD - 16;
    const finite = p.bars.map((b) => b.value).filter(Number.isFinite);
    const max = Math.max(...finite, 1e-9);
    const scale = (WIDTH - LABEL_W - 140) / max;
    for (const b of p.bars) {
      g.fillStyle = "#333333";
      g.font = "14px sans-serif";
      g.fillText(b.label, 20, y + BAR_H - 8);
      const ok = Number.isFinite(b.value);
      const w = ok ? Math.max(2, b.value * scale) : 0;
      g.fillStyle = COLORS[b.system] ?? "#666666";
      g.fillRect(LABEL_W, y, w, BAR_H);
      g.fillStyle = "#111111";
      const text = ok ? `${b.value.toLocaleString("en-US", { maximumFractionDigits: b.value < 10 ? 2 : 0 })} ${p.unit}` : "n/a";
      g.fillText(text, LABEL_W + w + 8, y + BAR_H - 8);
      y += BAR_H + 6;
    }
    y += 16;
  }
  return canvas.toBuffer("image/png");
}
