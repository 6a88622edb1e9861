/**
 * Heartbeats over HTTP, judged beat by beat: one whose progress or checkpoint cannot be
 * stored is refused on its own (not renewed, nothing stored, answered in `invalid`), and the
 * request's other beats are renewed as usual. A bad value from one job must not stop the
 * leases of every job its worker holds from being renewed.
 */
import { ValidationError } from "leasehold/internal/errors";
import { serializePayload } from "leasehold/internal/jobs/validate";
import * as store from "leasehold/internal/store/index";

export interface BeatIn {
  id: string;
  attempt: number;
  progress?: unknown;
  checkpoint?: unknown;
}

export interface InvalidBeat {
  id: string;
  attempt: number;
  code: "invalid_input";
  message: string;
}

export async function renewBeats(
  db: store.Queryable,
  p: { workerId: string; leaseMs: number; beats: BeatIn[]; inFlight?: number; beatDelays?: number[] },
): Promise<{ result: store.BeatResult; invalid: InvalidBeat[] }> {
  const invalid: InvalidBeat[] = [];
  const ready: store.Beat[] = [];
  for (const b of p.beats) {
    try {
      ready.push({
        id: b.id,
        attempt: b.attempt,
        progressJson: b.progress === undefined ? null : serializePayload(b.progress, `job ${b.id}: progress`),
        checkpointJson: b.checkpoint === undefined ? null : serializePayload(b.checkpoint, `job ${b.id}: checkpoint`),
      });
    } catch (err) {
      // ValidationError: not JSON, or not storable; RangeError: nested too deeply to serialize.
      if (!(err instanceof ValidationError || err instanceof RangeError)) throw err;
      invalid.push({ id: b.id, attempt: b.attempt, code: "invalid_input", message: describeInvalid(b.id, err) });
    }
  }
  const extend = (beats: store.Beat[]) =>
    store.extendLeases(db, { workerId: p.workerId, leaseMs: p.leaseMs, beats, inFlight: p.inFlight, beatDelays: p.beatDelays });
  try {
    return { result: await extend(ready), invalid };
  } catch (err) {
    if (!refusedValue(err)) throw err;
  }
  // PostgreSQL refused a value that passed serializePayload (the statement changed nothing).
  // Find which: the beats without values together, then each beat with values alone.
  const renewed = new Map<string, { cancelRequested: boolean }>();
  const lost: string[] = [];
  const merge = (r: store.BeatResult) => {
    for (const [id, v] of r.renewed) renewed.set(id, v);
    lost.push(...r.lost);
  };
  const plain = ready.filter((b) => b.progressJson == null && b.checkpointJson == null);
  if (plain.length > 0) merge(await extend(plain));
  for (const b of ready.filter((x) => !plain.includes(x))) {
    try {
      merge(await extend([b]));
    } catch (err) {
      if (!refusedValue(err)) throw err;
      invalid.push({ id: b.id, attempt: b.attempt, code: "invalid_input", message: describeInvalid(b.id, err) });
    }
  }
  return { result: { renewed, lost }, invalid };
}

/** Data exceptions (class 22: bad JSON text, \u0000 in jsonb) and nesting too deep for jsonb (54001). */
function refusedValue(err: unknown): boolean {
  const code = (err as { code?: unknown })?.code;
  return typeof code === "string" && (code.startsWith("22") || code === "54001");
}

function describeInvalid(id: string, err: unknown): string {
  if (err instanceof ValidationError) return err.message;
  // JSON.stringify and recursive checks overflow the stack on deeply nested values.
  if (err instanceof RangeError || (err as { code?: string }).code === "54001") return `job ${id}: progress or checkpoint is nested too deeply`;
  // PostgreSQL's detail names what is wrong with the value ("Unicode low surrogate must follow a high surrogate."); never SQL.
  const e = err as { detail?: string; message?: string };
  return `job ${id}: progress or checkpoint cannot be stored as jsonb: ${(e.detail ?? e.message ?? "refused").split("\n")[0]}`;
}
