/**
 * Flow control's guarantees (docs/flow-control.md), against worker processes of their own
 * claiming from the real server: no limit is ever exceeded, measured on the database's clock
 * from the audit trail; a pause stops every start and gives buffered jobs back for free; a
 * limit changed at run time binds at once, and a killed worker's slots come back with its
 * leases; a handler's "rate-limited, retry in X" holds its key or queue; bad settings are
 * refused by name and touch no job. Fairness and rate accuracy: flow-fairness.test.ts.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { UnknownQueueError, ValidationError } from "../packages/leasehold/src/errors.js";
import type { NewJob } from "../packages/leasehold/src/jobs/types.js";
import { eventually, freshLeasehold } from "./helpers/db.js";
import { auditTrail, byKey, dbNow, flowWorkers, holdersAt, maxOverlap, maxStartsInWindow, sleep, type Attempt } from "./helpers/flow.js";

type Lh = Awaited<ReturnType<typeof freshLeasehold>>;

const unfinished = async (lh: Lh) => (await lh.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM jobs")).rows[0]!.n;
const drained = (lh: Lh, what: string, timeoutMs = 60_000) => eventually(async () => (await unfinished(lh)) === 0, what, timeoutMs);

/** The attempts holding leases when each attempt started (itself included), in start order. */
function concurrencyAtStarts(attempts: Attempt[]): { start: number; n: number }[] {
  return attempts
    .map((a) => ({ start: a.start, n: attempts.filter((b) => b.start <= a.start && a.start < b.end).length }))
    .sort((x, y) => x.start - y.start);
}

/** Every job ended as succeeded, and no attempt spent budget (released and rate_limited are free). */
async function allSucceededFree(lh: Lh, count: number) {
  const { rows } = await lh.pool.query<{ state: string; spent: number; n: number }>(
    "SELECT state, spent_attempts AS spent, count(*)::int AS n FROM finished_jobs GROUP BY 1, 2",
  );
  assert.deepEqual(rows, [{ state: "succeeded", spent: 0, n: count }]);
}

