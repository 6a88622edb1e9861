/**
 * The `tx` a handler gets from `ctx.transaction`: the pooled connection of that transaction,
 * behind a guard. The transaction commits with the job's completion, so the handler must not
 * end it itself: COMMIT, ROLLBACK, BEGIN and the like are refused (SAVEPOINT, ROLLBACK TO
 * SAVEPOINT and RELEASE, which nest inside it, are not), so is `release()`, and once the
 * callback has returned `tx` is dead: its connection went back to the pool, where it may run
 * another job's transaction. A refused statement is never sent; the attempt then fails even if
 * the handler caught the error. The database checks too (a marker of the transaction, see
 * store/finish.ts), for what slips past the text: a statement sent on `tx.connection` itself.
 */
import type pg from "pg";
import { TransactionMisuseError } from "../errors.js";

export interface GuardedTransaction {
  /** What the handler is given. */
  tx: pg.PoolClient;
  /** What the handler tried that would have broken out of the transaction, if it did. */
  readonly misuse: string | undefined;
  /** The callback returned (or threw): from now on every use of `tx` throws. */
  end(): void;
}

/** Methods that add a listener: removed when the callback ends, so none stays on a pooled connection. */
const LISTENER_METHODS = new Set<PropertyKey>(["on", "addListener", "once", "prependListener", "prependOnceListener"]);

/** `label` names the attempt in errors ("job 12 attempt 1"). */
export function guardTransaction(client: pg.PoolClient, label: string): GuardedTransaction {
  let misuse: string | undefined;
  let ended = false;
  const listeners: [string | symbol, (...args: unknown[]) => void][] = [];
  const refuse = (problem: string): TransactionMisuseError => {
    misuse ??= problem;
    return new TransactionMisuseError(problem);
  };
  const afterEnd = () =>
    refuse(
      `ctx.transaction (${label}): tx was used after its callback returned; its connection went back to the pool ` +
        "and may be running another job's transaction. Keep no reference to tx beyond the callback",
    );

  /** pg's query, refusing what would end the transaction (answered as pg would: callback, or rejected promise). */
  const query = (...args: unknown[]): unknown => {
    const statement = ended ? undefined : transactionControl(queryText(args[0]));
    if (!ended && statement === undefined) return (client.query as (...a: unknown[]) => unknown)(...args);
    const err = ended
      ? afterEnd()
      : refuse(
          `ctx.transaction (${label}): the handler sent ${statement} on tx, which was not run. The transaction ends with ` +
            "the job's completion: return from the callback to commit, throw to roll back, and use SAVEPOINT / " +
            "ROLLBACK TO SAVEPOINT to undo part of it",
        );
    const callback = args[args.length - 1];
    if (typeof callback === "function") {
      process.nextTick(callback as (e: Error) => void, err);
      return undefined;
    }
    if (typeof (args[0] as { submit?: unknown } | null)?.submit === "function") throw err;
    return Promise.reject(err);
  };
  const release = () => {
    throw ended
      ? afterEnd()
      : refuse(`ctx.transaction (${label}): the handler called tx.release(); the connection is released when the callback returns`);
  };

  const tx = new Proxy(client, {
    get(target, prop) {
      if (prop === "query") return query;
      if (prop === "release") return release;
      if (ended && prop === "connection") throw afterEnd();
      const value: unknown = Reflect.get(target, prop, target);
      if (typeof value !== "function") return value;
      if (ended)
        return () => {
          throw afterEnd();
        };
      const method = value as (...a: unknown[]) => unknown;
      if (!LISTENER_METHODS.has(prop)) return method.bind(target); // bound, a constructor (pg's _Promise) stays one
      return (event: string | symbol, listener: (...a: unknown[]) => void) => {
        listeners.push([event, listener]);
        method.call(target, event, listener);
        return tx; // chaining (tx.on(...).on(...)) stays on the guard
      };
    },
    set(target, prop, value) {
      if (ended) throw afterEnd();
      return Reflect.set(target, prop, value, target);
    },
  });

  return {
    tx,
    get misuse() {
      return misuse;
    },
    end() {
      if (ended) return;
      ended = true;
      for (const [event, listener] of listeners) client.removeListener(event, listener);
    },
  };
}

function queryText(first: unknown): string | undefined {
  if (typeof first === "string") return first;
  const text = (first as { text?: unknown } | null)?.text;
  return typeof text === "string" ? text : undefined;
}

