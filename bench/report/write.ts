/**
 * The report: results as JSON (everything, every run), Markdown (medians, ratios against
 * each peer, the targets, versions, settings and machine) and an SVG chart.
 */
import fs from "node:fs";
import path from "node:path";
import type { CoreLayout } from "../lib/cores.js";
import type { BenchOptions, Metrics } from "../workloads/context.js";
import { MULTI_CONCURRENCY } from "../workloads/throughput.js";
import { drawChart } from "./chart.js";

export interface WorkloadRow {
  label: string;
  system: string;
  settings: string;
  /** Set when the run measured its drains in more than the default layout: where this row ran (its label ends in "(shared cores)" or "(split cores)"). */
  cores?: CoreLayout;
  /** The label of the row whose throughput this row's is reported as a share of (flow control's cost). */
  compareTo?: string;
  runs: Metrics[];
  median: Metrics;
  errors: string[];
}

export interface WorkloadResult {
  id: string;
  title: string;
  runs: number;
  rows: WorkloadRow[];
}

export interface BenchResults {
  command: string;
  startedAt: string;
  finishedAt: string;
  machine: Record<string, unknown> & { postgresSettings: Record<string, string> };
  versions: Record<string, string>;
  settings: Record<string, Record<string, string>>;
  options: BenchOptions;
  workloads: WorkloadResult[];
}

type Column = [key: string, header: string, digits: number];

/** Which metrics each workload's table shows (the JSON has them all). */
const COLUMNS: Record<string, Column[]> = {
  enqueue: [
    ["jobsPerSecond", "jobs/s", 0],
    ["walBytesPerJob", "WAL B/job", 0],
    ["serverCpuPct", "server CPU %", 0],
    ["clientCpuPct", "producer CPU %", 0],
  ],
  drain: [
    ["jobsPerSecond", "jobs/s", 0],
    ["serverCpuMsPerKJob", "server CPU ms/1k jobs", 0],
    ["clientCpuMsPerKJob", "worker CPU ms/1k jobs", 0],
    ["statementsPerKJob", "statements/1k jobs", 1],
    ["walBytesPerJob", "WAL B/job", 0],
    ["activeBackends", "active backends", 1],
    ["lockWaitPct", "% lock waits", 0],
    ["lwlockWaitPct", "% LWLock waits", 0],
    ["ioWaitPct", "% IO waits", 0],
  ],
  ceiling: [
    ["jobsPerSecond", "best jobs/s", 0],
    ["jobsPerSecond_1conn", "1 conn", 0],
    ["jobsPerSecond_2conn", "2 conns", 0],
    ["jobsPerSecond_4conn", "4 conns", 0],
  ],
  latency: [
    ["p50Ms", "p50 ms", 2],
    ["p99Ms", "p99 ms", 2],
    ["maxMs", "max ms", 1],
    ["samples", "samples", 0],
  ],
  recovery: [["recoverySeconds", "kill -9 → running again, s", 2]],
  crash: [
    ["kills", "kills", 0],
    ["p50Seconds", "p50 s", 2],
    ["p99Seconds", "p99 s", 2],
    ["maxSeconds", "max s", 2],
    ["lockFreeMaxSeconds", "lock free, max s", 3],
    ["detectMaxSeconds", "seen lost, max s", 3],
    ["graceMaxSeconds", "grace, max s", 3],
    ["claimMaxSeconds", "claim, max s", 3],
  ],
  heartbeat: [
    ["jobsInFlight", "jobs in flight", 0],
    ["statementsPerSecond", "worker statements/s", 1],
    ["serverXactsPerSecond", "server xacts/s", 1],
    ["serverCpuPct", "server CPU %", 1],
    ["clientCpuPct", "workers CPU %", 1],
    ["walBytesPerSecond", "WAL B/s", 0],
  ],
  steady: [
    ["jobs", "jobs", 0],
    ["startJobsPerSecond", "start jobs/s", 0],
    ["endJobsPerSecond", "end jobs/s", 0],
    ["endToStart", "end/start", 2],
    ["slowestTenthJobsPerSecond", "slowest tenth jobs/s", 0],
    ["tableMBAt10pct", "tables MB @10%", 1],
    ["tableMBAtHalf", "tables MB @50%", 1],
    ["tableMBAtEnd", "tables MB @end", 1],
    ["tableMBMax", "tables MB max", 1],
    ["deadTuplesMax", "dead tuples max", 0],
  ],
  pressure: (["before", "pinned", "after"] as const).flatMap((p): Column[] => [
    [`${p}JobsPerSecond`, `${p} jobs/s`, 0],
    [`${p}P99Ms`, `${p} p99 ms`, 1],
    [`${p}DeadTuplesMax`, `${p} dead tuples`, 0],
  ]),
  plans: [
    ["completeMsCustom", "complete, custom ms", 2],
    ["completeMsGeneric", "complete, generic ms", 2],
    ["heartbeatMsCustom", "heartbeat, custom ms", 2],
    ["heartbeatMsGeneric", "heartbeat, generic ms", 2],
  ],
};
COLUMNS["drain-multi"] = COLUMNS.drain!;
COLUMNS.sweep = COLUMNS.drain!;
COLUMNS["flow-cost"] = COLUMNS.drain!;
COLUMNS["flow-index"] = COLUMNS.drain!;
COLUMNS["cancel-latency"] = [
  ["p50Ms", "p50 ms", 1],
  ["p99Ms", "p99 ms", 1],
  ["maxMs", "max ms", 1],
  ["samples", "cancels", 0],
  ["neverAborted", "never aborted (15 s)", 0],
];
COLUMNS["flow-rate"] = [
  ["starts", "starts", 0],
  ["startsPerSecond", "starts/s", 2],
  ["rateErrorPct", "off the rate %", 1],
  ["worstWindowStarts", "most claims in a sliding 1-s window", 0],
  ["worstWindowOverPct", "worst window over %", 1],
  ["worstHandlerWindowStarts", "most handler starts in a sliding 1-s window", 0],
  ["claimToHandlerP99Ms", "claim → handler start p99 ms", 0],
  ["worstFixedSecond", "worst fixed second", 0],
  ["quietestFixedSecond", "quietest fixed second", 0],
];

