/**
 * `leasehold flows enqueue FILE|-` (a JSON array of nodes) and `leasehold batches enqueue
 * FILE|-` (a JSON object { jobs, onComplete }): a graph of jobs or a batch in one transaction,
 * on the database or through a server (docs/flows.md). The library checks the graph: a bad
 * one is refused whole, with an error naming the node, and nothing is written.
 */
import fs from "node:fs";
import type { Command } from "commander";
import { ValidationError } from "leasehold/internal/errors";
import type { BatchInput, FlowNode } from "leasehold/internal/jobs/flow-graph";
import type { Run } from "../context.js";
import { CliError } from "../errors.js";
import { json, readFile } from "../parse.js";

export function registerFlowCommands(program: Command, run: Run): void {
  program
    .command("flows")
    .description("graphs of jobs that wait for each other (docs/flows.md)")
    .command("enqueue <file>")
    .description(
      "enqueue a graph of jobs in one transaction: a JSON array of nodes { ref, task, payload?, dependsOn?, onParentFailure?, ...options }; - reads stdin",
    )
    .action(
      run(async (cli, file: string) => {
        const nodes = readJson(file);
        if (!Array.isArray(nodes)) throw new CliError(`${describe(file)}: a flow is a JSON array of nodes`);
        const ops = await cli.operations();
        const { jobs } = await ops.enqueueFlow(nodes.map((n, i) => withDates(n, `node ${i}`)) as FlowNode[]);
        const ids = Object.values(jobs);
        cli.result(
          { jobs },
          () =>
            `enqueued a flow of ${ids.length} jobs` +
            (ids.length <= 20
              ? `: ${Object.entries(jobs)
                  .map(([r, id]) => `${r}=${id}`)
                  .join(" ")}`
              : ""),
        );
      }),
    );

  program
    .command("batches")
    .description("sets of jobs with a completion callback (docs/flows.md)")
    .command("enqueue <file>")
    .description("enqueue a batch and its callback in one transaction: a JSON object { jobs: [...], onComplete: { task, ... } }; - reads stdin")
    .action(
      run(async (cli, file: string) => {
        const batch = readJson(file) as Record<string, unknown> | null;
        if (batch === null || typeof batch !== "object" || Array.isArray(batch)) {
          throw new CliError(`${describe(file)}: a batch is a JSON object { jobs, onComplete }`);
        }
        const ops = await cli.operations();
        const input = {
          ...batch,
          ...(Array.isArray(batch.jobs) && { jobs: batch.jobs.map((j, i) => withDates(j, `job ${i}`)) }),
          ...(batch.onComplete !== undefined && { onComplete: withDates(batch.onComplete, "onComplete") }),
        };
        const result = await ops.enqueueBatch(input as BatchInput);
        cli.result(result, () => `enqueued a batch of ${result.jobIds.length} jobs; its callback is job ${result.callbackId}`);
      }),
    );
}

const describe = (file: string) => (file === "-" ? "stdin" : file);

function readJson(file: string): unknown {
  const text = file === "-" ? fs.readFileSync(0, "utf8") : readFile(file, file);
  return json(text, describe(file));
}

/** JSON has no dates: a `runAt` arrives as an ISO string. */
function withDates(job: unknown, where: string): unknown {
  if (job === null || typeof job !== "object" || typeof (job as { runAt?: unknown }).runAt !== "string") return job;
  const runAt = new Date((job as { runAt: string }).runAt);
  if (Number.isNaN(runAt.getTime())) throw new ValidationError(`${where}: runAt must be an ISO 8601 date-time`);
  return { ...job, runAt };
}
