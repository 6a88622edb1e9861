/**
 * `leasehold enqueue TASK`: one job, or with --payloads a JSON-lines file (or `-` for stdin)
 * of payloads, one job per line. On the database the import is one transaction, written in
 * batches of ENQUEUE_CHUNK: a bad line stops it with its line number and nothing is written.
 * Through a server, batches of REMOTE_ENQUEUE_BATCH are committed one by one: a bad line
 * stops the import and the error says exactly how many jobs were committed before it.
 */
import fs from "node:fs";
import readline from "node:readline";
import type { Command } from "commander";
import { ENQUEUE_CHUNK, type Leasehold } from "leasehold/internal/client";
import { LeaseholdError } from "leasehold/internal/errors";
import {
  ON_DUPLICATE_MODES,
  UNIQUE_SCOPES,
  type EnqueuedJob,
  type EnqueueOptions,
  type EnqueueWarning,
  type NewJob,
  type OnDuplicate,
  type UniqueScope,
} from "leasehold/internal/jobs/types";
import { checkName, checkRunAt, serializePayload } from "leasehold/internal/jobs/validate";
import type { Cli, Run } from "../context.js";
import { RemoteOperations, REMOTE_ENQUEUE_BATCH } from "../remote-operations.js";
import { CliError, describeFailure, EXIT } from "../errors.js";
import { withTransaction } from "leasehold/internal/store/db";
import { duration, int, isoDate, json, limitOrNone, noneAsNull, readFile } from "../parse.js";
import { printWarnings, unknownTasksOption, useUnknownTasks } from "../unknown-tasks.js";

interface EnqueueFlags {
  nats?: string;
  payload?: string;
  payloadFile?: string;
  payloads?: string;
  queue?: string;
  priority?: number;
  delay?: number;
  runAt?: Date;
  maxAttempts?: number;
  uniqueKey?: string;
  onDuplicate?: string;
  uniqueScope?: string;
  key?: string;
  lease?: number;
  maxRun?: number | "none";
  unknownTasks?: string;
}