const GRAPH_COLUMNS: Column[] = [
  ["jobs", "jobs", 0],
  ["seconds", "enqueue → last done, s", 2],
  ["jobsPerSecond", "jobs/s", 0],
  ["enqueueMs", "enqueue call, ms", 0],
  ["stepP50Ms", "step p50 ms", 1],
  ["stepP99Ms", "step p99 ms", 1],
];
COLUMNS["graph-fan-out"] = GRAPH_COLUMNS;
COLUMNS["graph-fan-in"] = GRAPH_COLUMNS;
// A chain's rate is a few jobs a second for pg-boss: two decimals.
COLUMNS["graph-chain"] = [
  ...GRAPH_COLUMNS.map((c): Column => (c[0] === "jobsPerSecond" ? [c[0], c[1], 2] : c)),
  ["fullChainSeconds", "full chain, s (pg-boss: scaled)", 1],
];
const GRAPH_WORKLOADS = ["graph-fan-out", "graph-fan-in", "graph-chain"];
COLUMNS["durable-steps"] = [
  ["workflowsPerSecond", "workflows/s", 0],
  ["statementsPerStep", "statements/step", 2],
  ["xactsPerStep", "server xacts/step", 2],
  ["serverCpuMsPerKStep", "server CPU ms/1k steps", 0],
  ["workerCpuMsPerKStep", "worker CPU ms/1k steps", 0],
  ["walBytesPerStep", "WAL B/step", 0],
];
COLUMNS["durable-event"] = [
  ["p50Ms", "p50 ms", 2],
  ["p95Ms", "p95 ms", 2],
  ["p99Ms", "p99 ms", 2],
  ["maxMs", "max ms", 1],
  ["resumed", "resumed", 0],
];
COLUMNS["durable-sleep"] = [
  ["sleepers", "sleeping workflows", 0],
  ["startCallsSeconds", "start calls, s", 1],
  ["createSeconds", "start → all asleep, s", 1],
  ["idleServerCpuPct", "idle server CPU %", 2],
  ["idleWorkerCpuPct", "idle workers CPU %", 2],
  ["idleStatementsPerSecond", "idle worker statements/s", 1],
  ["idleXactsPerSecond", "idle server xacts/s", 1],
  ["bytesPerSleeper", "table bytes/sleeper", 0],
];

/** Workloads where Leasehold is compared to each peer, and which way is better. */
const RATIOS: Record<string, { key: string; higherIsBetter: boolean }> = {
  enqueue: { key: "jobsPerSecond", higherIsBetter: true },
  drain: { key: "jobsPerSecond", higherIsBetter: true },
  "drain-multi": { key: "jobsPerSecond", higherIsBetter: true },
  latency: { key: "p50Ms", higherIsBetter: false },
  recovery: { key: "recoverySeconds", higherIsBetter: false },
};

export function fmt(v: number | undefined, digits: number): string {
  if (v === undefined) return "–";
  if (!Number.isFinite(v)) return "n/a";
  return v.toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });
}

function table(w: WorkloadResult): string[] {
  const cols = COLUMNS[w.id] ?? [];
  const lines = [`| | ${cols.map((c) => c[1]).join(" | ")} |`, `|---|${cols.map(() => "---:").join("|")}|`];
  for (const r of w.rows) {
    const cells = r.runs.length === 0 ? cols.map(() => "failed") : cols.map(([k, , d]) => fmt(r.median[k], d));
    lines.push(`| ${r.label} | ${cells.join(" | ")} |`);
  }
  return lines;
}

/** The sweep compares systems at each concurrency: Leasehold's row against every peer row at the same one. */
function sweepRatioLines(w: WorkloadResult): string[] {
  const concurrencyOf = (label: string) => / c=(\d+)/.exec(label)?.[1];
  const out: string[] = [];
  for (const lh of w.rows.filter((r) => r.system === "leasehold")) {
    const c = concurrencyOf(lh.label);
    const v = lh.median.jobsPerSecond;
    if (v === undefined) continue;
    for (const peer of w.rows.filter((r) => !r.system.startsWith("leasehold") && concurrencyOf(r.label) === c)) {
      const p = peer.median.jobsPerSecond;
      if (p !== undefined) out.push(`- ${lh.label} vs ${peer.label}: **${fmt(v / p, 2)}x** the throughput`);
    }
  }
  return out;
}

