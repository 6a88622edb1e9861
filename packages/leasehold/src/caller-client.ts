/**
 * Enqueueing on the caller's own `pg` client (the `db` of EnqueueTarget), inside the caller's
 * transaction: the client must be one connection, and several statements on it are all or
 * nothing.
 */
import { ValidationError } from "./errors.js";
import type { Queryable } from "./store/db.js";

/**
 * The caller's `db` must be one connection: a Pool would run each statement on whichever
 * connection is free, so a BEGIN could be left open on one while the rows land, committed
 * alone, on others.
 */
export function checkCallerClient(db: unknown): void {
  if (typeof (db as { query?: unknown })?.query !== "function") {
    throw new ValidationError("db must be a pg Client or PoolClient (an object with a query method)");
  }
  if (typeof (db as { connect?: unknown }).connect === "function" && "totalCount" in (db as object)) {
    throw new ValidationError(
      "db is a pg Pool: pass one client (const client = await pool.connect()) so the enqueue joins its transaction, or leave db out",
    );
  }
}

/**
 * Several statements on a caller's client, all or nothing: inside the caller's transaction
 * (a savepoint proves there is one) they are part of it, and a failure undoes them alone;
 * outside one, they get a transaction of their own.
 */
export async function allOrNothing<T>(db: Queryable, run: () => Promise<T>): Promise<T> {
  try {
    await db.query("SAVEPOINT leasehold_enqueue");
  } catch (err) {
    if ((err as { code?: string }).code !== "25P01") throw err; // no_active_sql_transaction
    await db.query("BEGIN");
    try {
      const result = await run();
      await db.query("COMMIT");
      return result;
    } catch (e) {
      await db.query("ROLLBACK").catch(() => {});
      throw e;
    }
  }
  try {
    const result = await run();
    await db.query("RELEASE SAVEPOINT leasehold_enqueue");
    return result;
  } catch (err) {
    // Undo the chunks written so far; the caller's transaction goes on, and decides.
    await db.query("ROLLBACK TO SAVEPOINT leasehold_enqueue").catch(() => {});
    throw err;
  }
}
