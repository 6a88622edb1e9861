/**
 * `leasehold worker`'s line per job start and end: every line still printed, written together
 * once per turn of the event loop rather than one write each (two writes per no-op job were
 * ~28 % of its CPU), and a failure's line written at once, after those before it.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { EventEmitter } from "node:events";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { bufferedLines } from "../packages/cli/src/cli/line-buffer.js";
import { printJobEvents } from "../packages/cli/src/cli/job-events.js";
import type { Worker } from "../packages/leasehold/src/worker/worker.js";
import type { ClaimedJob } from "../packages/leasehold/src/jobs/types.js";
import { eventually, freshLeasehold } from "./helpers/db.js";
import { startCli } from "./helpers/cli.js";

const COUNT_WRITES = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "helpers", "count-stdout-writes.mjs");
const turn = () => new Promise((r) => setImmediate(r));

test("leasehold worker prints a line per job start and end, in far fewer writes than lines", async (t) => {
  const lh = await freshLeasehold(t);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-tasks-"));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const tasksFile = path.join(dir, "tasks.mjs");
  fs.writeFileSync(tasksFile, "export default { noop: () => {} };\n");
  const jobs = await lh.enqueueMany(Array.from({ length: 200 }, () => ({ task: "noop", payload: {} })));
  const worker = await startCli(["worker", "--tasks", tasksFile, "--concurrency", "50", "--no-watchdog"], {
    schema: lh.schema,
    env: { NODE_OPTIONS: `--import ${COUNT_WRITES}` },
    ready: /running noop/,
  });
  t.after(() => void worker.stop("SIGKILL"));
  await eventually(async () => (worker.output().match(/ succeeded in /g) ?? []).length === jobs.length, "every job's success line", 30_000);
  const stopped = await worker.stop("SIGTERM");
  assert.equal(stopped.code, 0, stopped.stderr);
  for (const { id } of jobs) {
    assert.match(stopped.stdout, new RegExp(`▶ job ${id} noop started \\(attempt 1 of \\d+\\)\\n`));
    assert.match(stopped.stdout, new RegExp(`✔ job ${id} noop succeeded in \\d+\\.\\ds\\n`));
  }
  const lines = stopped.stdout.split("\n").length - 1;
  const writes = Number(/stdout writes: (\d+)/.exec(stopped.stderr)?.[1]);
  assert.ok(lines > 2 * jobs.length, `${lines} lines`);
  // One write per turn of the event loop: a claim's starts together, a report batch's ends together.
  assert.ok(writes < lines / 4, `${writes} writes for ${lines} lines`);
});

test("buffered job lines: a turn's lines go out in one write; a failure's line at once, after the lines before it", async () => {
  const writes: string[] = [];
  const out = bufferedLines((chunk) => writes.push(chunk));
  out.line("a");
  out.line("b");
  assert.deepEqual(writes, []);
  await turn();
  assert.deepEqual(writes, ["a\nb\n"]);
  out.line("c");
  out.urgent("! failed");
  assert.deepEqual(writes, ["a\nb\n", "c\n! failed\n"]);
  out.line("d");
  out.flush(); // what the process's exit does

  assert.deepEqual(writes, ["a\nb\n", "c\n! failed\n", "d\n"]);
});

test("job lines: a success waits for the turn's write; a failure, a lost lease or a failed report is printed at once", () => {
  const worker = new EventEmitter() as unknown as Worker;
  const later: string[] = [];
  const now: string[] = [];
  printJobEvents(
    worker,
    (l) => later.push(l),
    false,
    (l) => now.push(l),
  );
  const job = { id: "7", task: "t", queue: "default", attempt: 1, spentAttempts: 0, maxAttempts: 3 } as ClaimedJob;
  worker.emit("job:start", job);
  worker.emit("job:end", job, { state: "succeeded" });
  worker.emit("job:end", job, { state: "waiting" });
  worker.emit("job:end", job, { state: "lost", reason: "renewal_failed" });
  worker.emit("job:end", job, { state: "report_failed", error: new Error("x") });
  assert.deepEqual(
    later.map((l) => l.slice(0, 12)),
    ["▶ job 7 t st", "✔ job 7 t su"],
  );
  assert.equal(now.length, 3);
  assert.match(now[0]!, /failed after/);
  assert.match(now[1]!, /stopped: renewal_failed/);
  assert.match(now[2]!, /could not report/);
});