/** Rows measured against another row of the same run (flow control's cost): throughput as a share of it. */
function shareLines(w: WorkloadResult): string[] {
  const out: string[] = [];
  for (const r of w.rows) {
    const base = r.compareTo === undefined ? undefined : w.rows.find((b) => b.label === r.compareTo);
    const v = r.median.jobsPerSecond;
    const b = base?.median.jobsPerSecond;
    if (v !== undefined && b !== undefined) out.push(`- ${r.label}: **${fmt((v / b) * 100, 0)}%** of ${base!.label}`);
  }
  return out;
}

/** A row's throughput as a share of its `compareTo` row, or undefined. */
function share(w: WorkloadResult | undefined, label: string): number | undefined {
  const r = w?.rows.find((x) => x.label === label);
  const base = w?.rows.find((x) => x.label === r?.compareTo);
  const v = r?.median.jobsPerSecond;
  const b = base?.median.jobsPerSecond;
  return v === undefined || b === undefined ? undefined : v / b;
}

/** Graphs: Leasehold's jobs/s against each pg-boss row at the same handler concurrency. */
function graphRatioLines(w: WorkloadResult): string[] {
  const concurrencyOf = (label: string) => / c=(\d+)/.exec(label)?.[1];
  const out: string[] = [];
  for (const lh of w.rows.filter((r) => r.system === "leasehold")) {
    const v = lh.median.jobsPerSecond;
    if (v === undefined) continue;
    for (const peer of w.rows.filter((r) => r.system === "pg-boss" && concurrencyOf(r.label) === concurrencyOf(lh.label))) {
      const p = peer.median.jobsPerSecond;
      if (p !== undefined) out.push(`- ${lh.label} vs ${peer.label}: **${fmt(v / p, 1)}x** the jobs/s`);
    }
  }
  return out;
}

/** Durable steps: Leasehold's row against DBOS's of the same processes (the label's " xN"). */
function durableRatioLines(w: WorkloadResult): string[] {
  const spec = DURABLE_RATIOS[w.id]!;
  const out: string[] = [];
  for (const lh of w.rows.filter((r) => r.system === "leasehold")) {
    const peer = w.rows.find((r) => r.system === "dbos" && processesOf(r) === processesOf(lh));
    const v = lh.median[spec.key];
    const p = peer?.median[spec.key];
    if (v === undefined || p === undefined || !Number.isFinite(v) || !Number.isFinite(p)) continue;
    const ratio = spec.higherIsBetter ? v / p : p / v;
    out.push(`- ${lh.label} vs ${peer!.label}: **${fmt(ratio, 2)}x** ${spec.what}`);
  }
  return out;
}

/** " x4" of "leasehold x4": the durable rows' worker processes (empty where the label has none). */
const processesOf = (r: { label: string; system: string }) => r.label.slice(r.system.length);

const DURABLE_RATIOS: Record<string, { key: string; higherIsBetter: boolean; what: string }> = {
  "durable-steps": { key: "workflowsPerSecond", higherIsBetter: true, what: "the workflows/s" },
  "durable-event": { key: "p50Ms", higherIsBetter: false, what: "as fast (p50)" },
  "durable-sleep": { key: "createSeconds", higherIsBetter: false, what: "as fast to put them to sleep" },
};

/** The drains whose rows may run in several core layouts (`--cores`). */
const DRAIN_WORKLOADS = ["drain", "drain-multi", "sweep"];

/** Where a row ran; rows without a layout (the default, older results) shared the cores. */
export const coresOf = (r: { cores?: CoreLayout }): CoreLayout => r.cores ?? "shared";
const hasCoreLayouts = (w: WorkloadResult) => w.rows.some((r) => r.cores !== undefined);
const layoutsOf = (w: WorkloadResult) => [...new Set(w.rows.map(coresOf))];
const withoutLayout = (label: string, cores: CoreLayout | undefined) => (cores ? label.slice(0, -` (${cores} cores)`.length) : label);

/** The rows of one core layout, labelled as in a run without `--cores`: what ratios and targets read. */
function inLayout(w: WorkloadResult, cores: CoreLayout): WorkloadResult {
  return {
    ...w,
    rows: w.rows
      .filter((r) => coresOf(r) === cores)
      .map((r) => ({
        ...r,
        label: withoutLayout(r.label, r.cores),
        ...(r.compareTo !== undefined ? { compareTo: withoutLayout(r.compareTo, r.cores) } : {}),
      })),
  };
}

/** Leasehold's fleet rows with targets against the fastest peer, by label prefix, and the targets: the most server CPU and the least jobs/s, as multiples of the fastest peer's. */
const RECORD_OFF = "leasehold (record off)";
const FLEET_VARIANTS = [
  { prefix: "leasehold", name: "record on", serverCpu: 1.2, jobs: 1.0 },
  { prefix: RECORD_OFF, name: "record off", serverCpu: 1.0, jobs: 1.5 },
];

