/**
 * A process that takes one message from a NATS dispatch consumer and never acknowledges it:
 * a worker between receiving a message and claiming its job, to be killed with kill -9.
 * Prints "got <body>" once it holds the message. Environment: NATS_URL, STREAM, CONSUMER.
 */
import { connect } from "@nats-io/transport-node";
import { jetstream } from "@nats-io/jetstream";

const nc = await connect({ servers: process.env.NATS_URL! });
const consumer = await jetstream(nc).consumers.get(process.env.STREAM!, process.env.CONSUMER!);
for (;;) {
  const m = await consumer.next({ expires: 1_000 });
  if (m) {
    process.stdout.write(`got ${m.string()}\n`);
    break;
  }
}
await new Promise(() => {}); // holds it until killed
