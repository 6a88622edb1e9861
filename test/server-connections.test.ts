/**
 * `leasehold serve` under connections that never send a request (they need no token): one
 * address cannot fill the server's connection cap, silent connections are closed, and
 * authenticated requests, long polls included, are answered meanwhile. Real sockets on
 * loopback: the flood comes from 127.0.0.2, the real client from 127.0.0.1.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import net from "node:net";
import { addressKey } from "../packages/cli/src/server/idle-connections.js";
import { eventually, freshLeasehold } from "./helpers/db.js";
import { api, startServe } from "./helpers/server.js";

let lh: Awaited<ReturnType<typeof freshLeasehold>>;

before(async () => {
  lh = await freshLeasehold();
});

after(async () => {
  await lh.dispose();
});

/** Silent connections from `localAddress`, each reopened as soon as the server closes it, until `stop()`; at most `maxOpens` in all. */
function silentFlood(url: string, localAddress: string, count: number, maxOpens: number) {
  const { port, hostname } = new URL(url);
  const open = new Set<net.Socket>();
  let opens = 0;
  let stopped = false;
  const connect = () => {
    if (stopped || opens >= maxOpens) return;
    opens++;
    const socket = net.connect({ port: Number(port), host: hostname, localAddress });
    open.add(socket);
    socket.on("error", () => {});
    socket.on("close", () => {
      open.delete(socket);
      connect();
    });
  };
  for (let i = 0; i < count; i++) connect();
  return {
    open: () => open.size,
    opens: () => opens,
    /** Stops reopening; the connections still open stay for the server to close. */
    stop: () => (stopped = true),
    destroy: () => {
      stopped = true;
      for (const s of open) s.destroy();
    },
  };
}

test("silent connections from one address cannot fill --max-connections: its oldest idle ones are closed, the rest time out, and authenticated requests and long polls are answered meanwhile", async () => {
  // Room for 100 connections; one address may hold 64 idle (the default), so 36 stay for others.
  const serve = await startServe(lh.schema, ["--max-connections", "100", "--no-watchdog", "--dashboard", "off"]);
  const url = serve.match[1]!;
  const flood = silentFlood(url, "127.0.0.2", 100, 1_000);
  try {
    await eventually(async () => flood.opens() >= 100, "the flood's first 100 connections opened", 5_000);
    await new Promise((r) => setTimeout(r, 300));

    // Meanwhile a remote worker's long poll waits its full time, and plain requests are answered.
    const started = Date.now();
    const poll = api(url, "POST", "/v1/worker/claim", {
      workerId: "w-flooded",
      queues: ["flooded-q"],
      tasks: ["flooded.t"],
      limit: 1,
      leaseMs: 5_000,
      waitMs: 2_000,
    });
    for (let i = 0; i < 20; i++) {
      const r = await api(url, "GET", "/v1/stats");
      assert.equal(r.status, 200, r.text);
    }
    const enqueued = await api(url, "POST", "/v1/jobs", { task: "flooded.t", queue: "other-q", payload: { n: 1 } });
    assert.equal(enqueued.status, 201, enqueued.text);
    const waited = await poll;
    assert.equal(waited.status, 200, waited.text);
    assert.deepEqual([waited.json.jobs, waited.json.waited], [[], true]);
    assert.ok(Date.now() - started >= 1_900, "the long poll was answered before its waitMs");
    // Each connection beyond 64 closed the address's oldest idle one (which the flood reopened).
    await eventually(async () => flood.opens() === 1_000 && flood.open() <= 64, "the flood held down to 64 idle connections", 5_000);

    // Stopped reopening: what is left sent no request and is closed by the headers timeout (5 s).
    flood.stop();
    await eventually(async () => flood.open() === 0, "the silent connections closed", 9_000);
    const metrics = await api(url, "GET", "/metrics");
    assert.match(metrics.text, /^leasehold_server_idle_connections_evicted_total [1-9]\d*$/m);
  } finally {
    flood.destroy();
    await serve.stop("SIGTERM");
  }
});

test("--headers-timeout and --max-idle-per-address set the bounds: a silent connection is closed after the first, an address's oldest idle one beyond the second", async () => {
  const serve = await startServe(lh.schema, ["--headers-timeout", "500", "--max-idle-per-address", "2", "--no-watchdog", "--dashboard", "off"]);
  const url = serve.match[1]!;
  const sockets: net.Socket[] = [];
  const open = (localAddress: string) => {
    const { port, hostname } = new URL(url);
    const socket = net.connect({ port: Number(port), host: hostname, localAddress });
    socket.on("error", () => {});
    sockets.push(socket);
    const opened = Date.now();
    return { socket, closed: new Promise<number>((resolve) => socket.on("close", () => resolve(Date.now() - opened))) };
  };
  try {
    const first = open("127.0.0.3");
    await new Promise((r) => setTimeout(r, 100));
    const second = open("127.0.0.3");
    await new Promise((r) => setTimeout(r, 100));
    const third = open("127.0.0.3");
    assert.ok((await first.closed) < 400, "the oldest of three idle connections was kept");
    // Another address is not held to 127.0.0.3's share.
    assert.equal((await api(url, "GET", "/v1/stats")).status, 200);
    const [secondMs, thirdMs] = await Promise.all([second.closed, third.closed]);
    assert.ok(secondMs >= 400 && secondMs < 2_500, `a silent connection was closed after ${secondMs} ms, not about 500`);
    assert.ok(thirdMs >= 400 && thirdMs < 2_500, `a silent connection was closed after ${thirdMs} ms, not about 500`);
  } finally {
    for (const s of sockets) s.destroy();
    await serve.stop("SIGTERM");
  }
});

test("connections are counted per IPv4 address and per IPv6 /64 network", () => {
  assert.equal(addressKey("127.0.0.2"), "127.0.0.2");
  assert.equal(addressKey("::ffff:10.1.2.3"), "10.1.2.3");
  assert.equal(addressKey("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::/64");
  assert.equal(addressKey("2001:db8:1:2:bbbb:cccc:dddd:eeee"), "2001:db8:1:2::/64");
  assert.equal(addressKey("2001:0db8::1"), "2001:db8:0:0::/64");
  assert.equal(addressKey("::1"), "0:0:0:0::/64");
  assert.notEqual(addressKey("2001:db8:1:3::1"), addressKey("2001:db8:1:2::1"));
});
