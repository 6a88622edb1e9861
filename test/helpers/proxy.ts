/**
 * A TCP proxy on 127.0.0.1 in front of the test PostgreSQL, so a test can cut a client's
 * connections for real (and refuse new ones) while the client process lives on.
 */
import net from "node:net";

export class TcpProxy {
  private server?: net.Server;
  private readonly sockets = new Set<net.Socket>();
  private readonly pairs = new Set<[net.Socket, net.Socket]>();
  private blocked = false;
  port = 0;

  constructor(
    private readonly targetHost: string,
    private readonly targetPort: number,
  ) {}

  static forUrl(url: string): { proxy: TcpProxy; proxiedUrl: () => string } {
    const u = new URL(url);
    const proxy = new TcpProxy(u.hostname, Number(u.port || 5432));
    return {
      proxy,
      proxiedUrl: () => {
        const v = new URL(url);
        v.port = String(proxy.port);
        return v.toString();
      },
    };
  }

  /** Listens on `port` (0: any free one; a fixed one lets a test bring a closed port up). */
  async start(port = 0): Promise<void> {
    this.server = net.createServer((client) => {
      if (this.blocked) return client.destroy();
      const upstream = net.connect(this.targetPort, this.targetHost);
      this.sockets.add(client).add(upstream);
      const close = () => {
        client.destroy();
        upstream.destroy();
        this.sockets.delete(client);
        this.sockets.delete(upstream);
      };
      client.on("error", close).on("close", close);
      upstream.on("error", close).on("close", close);
      client.pipe(upstream);
      upstream.pipe(client);
      this.pairs.add([client, upstream]);
    });
    await new Promise<void>((resolve) => this.server!.listen(port, "127.0.0.1", resolve));
    this.port = (this.server!.address() as net.AddressInfo).port;
  }

  /** Drops every open connection and refuses new ones until `restore()`. */
  cut(): void {
    this.blocked = true;
    for (const s of this.sockets) s.destroy();
    this.sockets.clear();
  }

  /**
   * Half-open: the connections open now go silent in both directions (nothing forwarded,
   * nothing closed: neither end hears a thing), while new connections work.
   */
  silence(): void {
    for (const [client, upstream] of this.pairs) {
      client.unpipe(upstream);
      upstream.unpipe(client);
      client.pause();
      upstream.pause();
    }
    this.pairs.clear();
  }

  /** A partition: the connections open now go silent (as `silence()`) and new ones are refused, until `restore()`. */
  isolate(): void {
    this.silence();
    this.blocked = true;
  }

  restore(): void {
    this.blocked = false;
  }

  async stop(): Promise<void> {
    this.cut();
    await new Promise<void>((resolve) => this.server?.close(() => resolve()) ?? resolve());
  }
}
