/**
 * `leasehold queues list|depth|pause|resume|limit|clear-hold|history`: flow control at run time, for the whole fleet
 * (docs/flow-control.md), what a queue keeps of its finished jobs, and the queues' depth (docs/deployment.md#autoscaling). On the
 * database, or through a server with --server.
 */
import type { Command } from "commander";
import {
  MAX_CONCURRENCY_LIMIT,
  MAX_KEY_WEIGHT,
  MAX_RATE_LIMIT,
  MAX_RATE_WINDOW_MS,
  MIN_MAX_HOLD_MS,
  MIN_RATE_WINDOW_MS,
} from "leasehold/internal/jobs/flow-limits";
import {
  DEFAULT_MAX_HOLD_MS,
  type QueueDepth,
  type QueueInfo,
  type QueueLimits,
  type QueueSettings,
  type RateLimit,
} from "leasehold/internal/store/index";
import type { Run } from "../context.js";
import { CliError, EXIT } from "../errors.js";
import { table } from "../format.js";
import { duration, int } from "../parse.js";

interface LimitFlags {
  concurrency?: number | "none";
  keyConcurrency?: number | "none";
  rate?: RateLimit | "none";
  keyRate?: RateLimit | "none";
  keyWeight?: Record<string, number> | "none";
  maxHold?: number | "none";
  allowQueueHold?: boolean;
  create?: boolean;
}

const CREATE_HELP = "configure a queue no job, worker or setting names yet (otherwise an unknown name is refused)";

