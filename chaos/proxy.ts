/**
 * A TCP proxy on 127.0.0.1 in front of PostgreSQL, one per chaos process, so the harness can
 * partition one process from the database while the process stays alive:
 *   - cut:   every open connection is reset and new ones are dropped at once;
 *   - stall: bytes stop flowing both ways (a black hole), new connections hang; on restore the
 *            buffered bytes flow again, as after a network that came back;
 *   - half-open: the open connections go silent, new ones work (a NAT that forgot its flows).
 */
import net from "node:net";

type Mode = "open" | "cut" | "stall";

interface Pair {
  client: net.Socket;
  server: net.Socket;
}

export class TcpProxy {
  private server?: net.Server;
  private readonly pairs = new Set<Pair>();
  private mode: Mode = "open";
  port = 0;

  constructor(private readonly targetPort: number) {}

  async start(): Promise<number> {
    const server = net.createServer((client) => this.accept(client));
    this.server = server;
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(0, "127.0.0.1", () => resolve());
    });
    this.port = (server.address() as net.AddressInfo).port;
    return this.port;
  }

  get state(): Mode {
    return this.mode;
  }

  private accept(client: net.Socket): void {
    client.setNoDelay(true);
    if (this.mode === "cut") {
      client.destroy();
      return;
    }
    const server = net.connect(this.targetPort, "127.0.0.1");
    server.setNoDelay(true);
    const pair = { client, server };
    this.pairs.add(pair);
    const close = () => {
      this.pairs.delete(pair);
      this.paused.delete(pair);
      client.destroy();
      server.destroy();
    };
    client.on("error", close).on("close", close);
    server.on("error", close).on("close", close);
    // pipe() honours pause(): a stalled pair stops reading, so bytes wait in the kernel.
    client.pipe(server);
    server.pipe(client);
    if (this.mode === "stall") this.pause(pair);
  }

  private readonly paused = new Set<Pair>();

  private pause(p: Pair): void {
    if (this.paused.has(p)) return;
    this.paused.add(p);
    p.client.unpipe(p.server);
    p.server.unpipe(p.client);
    p.client.pause();
    p.server.pause();
  }

  private resume(p: Pair): void {
    if (!this.paused.delete(p)) return;
    p.client.pipe(p.server);
    p.server.pipe(p.client);
  }

  /** Resets every connection and refuses new ones until `restore()`. */
  cut(): void {
    this.mode = "cut";
    for (const p of this.pairs) {
      p.client.resetAndDestroy();
      p.server.destroy();
    }
    this.pairs.clear();
    this.paused.clear();
  }

  /** Stops all traffic without closing anything until `restore()`. */
  stall(): void {
    this.mode = "stall";
    for (const p of this.pairs) this.pause(p);
  }

  /**
   * A half-open network: the connections open now go silent (as after a NAT or firewall
   * forgot them), while new connections work. Nothing tells the client its sockets are dead.
   */
  stallExisting(): void {
    for (const p of this.pairs) this.pause(p);
  }

  restore(): void {
    this.mode = "open";
    for (const p of this.pairs) this.resume(p);
  }

  async close(): Promise<void> {
    for (const p of this.pairs) {
      p.client.destroy();
      p.server.destroy();
    }
    this.pairs.clear();
    await new Promise<void>((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }
}
