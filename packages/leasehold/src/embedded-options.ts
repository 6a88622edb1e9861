/**
 * The embedded PostgreSQL for development (`Leasehold.connect({ embedded: true })`) lives in the
 * `@leasehold/cli` package with the rest of the tooling; the library loads it only when asked.
 * Its options are declared here so that they type-check without it.
 */
import { loadOptional } from "./optional.js";
export interface EmbeddedPostgresOptions {
  /** Where the cluster's files live. Default `./.leasehold/pgdata`. */
  dataDir?: string;
  /** TCP port on 127.0.0.1; 0 (default) picks a free one. */
  port?: number;
  /** Extra `-c name=value` settings for the server. */
  settings?: Record<string, string | number>;
  /** Where server output goes; defaults to a log file beside the data directory. */
  onLog?: (line: string) => void;
  /**
   * As root, when the `postgres` user cannot reach `dataDir` (a parent is closed to other
   * users), keep the cluster in /var/lib/leasehold/data-<hash of dataDir> instead of
   * refusing. Default: true for the default data directory (no `dataDir` given), false for
   * one you chose. The CLI sets it only for its default data directory.
   */
  relocateIfUnreachable?: boolean;
  /** What the refusal of an unreachable `dataDir` tells to do instead; default: names `relocateIfUnreachable`. */
  unreachableHint?: string;
  /** Told when the cluster is relocated; default: one line on stderr. */
  onRelocate?: (dataDir: string, requested: string) => void;
  /**
   * Run the server in a process group of its own, so a Ctrl-C in the terminal reaches only
   * this process and not the server: the owner's graceful shutdown (finish or release running
   * jobs) still has its database, and stop() ends the server after it. For owners that handle
   * SIGINT and SIGTERM themselves; the server is also stopped when this process exits.
   * Default false: the server gets the terminal's signals like any child.
   */
  ownProcessGroup?: boolean;
}

/** A started (or joined) embedded server, as the client uses it. */
export interface EmbeddedServer {
  readonly dataDir: string;
  /** Set when another process runs the server on this data directory (this one only connected). */
  readonly owner?: unknown;
  /** Starts the server (or joins the running one); resolves with its URL. */
  start(): Promise<string>;
  /** Stops the server if this process started it. */
  stop(): Promise<void>;
}

/** A server for `embedded` (true, or its options), from `@leasehold/cli`; a ConfigError says what to install without it. */
export async function embeddedServer(options: true | EmbeddedPostgresOptions): Promise<EmbeddedServer> {
  const { EmbeddedPostgres } = await loadOptional<{ EmbeddedPostgres: new (o: EmbeddedPostgresOptions) => EmbeddedServer }>(
    "@leasehold/cli/embedded",
    "embedded: true",
  );
  return new EmbeddedPostgres(options === true ? {} : options);
}