/**
 * The first statement of `sql` that would end the surrounding transaction or start one
 * ("COMMIT", "ROLLBACK", "BEGIN", "START TRANSACTION", "PREPARE TRANSACTION", ...), or
 * undefined. Comments, quoted strings and identifiers, and dollar-quoted bodies (a DO block's,
 * a function's) are skipped: only a top-level statement can end the transaction.
 */
export function transactionControl(sql: string | undefined): string | undefined {
  // Most statements name none of these words: they skip the scan.
  if (sql === undefined || !/\b(BEGIN|COMMIT|END|ABORT|ROLLBACK|START|PREPARE)\b/i.test(sql)) return undefined;
  let atomic = false; // inside a BEGIN ATOMIC function body, whose statements end in ";" too
  for (const statement of topLevelStatements(sql)) {
    const words = statement.match(/[a-z_]+/gi)?.map((w) => w.toUpperCase()) ?? [];
    const [first, second] = words;
    if (atomic) {
      if (first === "END") atomic = false;
      continue;
    }
    if (/\bBEGIN\s+ATOMIC\b/i.test(statement) && first !== "BEGIN") {
      atomic = !/\bBEGIN\s+ATOMIC\s+END\s*$/i.test(statement); // an empty body ends here
      continue;
    }
    if (first === "COMMIT" && second === "PREPARED") return "COMMIT PREPARED";
    if (first === "BEGIN" || first === "COMMIT" || first === "END" || first === "ABORT") return first;
    if (first === "START" && second === "TRANSACTION") return "START TRANSACTION";
    if (first === "PREPARE" && second === "TRANSACTION") return "PREPARE TRANSACTION";
    if (first === "ROLLBACK") {
      // ROLLBACK [WORK | TRANSACTION] TO [SAVEPOINT] name nests; a bare ROLLBACK ends it all.
      const to = second === "WORK" || second === "TRANSACTION" ? words[2] : second;
      if (to !== "TO") return "ROLLBACK";
    }
  }
  return undefined;
}

/** The text of each top-level statement, with comments and quoted parts blanked out. */
function topLevelStatements(sql: string): string[] {
  let out = "";
  let i = 0;
  const n = sql.length;
  while (i < n) {
    const c = sql[i]!;
    const next = sql[i + 1];
    if (c === "-" && next === "-") {
      const end = sql.indexOf("\n", i);
      i = end === -1 ? n : end;
      out += " ";
    } else if (c === "/" && next === "*") {
      let depth = 1;
      i += 2;
      while (i < n && depth > 0) {
        const pair = sql.slice(i, i + 2);
        if (pair === "/*") depth++;
        else if (pair === "*/") depth--;
        i += pair === "/*" || pair === "*/" ? 2 : 1;
      }
      out += " ";
    } else if (c === "'" || c === '"') {
      // E'...' strings take backslash escapes; doubled quotes escape in every kind.
      const escapes = c === "'" && /[eE]/.test(sql[i - 1] ?? "") && !/[\w$]/.test(sql[i - 2] ?? "");
      i++;
      while (i < n) {
        if (escapes && sql[i] === "\\") i += 2;
        else if (sql[i] === c && sql[i + 1] === c) i += 2;
        else if (sql[i] === c) break;
        else i++;
      }
      i++;
      out += " x ";
    } else if (c === "$" && !/[\w$]/.test(sql[i - 1] ?? "")) {
      const tag = /^\$([A-Za-z_][\w]*)?\$/.exec(sql.slice(i))?.[0];
      if (tag === undefined) {
        out += c;
        i++;
        continue;
      }
      const end = sql.indexOf(tag, i + tag.length);
      i = end === -1 ? n : end + tag.length;
      out += " x ";
    } else {
      out += c;
      i++;
    }
  }
  return out.split(";");
}

/**
 * Runs `work` on a guarded `tx` of `client` (already in its transaction): a misuse fails it with
 * a TransactionMisuseError, even one the handler caught, and `tx` is dead once `work` returns.
 */
export async function runGuarded<T>(client: pg.PoolClient, label: string, work: (tx: pg.PoolClient) => Promise<T>): Promise<T> {
  const guard = guardTransaction(client, label);
  let value: T;
  try {
    value = await work(guard.tx);
  } catch (err) {
    throw guard.misuse === undefined ? err : new TransactionMisuseError(guard.misuse);
  } finally {
    guard.end();
  }
  // Refused before it was sent, and caught by the handler: the attempt fails all the same.
  if (guard.misuse !== undefined) throw new TransactionMisuseError(guard.misuse);
  return value;
}
