/**
 * Where the benchmark's processes run. "shared": wherever the kernel puts them (every process
 * on every core, as the bench always ran). "split": PostgreSQL (its postmaster and every
 * backend) on one core, the worker processes and the bench's own process on the other. On a
 * 2-core machine a fleet that burns worker CPU otherwise takes it from the server; split, each
 * side has a core of its own, closer to a real fleet whose workers run on other hosts.
 *
 * Pinning goes through `taskset` (util-linux): `-a` sets every thread of a process. Backends
 * forked later inherit the postmaster's affinity and worker processes the bench's, so pinning
 * the postmaster, its running children and the bench before a row covers the whole row.
 */
import { spawnSync } from "node:child_process";
import fs from "node:fs";

export type CoreLayout = "shared" | "split";
export const CORE_LAYOUTS: readonly CoreLayout[] = ["shared", "split"];

/** The processes a split pins, and the cores they go to. */
export interface CoreSplit {
  /** The core PostgreSQL runs on, and the one the workers and the bench run on. */
  serverCpu: number;
  clientCpu: number;
  /** Pins the server and the bench; returns the undo. Throws if a process escaped. */
  pin(): () => void;
}

/**
 * Checks that a split is possible here and returns it: `taskset` installed, the postmaster's pid
 * known (a server the bench started), and at least two cores this process may use.
 */
export function coreSplit(postmasterPid: number | undefined): CoreSplit {
  const probe = spawnSync("taskset", ["--version"], { encoding: "utf8" });
  if (probe.error || probe.status !== 0) {
    throw new Error("--cores split needs taskset (util-linux: apt-get install util-linux), which is not on the PATH");
  }
  if (!postmasterPid) {
    throw new Error("--cores split pins PostgreSQL's processes: it needs the server the bench starts itself, not --database-url");
  }
  const allowed = cpusOf(process.pid);
  if (allowed.length < 2) {
    throw new Error(`--cores split needs two cores; this process may only use ${allowed.join(",") || "none"}`);
  }
  const [serverCpu, clientCpu] = allowed as [number, number];
  return {
    serverCpu,
    clientCpu,
    pin() {
      const serverBefore = cpusOf(postmasterPid);
      const benchBefore = allowed;
      // The postmaster first: a backend forked from now on inherits its core.
      setCpus(postmasterPid, [serverCpu]);
      for (const pid of childrenOf(postmasterPid)) setCpus(pid, [serverCpu], true);
      setCpus(process.pid, [clientCpu]);
      return () => {
        // The server's processes back on the cores it had, and the bench on its own.
        setCpus(postmasterPid, serverBefore);
        for (const pid of childrenOf(postmasterPid)) setCpus(pid, serverBefore, true);
        setCpus(process.pid, benchBefore);
      };
    },
  };
}

/**
 * Throws unless the server's processes all run on `serverCpu` and every pid of `clients` on
 * `clientCpu`: a check, at the end of a split row, that nothing ran where the row says it did not.
 */
export function assertSplit(split: CoreSplit, postmasterPid: number, clients: number[]): void {
  const wrong: string[] = [];
  for (const pid of [postmasterPid, ...childrenOf(postmasterPid)]) {
    const cpus = cpusOfOrUndefined(pid);
    if (cpus && (cpus.length !== 1 || cpus[0] !== split.serverCpu)) wrong.push(`server pid ${pid} on ${cpus.join(",")}`);
  }
  for (const pid of clients) {
    const cpus = cpusOfOrUndefined(pid);
    if (cpus && (cpus.length !== 1 || cpus[0] !== split.clientCpu)) wrong.push(`client pid ${pid} on ${cpus.join(",")}`);
  }
  if (wrong.length) throw new Error(`split cores: processes off their core: ${wrong.join("; ")}`);
}

/** The cores a process may run on (its main thread's `Cpus_allowed_list`). */
export function cpusOf(pid: number): number[] {
  const cpus = cpusOfOrUndefined(pid);
  if (!cpus) throw new Error(`no process ${pid}`);
  return cpus;
}

function cpusOfOrUndefined(pid: number): number[] | undefined {
  let status: string;
  try {
    status = fs.readFileSync(`/proc/${pid}/status`, "utf8");
  } catch {
    return undefined; // exited
  }
  const list = /^Cpus_allowed_list:\s*(\S+)/m.exec(status)?.[1] ?? "";
  return list.split(",").flatMap((part) => {
    const [from, to] = part.split("-").map(Number) as [number, number | undefined];
    return Array.from({ length: (to ?? from) - from + 1 }, (_, i) => from + i);
  });
}

/** `taskset -a -c -p`: every thread of `pid` onto `cpus`. `mayHaveExited`: a backend that ended meanwhile is fine. */
function setCpus(pid: number, cpus: number[], mayHaveExited = false): void {
  const r = spawnSync("taskset", ["-a", "-c", "-p", cpus.join(","), String(pid)], { encoding: "utf8" });
  if (r.status !== 0 && !(mayHaveExited && !fs.existsSync(`/proc/${pid}`))) {
    throw new Error(`taskset -a -c -p ${cpus.join(",")} ${pid} failed: ${r.stderr.trim() || r.error}`);
  }
}

/** The postmaster's children (backends, checkpointer, walwriter, ...) from /proc. */
function childrenOf(parent: number): number[] {
  const out: number[] = [];
  for (const entry of fs.readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${entry}/stat`, "utf8");
      if (Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]) === parent) out.push(Number(entry));
    } catch {
      // exited meanwhile
    }
  }
  return out;
}
