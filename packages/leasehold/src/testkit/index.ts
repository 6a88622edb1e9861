/**
 * `leasehold/testing`: helpers for your own test suites (docs/testing.md).
 *
 *   const queue = await createTestQueue({ handlers });   // a fresh, migrated database
 *   await signUp(queue.lh, "ada@example.com");            // your code enqueues
 *   await queue.expectEnqueued("send-email", { to: "ada@example.com" });
 *   await queue.drain();                                  // run them with a real worker
 *   await queue.clock.advance(24 * 3600_000);             // fake time: schedules and backoff
 *   await queue.close();                                  // drops the database
 *
 * Self-contained: it uses the library through its public entry points only.
 */
export { createTestQueue, TestQueue } from "./queue.js";
export type { TestQueueOptions } from "./queue.js";
export type { TestClock } from "./clock.js";
export type { TestHandlers } from "./handlers.js";
export type { DrainOptions, DrainResult, DrainedJob, LeftJob } from "./drain.js";
export type { ExpectEnqueuedOptions, PayloadMatcher, WaitForOptions } from "./expect.js";
export { payloadMatches } from "./expect.js";
export type { InlineOptions, InlineResult, InlineState } from "./inline.js";
export type { InlineSuspension } from "./inline-steps.js";
export { dropTemplates } from "./database.js";
