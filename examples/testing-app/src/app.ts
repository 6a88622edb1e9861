/**
 * The application: a sign-up that sends a welcome email through the queue, a daily digest, and
 * a contacts import that reports progress and resumes from its checkpoint. It takes a Leasehold
 * client (and a mailer) rather than making its own, so tests can hand it theirs.
 */
import type { Leasehold, Worker } from "leasehold";
import { createTasks, type Mailer } from "./tasks.js";

export async function signUp(lh: Leasehold, email: string): Promise<string> {
  // ... create the account in your database, then:
  const job = await lh.enqueue("send-welcome-email", { to: email }, { maxAttempts: 5 });
  return job.id;
}

export async function importContacts(lh: Leasehold, contacts: string[]): Promise<string> {
  return (await lh.enqueue("import-contacts", { contacts })).id;
}

/** Declared at every start: saving the same schedule again keeps its place. */
export async function declareSchedules(lh: Leasehold): Promise<void> {
  await lh.schedule({ name: "daily-digest", cron: "0 8 * * *", task: "send-digest", payload: { to: "team@example.com" } });
}

/** The app's worker process. */
export async function startWorker(lh: Leasehold, mailer: Mailer): Promise<Worker> {
  return lh.typed(createTasks(mailer)).worker({ concurrency: 5 }).start();
}