/**
 * What a row measures apart from its system: "" (best settings), " c=50 x4". graphile-worker's
 * local queue is its own tuning at a concurrency (the sweep), not a setting of its own.
 */
function kindOf(r: WorkloadRow): string {
  const system = r.label.startsWith(RECORD_OFF) ? RECORD_OFF : r.system;
  return r.label.slice(system.length).replace(/ localQueue=\d+/, "");
}

const isPeer = (r: WorkloadRow) => !r.system.startsWith("leasehold");

/** A ratio of two rows: of their medians, and of each run (empty when a run failed: no pairs to make). */
interface Ratio {
  median: number;
  runs: number[];
}

/** A ratio as text; n/a where a reading was 0 (a CPU time under the 10 ms tick /proc counts in: tiny runs). */
const timesText = (v: number) => (Number.isFinite(v) ? `${fmt(v, 2)}x` : "n/a");
const ratioText = (r: Ratio) => `**${timesText(r.median)}**${r.runs.length > 1 ? ` (runs ${r.runs.map(timesText).join(", ")})` : ""}`;

/** Rows that measured every run of `w`: their runs pair up by index. */
const complete = (w: WorkloadResult, rows: WorkloadRow[]) => rows.every((r) => r.runs.length === w.runs && r.errors.length === 0);

/** `a`'s `key` over `b`'s, the medians' and each run's. */
function rowRatio(w: WorkloadResult, a: WorkloadRow, b: WorkloadRow, key: string): Ratio | undefined {
  const va = a.median[key];
  const vb = b.median[key];
  if (va === undefined || vb === undefined) return undefined;
  return { median: va / vb, runs: complete(w, [a, b]) ? a.runs.map((m, i) => m[key]! / b.runs[i]![key]!) : [] };
}

/**
 * A Leasehold row against the fastest peer of the same kind in the same run: the peer with the
 * best median jobs/s for the medians, and in each run the peer fastest in that run.
 */
function againstFastestPeer(w: WorkloadResult, lh: WorkloadRow): { peer: WorkloadRow; jobs: Ratio; serverCpu: Ratio; workerCpu: Ratio } | undefined {
  const peers = w.rows.filter((r) => isPeer(r) && kindOf(r) === kindOf(lh) && r.median.jobsPerSecond !== undefined);
  if (peers.length === 0 || lh.median.jobsPerSecond === undefined) return undefined;
  const fastest = <T>(items: T[], jobs: (t: T) => number) => items.reduce((a, b) => (jobs(b) > jobs(a) ? b : a));
  const peer = fastest(peers, (r) => r.median.jobsPerSecond!);
  const perRun = complete(w, [lh, ...peers])
    ? lh.runs.map((m, i) => ({
        m,
        best: fastest(
          peers.map((p) => p.runs[i]!),
          (r) => r.jobsPerSecond!,
        ),
      }))
    : [];
  const ratio = (key: string): Ratio => ({
    median: lh.median[key]! / peer.median[key]!,
    runs: perRun.map(({ m, best }) => m[key]! / best[key]!),
  });
  return { peer, jobs: ratio("jobsPerSecond"), serverCpu: ratio("serverCpuMsPerKJob"), workerCpu: ratio("clientCpuMsPerKJob") };
}

/** The drains: each Leasehold row against the fastest peer of its kind, jobs/s and CPU per 1,000 jobs. */
function fastestPeerLines(w: WorkloadResult): string[] {
  const out: string[] = [];
  for (const lh of w.rows.filter((r) => !isPeer(r))) {
    const c = againstFastestPeer(w, lh);
    if (!c) continue;
    out.push(
      `- ${lh.label} vs the fastest peer, ${c.peer.label}: ${ratioText(c.jobs)} the jobs/s, ` +
        `${ratioText(c.serverCpu)} the server CPU per 1,000 jobs, ${ratioText(c.workerCpu)} the worker CPU per 1,000 jobs`,
    );
  }
  return out;
}

/** Ratio lines; with core layouts, each layout's rows against each other only. */
function ratioLines(w: WorkloadResult): string[] {
  const lines = (x: WorkloadResult) => [...ratioLinesOf(x), ...(DRAIN_WORKLOADS.includes(x.id) ? fastestPeerLines(x) : [])];
  if (!hasCoreLayouts(w)) return lines(w);
  return layoutsOf(w).flatMap((cores) => lines(inLayout(w, cores)).map((l) => l.replace(/^- /, `- ${cores} cores: `)));
}