test("no limit is exceeded: 4 worker processes (concurrency 10 and 50) claim against concurrency 5, per key 1 (in order) and 3, 50 starts/s, and 10 starts per 500 ms per key", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.setQueueLimits("global5", { concurrency: 5 }, { create: true });
  await lh.setQueueLimits("key1", { keyConcurrency: 1 }, { create: true });
  await lh.setQueueLimits("key3", { keyConcurrency: 3 }, { create: true });
  await lh.setQueueLimits("rate50", { rate: { limit: 50, windowMs: 1_000 } }, { create: true });
  await lh.setQueueLimits("keyrate", { keyRate: { limit: 10, windowMs: 500 } }, { create: true });

  // Handlers sleep a few tens of ms: without the limits, attempts would overlap by the dozen.
  const sleepy = { min: 10, max: 40 };
  const jobs: NewJob[] = [];
  for (let i = 0; i < 400; i++) jobs.push({ task: "sleep", payload: sleepy, queue: "global5" });
  for (let i = 0; i < 12 * 10; i++) {
    // Interleaved keys, and priorities that reorder each key's line.
    jobs.push({ task: "sleep", payload: sleepy, queue: "key1", key: `k1-${i % 12}`, priority: Math.floor(Math.random() * 3) });
  }
  for (let i = 0; i < 8 * 25; i++) jobs.push({ task: "sleep", payload: sleepy, queue: "key3", key: `k3-${i % 8}` });
  for (let i = 0; i < 250; i++) jobs.push({ task: "sleep", payload: { min: 5, max: 20 }, queue: "rate50" });
  for (let i = 0; i < 4 * 40; i++) jobs.push({ task: "sleep", payload: { min: 5, max: 20 }, queue: "keyrate", key: `kr-${i % 4}` });
  // One transaction: every key's whole line is there before the first claim, so its order is
  // the (priority, enqueue) order of all its jobs.
  const enqueued = await lh.enqueueMany(jobs);
  const jobOf = new Map(enqueued.map((e, i) => [e.id, { ...jobs[i]!, seq: i }]));

  const queues = ["global5", "key1", "key3", "rate50", "keyrate"];
  await flowWorkers(t, lh.schema, [
    { queues, concurrency: 10 },
    { queues, concurrency: 50 },
    { queues, concurrency: 10 },
    { queues, concurrency: 50 },
  ]);
  await drained(lh, "every job ran");
  await allSucceededFree(lh, jobs.length);

  const trail = await auditTrail(lh.pool);
  const inQueue = (q: string) => trail.filter((a) => jobOf.get(a.jobId)!.queue === q);
  const keyOf = new Map([...jobOf].filter(([, j]) => j.key !== undefined).map(([id, j]) => [id, j.key!]));

  const global = maxOverlap(inQueue("global5"));
  assert.ok(global.max <= 5, `global5: ${global.max} attempts at once (limit 5): ${holdersAt(inQueue("global5"), global.at)}`);
  assert.equal(global.max, 5, "global5: the limit was reached (the test had overlap to refuse)");

  for (const [key, attempts] of byKey(inQueue("key1"), keyOf)) {
    const o = maxOverlap(attempts);
    assert.ok(o.max <= 1, `key1/${key}: ${o.max} attempts at once (limit 1): ${holdersAt(attempts, o.at)}`);
    // Strictly in line: the jobs in the order they started (a released job that starts again
    // counts once) are the key's jobs by (priority, enqueue).
    const started = attempts.map((a) => a.jobId).filter((id, i, all) => i === 0 || all[i - 1] !== id);
    const line = [...jobOf]
      .filter(([, j]) => j.queue === "key1" && j.key === key)
      .sort(([, a], [, b]) => a.priority! - b.priority! || a.seq - b.seq)
      .map(([id]) => id);
    assert.deepEqual(started, line, `key1/${key} started out of (priority, enqueue) order`);
  }
  const widest = maxOverlap(inQueue("key1")).max;
  assert.ok(widest > 1, `key1: keys ran side by side (${widest} at once)`);

  let perKeyMax = 0;
  for (const [key, attempts] of byKey(inQueue("key3"), keyOf)) {
    const o = maxOverlap(attempts);
    assert.ok(o.max <= 3, `key3/${key}: ${o.max} attempts at once (limit 3): ${holdersAt(attempts, o.at)}`);
    perKeyMax = Math.max(perKeyMax, o.max);
  }
  assert.equal(perKeyMax, 3, "key3: some key reached its limit");

  const rate = maxStartsInWindow(inQueue("rate50"), 1_000);
  assert.ok(rate.max <= 50, `rate50: ${rate.max} starts in the second from ${new Date(rate.at).toISOString()} (limit 50/s)`);
  assert.equal(rate.max, 50, "rate50: the rate was reached");

  let keyRateMax = 0;
  for (const [key, attempts] of byKey(inQueue("keyrate"), keyOf)) {
    const r = maxStartsInWindow(attempts, 500);
    assert.ok(r.max <= 10, `keyrate/${key}: ${r.max} starts in the 500 ms from ${new Date(r.at).toISOString()} (limit 10)`);
    keyRateMax = Math.max(keyRateMax, r.max);
  }
  assert.equal(keyRateMax, 10, "keyrate: some key reached its rate");
  assert.ok(maxStartsInWindow(inQueue("keyrate"), 500).max > 10, "keyrate: keys started side by side");
});

