/**
 * Graceful stop for long-running commands: the first SIGINT/SIGTERM resolves (the command
 * then shuts down cleanly); a second one exits at once.
 */
import type { Cli } from "./context.js";

export function untilSignal(cli: Cli, what: string): Promise<NodeJS.Signals> {
  return new Promise((resolve) => {
    const first = (signal: NodeJS.Signals) => {
      process.off("SIGINT", first);
      process.off("SIGTERM", first);
      cli.note(`${signal}: ${what} (send it again to exit at once)`);
      process.once("SIGINT", () => process.exit(130));
      process.once("SIGTERM", () => process.exit(143));
      resolve(signal);
    };
    process.on("SIGINT", first);
    process.on("SIGTERM", first);
  });
}
