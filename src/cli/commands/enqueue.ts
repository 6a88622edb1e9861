/**
 * `leasehold enqueue TASK`: one job, or with --payloads a JSON-lines file (or `-` for stdin)
 * of payloads, one job per line, inserted in batches of ENQUEUE_CHUNK (REMOTE_ENQUEUE_BATCH
 * through a server). Each batch is one
 * INSERT and every line of it is checked before it is sent, so a bad line stops the import
 * with its line number and nothing of its batch is written (earlier batches are).
 */
import fs from "node:fs";
import readline from "node:readline";
import type { Command } from "commander";
import { ENQUEUE_CHUNK } from "../../client.js";
import { LeaseholdError } from "../../errors.js";
import type { EnqueueOptions, NewJob } from "../../jobs/types.js";
import { checkName, serializePayload } from "../../jobs/validate.js";
import type { Cli, Run } from "../context.js";
import { RemoteOperations, REMOTE_ENQUEUE_BATCH } from "../remote-operations.js";
import { CliError } from "../errors.js";
import { duration, int, isoDate, json, readFile } from "../parse.js";

interface EnqueueFlags {
  payload?: string;
  payloadFile?: string;
  payloads?: string;
  queue?: string;
  priority?: number;
  delay?: number;
  runAt?: Date;
  maxAttempts?: number;
  uniqueKey?: string;
  lease?: number;
}

export function registerEnqueue(program: Command, run: Run): void {
  program
    .command("enqueue <task>")
    .description("enqueue a job (or many with --payloads)")
    .option("--payload <json>", "the job's payload as JSON (default {})")
    .option("--payload-file <file>", "read the payload (JSON) from a file")
    .option("--payloads <file.jsonl>", "one job per line of JSON payloads; - reads stdin")
    .option("--queue <queue>", "queue name (default: default)")
    .option("--priority <n>", "lower runs first (default 0)", int("--priority", -32768, 32767))
    .option("--delay <duration>", "run no earlier than this from now, e.g. 30s, 5m", duration("--delay"))
    .option("--run-at <iso>", "run no earlier than this moment", isoDate("--run-at"))
    .option("--max-attempts <n>", "attempts before the job is dead (default 25)", int("--max-attempts", 1, 1000))
    .option("--unique-key <key>", "while an unfinished job has this key, return it instead of enqueueing again")
    .option("--lease <duration>", "this job's lease (default: the worker's)", duration("--lease"))
    .action(
      run(async (cli, task: string, flags: EnqueueFlags) => {
        checkName(task, "task");
        if (flags.queue !== undefined) checkName(flags.queue, "--queue");
        const sources = [flags.payload, flags.payloadFile, flags.payloads].filter((s) => s !== undefined).length;
        if (sources > 1) throw new CliError("give one of --payload, --payload-file or --payloads");
        if (flags.delay !== undefined && flags.runAt !== undefined) throw new CliError("give --delay or --run-at, not both");
        if (flags.payloads !== undefined && flags.uniqueKey !== undefined) throw new CliError("--unique-key applies to one job; it cannot be used with --payloads");
        const options: EnqueueOptions = {
          ...(flags.queue !== undefined && { queue: flags.queue }),
          ...(flags.priority !== undefined && { priority: flags.priority }),
          ...(flags.delay !== undefined && { delayMs: flags.delay }),
          ...(flags.runAt !== undefined && { runAt: flags.runAt }),
          ...(flags.maxAttempts !== undefined && { maxAttempts: flags.maxAttempts }),
          ...(flags.uniqueKey !== undefined && { uniqueKey: flags.uniqueKey }),
          ...(flags.lease !== undefined && { leaseMs: flags.lease }),
        };
        if (flags.payloads !== undefined) return enqueueLines(cli, task, options, flags.payloads);
        const payload =
          flags.payload !== undefined
            ? json(flags.payload, "--payload")
            : flags.payloadFile !== undefined
              ? json(readFile(flags.payloadFile, "--payload-file"), `--payload-file ${flags.payloadFile}`)
              : {};
        const lh = await cli.operations();
        const job = await lh.enqueue(task, payload, options);
        cli.result(job, () =>
          job.created ? `enqueued job ${job.id} (${task})` : `job ${job.id} with unique key ${JSON.stringify(flags.uniqueKey)} is unfinished; not enqueued again`,
        );
      }),
    );
}

async function enqueueLines(cli: Cli, task: string, options: EnqueueOptions, file: string): Promise<void> {
  let input: NodeJS.ReadableStream;
  if (file === "-") input = process.stdin;
  else {
    if (!fs.existsSync(file)) throw new CliError(`--payloads: cannot read ${file} (ENOENT)`);
    input = fs.createReadStream(file, "utf8");
  }
  const lh = await cli.operations();
  // One batch is one INSERT (or one API request), so it is written whole or not at all.
  const batchSize = lh instanceof RemoteOperations ? REMOTE_ENQUEUE_BATCH : ENQUEUE_CHUNK;
  const lines = readline.createInterface({ input, crlfDelay: Infinity });
  let batch: NewJob[] = [];
  let batchFirstLine = 0;
  let enqueued = 0;
  let created = 0;
  let lineNo = 0;
  const flush = async () => {
    if (batch.length === 0) return;
    let jobs;
    try {
      jobs = await lh.enqueueMany(batch);
    } catch (err) {
      // Checked line by line already; what is left is a job option (e.g. a bad --queue).
      if (err instanceof LeaseholdError) throw new CliError(`${err.message.replace(/^job \d+: /, "")}; nothing was enqueued from lines ${batchFirstLine}-${lineNo}`);
      throw err;
    }
    enqueued += jobs.length;
    created += jobs.filter((j) => j.created).length;
    batch = [];
  };
  try {
    for await (const line of lines) {
      lineNo++;
      if (line.trim() === "") continue;
      if (batch.length === 0) batchFirstLine = lineNo;
      let payload: unknown;
      try {
        payload = JSON.parse(line);
        serializePayload(payload, "payload");
      } catch (err) {
        const why = err instanceof SyntaxError ? `invalid JSON (${err.message})` : (err as Error).message;
        throw new CliError(
          `line ${lineNo}: ${why}; nothing was enqueued from lines ${batchFirstLine}-${lineNo}` + (enqueued > 0 ? ` (${enqueued} jobs from earlier lines were)` : ""),
        );
      }
      batch.push({ ...options, task, payload });
      if (batch.length >= batchSize) await flush();
    }
    await flush();
  } finally {
    lines.close();
  }
  cli.result({ enqueued, created }, () => `enqueued ${enqueued} jobs (${task})` + (created < enqueued ? `, ${enqueued - created} already existed` : ""));
}
