/** Option values from the command line, checked with messages that name the flag. */
import fs from "node:fs";
import { MAX_LIMIT_MS, MIN_LIMIT_MS } from "leasehold/internal/jobs/validate";
import { CliError } from "./errors.js";

export function int(flag: string, min: number, max: number): (value: string) => number {
  return (value) => {
    if (!/^-?\d+$/.test(value.trim())) throw new CliError(`${flag} must be a whole number (got ${JSON.stringify(value)})`);
    const n = Number(value);
    if (n < min || n > max) throw new CliError(`${flag} must be from ${min} to ${max} (got ${n})`);
    return n;
  };
}

const UNITS: Record<string, number> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/** "500ms", "30s", "5m", "2h", "1d" → milliseconds. */
export function duration(flag: string): (value: string) => number {
  return (value) => {
    const m = /^(\d+(?:\.\d+)?)(ms|s|m|h|d)$/.exec(value.trim());
    if (!m) throw new CliError(`${flag} must be a duration like 500ms, 30s, 5m, 2h or 1d (got ${JSON.stringify(value)})`);
    return Math.round(Number(m[1]) * UNITS[m[2]!]!);
  };
}

/**
 * A run-time limit: a duration from 1s to 7d (the bounds the library checks), or "none" for no
 * limit (commander turns a parser's null into "", so "none" is kept: see `noneAsNull`).
 */
export function limitOrNone(flag: string): (value: string) => number | "none" {
  const parse = duration(flag);
  return (value) => {
    if (value.trim() === "none") return "none";
    let ms: number;
    try {
      ms = parse(value);
    } catch {
      throw new CliError(`${flag} must be a duration like 30s, 15m or 2h, or none for no limit (got ${JSON.stringify(value)})`);
    }
    if (ms < MIN_LIMIT_MS || ms > MAX_LIMIT_MS)
      throw new CliError(`${flag} must be from 1s to 7d, or none for no limit (got ${JSON.stringify(value)})`);
    return ms;
  };
}

export function noneAsNull(value: number | "none"): number | null {
  return value === "none" ? null : value;
}

export function isoDate(flag: string): (value: string) => Date {
  return (value) => {
    const d = new Date(value);
    if (!/^\d{4}-\d{2}-\d{2}/.test(value) || Number.isNaN(d.getTime())) {
      throw new CliError(`${flag} must be an ISO 8601 date-time like 2030-01-31T12:00:00Z (got ${JSON.stringify(value)})`);
    }
    return d;
  };
}

export function list(flag: string): (value: string) => string[] {
  return (value) => {
    const items = value
      .split(",")
      .map((s) => s.trim())
      .filter(Boolean);
    if (items.length === 0) throw new CliError(`${flag} needs at least one name`);
    return items;
  };
}

export function json(text: string, what: string): unknown {
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new CliError(`${what} is not valid JSON: ${(err as Error).message}`);
  }
}

export function readFile(file: string, flag: string): string {
  try {
    return fs.readFileSync(file, "utf8");
  } catch (err) {
    throw new CliError(`${flag}: cannot read ${file} (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`);
  }
}
