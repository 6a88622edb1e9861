/**
 * The benchmark's side of a durable-workflow system (bench/workloads/durable.ts): reset its
 * tables, start workflows of one shape, send the event a waiting workflow expects, and count
 * unfinished and sleeping workflows. Its worker processes run `workerSystem` (SYSTEM_LOADERS)
 * with `WorkerSpec.durable` set.
 */
import type { DurableShape } from "./types.js";

/** What a workflow is started with: its id (also what its event is addressed to) and, asleep, its wake-up time. */
export interface DurableArgs {
  id: string;
  /** "sleep": when to wake (ms since the epoch), far in the future. */
  wakeAt?: number;
}

/** An event's data: when it was sent (nowMs clock), for the send-to-resume latency. */
export interface ResumeEvent {
  id: string;
  t: number;
}

export interface DurableStarter {
  /** Starts one workflow per entry, in as few calls as the system allows. */
  start(workflows: DurableArgs[]): Promise<void>;
  /** Sends the event the "event" workflow with this id waits for. */
  sendEvent(event: ResumeEvent): Promise<void>;
  /** Workflows not yet finished (queued, running, waiting or asleep). */
  unfinished(): Promise<number>;
  /** Workflows whose durable sleep is recorded. */
  sleeping(): Promise<number>;
  close(): Promise<void>;
}

export interface DurableDriver {
  /** The system its worker processes run (bench/systems/load.ts). */
  workerSystem: string;
  /** Drops and re-creates its tables: every run starts empty. */
  reset(url: string): Promise<void>;
  open(url: string, shape: DurableShape): Promise<DurableStarter>;
}

/** Steps per workflow of the "steps" shape. */
export const STEPS_PER_WORKFLOW = 5;
