/**
 * What every command shares: the global options, the logger, output in human or JSON form,
 * and the rule for finding the database:
 *
 *   1. --database-url, else DATABASE_URL;
 *   2. else the database of a `leasehold dev` running on the same data dir (its dev.json);
 *   3. else the embedded PostgreSQL in <data dir>/pgdata: the server another process (`serve`,
 *      `worker`, an app) runs there, else one started for this command.
 */
import path from "node:path";
import pino, { type Logger } from "pino";
import { Leasehold } from "leasehold/internal/client";
import type { UnknownTasksMode } from "leasehold/internal/jobs/known-tasks";
import { relocationNotice } from "../embedded/postgres.js";
import { readDevState } from "./dev-state.js";
import { CliError } from "./errors.js";
import { RemoteOperations, type JobOperations } from "./remote-operations.js";

export interface GlobalOptions {
  databaseUrl?: string;
  schema?: string;
  pooling?: "session" | "transaction";
  directDatabaseUrl?: string;
  dataDir: string;
  json?: boolean;
  server?: string;
  token?: string;
}

export class Cli {
  readonly dataDir: string;
  /** Where the embedded cluster is: <data dir>/pgdata, unless it had to be relocated (as root). */
  embeddedDataDir: string;
  private readonly closers: (() => Promise<void>)[] = [];
  /** NATS dispatch for this command's connection (docs/nats.md): --nats, else LEASEHOLD_NATS_URL. */
  private natsUrl?: string;
  /** Enqueue's check of unknown tasks for this command's connection (--unknown-tasks); unset: the library's default. */
  unknownTasks?: UnknownTasksMode;

  /** `dataDirIsDefault`: no --data-dir nor LEASEHOLD_DATA_DIR; only then may the cluster be relocated. */
  constructor(
    readonly options: GlobalOptions,
    private readonly dataDirIsDefault = false,
  ) {
    this.dataDir = path.resolve(options.dataDir);
    this.embeddedDataDir = path.join(this.dataDir, "pgdata");
  }

  get json(): boolean {
    return Boolean(this.options.json);
  }

  /** Prints a result: the JSON value with --json, else the human text. */
  result(value: unknown, human: () => string): void {
    process.stdout.write(this.json ? JSON.stringify(value) + "\n" : human() + "\n");
  }

  /** A human progress note on stderr (never in --json output). */
  note(text: string): void {
    if (!this.json) process.stderr.write(text + "\n");
  }

  /** Library logs go to stderr as JSON lines, so stdout stays the command's output. */
  logger(defaultLevel = "warn"): Logger {
    return pino({ level: process.env.LEASEHOLD_LOG_LEVEL ?? defaultLevel }, pino.destination({ fd: 2, sync: true }));
  }

  /** Commands with --nats call this before connecting: the flag, else LEASEHOLD_NATS_URL (none: polling only). */
  useNats(flag: string | undefined): void {
    this.natsUrl = flag ?? (process.env.LEASEHOLD_NATS_URL || undefined);
  }

  /**
   * Connects by the rule above; the connection is closed when the command ends. `graceful`:
   * the command stops on SIGINT/SIGTERM by itself (untilSignal), so an embedded server it
   * starts stays out of the terminal's Ctrl-C and is stopped after the command's shutdown.
   */
  async connect(options: { logger?: Logger; poolSize?: number; quiet?: boolean; graceful?: boolean } = {}): Promise<Leasehold> {
    let url = this.options.databaseUrl ?? process.env.DATABASE_URL;
    let schema = this.options.schema ?? process.env.LEASEHOLD_SCHEMA;
    if (!url) {
      const dev = readDevState(this.dataDir);
      if (dev) {
        url = dev.databaseUrl;
        schema ??= dev.schema;
      } else if (!options.quiet) {
        this.note(
          `No database given and no \`leasehold dev\` running: using the embedded PostgreSQL in ${path.join(this.dataDir, "pgdata")} (started for this command unless another process runs it).`,
        );
      }
    }
    const lh = await Leasehold.connect({
      databaseUrl: url,
      schema,
      pooling: this.options.pooling,
      directDatabaseUrl: this.options.directDatabaseUrl,
      embedded: {
        dataDir: path.join(this.dataDir, "pgdata"),
        relocateIfUnreachable: this.dataDirIsDefault,
        unreachableHint: "",
        ownProcessGroup: options.graceful ?? false,
        onRelocate: (to, from) => {
          this.embeddedDataDir = to;
          process.stderr.write(relocationNotice(to, from) + "\n");
        },
      },
      logger: options.logger ?? this.logger(),
      poolSize: options.poolSize,
      ...(this.natsUrl !== undefined && { nats: this.natsUrl }),
      ...(this.unknownTasks !== undefined && { unknownTasks: this.unknownTasks }),
    });
    this.closers.push(() => lh.close());
    return lh;
  }

  /** The server to use instead of the database: --server, else LEASEHOLD_SERVER_URL. */
  get serverUrl(): string | undefined {
    return this.options.server ?? process.env.LEASEHOLD_SERVER_URL;
  }

  get token(): string | undefined {
    return this.options.token ?? process.env.LEASEHOLD_TOKEN;
  }

  /** Job operations: through the server when one is given, else on the database. */
  async operations(): Promise<JobOperations> {
    const server = this.serverUrl;
    if (!server) return this.connect();
    const token = this.token;
    if (!token) throw new CliError("--server needs the server's API token: set LEASEHOLD_TOKEN or pass --token");
    return new RemoteOperations(server, token);
  }

  onClose(fn: () => Promise<void>): void {
    this.closers.push(fn);
  }

  async close(): Promise<void> {
    for (const fn of this.closers.splice(0).reverse()) await fn().catch(() => {});
  }
}

/** Wraps a command's action: builds its Cli from the global and local options, closes it after. */
export type Run = (fn: (cli: Cli, ...args: any[]) => Promise<void>) => (...args: any[]) => Promise<void>;

/** A URL safe to print: the password is masked. */
export function redactUrl(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = "***";
    return u.toString();
  } catch {
    return "(unparseable URL)";
  }
}
