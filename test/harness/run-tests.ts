/**
 * `npm test` (run with tsx): starts a throwaway PostgreSQL (the embedded one, on a free port, in a temp
 * directory) unless DATABASE_URL names a server, then runs every test file with node's
 * test runner. Each test file creates its own schema, so files never see each other's jobs.
 *
 *   npm test                      # everything in test/ but the rolling upgrade test
 *   npm test -- test/claim.test.ts  # some files
 *   npm run test:upgrade          # the rolling upgrade test (test/upgrade.test.ts)
 *
 * The dashboard's browser tests (*.browser.test.ts) drive a real Chromium: without one, they
 * are left out and one line says so and how to install it.
 * With a `nats-server` on the PATH (or in /usr/sbin) it also starts one with JetStream, for
 * the NATS dispatch tests (LEASEHOLD_TEST_NATS_URL); without one they are skipped, and this
 * says so in one line. Likewise the pooler tests need a `pgbouncer` (each test file starts its
 * own, test/harness/pgbouncer.ts; LEASEHOLD_TEST_PGBOUNCER names the binary, empty: skipped).
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { pipeline } from "node:stream/promises";
import { run } from "node:test";
import { spec } from "node:test/reporters";
import { EmbeddedPostgres } from "../../packages/cli/src/embedded/postgres.js";
import { CHROMIUM_HINT, findChromium } from "./chromium.js";
import { findNatsServer, NATS_INSTALL_HINT, NatsServer } from "./nats-server.js";
import { findPgBouncer, PGBOUNCER_INSTALL_HINT } from "./pgbouncer.js";

/**
 * Run only when named (`npm run test:upgrade`): the rolling upgrade test installs the previous
 * release with `npm ci`, which may need the registry.
 */
const NAMED_ONLY = new Set(["upgrade.test.ts"]);

/**
 * The files that took longest in a run on 2 cores (over 30 s each), longest first; started
 * first, so that no long file begins when the other lane is nearly done. The rest by name.
 */
const LONGEST = [
  "chaos.test.ts",
  "server.test.ts",
  "cli-dev.test.ts",
  "split-execution.test.ts",
  "bench-smoke-flow.test.ts",
  "flow-fairness.test.ts",
  "bench-smoke-graph.test.ts",
  "cli.test.ts",
  "bench-smoke.test.ts",
  "flow-control.test.ts",
  "nats.test.ts",
];

const args = process.argv.slice(2);
let files = args.length > 0 ? args : listTests("test");
const browserTests = files.filter((f) => f.endsWith(".browser.test.ts"));
if (browserTests.length > 0 && !findChromium()) {
  console.log(`# browser tests skipped (${browserTests.join(", ")}): no Chromium found; ${CHROMIUM_HINT}`);
  files = files.filter((f) => !browserTests.includes(f));
  // node --test with no file would look for tests everywhere.
  if (files.length === 0) process.exit(0);
}
let server: EmbeddedPostgres | undefined;
let dataRoot: string | undefined;
let url = process.env.DATABASE_URL;
if (!url) {
  dataRoot = fs.mkdtempSync(path.join(os.tmpdir(), "leasehold-test-"));
  fs.chmodSync(dataRoot, 0o755);
  server = new EmbeddedPostgres({
    dataDir: path.join(dataRoot, "pgdata"),
    // Crash tests cut connections and run many processes at once.
    settings: { max_connections: 400 },
  });
  try {
    url = await server.start();
  } catch (err) {
    // One line, and no temp directory left behind.
    await server.stop();
    fs.rmSync(dataRoot, { recursive: true, force: true });
    console.error(`npm test: cannot start the test PostgreSQL: ${(err as Error).message}`);
    process.exit(1);
  }
  console.log(`# test PostgreSQL (${server.binaries?.source}) at ${server.redactedUrl}`);
}

let nats: NatsServer | undefined;
const natsBinary = findNatsServer();
if (natsBinary) {
  nats = await NatsServer.start(natsBinary);
  console.log(`# test nats-server (${natsBinary}) at ${nats.url}`);
} else {
  console.log(`# NATS dispatch tests SKIPPED: no nats-server on the PATH; ${NATS_INSTALL_HINT}`);
}

const pgbouncerBinary = findPgBouncer();
if (!pgbouncerBinary) console.log(`# PgBouncer (transaction pooling) tests SKIPPED: no pgbouncer on the PATH; ${PGBOUNCER_INSTALL_HINT}`);

// Test files run two at a time: most of a file's time is spent waiting (on leases, timeouts,
// real processes), and node's default on a 2-core machine is one at a time.
const TEST_FILES_AT_ONCE = Number(process.env.LEASEHOLD_TEST_CONCURRENCY ?? 2);

// The "source" condition resolves the workspace packages (leasehold, @leasehold/*) to their
// TypeScript sources, in the test processes and every process they start: one copy of each
// module, the one the tests import. (Tests of the built CLI clear it: test/helpers/cli.ts.)
// Each test file runs in a process of its own, started with this process's --conditions=source
// --import tsx and this environment.
Object.assign(process.env, {
  NODE_OPTIONS: [process.env.NODE_OPTIONS, "--conditions=source"].filter(Boolean).join(" "),
  DATABASE_URL: url,
  LEASEHOLD_TEST_SERVER_PID: String(server?.pid ?? ""),
  LEASEHOLD_TEST_NATS_URL: nats?.url ?? "",
  LEASEHOLD_TEST_NATS_SERVER: natsBinary ?? "",
  LEASEHOLD_TEST_PGBOUNCER: pgbouncerBinary ?? "",
});
// node's test runner (`node --test`) sorts the files it is given by name; its run() keeps our
// order, so the longest files start first and the two lanes end close together.
let failed = false;
const stream = run({ files: longestFirst(files), concurrency: TEST_FILES_AT_ONCE, timeout: 180_000 });
stream.on("test:fail", () => (failed = true));
await pipeline(stream.compose(new spec()), process.stdout, { end: false });
const code = failed ? 1 : 0;
await nats?.dispose();
await server?.stop();
if (dataRoot) fs.rmSync(dataRoot, { recursive: true, force: true });
process.exit(code);

function listTests(dir: string): string[] {
  return fs
    .readdirSync(dir, { recursive: true, encoding: "utf8" })
    .filter((f) => f.endsWith(".test.ts") && !NAMED_ONLY.has(f))
    .sort()
    .map((f) => path.join(dir, f));
}

function longestFirst(list: string[]): string[] {
  const rank = (f: string) => {
    const i = LONGEST.indexOf(path.basename(f));
    return i === -1 ? LONGEST.length : i;
  };
  return [...list].sort((a, b) => rank(a) - rank(b));
}