export function registerQueueCommands(program: Command, run: Run): void {
  const queues = program.command("queues").description("flow control: pause and resume queues, change their limits at run time; their depth");

  queues
    .command("list")
    .description("every queue with its state, limits and counts")
    .action(
      run(async (cli) => {
        const lh = await cli.operations();
        const list = await lh.listQueues();
        cli.result(list, () => queuesTable(list));
      }),
    );

  queues
    .command("depth")
    .description("every queue's depth now: ready jobs and the oldest one's age, running, delayed and blocked jobs (what autoscalers read)")
    .action(
      run(async (cli) => {
        const lh = await cli.operations();
        const depth = await lh.queueDepth();
        cli.result(depth, () => depthTable(depth));
      }),
    );

  queues
    .command("pause <name>")
    .description("pause a queue for every worker: its jobs wait (enqueue goes on, running jobs finish)")
    .option("--create", CREATE_HELP)
    .action(
      run(async (cli, name: string, flags: { create?: boolean }) => {
        const lh = await cli.operations();
        const q = await lh.pauseQueue(name, { create: flags.create });
        cli.result(q, () => `queue ${name} paused: no worker starts its jobs until \`leasehold queues resume ${name}\``);
      }),
    );

  queues
    .command("resume <name>")
    .description("resume a paused queue, and lift the holds its handlers set (as clear-hold)")
    .option("--create", CREATE_HELP)
    .action(
      run(async (cli, name: string, flags: { create?: boolean }) => {
        const lh = await cli.operations();
        const q = await lh.resumeQueue(name, { create: flags.create });
        cli.result(q, () => `queue ${name} resumed`);
      }),
    );

  queues
    .command("clear-hold <name>")
    .description("lift the holds handlers set on a queue with RateLimitedError (the queue's and its keys') and make its rate-limited jobs due now")
    .action(
      run(async (cli, name: string) => {
        const lh = await cli.operations();
        const cleared = await lh.clearQueueHolds(name);
        cli.result(cleared, () =>
          !cleared.queue && cleared.keys === 0 && cleared.jobs === 0
            ? `queue ${name}: no hold in force`
            : `queue ${name}: lifted ${
                [cleared.queue && "the queue's hold", cleared.keys > 0 && `${cleared.keys} key hold${cleared.keys === 1 ? "" : "s"}`]
                  .filter(Boolean)
                  .join(" and ") || "no hold"
              }; ${cleared.jobs} rate-limited job${cleared.jobs === 1 ? "" : "s"} due now`,
        );
      }),
    );

  queues
    .command("limit <name>")
    .description("change a queue's limits for every worker, without a restart (the limits not given stay as they are)")
    .option("--concurrency <n|none>", "attempts running in the queue at once, across every worker", countOrNone("--concurrency"))
    .option("--key-concurrency <n|none>", "attempts running at once per key (1: one at a time, in order)", countOrNone("--key-concurrency"))
    .option("--rate <n/window|none>", "starts of the whole queue per window, e.g. 50/1s, 100/1m", rateOrNone("--rate"))
    .option("--key-rate <n/window|none>", "starts per key per window, e.g. 10/1s", rateOrNone("--key-rate"))
    .option(
      "--key-weight <key=weight|none>",
      "a key's turns per round-robin round (repeat for several; the weights given replace the queue's; none: all weigh 1)",
      keyWeight,
    )
    .option(
      "--max-hold <duration|none>",
      "the longest hold a handler's RateLimitedError may set, e.g. 30s, 10m (1s to 1d; none: the default, 5m); longer ones are clamped",
      maxHold,
    )
    .option(
      "--allow-queue-hold <yes|no>",
      "whether a handler may hold the whole queue (no, the default: only its own key)",
      yesNo("--allow-queue-hold"),
    )
    .option("--create", CREATE_HELP)
    .action(
      run(async (cli, name: string, flags: LimitFlags) => {
        const limits: Partial<QueueLimits> = {
          ...(flags.concurrency !== undefined && { concurrency: noneAsNull(flags.concurrency) }),
          ...(flags.keyConcurrency !== undefined && { keyConcurrency: noneAsNull(flags.keyConcurrency) }),
          ...(flags.rate !== undefined && { rate: noneAsNull(flags.rate) }),
          ...(flags.keyRate !== undefined && { keyRate: noneAsNull(flags.keyRate) }),
          ...(flags.keyWeight !== undefined && { keyWeights: noneAsNull(flags.keyWeight) }),
          ...(flags.maxHold !== undefined && { maxHoldMs: noneAsNull(flags.maxHold) }),
          ...(flags.allowQueueHold !== undefined && { allowQueueHold: flags.allowQueueHold }),
        };
        if (Object.keys(limits).length === 0)
          throw new CliError(
            "give at least one of --concurrency, --key-concurrency, --rate, --key-rate, --key-weight, --max-hold or --allow-queue-hold",
          );
        const lh = await cli.operations();
        const q = await lh.setQueueLimits(name, limits, { create: flags.create });
        cli.result(q, () => `queue ${name}: ${describeLimits(q)}`);
      }),
    );

  queues
    .command("history <name>")
    .description("set what a queue keeps of its finished jobs, for the completions from now on (without a flag: show it)")
    // --keep-succeeded first: declared after it, --no-keep-succeeded leaves the value unset unless given
    .option("--keep-succeeded", "keep a record of every finished job (the default)")
    .option("--no-keep-succeeded", "keep no record of succeeded jobs (no result, no `jobs show`); a job whose result is needed keeps it")
    .option("--create", CREATE_HELP)
    .action(
      run(async (cli, name: string, flags: { keepSucceeded?: boolean; create?: boolean }) => {
        const lh = await cli.operations();
        if (flags.keepSucceeded === undefined) {
          if (flags.create) throw new CliError("--create needs --keep-succeeded or --no-keep-succeeded: there is nothing to set without one");
          const q = (await lh.listQueues()).find((x) => x.name === name);
          if (!q) throw new CliError(`queue ${JSON.stringify(name)} is unknown: no job, worker or setting names it`, EXIT.notFound);
          cli.result(q, () => historyText(q));
          return;
        }
        const q = await lh.setQueueHistory(name, { keepSucceeded: flags.keepSucceeded }, { create: flags.create });
        cli.result(q, () => historyText(q));
      }),
    );
}