test("pause: nothing starts once pauseQueue returns, buffered jobs go back without spending an attempt, running ones finish; enqueue goes on; resume drains", async (t) => {
  const lh = await freshLeasehold(t);
  const total = 600;
  await lh.enqueueMany(Array.from({ length: total }, () => ({ task: "sleep", payload: { min: 50, max: 150 }, queue: "p" })));
  const workers = await flowWorkers(t, lh.schema, [
    { queues: ["p"], concurrency: 10 },
    { queues: ["p"], concurrency: 10 },
  ]);
  // Draining at full speed, with jobs buffered ahead of the handlers.
  await eventually(async () => (await lh.pool.query("SELECT count(*)::int AS n FROM finished_jobs")).rows[0].n >= 60, "draining");

  const settings = await lh.pauseQueue("p");
  const pausedAt = await dbNow(lh.pool); // the pause has committed: nothing may start after this
  const pausedLocal = Date.now();
  assert.equal(settings.paused, true);
  const whilePaused = await lh.enqueue("sleep", { min: 1, max: 2 }, { queue: "p" });
  assert.equal(whilePaused.created, true, "enqueue works while paused");

  // Running jobs finish, buffered ones go back: within a second no lease is held.
  await eventually(
    async () => (await lh.pool.query("SELECT count(*)::int AS n FROM jobs WHERE state = 'running'")).rows[0].n === 0,
    "the queue holds no lease",
    5_000,
  );
  await sleep(1_000);
  const paused = await auditTrail(lh.pool);
  const late = paused.filter((a) => a.start > pausedAt);
  assert.deepEqual(late, [], "attempts started after the pause returned");
  const handlerStartsAfter = workers.flatMap((w) => [...w.starts.values()]).filter((at) => at > pausedLocal + 1_000);
  assert.deepEqual(handlerStartsAfter, [], "handlers started more than 1 s after the pause returned");
  const released = paused.filter((a) => a.outcome === "released");
  const lastHandler = Math.max(...workers.flatMap((w) => [...w.starts.values()]));
  t.diagnostic(
    `${released.length} buffered jobs given back, the last ${Math.round(Math.max(...released.map((a) => a.end)) - pausedAt)} ms after the pause returned; ` +
      `the last handler start ${lastHandler - pausedLocal} ms after it`,
  );
  assert.ok(released.length > 0, "some buffered jobs were given back (the test had a buffer to pause)");
  for (const a of released) {
    assert.ok(a.end >= pausedAt - 1_000 && a.end <= pausedAt + 1_000, `released ${a.end - pausedAt} ms after the pause`);
  }
  const outcomes = new Set(paused.map((a) => a.outcome));
  assert.deepEqual([...outcomes].sort(), ["released", "succeeded"], "running jobs finished; nothing failed or was lost");
  const { rows } = await lh.pool.query<{ state: string; spent: number; n: number }>(
    "SELECT state, spent_attempts AS spent, count(*)::int AS n FROM jobs GROUP BY 1, 2",
  );
  assert.equal(rows.length, 1, JSON.stringify(rows));
  assert.deepEqual([rows[0]!.state, rows[0]!.spent], ["waiting", 0], "the backlog waits, no attempt spent");
  const releasedJobs = new Set(released.map((a) => a.jobId));
  const { rows: back } = await lh.pool.query("SELECT count(*)::int AS n FROM jobs WHERE id = ANY($1::bigint[])", [[...releasedJobs]]);
  assert.equal(back[0].n, releasedJobs.size, "every released job waits again");

  await lh.resumeQueue("p");
  await drained(lh, "the backlog drained after resume");
  await allSucceededFree(lh, total + 1);
});

test("a limit set at run time binds the running fleet at once: set, raised, lowered, removed, no worker restarted", async (t) => {
  const lh = await freshLeasehold(t);
  const total = 1_000;
  await lh.enqueueMany(Array.from({ length: total }, () => ({ task: "sleep", payload: { min: 20, max: 60 }, queue: "c" })));
  await flowWorkers(t, lh.schema, [
    { queues: ["c"], concurrency: 10 },
    { queues: ["c"], concurrency: 10 },
  ]);
  // No limit yet: the workers claim the queue with the plain claim.
  await eventually(async () => (await lh.pool.query("SELECT count(*)::int AS n FROM finished_jobs")).rows[0].n >= 20, "draining");
  const change = async (concurrency: number | null) => {
    const before = await dbNow(lh.pool);
    await lh.setQueueLimits("c", { concurrency });
    return { before, after: await dbNow(lh.pool) };
  };
  const set = await change(2);
  await sleep(1_500);
  const raised = await change(6);
  await sleep(1_500);
  const lowered = await change(1);
  await sleep(1_500);
  const removed = await change(null);
  await drained(lh, "every job ran");
  await allSucceededFree(lh, total);

  // A limit binds the claims that start after it is stored; attempts already running finish,
  // so a start is checked against the attempts holding leases at that moment, itself included.
  const at = concurrencyAtStarts(await auditTrail(lh.pool));
  const worst = (from: number, to: number) => Math.max(0, ...at.filter((s) => s.start >= from && s.start < to).map((s) => s.n));
  assert.ok(worst(0, set.before) > 6, `no limit at first: ${worst(0, set.before)} at once at most`);
  assert.ok(worst(set.after, raised.before) <= 2, `at 2: a start with ${worst(set.after, raised.before)} at once`);
  assert.equal(worst(set.after, raised.before), 2, "set to 2: the queue went on at 2");
  assert.ok(worst(raised.before, lowered.before) <= 6, `at 6: a start with ${worst(raised.before, lowered.before)} at once`);
  assert.equal(worst(raised.after, lowered.before), 6, "raised to 6: the running workers used it");
  assert.ok(worst(lowered.after, removed.before) <= 1, `at 1: a start with ${worst(lowered.after, removed.before)} at once`);
  assert.ok(worst(removed.after, Infinity) > 6, `no limit again: ${worst(removed.after, Infinity)} at once at most`);
});

