/**
 * Type-level test of typed events and typed steps, checked by `tsc` (npm run typecheck, through
 * tsconfig.check.json) and never run: each `@ts-expect-error` marks a misuse that must not
 * compile. Were the types to let one through, the directive itself would be the error.
 */
import { z } from "zod";
import { defineEvent, defineTask, type EventData, type EventInput, type JsonValue, type Leasehold } from "../packages/leasehold/src/index.js";
import type { TestQueue } from "../packages/leasehold/src/testkit/index.js";

/** Compile-time equality: `expectTypeOf(x).toBe<T>()` compiles only if x's type is exactly T. */
type Equal<A, B> = (<G>() => G extends A ? 1 : 2) extends <G>() => G extends B ? 1 : 2 ? true : false;
function expectTypeOf<Actual>(_value: Actual) {
  return { toBe: <Expected>(..._proof: Equal<Actual, Expected> extends true ? [] : [never]) => {} };
}
function expectType<T extends true>(_: T): void {}

const paymentSucceeded = defineEvent("payment.succeeded", z.object({ order: z.string(), amount: z.number(), currency: z.string().default("EUR") }));

expectTypeOf(paymentSucceeded.name).toBe<"payment.succeeded">();
expectType<Equal<EventInput<typeof paymentSucceeded>, { order: string; amount: number; currency?: string | undefined }>>(true);
expectType<Equal<EventData<typeof paymentSucceeded>, { order: string; amount: number; currency: string }>>(true);

export const checkout = defineTask({
  name: "checkout",
  schema: z.object({ order: z.string() }),
  handler: async (payload, ctx) => {
    // Steps are typed by their function; a transaction step by its work.
    const reserved = await ctx.step("reserve", async () => ({ sku: "a-1", count: 2 }));
    expectTypeOf(reserved).toBe<{ sku: string; count: number }>();
    const booked = await ctx.step.transaction("book", async () => 7);
    expectTypeOf(booked).toBe<number>();

    // A defined event: the wait returns its schema's output, or null after the timeout.
    const paid = await ctx.waitForEvent("paid", { event: paymentSucceeded, match: { order: payload.order }, timeout: "3d" });
    expectTypeOf(paid).toBe<{ order: string; amount: number; currency: string } | null>();
    // @ts-expect-error the wait may time out: null must be handled
    void paid.amount;

    // By name: JSON, or the type the caller states.
    const byName = await ctx.waitForEvent("shipped", { event: "order.shipped" });
    expectTypeOf(byName).toBe<JsonValue | null>();
    const stated = await ctx.waitForEvent<{ carrier: string }>("delivered", { event: "order.delivered" });
    expectTypeOf(stated).toBe<{ carrier: string } | null>();

    // @ts-expect-error an event is a name or an event made by defineEvent
    await ctx.waitForEvent("bad", { event: { name: "payment.succeeded" } });
    return paid?.currency ?? "expired";
  },
});

export async function send(lh: Leasehold, queue: TestQueue): Promise<void> {
  // Right: the input type (defaults may be left out); a name takes any data.
  await lh.sendEvent(paymentSucceeded, { order: "o-1", amount: 10 });
  await lh.sendEvent(paymentSucceeded, { order: "o-1", amount: 10, currency: "USD" }, { db: undefined });
  await lh.sendEvent("payment.succeeded", { anything: true });
  await lh.sendEvent("ping");
  await queue.sendEvent(paymentSucceeded, { order: "o-1", amount: 10 });
  await queue.sendEvent("ping");

  // @ts-expect-error wrong field type: amount is a number
  await lh.sendEvent(paymentSucceeded, { order: "o-1", amount: "10" });
  // @ts-expect-error a required field left out
  await lh.sendEvent(paymentSucceeded, { order: "o-1" });
  // @ts-expect-error a defined event's data is required
  await lh.sendEvent(paymentSucceeded);
  // @ts-expect-error the test queue's sendEvent is typed the same
  await queue.sendEvent(paymentSucceeded, { order: 1, amount: 10 });
}
