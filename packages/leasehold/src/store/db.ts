/**
 * The connection seam. Every Leasehold statement runs with `search_path` set to the
 * Leasehold schema, so the SQL in this folder names tables without a schema.
 */
import pg from "pg";
import { ConfigError } from "../errors.js";

/** Anything that can run a query: a pool or one client (inside a transaction). */
export interface Queryable {
  query<R extends pg.QueryResultRow = pg.QueryResultRow>(text: string, values?: unknown[]): Promise<pg.QueryResult<R>>;
}

export const DEFAULT_SCHEMA = "leasehold";
const SCHEMA_NAME = /^[a-z_][a-z0-9_]{0,62}$/;

// bigint ids come back as strings from pg; keep them as strings (exact beyond 2^53).
// timestamptz come back as Date.

/** An identifier quoted for SQL: a schema may be named like a keyword ("select"). */
export function quoteIdent(name: string): string {
  return pg.escapeIdentifier(name);
}

export function assertSchemaName(schema: string): string {
  if (!SCHEMA_NAME.test(schema)) {
    throw new ConfigError(`schema "${schema}" must be a lower-case SQL identifier (letters, digits, _)`);
  }
  return schema;
}

export interface PoolOptions {
  connectionString: string;
  schema?: string;
  max?: number;
  applicationName?: string;
  /**
   * "transaction": the URL goes through a transaction pooler, which refuses (PgBouncer) or
   * loses the `options` start-up parameter; the pooler sets search_path (store/pooling.ts).
   */
  pooling?: "session" | "transaction";
}

export function createPool(options: PoolOptions): pg.Pool {
  const schema = assertSchemaName(options.schema ?? DEFAULT_SCHEMA);
  const pool = new pg.Pool({
    connectionString: options.connectionString,
    max: options.max ?? 10,
    application_name: options.applicationName ?? "leasehold",
    // jit: our statements are small and frequent; a JIT compile would cost more than it saves.
    // The search_path value is a quoted identifier, so a schema named like a keyword works.
    ...(options.pooling !== "transaction" && { options: `-c search_path=${quoteIdent(schema)} -c jit=off` }),
    connectionTimeoutMillis: 10_000,
  });
  return guardClients(pool);
}

/**
 * A client whose connection dies (database restart, terminated backend) emits 'error'; unheard,
 * that event crashes the process. The pool hears it for idle clients and re-emits it on itself.
 * A client being handed out has no listener until its caller adds one, and a backend ended
 * right after its start-up delivers its FATAL in that gap (seen under pg_terminate_backend
 * storms), so every client keeps a listener of its own for its whole life. The next query
 * on it fails as a connection error and the pool discards it.
 */
export function guardClients(pool: pg.Pool): pg.Pool {
  pool.on("error", () => {});
  pool.on("connect", (client) => client.on("error", () => {}));
  return pool;
}

/**
 * Connections as the application's own would be (the server's default search_path), for
 * handlers' transactions (ctx.transaction): their SQL names the application's tables.
 */
export function createAppPool(connectionString: string, max = 10): pg.Pool {
  return guardClients(new pg.Pool({ connectionString, max, application_name: "leasehold-handler-tx", connectionTimeoutMillis: 10_000 }));
}

/** The NOTIFY channel that wakes workers of this schema; the payload is the queue name. */
export function notifyChannel(schema: string): string {
  return `leasehold:${schema}`;
}

/**
 * The channel on which a cancel request of a running job is announced (migration 014), with
 * "id:attempt:worker id" as payload: the worker holding that attempt aborts its handler.
 */
export function cancelChannel(schema: string): string {
  return `leasehold:${schema}:cancel`;
}

/**
 * A client checked out of a pool emits 'error' when its connection dies between statements
 * (a terminated backend while the transaction waits on the caller); unheard, that event would
 * crash the process. Held here, and the client is discarded rather than returned.
 */
export async function checkOut(pool: pg.Pool): Promise<{ client: pg.PoolClient; release: (err?: unknown) => void }> {
  const client = await pool.connect();
  let broken: unknown;
  const onError = (err: unknown) => (broken = err);
  client.on("error", onError);
  return {
    client,
    release: (err?: unknown) => {
      client.off("error", onError);
      const fault = broken ?? err;
      client.release(fault instanceof Error ? fault : fault === undefined ? undefined : new Error(String(fault)));
    },
  };
}

/** Runs fn inside a transaction on one client of the pool. */
export function withTransaction<T>(pool: pg.Pool, fn: (client: pg.PoolClient) => Promise<T>): Promise<T> {
  return inTransaction(pool, "BEGIN", fn);
}

/**
 * Runs fn's reads in one read-only REPEATABLE READ transaction: every statement sees the same
 * snapshot, so reads of one job's parts (its row, its attempts) cannot straddle a commit.
 */
export function withSnapshot<T>(pool: pg.Pool, fn: (client: pg.PoolClient) => Promise<T>): Promise<T> {
  return inTransaction(pool, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", fn);
}

async function inTransaction<T>(pool: pg.Pool, begin: string, fn: (client: pg.PoolClient) => Promise<T>): Promise<T> {
  const { client, release } = await checkOut(pool);
  let failed: unknown;
  try {
    await client.query(begin);
    const result = await fn(client);
    await client.query("COMMIT");
    return result;
  } catch (err) {
    await client.query("ROLLBACK").catch((e: unknown) => (failed = e));
    throw err;
  } finally {
    release(failed);
  }
}

/** Errors that mean "the request may or may not have been applied": retry the fenced call. */
export function isConnectionError(err: unknown): boolean {
  const e = err as { code?: string; message?: string };
  if (!e || typeof e !== "object") return false;
  if (typeof e.code === "string") {
    // node socket errors, and PostgreSQL's admin shutdown / connection-exception classes
    if (/^(ECONNRESET|ECONNREFUSED|EPIPE|ETIMEDOUT|ENOTFOUND|EHOSTUNREACH|ECONNABORTED|UND_ERR_\w+)$/.test(e.code)) return true;
    if (/^(57P0[1-3]|08\d{3})$/.test(e.code)) return true;
    // the remote transport: the server could not be reached, or could not reach the database
    if (e.code === "server_unavailable") return true;
  }
  return /Connection terminated|connection timeout|timeout exceeded when trying to connect|Client has encountered a connection error|socket hang up|fetch failed|Query read timeout/i.test(
    e.message ?? "",
  );
}