function ratioLinesOf(w: WorkloadResult): string[] {
  if (w.id === "sweep") return sweepRatioLines(w);
  if (DURABLE_RATIOS[w.id]) return durableRatioLines(w);
  if (GRAPH_WORKLOADS.includes(w.id)) return graphRatioLines(w);
  if (w.rows.some((r) => r.compareTo !== undefined)) return shareLines(w);
  if (w.id === "drain-multi") return pairedRatioLines(w);
  const spec = RATIOS[w.id];
  const lh = w.rows.find((r) => r.system === "leasehold")?.median[spec?.key ?? ""];
  if (!spec || lh === undefined) return [];
  const out: string[] = [];
  for (const peer of w.rows.filter((r) => !r.system.startsWith("leasehold"))) {
    const v = peer.median[spec.key];
    if (v === undefined) continue;
    if (!Number.isFinite(v)) {
      out.push(`- vs ${peer.label}: ${peer.label} did not recover within the timeout`);
      continue;
    }
    const ratio = spec.higherIsBetter ? lh / v : v / lh;
    if (spec.higherIsBetter) out.push(`- vs ${peer.label}: **${fmt(ratio, 2)}x** the throughput`);
    else out.push(`- vs ${peer.label}: **${fmt(ratio >= 1 ? ratio : 1 / ratio, 2)}x** ${ratio >= 1 ? "faster" : "slower"}`);
  }
  return out;
}

/** Rows at the same settings side by side: each Leasehold row against each peer's row of the same setting. */
function pairedRatioLines(w: WorkloadResult): string[] {
  const setting = (r: { label: string; system: string }) => r.label.slice(r.system.length);
  const out: string[] = [];
  for (const lh of w.rows.filter((r) => r.system === "leasehold")) {
    const v = lh.median.jobsPerSecond;
    if (v === undefined) continue;
    for (const peer of w.rows.filter((r) => r !== lh && setting(r) === setting(lh))) {
      const p = peer.median.jobsPerSecond;
      if (p) out.push(`- ${lh.label} vs ${peer.label}: **${fmt(v / p, 2)}x** the throughput`);
    }
  }
  return out;
}

interface Target {
  name: string;
  value: string;
  met: boolean | undefined;
}

/** Drain targets of one core layout; `tag` says which in each target's name (empty without --cores). */
function drainTargets(w: (id: string) => WorkloadResult | undefined, results: BenchResults, tag: string): Target[] {
  const out: Target[] = [];
  const drain = w("drain");
  const lhDrain = drain?.rows.find((r) => r.system === "leasehold")?.median.jobsPerSecond;
  if (drain && lhDrain !== undefined) {
    const best = Math.max(...drain.rows.filter((r) => !r.system.startsWith("leasehold")).map((r) => r.median.jobsPerSecond ?? 0));
    out.push({ name: `drain ≥ 2x the fastest peer (1 process${tag})`, value: `${fmt(lhDrain / best, 2)}x`, met: lhDrain >= 2 * best });
  }
  const multi = w("drain-multi");
  const lhMulti = multi?.rows.find((r) => r.label === "leasehold")?.median.jobsPerSecond;
  const P = results.options.processes;
  if (multi && lhMulti !== undefined) {
    const best = Math.max(
      ...multi.rows.filter((r) => r.label === r.system && !r.system.startsWith("leasehold")).map((r) => r.median.jobsPerSecond ?? 0),
    );
    out.push({
      name: `drain ahead of the fastest peer (${P} processes, best settings${tag}; aim 1.5x)`,
      value: `${fmt(lhMulti / best, 2)}x`,
      met: lhMulti > best,
    });
  }
  // The fleet targets: Leasehold's processes of concurrency 50 against the fastest peer's
  // (by jobs/s, in the same run), with the record of succeeded jobs kept and not kept.
  for (const variant of FLEET_VARIANTS) {
    const fleet = multi?.rows.find((r) => r.label === `${variant.prefix} c=${MULTI_CONCURRENCY} x${P}`);
    const single = multi?.rows.find((r) => r.label === `${variant.prefix} c=${MULTI_CONCURRENCY} x1`);
    const at = `${P} processes of concurrency ${MULTI_CONCURRENCY}, ${variant.name}${tag}`;
    const vsPeer = fleet && againstFastestPeer(multi!, fleet);
    if (vsPeer) {
      const peer = ` vs ${vsPeer.peer.label}`;
      out.push({
        name: `server CPU per 1,000 jobs ≤ ${variant.serverCpu}x the fastest peer's (${at})`,
        value: `${ratioText(vsPeer.serverCpu)}${peer}`,
        met: vsPeer.serverCpu.median <= variant.serverCpu,
      });
      out.push({
        name: `jobs/s ≥ ${variant.jobs}x the fastest peer's (${at})`,
        value: `${ratioText(vsPeer.jobs)}${peer}`,
        met: vsPeer.jobs.median >= variant.jobs,
      });
    }
    if (fleet && single) {
      const r = rowRatio(multi!, fleet, single, "jobsPerSecond");
      if (r)
        out.push({
          name: `${P} processes drain at least as fast as 1 (concurrency ${MULTI_CONCURRENCY}, ${variant.name}${tag})`,
          value: ratioText(r),
          met: r.median >= 1,
        });
    }
  }
  if (multi && lhMulti !== undefined && lhDrain !== undefined) {
    out.push({
      name: `${P} processes drain at least as fast as 1 (best settings${tag})`,
      value: `${fmt(lhMulti / lhDrain, 2)}x`,
      met: lhMulti >= lhDrain,
    });
  }
  const sweep = w("sweep");
  for (const c of results.options.sweep) {
    const lh = sweep?.rows.find((r) => r.label === `leasehold c=${c}`)?.median.jobsPerSecond;
    const peers = sweep?.rows.filter((r) => r.system === "graphile-worker" && r.label.startsWith(`graphile-worker c=${c} `)) ?? [];
    if (lh === undefined || peers.length === 0) continue;
    const best = Math.max(...peers.map((r) => r.median.jobsPerSecond ?? 0));
    out.push({
      name: `drain ahead of graphile-worker at concurrency ${c} (its best local queue${tag})`,
      value: `${fmt(lh / best, 2)}x`,
      met: lh > best,
    });
  }
  return out;
}

