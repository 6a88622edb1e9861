/**
 * Store statements with their result columns declared beside the SQL: the row type the code
 * reads is derived from the declaration, and a test (test/statements.test.ts) runs every
 * registered statement against the migrated schema and compares the columns PostgreSQL
 * describes with it, so a renamed or retyped column fails a test before it fails a user.
 */
import type pg from "pg";
import type { JsonValue } from "../jobs/types.js";
import type { Queryable } from "./db.js";

/** PostgreSQL type names (pg_type.typname) and the JavaScript value `pg` returns for each. */
interface ColumnTypes {
  int8: string; // exact beyond 2^53: kept as a string
  int4: number;
  int2: number;
  float8: number;
  bool: boolean;
  text: string;
  timestamptz: Date;
  jsonb: JsonValue;
  _text: string[];
  _int4: number[];
}

type TypeName = keyof ColumnTypes;
/** A column's type; a trailing "?" marks it nullable. */
export type ColumnType = TypeName | `${TypeName}?`;
export type Columns = Record<string, ColumnType>;

export type RowOf<C extends Columns> = {
  -readonly [K in keyof C]: C[K] extends `${infer T extends TypeName}?` ? ColumnTypes[T] | null : C[K] extends TypeName ? ColumnTypes[C[K]] : never;
};

export interface Statement<C extends Columns = Columns> {
  /** The store function's name, for messages. */
  readonly name: string;
  readonly text: string;
  /** Result columns in order; {} for a statement that returns no rows. */
  readonly columns: C;
}

const registry: Statement[] = [];

/** Declares (and registers, for the schema test) a statement and its result columns. */
export function statement<const C extends Columns>(name: string, text: string, columns: C): Statement<C> {
  const st = { name, text, columns };
  registry.push(st);
  return st;
}

/** Every statement declared so far (the store's modules register theirs when loaded). */
export function registeredStatements(): readonly Statement[] {
  return registry;
}

/** Runs a statement; rows come back typed by its declaration. */
export async function run<C extends Columns>(db: Queryable, st: Statement<C>, values: unknown[] = []): Promise<RowOf<C>[]> {
  const result: pg.QueryResult = await db.query(st.text, values);
  return result.rows as RowOf<C>[];
}