/** The queue's setting, said as what it means for the jobs. */
function historyText(q: QueueSettings): string {
  return q.keepSucceeded
    ? `queue ${q.name} keeps a record of every finished job`
    : `queue ${q.name} keeps no record of succeeded jobs (failed, dead and cancelled ones, and those whose result is needed, keep theirs)`;
}

/** Commander turns a parser's null into "", so "none" travels as itself until here. */
function noneAsNull<T>(value: T | "none"): T | null {
  return value === "none" ? null : value;
}

function countOrNone(flag: string): (value: string) => number | "none" {
  const parse = int(flag, 1, MAX_CONCURRENCY_LIMIT);
  return (value) => {
    if (value.trim() === "none") return "none";
    try {
      return parse(value);
    } catch {
      throw new CliError(`${flag} must be a whole number from 1 to ${MAX_CONCURRENCY_LIMIT}, or none for no limit (got ${JSON.stringify(value)})`);
    }
  };
}

/** "50/1s", "100/1m", "5/500ms", "10/s" (a bare unit: one of it), or "none". */
function rateOrNone(flag: string): (value: string) => RateLimit | "none" {
  const window = duration(flag);
  const bad = (value: string, why: string) => new CliError(`${flag} ${why} (got ${JSON.stringify(value)})`);
  return (value) => {
    if (value.trim() === "none") return "none";
    const m = /^(\d+)\/(.+)$/.exec(value.trim());
    if (!m) throw bad(value, "must be starts per window like 50/1s or 100/1m, or none for no limit");
    const limit = Number(m[1]);
    if (limit < 1 || limit > MAX_RATE_LIMIT) throw bad(value, `must allow 1 to ${MAX_RATE_LIMIT} starts per window`);
    let windowMs: number;
    try {
      windowMs = window(/^(ms|s|m|h|d)$/.test(m[2]!) ? `1${m[2]}` : m[2]!);
    } catch {
      throw bad(value, "must be starts per window like 50/1s or 100/1m: the window is a duration like 500ms, 1s, 1m or 1h");
    }
    if (windowMs < MIN_RATE_WINDOW_MS || windowMs > MAX_RATE_WINDOW_MS) throw bad(value, "needs a window from 10ms to 1d");
    return { limit, windowMs };
  };
}

/** A duration from 1s to 1d, or "none" (the default cap). */
function maxHold(value: string): number | "none" {
  if (value.trim() === "none") return "none";
  let ms: number;
  try {
    ms = duration("--max-hold")(value);
  } catch {
    ms = NaN;
  }
  if (!(ms >= MIN_MAX_HOLD_MS && ms <= MAX_RATE_WINDOW_MS)) {
    throw new CliError(`--max-hold must be a duration from 1s to 1d like 30s or 10m, or none for the default (got ${JSON.stringify(value)})`);
  }
  return ms;
}

function yesNo(flag: string): (value: string) => boolean {
  return (value) => {
    if (value === "yes" || value === "true") return true;
    if (value === "no" || value === "false") return false;
    throw new CliError(`${flag} must be yes or no (got ${JSON.stringify(value)})`);
  };
}

/** KEY=WEIGHT, repeatable; "none" clears the weights. */
function keyWeight(value: string, previous: Record<string, number> | "none" | undefined): Record<string, number> | "none" {
  if (value.trim() === "none") {
    if (previous !== undefined) throw new CliError("--key-weight none clears the weights: give it alone");
    return "none";
  }
  if (previous === "none") throw new CliError("--key-weight none clears the weights: give it alone");
  const at = value.lastIndexOf("=");
  const key = value.slice(0, at);
  const weight = value.slice(at + 1);
  if (at <= 0 || !/^\d+$/.test(weight) || Number(weight) < 1 || Number(weight) > MAX_KEY_WEIGHT) {
    throw new CliError(`--key-weight must be KEY=WEIGHT with a weight from 1 to ${MAX_KEY_WEIGHT}, e.g. acme=3 (got ${JSON.stringify(value)})`);
  }
  return { ...previous, [key]: Number(weight) };
}

