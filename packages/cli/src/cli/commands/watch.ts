/**
 * `leasehold jobs watch`: the dashboard's live view for a terminal. Every interval it reads
 * the counts per queue (waiting, scheduled, running, dead, the oldest ready job's wait), the
 * waiting jobs no live worker runs, and the running jobs (progress as a bar when the handler
 * reports a fraction, lease left, last beat, attempt, worker), from the database or, with
 * --server, from the API's
 * /v1/overview and /v1/running. The same bounded statements as the dashboard: watching costs
 * the same at any load.
 */
import { setTimeout as sleep } from "node:timers/promises";
import type { Command } from "commander";
import type { Leasehold } from "leasehold/internal/client";
import { progressFraction } from "leasehold/internal/jobs/progress";
import * as store from "leasehold/internal/store/index";
import type { Cli, Run } from "../context.js";
import { describeFailure, EXIT } from "../errors.js";
import { gapsText, table } from "../format.js";
import { handlerGaps, type HandlerGap } from "leasehold/internal/maintenance/handler-gaps";
import { int } from "../parse.js";
import { onOutputClosed } from "../signals.js";
import { RemoteOperations } from "../remote-operations.js";

const RUNNING_SHOWN = 30;
const BAR_WIDTH = 20;

export interface WatchFrame {
  at: string;
  queues: store.QueueOverview[];
  /** Waiting jobs no live worker can run. */
  withoutHandler: HandlerGap[];
  running: {
    id: string;
    queue: string;
    task: string;
    attempt: number;
    workerId: string;
    leaseLeftMs: number;
    heartbeatMsAgo: number;
    progressFraction: number | null;
  }[];
  moreRunning: boolean;
}

export function registerWatch(jobs: Command, run: Run): void {
  jobs
    .command("watch")
    .description("live counts per queue and the running jobs with their progress, redrawn every interval (Ctrl-C to stop)")
    .option("--interval <ms>", "redraw every this many milliseconds (default 2000)", int("--interval", 250, 3_600_000), 2_000)
    .option("--queue <queue>", "only the running jobs of this queue")
    .option("--once", "print one frame and exit (for scripts; with --json, one JSON object)")
    .action(
      run(async (cli, opts: { interval: number; queue?: string; once?: boolean }) => {
        const read = await source(cli, opts.queue);
        const tty = process.stdout.isTTY && !cli.json;
        // Ctrl-C ends the wait for the next frame and the loop.
        const stop = new AbortController();
        const onSignal = () => stop.abort();
        process.once("SIGINT", onSignal);
        process.once("SIGTERM", onSignal);
        // Piped into a reader that has gone (`| head`): nothing more to show.
        const offOutput = onOutputClosed(onSignal);
        try {
          let shown: WatchFrame | undefined;
          let unreachableSince: string | undefined;
          while (!stop.signal.aborted) {
            // A terminal is redrawn in place; a pipe gets one frame after another.
            const clear = tty ? "\x1b[H\x1b[2J" : "";
            try {
              const frame = await read();
              shown = frame;
              unreachableSince = undefined;
              cli.result(frame, () => clear + render(frame, opts.interval, opts.once === true));
            } catch (err) {
              // A blip (the database or the server restarting, a cut connection) is waited out,
              // as the dashboard does: the last frame stays up, marked stale, until a read works.
              // Anything else, --once, or no frame yet (a wrong URL, not a blip) is a failure as usual.
              const failure = describeFailure(err);
              if (opts.once || !shown || failure.exitCode !== EXIT.unavailable || stop.signal.aborted) throw err;
              const at = new Date().toISOString();
              unreachableSince ??= at;
              const last = shown;
              const notice = { at, unreachable: failure.message, since: unreachableSince, lastFrameAt: last.at };
              cli.result(notice, () => clear + renderUnreachable(notice, last, opts.interval));
            }
            if (opts.once) return;
            await sleep(opts.interval, undefined, { signal: stop.signal }).catch(() => {});
          }
        } finally {
          process.off("SIGINT", onSignal);
          process.off("SIGTERM", onSignal);
          offOutput();
        }
      }),
    );
}