test("a killed worker's slot comes back with its lease: the limited queue's next job starts within crash detection", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.setQueueLimits("k", { concurrency: 1 }, { create: true });
  const [a, b] = await flowWorkers(t, lh.schema, [{ queues: ["k"] }, { queues: ["k"] }]);
  // The deployment's watchdog, at its default settings.
  const watchdog = lh.watchdog().start();
  t.after(() => watchdog.stop());
  const hold = await lh.enqueue("hold", {}, { queue: "k", maxAttempts: 1 });
  const holder = await eventually(async () => [a!, b!].find((w) => w.starts.has(hold.id)), "the hold job started");
  const next = await lh.enqueueMany(Array.from({ length: 3 }, () => ({ task: "quick", queue: "k" })));
  await sleep(1_000);
  assert.equal((await auditTrail(lh.pool)).length, 0, "nothing else started while the hold job had the only slot");
  const killedAt = await dbNow(lh.pool);
  holder.child.kill("SIGKILL");
  await drained(lh, "the other jobs ran after the kill", 30_000);
  const trail = await auditTrail(lh.pool);
  const lost = trail.find((a) => a.jobId === hold.id)!;
  assert.equal(lost.outcome, "worker_lost");
  const firstNext = Math.min(...trail.filter((a) => next.some((n) => n.id === a.jobId)).map((a) => a.start));
  t.diagnostic(
    `kill -9 to the next start: ${Math.round(firstNext - killedAt)} ms (the lost attempt ended ${Math.round(lost.end - killedAt)} ms after the kill)`,
  );
  // Crash detection at defaults: the 1 s liveness grace plus about two watchdog slots of 250
  // ms (docs/concepts.md); the lease (30 s) would be ten times this.
  assert.ok(firstNext - killedAt < 3_000, `the next job started ${Math.round(firstNext - killedAt)} ms after the kill`);
  assert.ok(firstNext >= lost.end, "not before the killed worker's lease was taken back");
});

