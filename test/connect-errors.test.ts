/**
 * connect() and a database it cannot reach: it fails at once (with or without migrations)
 * with the library's DatabaseUnavailableError naming the host and port, never the password;
 * with connectRetry it waits, visibly (logger and onRetry), and succeeds when the database
 * comes up, or fails by name when its time runs out.
 */
import assert from "node:assert/strict";
import net from "node:net";
import { Writable } from "node:stream";
import { test } from "node:test";
import pino from "pino";
import { Registry } from "prom-client";
import { Leasehold } from "../packages/leasehold/src/client.js";
import type { ConnectRetry } from "../packages/leasehold/src/connecting.js";
import { DatabaseUnavailableError, LeaseholdError } from "../packages/leasehold/src/errors.js";
import { databaseUrl, freshLeasehold, silent } from "./helpers/db.js";
import { TcpProxy } from "./helpers/proxy.js";

/** A port on 127.0.0.1 nothing listens on (it was free a moment ago). */
async function closedPort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

function urlOnPort(port: number): string {
  const url = new URL(databaseUrl());
  url.hostname = "127.0.0.1";
  url.port = String(port);
  url.password = "s3cret-never-shown";
  return url.toString();
}

async function failure(promise: Promise<Leasehold>): Promise<DatabaseUnavailableError> {
  const err = await promise.then(
    async (lh) => {
      await lh.close();
      return assert.fail("connect should have failed");
    },
    (e: unknown) => e,
  );
  assert.ok(err instanceof DatabaseUnavailableError, `a DatabaseUnavailableError, not ${String(err)}`);
  assert.ok(err instanceof LeaseholdError);
  assert.equal(err.code, "database_unavailable");
  return err;
}

test("a closed port fails at once, migrate or not, with DatabaseUnavailableError naming the host and port and keeping the driver's error", async () => {
  const port = await closedPort();
  for (const migrate of [true, false]) {
    const started = Date.now();
    const err = await failure(Leasehold.connect({ databaseUrl: urlOnPort(port), logger: silent, migrate, metricsRegistry: new Registry() }));
    // Not waited for: before, migrate: false rode out a refusal for 30 s, silently.
    assert.ok(Date.now() - started < 5_000, `migrate: ${migrate} waited ${Date.now() - started} ms`);
    assert.match(err.message, new RegExp(`^cannot reach the database at 127\\.0\\.0\\.1:${port}: .*ECONNREFUSED`));
    assert.doesNotMatch(err.message, /\n/);
    assert.doesNotMatch(err.message, /s3cret/);
    assert.equal(err.target, `127.0.0.1:${port}`);
    assert.equal((err.cause as { code?: string }).code, "ECONNREFUSED");
  }
});

test("with connectRetry, connect waits for a database that comes up, says so on the logger and to onRetry, then succeeds", async (t) => {
  const lh = await freshLeasehold(t);
  const port = await closedPort();
  const proxy = new TcpProxy(new URL(databaseUrl()).hostname, Number(new URL(databaseUrl()).port || 5432));
  t.after(() => proxy.stop());
  const lines: { msg: string; attempt?: number; target?: string }[] = [];
  const logger = pino(
    { level: "warn" },
    new Writable({
      write(chunk: Buffer, _enc, done) {
        lines.push(JSON.parse(chunk.toString()) as (typeof lines)[number]);
        done();
      },
    }),
  );
  const retries: ConnectRetry[] = [];
  let settled = false;
  const connecting = Leasehold.connect({
    databaseUrl: urlOnPort(port).replace("s3cret-never-shown", encodeURIComponent(new URL(databaseUrl()).password)),
    schema: lh.schema,
    logger,
    metricsRegistry: new Registry(),
    connectRetry: { timeoutMs: 60_000, onRetry: (r) => retries.push(r) },
  }).finally(() => (settled = true));
  await new Promise((r) => setTimeout(r, 1_000));
  assert.equal(settled, false, "connect gave up while the database was down");
  assert.ok(retries.length >= 2, `onRetry heard of each wait (${retries.length})`);
  assert.deepEqual(
    retries.map((r) => r.attempt),
    retries.map((_, i) => i + 1),
  );
  assert.ok(retries.every((r) => r.error instanceof DatabaseUnavailableError && r.error.message.includes(`127.0.0.1:${port}`)));
  const warned = lines.filter((l) => l.msg === "database not reachable yet; connect tries again");
  assert.equal(warned.length, retries.length, "each wait is logged");
  assert.equal(warned[0]!.target, `127.0.0.1:${port}`);

  await proxy.start(port); // the database comes up on that port
  const client = await connecting;
  assert.equal((await client.pool.query<{ one: number }>("SELECT 1 AS one")).rows[0]!.one, 1);
  await client.close();
});

test("connectRetry ends by name when its time runs out, and is checked at connect", async () => {
  const port = await closedPort();
  const retries: ConnectRetry[] = [];
  const err = await failure(
    Leasehold.connect({
      databaseUrl: urlOnPort(port),
      logger: silent,
      metricsRegistry: new Registry(),
      connectRetry: { timeoutMs: 700, onRetry: (r) => retries.push(r) },
    }),
  );
  assert.ok(retries.length >= 1);
  assert.match(
    err.message,
    new RegExp(`^cannot reach the database at 127\\.0\\.0\\.1:${port}: .*ECONNREFUSED.* \\(still failing after \\d+ ms of connectRetry\\)$`),
  );

  await assert.rejects(
    Leasehold.connect({ databaseUrl: urlOnPort(port), logger: silent, connectRetry: { timeoutMs: -1 } }),
    /connectRetry\.timeoutMs must be an integer from 1 to 3600000 \(got -1\)/,
  );
  await assert.rejects(
    Leasehold.connect({ databaseUrl: urlOnPort(port), logger: silent, connectRetry: { timeoutMs: 1_000, onRetry: "log" as never } }),
    /connectRetry\.onRetry must be a function/,
  );
});

test("with connectRetry, a server ending the connection between connect's first statement and its schema check is waited for too", async (t) => {
  const lh = await freshLeasehold(t);
  // The schema check reads schema_migrations: held here, it waits, and is then ended as a
  // restarting server ends its sessions (57P01, "terminating connection due to administrator command").
  const holder = await lh.pool.connect();
  await holder.query("BEGIN");
  await holder.query(`LOCK TABLE ${lh.schema}.schema_migrations IN ACCESS EXCLUSIVE MODE`);
  const retries: ConnectRetry[] = [];
  const connecting = Leasehold.connect({
    databaseUrl: databaseUrl(),
    schema: lh.schema,
    migrate: false,
    logger: silent,
    metricsRegistry: new Registry(),
    connectRetry: { timeoutMs: 30_000, onRetry: (r) => retries.push(r) },
  });
  connecting.catch(() => {});
  let ended = 0;
  for (let i = 0; i < 500 && ended === 0; i++) {
    const { rows } = await lh.pool.query<{ n: number }>(
      `SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity
        WHERE wait_event_type = 'Lock' AND query LIKE '%schema_migrations%' AND pid <> pg_backend_pid()`,
    );
    ended = rows[0]!.n;
    if (ended === 0) await new Promise((r) => setTimeout(r, 10));
  }
  assert.equal(ended, 1, "the schema check was waiting on the lock");
  await holder.query("ROLLBACK");
  holder.release();
  const client = await connecting;
  assert.ok(retries.length >= 1, "the ended session was waited for as a database coming back");
  assert.equal((retries[0]!.error.cause as { code?: string }).code, "57P01");
  await client.close();
});
