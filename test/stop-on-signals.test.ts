/**
 * Shutdown as users write it (worker.stopOnSignals): a worker process sent Ctrl-C (SIGINT)
 * or SIGTERM gives its running job back without spending an attempt and exits on its own; a
 * handler that finishes within the grace completes its job; a second signal ends the grace at
 * once.
 */
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import path from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { databaseUrl, eventually, freshLeasehold } from "./helpers/db.js";

const CHILD = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "helpers/signal-worker-child.ts");

async function signalWorker(t: { after(fn: () => unknown): void }, schema: string, env: Record<string, string>) {
  const child = spawn(process.execPath, ["--import", "tsx", CHILD], {
    env: { ...process.env, DATABASE_URL: databaseUrl(), LEASEHOLD_SCHEMA: schema, FINISH_MS: "0", ...env },
    stdio: ["ignore", "pipe", "inherit"],
  });
  t.after(() => child.kill("SIGKILL"));
  let out = "";
  child.stdout!.on("data", (b: Buffer) => (out += b.toString()));
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
  await eventually(async () => out.includes("ready"), "worker process ready", 30_000);
  return { child, exited, output: () => out };
}

function stillRunning(child: ChildProcess): boolean {
  return child.exitCode === null && child.signalCode === null;
}

for (const signal of ["SIGINT", "SIGTERM"] as const) {
  test(`${signal}: the running job is released without spending an attempt, and the process exits on its own`, async (t) => {
    const lh = await freshLeasehold(t);
    const w = await signalWorker(t, lh.schema, { SHUTDOWN_TIMEOUT_MS: "300" });
    const job = await lh.enqueue("hold", {});
    await eventually(async () => w.output().includes(`started ${job.id}`), "the job started");
    w.child.kill(signal);
    assert.equal(await w.exited, 0);
    const { job: after, attempts } = await lh.getJob(job.id);
    assert.equal(after.state, "waiting");
    assert.equal(after.spentAttempts, 0, "a released attempt is not spent");
    assert.equal(after.lockedBy, null);
    assert.equal(attempts[0]?.outcome, "released");
  });
}

test("a handler that finishes within the grace completes its job before the process exits", async (t) => {
  const lh = await freshLeasehold(t);
  const w = await signalWorker(t, lh.schema, { SHUTDOWN_TIMEOUT_MS: "60000", FINISH_MS: "800" });
  const job = await lh.enqueue("finish", {});
  await eventually(async () => w.output().includes(`started ${job.id}`), "the job started");
  w.child.kill("SIGINT");
  assert.equal(await w.exited, 0);
  const { job: after } = await lh.getJob(job.id);
  assert.equal(after.state, "succeeded");
  assert.deepEqual(after.result, { finished: true });
});

test("a second signal ends the grace at once: the job is released, unspent, and the process exits", async (t) => {
  const lh = await freshLeasehold(t);
  const w = await signalWorker(t, lh.schema, { SHUTDOWN_TIMEOUT_MS: "600000" });
  const job = await lh.enqueue("hold", {});
  await eventually(async () => w.output().includes(`started ${job.id}`), "the job started");
  w.child.kill("SIGINT");
  // Within the ten-minute grace the handler keeps its job (a signal this soon after is the same Ctrl-C).
  await new Promise((r) => setTimeout(r, 1_000));
  assert.ok(stillRunning(w.child), "the first signal waits for the handler");
  assert.equal((await lh.getJob(job.id)).job.state, "running");
  w.child.kill("SIGINT");
  assert.equal(await w.exited, 0);
  const { job: after } = await lh.getJob(job.id);
  assert.equal(after.state, "waiting");
  assert.equal(after.spentAttempts, 0);
});