/** 50/1s, 100/1m, 5/250ms. */
export function rateText(rate: RateLimit | null): string {
  if (rate === null) return "-";
  const units: [number, string][] = [
    [86_400_000, "d"],
    [3_600_000, "h"],
    [60_000, "m"],
    [1_000, "s"],
  ];
  const unit = units.find(([ms]) => rate.windowMs % ms === 0);
  return `${rate.limit}/${unit ? `${rate.windowMs / unit[0]}${unit[1]}` : `${rate.windowMs}ms`}`;
}

function describeLimits(q: QueueSettings): string {
  const weights =
    q.keyWeights === null
      ? "-"
      : Object.entries(q.keyWeights)
          .map(([k, w]) => `${k}=${w}`)
          .join(", ");
  return (
    `${q.paused ? "paused" : "not paused"}; concurrency ${q.concurrency ?? "-"}, key concurrency ${q.keyConcurrency ?? "-"}, ` +
    `rate ${rateText(q.rate)}, key rate ${rateText(q.keyRate)}, key weights ${weights}; ` +
    `handlers hold at most ${durationText(q.maxHoldMs ?? DEFAULT_MAX_HOLD_MS)}${q.maxHoldMs === null ? " (default)" : ""}, ` +
    `${q.allowQueueHold ? "the whole queue allowed" : "their own key only"}`
  );
}

function durationText(ms: number): string {
  return rateText({ limit: 1, windowMs: ms }).slice(2);
}

/** The holds in force: "queue until 12:00:05 (job 42)", "key acme until ... (job 43)", "+3 keys". */
function holdsText(q: QueueInfo): string {
  if (q.holds.length === 0) return "-";
  const listed = q.holds.map(
    (h) => `${h.key === null ? "queue" : `key ${h.key}`} until ${h.until.toISOString()}${h.jobId ? ` (job ${h.jobId})` : ""}`,
  );
  const unlisted = q.heldKeys - q.holds.filter((h) => h.key !== null).length;
  return [...listed, ...(unlisted > 0 ? [`+${unlisted} keys`] : [])].join("; ");
}

function queuesTable(list: QueueInfo[]): string {
  if (list.length === 0) return "no queues";
  return table(
    ["NAME", "PAUSED", "CONCURRENCY", "KEY CONC.", "RATE", "KEY RATE", "WAITING", "RUNNING", "HELD", "RECORDS"],
    list.map((q) => [
      q.name,
      q.paused ? "yes" : "no",
      String(q.concurrency ?? "-"),
      String(q.keyConcurrency ?? "-"),
      rateText(q.rate),
      rateText(q.keyRate),
      String(q.waiting),
      String(q.running),
      holdsText(q),
      // A server of an earlier release does not say.
      q.keepSucceeded === false ? "no succeeded" : q.keepSucceeded === undefined ? "-" : "all",
    ]),
  );
}

function depthTable(depth: QueueDepth[]): string {
  if (depth.length === 0) return "no queues";
  return table(
    ["QUEUE", "PAUSED", "READY", "OLDEST READY", "RUNNING", "DELAYED", "BLOCKED", "LIMIT", "LIMITED", "SUSPENDED"],
    depth.map((d) => [
      d.queue,
      d.paused ? "yes" : "no",
      String(d.ready),
      d.ready === 0 ? "-" : `${d.oldestReadyAgeSeconds.toFixed(1)}s`,
      String(d.running),
      String(d.delayed),
      String(d.blocked),
      d.concurrencyLimit === null ? "-" : String(d.concurrencyLimit),
      d.limited ? "yes" : "no",
      // A server of an earlier release does not count them.
      d.suspended === undefined ? "-" : String(d.suspended),
    ]),
  );
}
