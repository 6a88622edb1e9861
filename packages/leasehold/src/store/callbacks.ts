/**
 * Completing a callback (docs/durable-callbacks.md): complete_callback() (migration 030) checks
 * the token was handed out and is unused, then sends its wait's event; every caller (the
 * library, `leasehold serve`, the CLI) comes here.
 */
import type { CallbackRefusal } from "../errors.js";
import type { Queryable } from "./db.js";
import { run, statement } from "./sql.js";

const COMPLETE_CALLBACK = statement("completeCallback", "SELECT complete_callback($1, $2::jsonb) AS outcome", { outcome: "text" });

export async function completeCallback(db: Queryable, token: string, dataJson: string | null): Promise<"completed" | CallbackRefusal> {
  const [row] = await run(db, COMPLETE_CALLBACK, [token, dataJson]);
  return row!.outcome as "completed" | CallbackRefusal;
}
