/**
 * Lines for stdout written together, once per turn of the event loop, instead of one write
 * each. `leasehold worker` prints a line at every job's start and end; on Linux a write to a
 * file, pipe or terminal is a synchronous system call, and two per job were ~28 % of a no-op
 * worker's CPU. A line that must not wait (a failure) is written at once, after the ones
 * before it, and whatever is left is written when the process exits.
 */
export interface LineWriter {
  /** Written by the end of this turn of the event loop. */
  line(text: string): void;
  /** Written now, after the lines before it. */
  urgent(text: string): void;
  /** Writes what waits (also done at the process's exit). */
  flush(): void;
}

/** Past this many characters waiting, they are written at once rather than at the turn's end. */
const MAX_PENDING_CHARS = 64 * 1024;

export function bufferedLines(write: (chunk: string) => void): LineWriter {
  let pending = "";
  let scheduled = false;
  const flush = () => {
    scheduled = false;
    if (pending === "") return;
    const chunk = pending;
    pending = "";
    write(chunk);
  };
  process.once("exit", flush);
  return {
    line(text) {
      pending += text + "\n";
      if (pending.length > MAX_PENDING_CHARS) flush();
      else if (!scheduled) {
        scheduled = true;
        setImmediate(flush);
      }
    },
    urgent(text) {
      pending += text + "\n";
      flush();
    },
    flush,
  };
}