export function targets(results: BenchResults): Target[] {
  const w = (id: string) => results.workloads.find((x) => x.id === id);
  const m = (id: string, system: string, key: string) => w(id)?.rows.find((r) => r.system === system || r.label === system)?.median[key];
  const out: Target[] = [];
  // The drains' targets in each core layout they ran in, read within that layout only.
  const drains = DRAIN_WORKLOADS.map(w).filter((x): x is WorkloadResult => x !== undefined);
  const labelled = drains.some(hasCoreLayouts);
  for (const cores of labelled ? [...new Set(drains.flatMap(layoutsOf))] : ["shared" as const]) {
    const view = (id: string) => {
      const x = w(id);
      return x && labelled ? inLayout(x, cores) : x;
    };
    const tag = labelled ? `, ${cores} cores` : "";
    out.push(...drainTargets(view, results, tag));
  }
  const lhDrain = w("drain")?.rows.find((r) => r.system === "leasehold" && coresOf(r) === "shared")?.median.jobsPerSecond;
  const ceiling = m("ceiling", "ceiling", "jobsPerSecond");
  if (ceiling !== undefined && lhDrain !== undefined) {
    out.push({ name: "drain as a fraction of the bare-SQL ceiling (no target)", value: `${fmt((lhDrain / ceiling) * 100, 0)}%`, met: undefined });
  }
  const enq = m("enqueue", "leasehold", "jobsPerSecond");
  if (enq !== undefined) out.push({ name: "bulk enqueue ≥ 100,000 jobs/s", value: fmt(enq, 0), met: enq >= 100_000 });
  const p50 = m("latency", "leasehold", "p50Ms");
  const p99 = m("latency", "leasehold", "p99Ms");
  if (p50 !== undefined) out.push({ name: "enqueue-to-start p50 ≤ 2 ms", value: `${fmt(p50, 2)} ms`, met: p50 <= 2 });
  if (p99 !== undefined) out.push({ name: "enqueue-to-start p99 ≤ 5 ms", value: `${fmt(p99, 2)} ms`, met: p99 <= 5 });
  const rec = m("recovery", "leasehold", "recoverySeconds");
  if (rec !== undefined)
    out.push({ name: "recovery after kill -9 as short as the lease allows (lease 1 s)", value: `${fmt(rec, 2)} s`, met: rec <= 1.5 });
  const recDefaults = m("recovery", "leasehold-defaults", "recoverySeconds");
  if (recDefaults !== undefined)
    out.push({ name: "recovery after kill -9 at default settings < 2 s", value: `${fmt(recDefaults, 2)} s`, met: recDefaults < 2 });
  const crashP50 = m("crash", "leasehold", "p50Seconds");
  const crashP99 = m("crash", "leasehold", "p99Seconds");
  if (crashP50 !== undefined && crashP99 !== undefined)
    out.push({
      name: `kill -9 → running again at defaults, p50 ≤ 1.5 s and p99 ≤ 2.5 s (${results.options.kills} kills)`,
      value: `${fmt(crashP50, 2)} / ${fmt(crashP99, 2)} s`,
      met: crashP50 <= 1.5 && crashP99 <= 2.5,
    });
  for (const [system, what] of [
    ["leasehold", "database worker"],
    ["leasehold-remote", "remote HTTP worker"],
  ] as const) {
    const cancelP99 = m("cancel-latency", system, "p99Ms");
    if (cancelP99 !== undefined)
      out.push({ name: `cancel → handler's AbortSignal p99 ≤ 250 ms (${what}, defaults)`, value: `${fmt(cancelP99, 1)} ms`, met: cancelP99 <= 250 });
  }
  const flow = w("flow-cost");
  for (const c of results.options.flowConcurrency ?? []) {
    const pick = (suffix: string) => flow?.rows.find((r) => r.label.startsWith(`leasehold c=${c}: ${suffix}`))?.label;
    const checks: [string, string, number | undefined][] = [
      ["queues row, nothing set", "no measurable cost for a queues row that sets nothing (≥ 95%, within noise)", 0.95],
      ["concurrency ", "a concurrency limit that never binds ≥ 90% of unlimited", 0.9],
      ["keys, no limit", "keyed, no limit (round-robin between keys) vs unlimited (no target)", undefined],
      ["keyConcurrency 1,", "per-key limit 1 over many keys ≥ 70% of unlimited", 0.7],
      ["keyConcurrency 5,", "per-key limit 5 over many keys ≥ 70% of unlimited", 0.7],
    ];
    for (const [suffix, name, min] of checks) {
      const label = pick(suffix);
      const v = label === undefined ? undefined : share(flow, label);
      if (v !== undefined) out.push({ name: `${name}, c=${c}`, value: `${fmt(v * 100, 0)}%`, met: min === undefined ? undefined : v >= min });
    }
  }
  const withoutIndex = share(w("flow-index"), "leasehold: jobs_running_idx dropped");
  if (withoutIndex !== undefined)
    out.push({
      name: "plain drain without jobs_running_idx, as a share of with it (no target)",
      value: `${fmt(withoutIndex * 100, 0)}%`,
      met: undefined,
    });
  for (const row of w("flow-rate")?.rows.filter((r) => r.system === "leasehold") ?? []) {
    const rate = row.median;
    const c = / c=(\d+)/.exec(row.label)?.[1];
    const at = c === undefined ? "" : `, c=${c}`;
    if (rate.rateErrorPct !== undefined)
      out.push({
        name: `rate limit: starts within ±5% of the rate${at}`,
        value: `${fmt(rate.rateErrorPct, 1)}%`,
        met: Math.abs(rate.rateErrorPct) <= 5,
      });
    if (rate.worstWindowOverPct !== undefined)
      out.push({
        name: `rate limit: no 1-second window more than 10% over${at}`,
        value: `${fmt(rate.worstWindowStarts, 0)} claims (${fmt(rate.worstWindowOverPct, 1)}%)`,
        met: rate.worstWindowOverPct <= 10,
      });
    if (rate.worstHandlerWindowStarts !== undefined)
      out.push({
        name: `rate limit: handler starts in a sliding 1-second window, and how long after its claim a handler starts (no target)${at}`,
        value: `${fmt(rate.worstHandlerWindowStarts, 0)}; p99 ${fmt(rate.claimToHandlerP99Ms, 0)} ms, max ${fmt(rate.claimToHandlerMaxMs, 0)} ms`,
        met: undefined,
      });
  }
  for (const id of GRAPH_WORKLOADS) {
    const g = w(id);
    for (const lh of g?.rows.filter((r) => r.system === "leasehold") ?? []) {
      const c = / c=(\d+)/.exec(lh.label)?.[1];
      const v = lh.median.jobsPerSecond;
      const peers = g!.rows.filter((r) => r.system === "pg-boss" && r.label.startsWith(`pg-boss c=${c} `));
      if (v === undefined || peers.length === 0) continue;
      const best = Math.max(...peers.map((r) => r.median.jobsPerSecond ?? 0));
      out.push({ name: `${id.slice(6)} ≥ 2x pg-boss's flow() (its faster interval), c=${c}`, value: `${fmt(v / best, 1)}x`, met: v >= 2 * best });
    }
  }
  for (const lh of w("graph-chain")?.rows.filter((r) => r.system === "leasehold") ?? []) {
    const p50 = lh.median.stepP50Ms;
    if (p50 !== undefined)
      out.push({ name: `chain step (parent's end → child's start) p50 < 5 ms, ${lh.label.slice(10)}`, value: `${fmt(p50, 1)} ms`, met: p50 < 5 });
  }
  const durable = w("durable-steps");
  for (const lh of durable?.rows.filter((r) => r.system === "leasehold") ?? []) {
    const procs = processesOf(lh);
    const v = lh.median.workflowsPerSecond;
    const peer = durable!.rows.find((r) => r.label === `dbos${procs}`)?.median.workflowsPerSecond;
    if (v !== undefined && peer !== undefined)
      out.push({ name: `durable five-step workflows ≥ 2x DBOS Transact's workflows/s,${procs}`, value: `${fmt(v / peer, 2)}x`, met: v >= 2 * peer });
    const statements = lh.median.statementsPerStep;
    if (statements !== undefined)
      out.push({ name: `durable steps: at most one statement per plain step,${procs}`, value: fmt(statements, 2), met: statements <= 1 });
  }
  const resumeP50 = m("durable-event", "leasehold", "p50Ms");
  if (resumeP50 !== undefined) out.push({ name: "event → resumed step p50 ≤ 10 ms", value: `${fmt(resumeP50, 1)} ms`, met: resumeP50 <= 10 });
  const steady = m("steady", "leasehold", "endToStart");
  if (steady !== undefined)
    out.push({ name: "no throughput loss over the long run (end ≥ 90% of start)", value: `${fmt(steady * 100, 0)}%`, met: steady >= 0.9 });
  const half = m("steady", "leasehold", "tableMBAtHalf");
  const end = m("steady", "leasehold", "tableMBAtEnd");
  if (half !== undefined && end !== undefined)
    out.push({
      name: "tables level off over the long run (size at the end ≤ 1.25x halfway)",
      value: `${fmt(half, 0)} → ${fmt(end, 0)} MB`,
      met: end <= 1.25 * half,
    });
  return out;
}

