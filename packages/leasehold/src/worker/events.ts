/**
 * The worker's events, typed: a listener gets the arguments its event carries, and an event
 * name the worker never emits is a compile error (`worker.on("jb:end", ...)`). At run time
 * this is node's EventEmitter, unchanged.
 */
import { EventEmitter } from "node:events";
import type { StaleLeaseError } from "../errors.js";
import type { ClaimedJob } from "../jobs/types.js";
import type { JobAbortedError } from "./context.js";
import type { JobOutcome } from "./report-end.js";

export interface WorkerEvents {
  /** A handler starts an attempt. */
  "job:start": [job: ClaimedJob];
  /** An attempt ended, and how (reported, lost, refused as stale, or its report failed). */
  "job:end": [job: ClaimedJob, outcome: JobOutcome];
  /** A report of this worker's was refused: the attempt no longer held the job. */
  "job:stale": [job: ClaimedJob, error: StaleLeaseError];
  /** A running handler's signal was aborted, and why. */
  "job:aborted": [job: ClaimedJob, error: JobAbortedError];
  /** A claim found nothing to do. */
  idle: [];
  /** Another process took this worker's name; the worker stops. */
  "identity:lost": [error: Error];
  stopped: [];
  /** @internal A handler's slot came free (a stopping worker waits on it). */
  slot: [];
}

export type WorkerEventName = keyof WorkerEvents;
type Listener<E extends WorkerEventName> = (...args: WorkerEvents[E]) => void;
type ListenerMethod = "on" | "once" | "off" | "addListener" | "removeListener" | "prependListener" | "prependOnceListener";

/** node's EventEmitter with the listener methods and `emit` narrowed to the worker's events. */
export interface WorkerEmitter extends Omit<EventEmitter, ListenerMethod | "emit"> {
  on<E extends WorkerEventName>(event: E, listener: Listener<E>): this;
  once<E extends WorkerEventName>(event: E, listener: Listener<E>): this;
  off<E extends WorkerEventName>(event: E, listener: Listener<E>): this;
  addListener<E extends WorkerEventName>(event: E, listener: Listener<E>): this;
  removeListener<E extends WorkerEventName>(event: E, listener: Listener<E>): this;
  prependListener<E extends WorkerEventName>(event: E, listener: Listener<E>): this;
  prependOnceListener<E extends WorkerEventName>(event: E, listener: Listener<E>): this;
  emit<E extends WorkerEventName>(event: E, ...args: WorkerEvents[E]): boolean;
}

/** The base class of Worker: EventEmitter itself, seen through WorkerEmitter's types. */
export const WorkerEmitter = EventEmitter as unknown as new () => WorkerEmitter;
