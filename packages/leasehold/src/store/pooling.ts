/**
 * Connection poolers (docs/deployment.md#pgbouncer-and-other-connection-poolers). In
 * transaction pooling (PgBouncer's `pool_mode = transaction`) a client owns its server
 * connection only for one transaction: session state (a SET, a session advisory lock, LISTEN)
 * stays behind on a connection the next client gets. So through such a pooler Leasehold sends
 * no `options` start-up parameter (PgBouncer refuses it), relies on the pooler to set
 * `search_path` (checked at connect), and keeps what needs a session (LISTEN, the liveness and
 * name locks) on the direct URL, or goes without it.
 */
import type pg from "pg";
import { ConfigError } from "../errors.js";
import type { Queryable } from "./db.js";

export type PoolingMode = "session" | "transaction";
export const POOLING_MODES: readonly PoolingMode[] = ["session", "transaction"];

/** The `pooling` option, else LEASEHOLD_POOLING, else "session"; anything else is refused. */
export function resolvePooling(given: unknown): PoolingMode {
  const fromEnv = given === undefined;
  const value = fromEnv ? process.env.LEASEHOLD_POOLING || "session" : given;
  if (!POOLING_MODES.includes(value as PoolingMode)) {
    throw new ConfigError(`${fromEnv ? "LEASEHOLD_POOLING" : "pooling"} must be "session" or "transaction" (got ${JSON.stringify(value)})`);
  }
  return value as PoolingMode;
}

const OPTIONS_REFUSED = /unsupported startup parameter: options/i;

/**
 * A pooler refused the `options` start-up parameter (PgBouncer does unless told to ignore it):
 * the URL goes through a pooler, so say how to connect through one. Other errors pass through.
 */
export function explainStartupRefusal(err: unknown, which: "databaseUrl" | "directDatabaseUrl"): unknown {
  if (!OPTIONS_REFUSED.test(String((err as Error)?.message ?? err))) return err;
  if (which === "directDatabaseUrl") {
    return new ConfigError(
      "directDatabaseUrl refused the `options` start-up parameter: it goes through a pooler. It must reach PostgreSQL itself " +
        "(or a session-mode pool that passes `options`): the worker's liveness lock and LISTEN need a session of their own",
    );
  }
  return new ConfigError(
    "the database refused the `options` start-up parameter: databaseUrl goes through a connection pooler (PgBouncer). " +
      'Set pooling: "transaction" (LEASEHOLD_POOLING=transaction, --pooling transaction), give the pooler\'s database ' +
      "a connect_query that sets search_path to Leasehold's schema, and give directDatabaseUrl for LISTEN and the liveness " +
      "lock (docs/deployment.md#pgbouncer-and-other-connection-poolers)",
  );
}

/**
 * Through a transaction pooler Leasehold cannot set its schema itself: the pooler's
 * connections must arrive with `search_path` on it already. Checked once at connect, so a
 * wrong setup fails here by name rather than later as "relation jobs does not exist".
 */
export async function checkPooledSchema(db: Queryable, schema: string): Promise<void> {
  const { rows } = await db.query<{ schema: string | null }>("SELECT current_schema() AS schema");
  const found = rows[0]?.schema ?? null;
  if (found === schema) return;
  throw new ConfigError(
    `pooling "transaction": connections through databaseUrl have current_schema() ${found === null ? "NULL (no schema of search_path exists)" : JSON.stringify(found)}, ` +
      `not Leasehold's schema "${schema}". A transaction pooler cannot pass search_path for Leasehold: set it on the pooler's side, ` +
      `e.g. a PgBouncer database alias with connect_query = 'SET search_path = ${schema}; SET jit = off', ` +
      `or ALTER ROLE <user> SET search_path = ${schema} (docs/deployment.md#pgbouncer-and-other-connection-poolers)`,
  );
}

const BACKEND_PID = "SELECT pg_backend_pid() AS pid";

async function backendPid(db: Queryable): Promise<number> {
  const { rows } = await db.query<{ pid: number }>(BACKEND_PID);
  return rows[0]!.pid;
}

/**
 * Whether `session` keeps its PostgreSQL backend to itself, as the worker's liveness and name
 * locks need: checked once per session before they are taken (so a refusal leaves none behind
 * on a pooled connection), at the cost of one more connection then and none per job. A
 * transaction pooler that drops the `options` start-up parameter (PgBouncer with
 * `ignore_startup_parameters = options`) is otherwise invisible. Between two statements of the
 * session, `other` (a second client of the same URL) runs one: through a transaction pooler
 * it is handed the session's backend (PgBouncer reuses the last one released), or, if that was
 * busy, the session comes back on the one `other` just released. Either is impossible on a
 * connection of its own (PostgreSQL itself, or a session-mode pool), so it never misfires there.
 */
export async function checkOwnBackend(
  session: Queryable,
  openOther: () => Promise<pg.Client>,
  which: "databaseUrl" | "directDatabaseUrl",
): Promise<void> {
  const before = await backendPid(session);
  const other = await openOther();
  let others: number;
  try {
    others = await backendPid(other);
  } finally {
    await other.end().catch(() => {});
  }
  const after = await backendPid(session);
  if (others !== before && after === before) return;
  const what =
    `${which} hands a session's PostgreSQL connection to other clients between its transactions: it goes through a ` +
    "transaction pooler (PgBouncer pool_mode = transaction) that drops the `options` start-up parameter " +
    "(ignore_startup_parameters = options). The worker's liveness and name locks would stay behind on a pooled connection " +
    "(crash detection would not fire, and a restart with the same name would be refused). ";
  throw new ConfigError(
    which === "directDatabaseUrl"
      ? what + "directDatabaseUrl must reach PostgreSQL itself, or a session-mode pool (docs/deployment.md#pgbouncer-and-other-connection-poolers)"
      : what +
          'Set pooling: "transaction" (LEASEHOLD_POOLING=transaction, --pooling transaction) and give directDatabaseUrl, straight to ' +
          "PostgreSQL, for the worker's session (docs/deployment.md#pgbouncer-and-other-connection-poolers)",
  );
}