/** The durable workloads' sizes, when the run has any (older results have no such options). */
function durableSizes(results: BenchResults): string {
  const o = results.options;
  if (!results.workloads.some((w) => DURABLE_RATIOS[w.id]) || o.durableWorkflows === undefined) return "";
  const n = (v: number) => v.toLocaleString("en-US");
  return (
    `Durable steps: ${n(o.durableWorkflows)} five-step workflows per drain at concurrency 50 per process, ` +
    `${n(o.durableWaiters)} waiters resumed one at a time, ${n(o.durableSleepers)} sleepers watched for ${o.durableIdleSeconds} s with ${o.processes} processes. `
  );
}

export function markdown(results: BenchResults): string {
  const lines: string[] = [
    `# Leasehold benchmark results`,
    "",
    `Command: \`${results.command}\`  `,
    `Run: ${results.startedAt} → ${results.finishedAt}`,
    "",
    `Machine: ${results.machine.cpus}, ${results.machine.memoryGB} GB RAM, ${results.machine.os}, Node ${results.machine.node}; ` +
      `PostgreSQL ${results.machine.postgres} (embedded, one server for all systems; ` +
      Object.entries(results.machine.postgresSettings)
        .filter(([k]) => k !== "server_version")
        .map(([k, v]) => `${k}=${v}`)
        .join(", ") +
      ")",
    "",
    `Versions: ${Object.entries(results.versions)
      .map(([k, v]) => `${k} ${v}`)
      .join(", ")}`,
    "",
    `Sizes: ${results.options.jobs.toLocaleString("en-US")} jobs for enqueue/drain/ceiling (enqueue batches of ${results.options.batch}), ` +
      `${results.options.processes} processes for the multi-process drain, latency at ${results.options.latencyRate} jobs/s for ${results.options.latencySeconds} s, ` +
      `${results.options.heartbeatJobs} long jobs for ${results.options.heartbeatSeconds} s in the heartbeat workload, ` +
      `${results.options.steadyJobs.toLocaleString("en-US")} jobs in the steady state, ${results.options.pressureRate} jobs/s with a ${results.options.pinSeconds} s pinned snapshot. ` +
      `Flow control: ${results.options.flowJobs?.toLocaleString("en-US")} jobs per drain at handler concurrency ${results.options.flowConcurrency?.join(" and ")}, keyed over ${results.options.flowKeys?.toLocaleString("en-US")} keys; ` +
      `rate ${results.options.rateLimit}/s for ${results.options.rateSeconds} s with ${results.options.rateProcesses} processes. ` +
      `Graphs: ${results.options.graphSize?.toLocaleString("en-US")} wide, a chain of ${results.options.graphChain?.toLocaleString("en-US")} (pg-boss: ${results.options.graphPgbossChain} steps, scaled) at handler concurrency ${results.options.graphConcurrency?.join(" and ")}. ` +
      durableSizes(results) +
      `Short workloads: median of ${results.options.runs} runs, systems taking turns in each run; long ones (heartbeat, steady, pressure, plans, flow-rate, durable-sleep): one run.`,
    "",
    "## Targets (Leasehold, with heartbeats, fencing and the audit trail on)",
    "",
    "| target | measured | met |",
    "|---|---:|:---:|",
    ...targets(results).map((t) => `| ${t.name} | ${t.value} | ${t.met === undefined ? "" : t.met ? "yes" : "**no**"} |`),
    "",
  ];
  for (const w of results.workloads) {
    lines.push(`## ${w.title}`, "", ...table(w), "");
    const ratios = ratioLines(w);
    const shares = w.rows.some((r) => r.compareTo !== undefined);
    if (ratios.length)
      lines.push(shares ? "Each row's throughput against its baseline, same run:" : "Leasehold against each peer, same run:", "", ...ratios, "");
    const errors = w.rows.flatMap((r) => r.errors.map((e) => `- ${r.label}: ${e.split("\n")[0]}`));
    if (errors.length) lines.push("Errors:", "", ...errors, "");
    if (w.id === "recovery") {
      // A row may wait longer than --recovery-timeout (BullMQ at its defaults): say each wait there is.
      const waits = [
        ...new Set([results.options.recoveryTimeoutSeconds, ...w.rows.map((r) => r.median.timeoutSeconds).filter((t) => t !== undefined)]),
      ];
      const which = waits.length > 1 ? " (each row's `timeoutSeconds` in the JSON)" : "";
      lines.push(`n/a: not running again within ${waits.join(" or ")} s of the kill${which}.`, "");
    }
  }
  lines.push("## Settings", "");
  for (const [system, profiles] of Object.entries(results.settings)) {
    lines.push(`- **${system} ${results.versions[system]}**`);
    for (const [profile, text] of Object.entries(profiles)) lines.push(`  - ${profile}: ${text}`);
  }
  lines.push("");
  return lines.join("\n");
}

/** Writes <name>.json, <name>.md and <name>.svg into `dir`; returns the paths. */
export async function writeReport(results: BenchResults, dir: string, name: string): Promise<string[]> {
  fs.mkdirSync(dir, { recursive: true });
  const json = path.join(dir, `${name}.json`);
  const md = path.join(dir, `${name}.md`);
  const svg = path.join(dir, `${name}.svg`);
  fs.writeFileSync(json, JSON.stringify(results, (_k, v) => (typeof v === "number" && !Number.isFinite(v) ? null : v), 2) + "\n");
  fs.writeFileSync(md, markdown(results) + `\n![chart](${name}.svg)\n`);
  fs.writeFileSync(svg, drawChart(results));
  return [json, md, svg];
}
