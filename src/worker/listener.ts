/**
 * A dedicated LISTEN connection that survives terminated backends and database restarts.
 * Notifications sent while it was disconnected are lost, so after every (re)connect it
 * calls `onNotify(undefined)`: the worker polls at once.
 */
import pg from "pg";

const RECONNECT_MIN_MS = 100;
const RECONNECT_MAX_MS = 5_000;

export class Listener {
  private client?: pg.Client;
  private stopped = false;
  private reconnectTimer?: NodeJS.Timeout;
  private delayMs = RECONNECT_MIN_MS;

  constructor(
    private readonly connectionString: string,
    private readonly channel: string,
    private readonly onNotify: (payload: string | undefined) => void,
  ) {}

  async start(): Promise<void> {
    await this.connect();
  }

  private async connect(): Promise<void> {
    if (this.stopped) return;
    const client = new pg.Client({ connectionString: this.connectionString, application_name: "leasehold-listen" });
    this.client = client;
    client.on("notification", (msg) => {
      if (msg.channel === this.channel) this.onNotify(msg.payload);
    });
    client.on("error", () => this.scheduleReconnect(client));
    client.on("end", () => this.scheduleReconnect(client));
    try {
      await client.connect();
      await client.query(`LISTEN ${pg.escapeIdentifier(this.channel)}`);
      this.delayMs = RECONNECT_MIN_MS;
      this.onNotify(undefined);
    } catch {
      this.scheduleReconnect(client);
    }
  }

  private scheduleReconnect(client: pg.Client): void {
    if (this.stopped || client !== this.client || this.reconnectTimer) return;
    client.end().catch(() => {});
    this.reconnectTimer = setTimeout(() => {
      this.reconnectTimer = undefined;
      void this.connect();
    }, this.delayMs);
    this.delayMs = Math.min(this.delayMs * 2, RECONNECT_MAX_MS);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.reconnectTimer) clearTimeout(this.reconnectTimer);
    await this.client?.end().catch(() => {});
  }
}