/** Reads a frame from the server's API (--server) or the database. */
async function source(cli: Cli, queue: string | undefined): Promise<() => Promise<WatchFrame>> {
  const ops = await cli.operations();
  if (ops instanceof RemoteOperations) {
    return async () => {
      const [overview, running] = await Promise.all([
        ops.get<{ queues: store.QueueOverview[]; withoutHandler: HandlerGap[] }>("/v1/overview"),
        ops.get<{ jobs: WatchFrame["running"]; more: boolean }>(
          `/v1/running?limit=${RUNNING_SHOWN}${queue ? `&queue=${encodeURIComponent(queue)}` : ""}`,
        ),
      ]);
      return {
        at: new Date().toISOString(),
        queues: overview.queues,
        withoutHandler: overview.withoutHandler,
        running: running.jobs.map(pick),
        moreRunning: running.more,
      };
    };
  }
  const lh = ops as Leasehold;
  return async () => {
    const [queues, withoutHandler, running] = await Promise.all([
      store.queueOverview(lh.pool),
      handlerGaps(lh.pool),
      store.runningJobs(lh.pool, { queue, limit: RUNNING_SHOWN + 1 }),
    ]);
    return {
      at: new Date().toISOString(),
      queues,
      withoutHandler,
      running: running.slice(0, RUNNING_SHOWN).map((j) => pick({ ...j, progressFraction: progressFraction(j.progress) })),
      moreRunning: running.length > RUNNING_SHOWN,
    };
  };
}

function pick(j: WatchFrame["running"][number]): WatchFrame["running"][number] {
  const { id, queue, task, attempt, workerId, leaseLeftMs, heartbeatMsAgo, progressFraction } = j;
  return { id, queue, task, attempt, workerId, leaseLeftMs, heartbeatMsAgo, progressFraction };
}

export function progressText(fraction: number | null): string {
  if (fraction === null) return "-";
  const filled = Math.round(fraction * BAR_WIDTH);
  return `[${"#".repeat(filled)}${"-".repeat(BAR_WIDTH - filled)}] ${String(Math.round(fraction * 100)).padStart(3)}%`;
}

const seconds = (ms: number) => `${(ms / 1000).toFixed(1)}s`;

export function render(frame: WatchFrame, intervalMs: number, once: boolean): string {
  const queues =
    frame.queues.length === 0
      ? "no unfinished or dead jobs"
      : table(
          ["QUEUE", "WAITING", "SCHEDULED", "RUNNING", "DEAD", "OLDEST WAITING"],
          frame.queues.map((q) => [
            q.queue,
            String(q.waiting),
            String(q.scheduled),
            q.expired > 0 ? `${q.running} (${q.expired} expired)` : String(q.running),
            String(q.dead),
            q.oldestWaitingMs === null ? "-" : seconds(q.oldestWaitingMs),
          ]),
        );
  const running =
    frame.running.length === 0
      ? "no job is running"
      : table(
          ["JOB", "TASK", "QUEUE", "PROGRESS", "LEASE LEFT", "LAST BEAT", "ATTEMPT", "WORKER"],
          frame.running.map((j) => [
            j.id,
            j.task,
            j.queue,
            progressText(j.progressFraction),
            j.leaseLeftMs < 0 ? `expired ${seconds(-j.leaseLeftMs)} ago` : seconds(j.leaseLeftMs),
            `${seconds(j.heartbeatMsAgo)} ago`,
            String(j.attempt),
            j.workerId,
          ]),
        ) + (frame.moreRunning ? `\n(only the ${RUNNING_SHOWN} longest running are shown)` : "");
  const header = `Leasehold  ${frame.at.slice(11, 19)} UTC${once ? "" : `  (every ${seconds(intervalMs)}; Ctrl-C to stop)`}`;
  return `${header}\n\n${queues}${gapsText(frame.withoutHandler)}\n\nRUNNING\n${running}`;
}

/** The last frame, kept up while the source cannot be read, under a line that says so. */
export function renderUnreachable(notice: { at: string; unreachable: string; since: string }, last: WatchFrame, intervalMs: number): string {
  const line =
    `! ${notice.unreachable}\n` +
    `! reconnecting since ${notice.since.slice(11, 19)} UTC (trying every ${seconds(intervalMs)}; Ctrl-C to stop)` +
    `; below: the last frame, from ${last.at.slice(11, 19)} UTC`;
  return `${line}\n\n${render(last, intervalMs, false)}`;
}
