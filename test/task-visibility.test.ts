/**
 * Jobs no worker can run are visible at once: enqueue of a task no worker announced warns
 * (or, in strict mode, is refused with the closest known name), and the waiting jobs no live
 * worker runs show in stats, `jobs watch`, the dashboard's overview, a metric and `doctor`.
 * Real workers announce their tasks; through the library, the CLI and the HTTP API.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { setTimeout as sleep } from "node:timers/promises";
import { Registry } from "prom-client";
import { ConfigError, Leasehold, NoWorkerForTaskError, type Worker } from "../packages/leasehold/src/index.js";
import { MISS_REFRESH_MS } from "../packages/leasehold/src/jobs/known-tasks.js";
import { databaseUrl, eventually, freshLeasehold, silent } from "./helpers/db.js";
import { runCli } from "./helpers/cli.js";
import { api, startServe, TOKEN } from "./helpers/server.js";

let lh: Awaited<ReturnType<typeof freshLeasehold>>;
let resizer: Worker;

/** A second client on the same schema, with its own check mode. */
async function client(unknownTasks?: "warn" | "refuse" | "allow"): Promise<Leasehold> {
  const c = await Leasehold.connect({ databaseUrl: databaseUrl(), schema: lh.schema, logger: silent, metricsRegistry: new Registry(), unknownTasks });
  return c;
}