export function registerEnqueue(program: Command, run: Run): void {
  const command = program
    .command("enqueue <task>")
    .description("enqueue a job (or many with --payloads)")
    .option("--payload <json>", "the job's payload as JSON (default {})")
    .option("--payload-file <file>", "read the payload (JSON) from a file")
    .option("--payloads <file.jsonl>", "one job per line of JSON payloads; - reads stdin")
    .option("--queue <queue>", "queue name (default: default)")
    .option("--nats <url>", "NATS JetStream dispatch (docs/nats.md), e.g. nats://127.0.0.1:4222 (default: LEASEHOLD_NATS_URL; none: polling only)")
    .option("--priority <n>", "lower runs first (default 0)", int("--priority", -32768, 32767))
    .option("--delay <duration>", "run no earlier than this from now, e.g. 30s, 5m", duration("--delay"))
    .option("--run-at <iso>", "run no earlier than this moment", isoDate("--run-at"))
    .option("--max-attempts <n>", "attempts before the job is dead (default 25)", int("--max-attempts", 1, 1000))
    .option("--unique-key <key>", "while an unfinished job has this key, return it instead of enqueueing again")
    .option(
      "--on-duplicate <mode>",
      "with --unique-key, when an unfinished job holds the key: keep (default), replace (its payload and run time; a running one loses the key), replace_payload (keeps its time), cancel_running (as replace, and cancels a running one)",
    )
    .option(
      "--unique-scope <scope>",
      "with --unique-key, which holder of the key is a duplicate: task (default, one of the same task), queue (one in the same queue), global (any)",
    )
    .option("--key <key>", "the job's flow-control key (a tenant, a customer): the queue's per-key limits count it, and keys take turns")
    .option("--lease <duration>", "this job's lease (default: the worker's)", duration("--lease"))
    .option(
      "--max-run <duration|none>",
      "end an attempt that runs longer than this, e.g. 2h; none: no limit (default: the task's, 15m unless it sets another)",
      limitOrNone("--max-run"),
    );
  unknownTasksOption(command).action(
    run(async (cli, task: string, flags: EnqueueFlags) => {
      cli.useNats(flags.nats);
      useUnknownTasks(cli, flags.unknownTasks);
      checkName(task, "task");
      if (flags.queue !== undefined) checkName(flags.queue, "--queue");
      const sources = [flags.payload, flags.payloadFile, flags.payloads].filter((s) => s !== undefined).length;
      if (sources > 1) throw new CliError("give one of --payload, --payload-file or --payloads");
      if (flags.delay !== undefined && flags.runAt !== undefined) throw new CliError("give --delay or --run-at, not both");
      if (flags.runAt !== undefined) checkRunAt(flags.runAt, "--run-at");
      if (flags.payloads !== undefined && flags.uniqueKey !== undefined)
        throw new CliError("--unique-key applies to one job; it cannot be used with --payloads");
      if (flags.onDuplicate !== undefined) {
        if (!ON_DUPLICATE_MODES.includes(flags.onDuplicate as OnDuplicate)) {
          throw new CliError(`--on-duplicate must be one of ${ON_DUPLICATE_MODES.join(", ")} (got ${JSON.stringify(flags.onDuplicate)})`);
        }
        if (flags.uniqueKey === undefined)
          throw new CliError("--on-duplicate needs --unique-key (it says what to do when an unfinished job holds the key)");
      }
      if (flags.uniqueScope !== undefined) {
        if (!UNIQUE_SCOPES.includes(flags.uniqueScope as UniqueScope)) {
          throw new CliError(`--unique-scope must be one of ${UNIQUE_SCOPES.join(", ")} (got ${JSON.stringify(flags.uniqueScope)})`);
        }
        if (flags.uniqueKey === undefined) throw new CliError("--unique-scope needs --unique-key (it says which job holding the key is a duplicate)");
      }
      const options: EnqueueOptions = {
        ...(flags.queue !== undefined && { queue: flags.queue }),
        ...(flags.priority !== undefined && { priority: flags.priority }),
        ...(flags.delay !== undefined && { delayMs: flags.delay }),
        ...(flags.runAt !== undefined && { runAt: flags.runAt }),
        ...(flags.maxAttempts !== undefined && { maxAttempts: flags.maxAttempts }),
        ...(flags.uniqueKey !== undefined && { uniqueKey: flags.uniqueKey }),
        ...(flags.onDuplicate !== undefined && { onDuplicate: flags.onDuplicate as OnDuplicate }),
        ...(flags.uniqueScope !== undefined && { uniqueScope: flags.uniqueScope as UniqueScope }),
        ...(flags.key !== undefined && { key: flags.key }),
        ...(flags.lease !== undefined && { leaseMs: flags.lease }),
        ...(flags.maxRun !== undefined && { maxRunMs: noneAsNull(flags.maxRun) }),
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
      cli.result(job, () => describeEnqueued(job, task, flags));
      printWarnings(cli, job.warnings);
    }),
  );
}

function describeEnqueued(job: EnqueuedJob, task: string, flags: EnqueueFlags): string {
  const key = JSON.stringify(flags.uniqueKey);
  const cancelled = job.cancelled !== undefined ? `; cancel requested for running job ${job.cancelled}, which held unique key ${key}` : "";
  if (job.created) return `enqueued job ${job.id} (${task})${cancelled}`;
  if (job.replaced) {
    const what = flags.onDuplicate === "replace_payload" ? "payload" : "payload and run time";
    return `job ${job.id} with unique key ${key} is unfinished; its ${what} replaced${cancelled}`;
  }
  return `job ${job.id} with unique key ${key} is unfinished; not enqueued again`;
}

async function enqueueLines(cli: Cli, task: string, options: EnqueueOptions, file: string): Promise<void> {
  let input: NodeJS.ReadableStream;
  if (file === "-") input = process.stdin;
  else {
    if (!fs.existsSync(file)) throw new CliError(`--payloads: cannot read ${file} (ENOENT)`);
    input = fs.createReadStream(file, "utf8");
  }
  const ops = await cli.operations();
  if (ops instanceof RemoteOperations) return enqueueLinesRemotely(cli, ops, task, options, input);
  // On the database the whole import is one transaction: a bad line, or any failure, leaves
  // nothing of the file behind.
  const lh = ops as Leasehold;
  const counts = await withTransaction(lh.pool, (client) =>
    readBatches(
      input,
      task,
      options,
      ENQUEUE_CHUNK,
      (batch) => lh.enqueueMany(batch, { db: client }),
      (line, why) => `line ${line}: ${why}; nothing was enqueued`,
    ),
  );
  printCounts(cli, task, counts);
}

/**
 * Through a server each batch is its own request, committed on its own: a failure says
 * exactly how many jobs were committed before it.
 */
async function enqueueLinesRemotely(
  cli: Cli,
  ops: RemoteOperations,
  task: string,
  options: EnqueueOptions,
  input: NodeJS.ReadableStream,
): Promise<void> {
  let committed = 0;
  let committedThrough = 0;
  const counts = await readBatches(
    input,
    task,
    options,
    REMOTE_ENQUEUE_BATCH,
    async (batch, lastLine) => {
      const jobs = await ops.enqueueMany(batch);
      committed += jobs.length;
      committedThrough = lastLine;
      return jobs;
    },
    (line, why) =>
      `line ${line}: ${why}; ` +
      (committed > 0 ? `${committed} jobs from lines 1-${committedThrough} were enqueued before it, nothing after` : "nothing was enqueued"),
  );
  printCounts(cli, task, counts);
}

interface Counts {
  enqueued: number;
  created: number;
  warnings?: EnqueueWarning[];
}

/**
 * Reads JSON lines into batches of jobs and hands each to `write`; a bad line, or a batch
 * `write` refuses, stops the import with an error `explain` words (line number and why).
 */
async function readBatches(
  input: NodeJS.ReadableStream,
  task: string,
  options: EnqueueOptions,
  batchSize: number,
  write: (batch: NewJob[], lastLine: number) => Promise<EnqueuedJob[]>,
  explain: (line: string, why: string) => string,
): Promise<Counts> {
  const lines = readline.createInterface({ input, crlfDelay: Infinity });
  const counts: Counts = { enqueued: 0, created: 0 };
  let batch: NewJob[] = [];
  let batchFirstLine = 0;
  let lineNo = 0;
  const flush = async () => {
    if (batch.length === 0) return;
    let jobs: EnqueuedJob[];
    try {
      jobs = await write(batch, lineNo);
    } catch (err) {
      // Lines were checked one by one already; what is left is a job option (e.g. a bad
      // --queue) or the database or server refusing the batch.
      const why = err instanceof LeaseholdError ? err.message.replace(/^job \d+: /, "") : describeFailure(err).message;
      throw new CliError(explain(`${batchFirstLine}-${lineNo}`, why), err instanceof LeaseholdError ? EXIT.usage : describeFailure(err).exitCode);
    }
    counts.enqueued += jobs.length;
    counts.created += jobs.filter((j) => j.created).length;
    // One task per import: its warning (if any) is the same for every job.
    const warned = jobs.find((j) => j.warnings)?.warnings;
    if (warned && !counts.warnings) counts.warnings = warned;
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
        serializePayload(payload, "");
      } catch (err) {
        throw new CliError(explain(String(lineNo), err instanceof SyntaxError ? `invalid JSON (${err.message})` : (err as Error).message));
      }
      batch.push({ ...options, task, payload });
      if (batch.length >= batchSize) await flush();
    }
    await flush();
  } finally {
    lines.close();
  }
  return counts;
}

function printCounts(cli: Cli, task: string, { enqueued, created, warnings }: Counts): void {
  cli.result(
    { enqueued, created, ...(warnings && { warnings }) },
    () => `enqueued ${enqueued} jobs (${task})` + (created < enqueued ? `, ${enqueued - created} already existed` : ""),
  );
  printWarnings(cli, warnings);
}
