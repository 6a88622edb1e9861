/** `leasehold jobs list|show|cancel|retry|rerun|watch`, `leasehold callbacks complete` and `leasehold stats`. */
import os from "node:os";
import type { Command } from "commander";
import { JOB_STATES } from "leasehold/internal/jobs/types";
import type { Run } from "../context.js";
import { CliError, EXIT } from "../errors.js";
import { jobDetails, jobsTable, statsText } from "../format.js";
import { duration, int, json } from "../parse.js";
import { registerWatch } from "./watch.js";

export function registerJobCommands(program: Command, run: Run): void {
  const jobs = program.command("jobs").description("list, inspect, cancel and retry jobs");

  jobs
    .command("list")
    .description("list jobs, newest first")
    .option("--state <state>", `only jobs in this state (${JOB_STATES.join(", ")})`, (v: string) => {
      if (!JOB_STATES.includes(v as never)) throw new CliError(`--state must be one of ${JOB_STATES.join(", ")} (got ${JSON.stringify(v)})`);
      return v;
    })
    .option("--queue <queue>", "only jobs of this queue")
    .option("--limit <n>", "at most this many (default 50)", int("--limit", 1, 10_000))
    .option("--before <id>", "only jobs older than this id (to continue a list from its last id)")
    .option("--payload", "include each job's payload (left out by default)")
    .action(
      run(async (cli, opts: { state?: string; queue?: string; limit?: number; before?: string; payload?: boolean }) => {
        const lh = await cli.operations();
        const { payload, ...filter } = opts;
        const list = await lh.listJobs({ ...filter, includePayload: payload ?? false });
        cli.result(list, () => jobsTable(list));
      }),
    );

  jobs
    .command("show <id>")
    .description("a job's record (with its result), its attempt history, its parents and children, its durable steps and what it waits for")
    .action(
      run(async (cli, id: string) => {
        const lh = await cli.operations();
        const { job, attempts, steps, stepCount, wait, ...relations } = await lh.getJob(id);
        cli.result({ job, attempts, ...relations, steps, stepCount, wait }, () => jobDetails(job, attempts, relations, { steps, stepCount, wait }));
      }),
    );

  jobs
    .command("wait <id>")
    .description(
      "wait until a job finishes and print its record (with its result). Exit 0: succeeded; 6: dead or cancelled; " +
        "7: not finished within --timeout; 3: no such job",
    )
    .option("--timeout <duration>", "give up after this long, e.g. 30s or 5m (default: wait as long as it takes)", duration("--timeout"))
    .action(
      run(async (cli, id: string, opts: { timeout?: number }) => {
        const lh = await cli.operations();
        const job = await lh.waitFor(id, { timeoutMs: opts.timeout });
        cli.result(
          job,
          () => `job ${id} ${job.state}` + (job.state === "succeeded" ? `; result: ${JSON.stringify(job.result)}` : `: ${job.lastError ?? "-"}`),
        );
        if (job.state !== "succeeded") process.exitCode = EXIT.jobFailed;
      }),
    );

  jobs
    .command("cancel <id>")
    .description("cancel a job: a waiting or blocked one ends now, a running one has its handler aborted at once")
    .action(
      run(async (cli, id: string) => {
        const lh = await cli.operations();
        const result = await lh.cancel(id);
        cli.result({ id, result }, () =>
          result === "cancelled" ? `job ${id} cancelled` : `cancel requested for running job ${id}: its handler is aborted now`,
        );
      }),
    );

  jobs
    .command("retry <id>")
    .description("move a dead or cancelled job back to waiting with a fresh retry budget")
    .action(
      run(async (cli, id: string) => {
        const lh = await cli.operations();
        await lh.retry(id);
        cli.result({ id, result: "retried" }, () => `job ${id} is waiting again with a fresh retry budget`);
      }),
    );

  jobs
    .command("rerun <id>")
    .description(
      "re-run a finished or dead durable job from a recorded step: the steps before it keep their records (and replay), " +
        "it and those after run again; the job's re-runs (jobs show) keep the records dropped",
    )
    .requiredOption("--from-step <name>", "the recorded step to run again from")
    .option("--occurrence <n>", "which call of that name, from 0 (a step in a loop; default 0)", int("--occurrence", 0, 100_000))
    .action(
      run(async (cli, id: string, opts: { fromStep: string; occurrence?: number }) => {
        const lh = await cli.operations();
        const rerun = await lh.rerunFromStep(id, opts.fromStep, { occurrence: opts.occurrence, requestedBy: `cli (${userName()})` });
        cli.result(
          rerun,
          () =>
            `job ${id} is waiting again from step "${rerun.fromStep}" (place ${rerun.fromSeq}); ` +
            `${rerun.stepsDropped} step record(s) dropped and kept in its re-runs`,
        );
      }),
    );

  registerWatch(jobs, run);

  program
    .command("callbacks")
    .description("complete the callbacks durable jobs wait for (ctx.callback)")
    .command("complete <token> [json]")
    .description("complete a callback's wait with JSON data (default null); once per token")
    .action(
      run(async (cli, token: string, data: string | undefined) => {
        const lh = await cli.operations();
        await lh.completeCallback(token, data === undefined ? null : json(data, "the callback data"));
        cli.result({ result: "completed" }, () => "callback completed: its job resumes with the data");
      }),
    );

  program
    .command("stats")
    .description("job counts by queue and state, active leases, the oldest waiting job")
    .action(
      run(async (cli) => {
        const lh = await cli.operations();
        const stats = await lh.stats();
        cli.result(stats, () => statsText(stats));
      }),
    );
}

/** Who ran the command, for a re-run's audit trail. */
function userName(): string {
  try {
    return os.userInfo().username;
  } catch {
    return "unknown user";
  }
}