const waitingOf = async (task: string) =>
  (await lh.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM jobs WHERE task = $1", [task])).rows[0]!.n;

before(async () => {
  lh = await freshLeasehold();
  // A real worker that announces it runs "resize" in queue "images" (and nothing else).
  resizer = lh.worker({ queues: ["images"], watchdog: false, scheduler: false, handlers: { resize: async () => {} } });
  await resizer.start();
});

after(async () => {
  await resizer.stop();
  await lh.dispose();
});

test("library: enqueue of a task no worker runs warns in the returned job, with the closest known name; a known task does not", async () => {
  const typo = await lh.enqueue("reszie", {}, { queue: "images" });
  assert.equal(typo.created, true);
  assert.equal(typo.warnings?.length, 1);
  assert.equal(typo.warnings[0]!.code, "unknown_task");
  assert.equal(typo.warnings[0]!.task, "reszie");
  assert.equal(typo.warnings[0]!.didYouMean, "resize");
  assert.match(typo.warnings[0]!.message, /task "reszie".*did you mean "resize"\?/);

  const known = await lh.enqueue("resize", {}, { queue: "images" });
  assert.equal(known.warnings, undefined);

  // The task is known, but its workers take other queues.
  const wrongQueue = await lh.enqueue("resize", {}, { queue: "image" });
  assert.equal(wrongQueue.warnings?.[0]?.code, "task_not_in_queue");
  assert.equal(wrongQueue.warnings?.[0]?.didYouMean, "images");

  // A batch: only the jobs of the unknown task carry the warning.
  const batch = await lh.enqueueMany([
    { task: "resize", queue: "images" },
    { task: "reszie", queue: "images" },
  ]);
  assert.equal(batch[0]!.warnings, undefined);
  assert.equal(batch[1]!.warnings?.[0]?.code, "unknown_task");

  // A schedule of an unknown task warns the same way.
  const schedule = await lh.schedule({ name: "typo-nightly", cron: "0 3 * * *", task: "reszie", queue: "images" });
  assert.equal(schedule.warnings?.[0]?.didYouMean, "resize");
  await lh.unschedule("typo-nightly");
});

test("library: strict mode refuses the enqueue, names the task and the closest known one, and writes nothing; allow checks nothing", async (t) => {
  const strict = await client("refuse");
  t.after(() => strict.close());
  const before = await waitingOf("reszie");
  await assert.rejects(strict.enqueue("reszie", {}, { queue: "images" }), (err: unknown) => {
    assert.ok(err instanceof NoWorkerForTaskError);
    assert.equal(err.code, "no_worker_for_task");
    assert.equal(err.task, "reszie");
    assert.match(err.message, /task "reszie".*did you mean "resize"\?.*nothing was enqueued/);
    return true;
  });
  // A batch is all or nothing: the known job beside it is not written either.
  await assert.rejects(
    strict.enqueueMany([
      { task: "resize", queue: "images" },
      { task: "reszie", queue: "images" },
    ]),
    /^NoWorkerForTaskError: job 1: refused/,
  );
  assert.equal(await waitingOf("reszie"), before);
  assert.equal((await strict.enqueue("resize", {}, { queue: "images" })).warnings, undefined);

  const allow = await client("allow");
  t.after(() => allow.close());
  assert.equal((await allow.enqueue("reszie", {}, { queue: "images" })).warnings, undefined);

  await assert.rejects(
    Leasehold.connect({ databaseUrl: databaseUrl(), schema: lh.schema, logger: silent, unknownTasks: "strict" as never }),
    (err: unknown) => err instanceof ConfigError && /unknownTasks must be one of warn, refuse, allow/.test(err.message),
  );
});

test("library: once a worker of the task starts, its enqueue no longer warns or is refused, and its jobs leave the without-handler list", async (t) => {
  const task = "transcode";
  const strict = await client("refuse");
  t.after(() => strict.close());
  assert.equal((await lh.enqueue(task)).warnings?.[0]?.code, "unknown_task");
  await assert.rejects(strict.enqueue(task), NoWorkerForTaskError);

  const gap = (await lh.stats()).withoutHandler.find((g) => g.task === task);
  assert.deepEqual(gap && { queue: gap.queue, waiting: gap.waiting, scheduled: gap.scheduled }, { queue: "default", waiting: 1, scheduled: 0 });

  const transcoder = lh.worker({ watchdog: false, scheduler: false, handlers: { [task]: async () => {} } });
  await transcoder.start();
  t.after(() => transcoder.stop());
  // A task not found is looked up again at most once a second.
  await sleep(MISS_REFRESH_MS + 100);
  assert.equal((await lh.enqueue(task)).warnings, undefined);
  assert.equal((await strict.enqueue(task)).warnings, undefined);
  await eventually(async () => !(await lh.stats()).withoutHandler.some((g) => g.task === task), "transcode jobs handled");
});

test("stats, the watchdog's metric and `doctor` show waiting jobs no live worker runs; doctor exits non-zero", async () => {
  await lh.enqueueMany([
    { task: "thumbnial", queue: "images" },
    { task: "thumbnial", queue: "images", delayMs: 3_600_000 },
    { task: "reszie", queue: "images" },
    { task: "resize", queue: "image" },
    { task: "resize", queue: "images", delayMs: 3_600_000 },
  ]);
  const stats = await lh.stats();
  const gap = stats.withoutHandler.find((g) => g.task === "thumbnial")!;
  assert.equal(gap.queue, "images");
  assert.equal(gap.waiting, 1);
  assert.equal(gap.scheduled, 1);
  assert.equal(gap.didYouMeanTask, null); // nothing close among the known tasks
  const reszie = stats.withoutHandler.find((g) => g.task === "reszie")!;
  assert.equal(reszie.didYouMeanTask, "resize");
  // Jobs whose task a live worker runs in their queue are not listed.
  assert.ok(!stats.withoutHandler.some((g) => g.task === "resize" && g.queue === "images"));
  assert.ok(stats.withoutHandler.some((g) => g.task === "resize" && g.queue === "image" && g.didYouMeanQueue === "images"));

  await lh.watchdog().runOnce();
  const metric = await lh.metrics.registry.getSingleMetric("leasehold_jobs_without_handler")!.get();
  const value = (task: string, queue: string) => metric.values.find((v) => v.labels.task === task && v.labels.queue === queue)?.value;
  assert.equal(value("thumbnial", "images"), 2);
  assert.equal(value("resize", "images"), undefined);

  const doctor = await runCli(["doctor", "--json"], { schema: lh.schema });
  assert.equal(doctor.code, 1, doctor.stderr);
  const findings: { level: string; message: string }[] = JSON.parse(doctor.stdout).findings;
  assert.ok(
    findings.some(
      (f) => f.level === "error" && /1 ready, 1 scheduled job\(s\) of task "thumbnial" in queue "images": no live worker/.test(f.message),
    ),
    JSON.stringify(findings),
  );
  assert.ok(findings.some((f) => f.level === "error" && /task "reszie".*did you mean task "resize"/.test(f.message)));
});

test("CLI: enqueue and schedules add warn on stderr (and in --json); --unknown-tasks refuse and LEASEHOLD_UNKNOWN_TASKS refuse exit 2; stats and jobs watch list the jobs", async () => {
  const schema = lh.schema;
  const warned = await runCli(["enqueue", "reszie", "--queue", "images"], { schema });
  assert.equal(warned.code, 0, warned.stderr);
  assert.match(warned.stdout, /^enqueued job \d+ \(reszie\)/);
  assert.match(warned.stderr, /^warning: no worker seen in the last 24 h handles task "reszie".*\(did you mean "resize"\?\)$/m);

  const json = await runCli(["enqueue", "reszie", "--queue", "images", "--json"], { schema });
  assert.equal(JSON.parse(json.stdout).warnings[0].didYouMean, "resize");

  const quiet = await runCli(["enqueue", "resize", "--queue", "images"], { schema });
  assert.equal(quiet.code, 0, quiet.stderr);
  assert.doesNotMatch(quiet.stderr, /warning/);

  const lines = await runCli(["enqueue", "reszie", "--queue", "images", "--payloads", "-"], { schema, input: "{}\n{}\n" });
  assert.equal(lines.code, 0, lines.stderr);
  assert.equal(lines.stderr.match(/^warning: /gm)?.length, 1);

  const before = await waitingOf("reszie");
  const refused = await runCli(["enqueue", "reszie", "--queue", "images", "--unknown-tasks", "refuse"], { schema });
  assert.equal(refused.code, 2);
  assert.match(refused.stderr, /refused: no worker seen in the last 24 h handles task "reszie".*did you mean "resize"/);
  const byEnv = await runCli(["enqueue", "reszie", "--queue", "images"], { schema, env: { LEASEHOLD_UNKNOWN_TASKS: "refuse" } });
  assert.equal(byEnv.code, 2, byEnv.stderr);
  assert.equal(await waitingOf("reszie"), before);
  const badMode = await runCli(["enqueue", "reszie", "--unknown-tasks", "never"], { schema });
  assert.equal(badMode.code, 2);
  assert.match(badMode.stderr, /--unknown-tasks must be one of warn, refuse, allow/);

  const schedule = await runCli(["schedules", "add", "typo", "--cron", "0 3 * * *", "--task", "reszie", "--queue", "images"], { schema });
  assert.equal(schedule.code, 0, schedule.stderr);
  assert.match(schedule.stderr, /^warning: .*task "reszie".*did you mean "resize"/m);
  const strictSchedule = await runCli(
    ["schedules", "add", "typo2", "--cron", "0 3 * * *", "--task", "reszie", "--queue", "images", "--unknown-tasks", "refuse"],
    { schema },
  );
  assert.equal(strictSchedule.code, 2, strictSchedule.stderr);
  assert.equal((await lh.listSchedules()).filter((s) => s.name === "typo2").length, 0);
  await lh.unschedule("typo");

  const stats = await runCli(["stats"], { schema });
  assert.match(stats.stdout, /NO WORKER CAN RUN THESE/);
  assert.match(
    stats.stdout,
    /job\(s\) of task "reszie" in queue "images": no live worker runs this task in this queue \(did you mean task "resize"\?\)/,
  );
  const watch = await runCli(["jobs", "watch", "--once"], { schema });
  assert.equal(watch.code, 0, watch.stderr);
  assert.match(watch.stdout, /NO WORKER CAN RUN THESE[\s\S]*task "reszie" in queue "images"/);
  const watchJson = JSON.parse((await runCli(["jobs", "watch", "--once", "--json"], { schema })).stdout);
  assert.ok(watchJson.withoutHandler.some((g: { task: string }) => g.task === "reszie"));
});

test("HTTP: enqueue answers carry warnings; a server started with --unknown-tasks refuse answers 400; stats and the dashboard's overview list the jobs", async (t) => {
  const serve = await startServe(lh.schema);
  t.after(() => serve.stop("SIGTERM"));
  const base = serve.match[1]!;

  const one = await api(base, "POST", "/v1/jobs", { task: "reszie", queue: "images" });
  assert.equal(one.status, 201, one.text);
  assert.equal(one.json.warnings[0].code, "unknown_task");
  assert.equal(one.json.warnings[0].didYouMean, "resize");
  const fine = await api(base, "POST", "/v1/jobs", { task: "resize", queue: "images" });
  assert.equal(fine.status, 201);
  assert.equal(fine.json.warnings, undefined);

  const batch = await api(base, "POST", "/v1/jobs/batch", {
    jobs: [
      { task: "resize", queue: "images" },
      { task: "reszie", queue: "images" },
      { task: "reszie", queue: "images" },
    ],
  });
  assert.equal(batch.status, 201, batch.text);
  assert.equal(batch.json.warnings.length, 1);
  assert.equal(batch.json.jobs[0].warnings, undefined);
  assert.equal(batch.json.jobs[2].warnings[0].task, "reszie");

  const stats = await api(base, "GET", "/v1/stats");
  assert.ok(stats.json.withoutHandler.some((g: { task: string; didYouMeanTask: string }) => g.task === "reszie" && g.didYouMeanTask === "resize"));
  // The dashboard's overview: what its alert is drawn from.
  const overview = await api(base, "GET", "/v1/overview");
  const gap = overview.json.withoutHandler.find((g: { task: string; queue: string }) => g.task === "reszie" && g.queue === "images");
  assert.ok(gap && gap.waiting > 0 && gap.didYouMeanTask === "resize", JSON.stringify(overview.json.withoutHandler));
  assert.ok(!overview.json.withoutHandler.some((g: { task: string; queue: string }) => g.task === "resize" && g.queue === "images"));

  // The OpenAPI document describes the field.
  const doc = await api(base, "GET", "/openapi.json");
  assert.match(doc.text, /no_worker_for_task/);

  const strict = await startServe(lh.schema, ["--no-watchdog", "--unknown-tasks", "refuse"]);
  t.after(() => strict.stop("SIGTERM"));
  const refused = await api(strict.match[1]!, "POST", "/v1/jobs", { task: "reszie", queue: "images" });
  assert.equal(refused.status, 400, refused.text);
  assert.equal(refused.json.error.code, "no_worker_for_task");
  assert.match(refused.json.error.message, /did you mean "resize"/);
  assert.equal(
    (await api(strict.match[1]!, "POST", "/v1/jobs", { task: "resize", queue: "images" }, { authorization: `Bearer ${TOKEN}` })).status,
    201,
  );
});