test("RateLimitedError: the job waits X without spending an attempt; its key (or its queue) starts nothing for X, others go on", async (t) => {
  const lh = await freshLeasehold(t);
  const retryInMs = 1_500;
  // A handler may hold a whole queue only where the operator allows it.
  await lh.setQueueLimits("rq", { allowQueueHold: true }, { create: true });
  await flowWorkers(t, lh.schema, [
    { queues: ["rl", "rq", "other"], concurrency: 10 },
    { queues: ["rl", "rq", "other"], concurrency: 10 },
  ]);
  const x = await lh.enqueue("throttled", { retryInMs, scope: "key" }, { queue: "rl", key: "a" });
  const y = await lh.enqueue("throttled", { retryInMs, scope: "queue" }, { queue: "rq" });
  const z = await lh.enqueue("throttled", { retryInMs, scope: "job" }, { queue: "rl", key: "c" });
  const limited = await eventually(async () => {
    const trail = await auditTrail(lh.pool);
    const of = (id: string) => trail.find((a) => a.jobId === id && a.outcome === "rate_limited");
    return of(x.id) && of(y.id) && of(z.id) ? { x: of(x.id)!, y: of(y.id)!, z: of(z.id)! } : undefined;
  }, "the three handlers were rate-limited");
  const ids = (jobs: { id: string }[]) => new Set(jobs.map((j) => j.id));
  const more = (queue: string, key?: string) =>
    lh.enqueueMany(Array.from({ length: 5 }, () => ({ task: "quick", queue, ...(key !== undefined && { key }) }))).then(ids);
  const [sameKey, otherKey, jobScoped, sameQueue, otherQueue] = await Promise.all([
    more("rl", "a"),
    more("rl", "b"),
    more("rl", "c"),
    more("rq"),
    more("other"),
  ]);
  await drained(lh, "every job ran", 30_000);
  await allSucceededFree(lh, 3 + 25);

  const trail = await auditTrail(lh.pool);
  const startsOf = (jobs: Set<string>) => trail.filter((a) => jobs.has(a.jobId)).map((a) => a.start);
  for (const [name, job, hold] of [
    ["key", x, limited.x],
    ["queue", y, limited.y],
    ["job", z, limited.z],
  ] as const) {
    const attempts = trail.filter((a) => a.jobId === job.id);
    assert.deepEqual(
      attempts.map((a) => a.outcome),
      ["rate_limited", "succeeded"],
      `scope ${name}`,
    );
    assert.ok(attempts[1]!.start >= hold.end + retryInMs, `scope ${name}: ran again ${Math.round(attempts[1]!.start - hold.end)} ms later`);
  }
  const holdEnds = (hold: Attempt) => hold.end + retryInMs;
  const early = (jobs: Set<string>, hold: Attempt) => startsOf(jobs).filter((s) => s < holdEnds(hold)).length;
  assert.equal(early(sameKey, limited.x), 0, "a job of the held key started during the hold");
  assert.equal(early(otherKey, limited.x), otherKey.size, "another key's jobs went on during the hold");
  assert.equal(early(jobScoped, limited.z), jobScoped.size, "scope job: the key's other jobs went on");
  assert.equal(early(sameQueue, limited.y), 0, "a job of the held queue started during the hold");
  assert.equal(early(otherQueue, limited.y), otherQueue.size, "another queue's jobs went on during the hold");
});

