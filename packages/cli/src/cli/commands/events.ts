/**
 * `leasehold events send EVENT [DATA]`: sends an event (docs/durable.md#events-and-the-race-with-a-wait), which wakes
 * the jobs waiting for it (ctx.waitForEvent). On the database, or through a server with --server.
 */
import type { Command } from "commander";
import { checkEventName, serializeEventData } from "leasehold/internal/jobs/steps";
import type { Run } from "../context.js";
import { json } from "../parse.js";

export function registerEventCommands(program: Command, run: Run): void {
  const events = program.command("events").description("durable steps' events: send one to wake the jobs waiting for it");

  events
    .command("send <event> [data]")
    .description("send an event (its data: JSON, or - to read it from stdin; default none): stored, and the jobs waiting for it woken")
    .action(
      run(async (cli, event: string, dataText: string | undefined) => {
        // Checked here, before any connection, so a bad name or data fails at once, naming it.
        checkEventName(event, "events send");
        // From stdin, data may be larger than one command-line argument can be.
        const text = dataText === "-" ? await readStdin() : dataText;
        const data = text === undefined ? undefined : json(text, "the event data");
        serializeEventData(data, "events send");
        const lh = await cli.operations();
        const sent = await lh.sendEvent(event, data);
        cli.result(sent, () => `event ${event} sent (id ${sent.id})`);
      }),
    );
}

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString("utf8");
}
