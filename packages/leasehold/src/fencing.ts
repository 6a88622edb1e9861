/**
 * Fenced downstream writes: how a handler writes its result somewhere else so that a stale
 * attempt (a zombie that woke up, a worker cut off past its lease) cannot overwrite the
 * result of a newer one. The downstream refuses the stale writer itself, using a token that
 * only grows as the fence. See docs/fencing.md.
 *
 * Two tokens: `ctx.fence` grows across every claim of every job (a sequence), so it fences a
 * row that several jobs write; `ctx.attempt` grows within one job, enough for a row only
 * that job writes. The target table needs a key column and a bigint token column:
 *
 *   CREATE TABLE results (
 *     key    text    PRIMARY KEY,
 *     token  bigint  NOT NULL,   -- the claim that wrote this row
 *     value  jsonb   NOT NULL
 *   );
 *
 * and the write is one statement:
 *
 *   INSERT INTO results (key, token, value) VALUES ($1, $2, $3)
 *   ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, value = EXCLUDED.value
 *    WHERE results.token <= EXCLUDED.token
 *
 * `<=` rather than `<`: the same claim may write again (a retry after an ambiguous commit is
 * not stale); an earlier one may not. Copy the statement for your own tables; this module
 * only builds it with escaped identifiers. From a handler, prefer `ctx.fencedWrite`: it uses
 * `ctx.fence`, and a refusal aborts the attempt and is counted.
 */
import pg from "pg";
import { ValidationError } from "./errors.js";

/** Anything with pg's `query` (a pool, a client, a client inside your own transaction). */
export interface FencedWriteDb {
  query(text: string, values?: unknown[]): Promise<{ rowCount: number | null }>;
}

export interface FencedWrite {
  /** The table to write; may be schema-qualified ("app.results"). */
  table: string;
  /** Column name to value for the key that identifies the row, e.g. { job_id: ctx.jobId }. */
  key: Record<string, unknown>;
  /**
   * The fencing token: `ctx.fence` (grows across every claim of every job: for a row several
   * jobs write) or `ctx.attempt` (grows within one job: for a row only that job writes). A
   * bigint may be given as a decimal string.
   */
  token: number | string;
  /** Other columns to write. */
  values: Record<string, unknown>;
  /** Name of the token column; default "token". */
  tokenColumn?: string;
}

const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/;

function quoteName(name: string, what: string): string {
  const parts = name.split(".");
  if (parts.length > 2 || !parts.every((p) => IDENTIFIER.test(p))) {
    throw new ValidationError(`${what} must be an SQL identifier (letters, digits, _; optionally schema.name), got ${JSON.stringify(name)}`);
  }
  return parts.map((p) => pg.escapeIdentifier(p)).join(".");
}

/** The statement `fencedWrite` runs, for reading or copying; values are `$1..$n` in key, token, values order. */
export function fencedWriteSql(w: Omit<FencedWrite, "token">): string {
  const table = quoteName(w.table, "table");
  const token = quoteName(w.tokenColumn ?? "token", "tokenColumn");
  const keys = Object.keys(w.key).map((k) => quoteName(k, "key column"));
  const cols = Object.keys(w.values).map((c) => quoteName(c, "column"));
  if (keys.length === 0) throw new ValidationError("fencedWrite needs at least one key column");
  const all = [...keys, token, ...cols];
  const placeholders = all.map((_, i) => `$${i + 1}`);
  const bareTable = table.split(".").pop()!;
  return (
    `INSERT INTO ${table} (${all.join(", ")}) VALUES (${placeholders.join(", ")})\n` +
    `ON CONFLICT (${keys.join(", ")}) DO UPDATE SET ${[token, ...cols].map((c) => `${c} = EXCLUDED.${c}`).join(", ")}\n` +
    ` WHERE ${bareTable}.${token} <= EXCLUDED.${token}`
  );
}

/**
 * Writes the row unless a later attempt already wrote it. Returns true if the write was
 * accepted, false if the downstream refused it as stale: then this attempt has lost its
 * job to a newer one, and should stop.
 */
export async function fencedWrite(db: FencedWriteDb, w: FencedWrite): Promise<boolean> {
  const ok =
    typeof w.token === "number" ? Number.isSafeInteger(w.token) && w.token >= 1 : typeof w.token === "string" && /^[1-9]\d{0,18}$/.test(w.token);
  if (!ok) {
    throw new ValidationError(`token must be ctx.fence or ctx.attempt, a positive integer (got ${JSON.stringify(w.token)})`);
  }
  const sql = fencedWriteSql(w);
  const { rowCount } = await db.query(sql, [...Object.values(w.key), w.token, ...Object.values(w.values)]);
  return rowCount === 1;
}