test("bad settings and keys are refused by name and touch no job; an unknown queue needs { create: true }", async (t) => {
  const lh = await freshLeasehold(t);
  await lh.setQueueLimits("q", { concurrency: 3, keyConcurrency: 1 }, { create: true });
  await lh.enqueueMany(Array.from({ length: 20 }, (_, i) => ({ task: "t", queue: "q", key: `k${i % 4}`, payload: { i } })));
  const snapshot = async () =>
    (
      await lh.pool.query<{ jobs: string; queues: string }>(
        `SELECT (SELECT count(*) || ':' || md5(string_agg(row_to_json(j)::text, ',' ORDER BY j.id)) FROM jobs AS j) AS jobs,
                (SELECT count(*) || ':' || md5(string_agg(row_to_json(q)::text, ',' ORDER BY q.name)) FROM queues AS q) AS queues`,
      )
    ).rows[0]!;
  const before = await snapshot();

  const refused = async (what: RegExp, attempt: () => Promise<unknown>) => {
    await assert.rejects(attempt, (err: Error) => {
      assert.ok(err instanceof ValidationError, `${String(what)}: ${err.name}: ${err.message}`);
      assert.match(err.message, what);
      return true;
    });
  };
  const notCounts = [0, -1, 1.5, 2 ** 31, Number.MAX_SAFE_INTEGER, Infinity, NaN, "5", true];
  for (const bad of [...notCounts, 100_001]) {
    await refused(/^concurrency must be an integer from 1 to 100000 /, () => lh.setQueueLimits("q", { concurrency: bad as number }));
    await refused(/^keyConcurrency must be an integer from 1 to 100000 /, () => lh.setQueueLimits("q", { keyConcurrency: bad as number }));
  }
  for (const bad of [...notCounts, 1_000_001]) {
    const rate = { limit: bad as number, windowMs: 1_000 };
    await refused(/^rate\.limit must be an integer from 1 to 1000000 /, () => lh.setQueueLimits("q", { rate }));
    await refused(/^keyRate\.limit must be an integer from 1 to 1000000 /, () => lh.setQueueLimits("q", { keyRate: rate }));
  }
  for (const windowMs of [9, 1, 0, -10, 9.5, 86_400_001]) {
    await refused(/^rate\.windowMs must be an integer from 10 to 86400000/, () => lh.setQueueLimits("q", { rate: { limit: 5, windowMs } }));
    await refused(/^keyRate\.windowMs must be an integer from 10 to 86400000/, () => lh.setQueueLimits("q", { keyRate: { limit: 5, windowMs } }));
  }
  await refused(/^keyWeights\["k1"\] must be an integer from 1 to 100/, () => lh.setQueueLimits("q", { keyWeights: { k1: 0 } }));
  await refused(/^keyWeights\["k1"\] must be an integer/, () => lh.setQueueLimits("q", { keyWeights: { k1: 2.5 } }));
  await refused(/unknown queue limit "concurency"/, () => lh.setQueueLimits("q", { concurency: 3 } as never));
  // A bad value among good ones: the good ones are not stored either.
  await refused(/^rate\.windowMs/, () => lh.setQueueLimits("q", { concurrency: 50, rate: { limit: 5, windowMs: 5 } }));

  // Keys: over-long, NUL, empty, not a string; one bad job fails its whole batch.
  const good = { task: "t", queue: "q", key: "fine" };
  await refused(/^job 1: key must be a non-empty string of at most 512 characters/, () => lh.enqueueMany([good, { ...good, key: "x".repeat(513) }]));
  await refused(/^job 1: key .*NUL/i, () => lh.enqueueMany([good, { ...good, key: "a\u0000b" }]));
  await refused(/^job 0: key must be a non-empty string/, () => lh.enqueue("t", {}, { queue: "q", key: "" }));
  await refused(/^job 0: key must be a non-empty string/, () => lh.enqueue("t", {}, { queue: "q", key: 42 as never }));
  await refused(/^keyWeights: a key must be a non-empty string of at most 512/, () =>
    lh.setQueueLimits("q", { keyWeights: { ["y".repeat(513)]: 2 } }),
  );

  // An unknown queue: refused by name (with the nearest known one), nothing created.
  for (const call of [() => lh.setQueueLimits("qq", { concurrency: 2 }), () => lh.pauseQueue("qq"), () => lh.resumeQueue("qq")]) {
    await assert.rejects(call, (err: Error) => {
      assert.ok(err instanceof UnknownQueueError, `${err.name}: ${err.message}`);
      assert.equal(err.code, "unknown_queue");
      assert.match(err.message, /queue "qq" is unknown.*did you mean "q"\?.*\{ create: true \}/);
      return true;
    });
  }
  await refused(/queue/, () => lh.pauseQueue("bad\u0000name", { create: true }));
  assert.deepEqual(await snapshot(), before, "no job and no setting changed");

  // { create: true } configures a queue before its first job; the others are untouched.
  const created = await lh.setQueueLimits("qq", { concurrency: 2, rate: { limit: 10, windowMs: 10 } }, { create: true });
  assert.deepEqual([created.name, created.concurrency, created.rate, created.paused], ["qq", 2, { limit: 10, windowMs: 10 }, false]);
  assert.equal((await lh.pauseQueue("qp", { create: true })).paused, true);
  const listed = await lh.listQueues();
  assert.deepEqual(
    listed.map((q) => [q.name, q.paused, q.concurrency]),
    [
      ["q", false, 3],
      ["qp", true, null],
      ["qq", false, 2],
    ],
  );
  assert.equal((await snapshot()).jobs, before.jobs, "no job changed");
});

test("a worker with room for one job at a time takes turns between its limited queues: none takes every claim", async (t) => {
  const lh = await freshLeasehold(t);
  const queues = ["turn-a", "turn-b", "turn-c"];
  for (const queue of queues) await lh.setQueueLimits(queue, { concurrency: 5 }, { create: true });
  await lh.enqueueMany(queues.flatMap((queue) => Array.from({ length: 20 }, (): NewJob => ({ task: "t", queue }))));
  const started: string[] = [];
  const worker = lh.worker({ queues, concurrency: 1, handlers: { t: () => new Promise((r) => setTimeout(r, 5)) } });
  worker.on("job:start", (job: { queue: string }) => started.push(job.queue));
  await worker.start();
  t.after(() => worker.stop(0));
  await eventually(async () => started.length >= 15, "15 jobs started");
  const first = started.slice(0, 15);
  for (const queue of queues) {
    assert.ok(
      first.filter((q) => q === queue).length >= 3,
      `${queue} had ${first.filter((q) => q === queue).length} of the first 15 starts: ${first.join(" ")}`,
    );
  }
});
