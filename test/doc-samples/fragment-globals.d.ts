// The names the docs' fragments (<!-- sample: fragment -->) use without declaring: what the
// prose around them says exists, with the type it gives. Only tsconfig.fragments.json sees this
// file: the programs, and the rest of the repository, must declare what they use.

// The client, a worker's context and the test kit's queue, as each page introduces them.
declare const lh: import("leasehold").Leasehold;
declare const ctx: import("leasehold").JobContext;
declare const handlers: import("leasehold").TaskHandlers;
declare const queue: import("leasehold/testing").TestQueue;
declare const databaseUrl: string;
declare const serverUrl: string;
declare const token: string;
declare const transport: import("leasehold").WorkerTransport;
declare const tracerProvider: import("@opentelemetry/api").TracerProvider;

// Names api.md imports once at its top, for the whole page.
declare const Leasehold: typeof import("leasehold").Leasehold;
declare const Worker: typeof import("leasehold").Worker;
declare const RemoteTransport: typeof import("leasehold").RemoteTransport;
declare const PayloadValidationError: typeof import("leasehold").PayloadValidationError;
type JobContext = import("leasehold").JobContext;
type Handler<P = any> = import("leasehold").Handler<P>;
declare const z: typeof import("zod").z;

// Tasks defined earlier on the page (typescript.md, api.md).
declare const sendEmail: import("leasehold").DefinedTask<"send-email", import("leasehold").StandardSchemaV1<{ to: string }>>;
declare const order: import("leasehold").DefinedTask<"order", import("leasehold").StandardSchemaV1<{ items: { sku: string }[] }>>;

// Hooks, written elsewhere on tracing.md.
declare const beforeEnqueue: NonNullable<import("leasehold").LeaseholdHooks["beforeEnqueue"]>;
declare const aroundHandler: NonNullable<import("leasehold").LeaseholdHooks["aroundHandler"]>;
declare const afterAttempt: NonNullable<import("leasehold").LeaseholdHooks["afterAttempt"]>;
declare const a: import("leasehold").LeaseholdHooks;
declare const b: import("leasehold").LeaseholdHooks;
declare const tenantStorage: import("node:async_hooks").AsyncLocalStorage<string | undefined>;
declare function currentTenant(): string;
declare function alert(message: string): void;

// The application's own code and data.
declare const pool: import("pg").Pool;
declare const appPool: import("pg").Pool;
declare const orders: any; // a drizzle table
declare const url: string;
declare const tenantId: string;
declare const earlierJobId: string;
declare const rev: number;
declare const customer: string;
declare const email: string;
declare const contacts: { name: string; email: string }[];
declare const invoices: { id: string; customer: string; cents: number }[];
declare const input: any; // a request's body
declare const write: Omit<import("leasehold").FencedWrite, "token">;
declare const payments: { charge(orderId: string, cents: number, options: { idempotencyKey: string }): Promise<{ id: string }> };
interface Mailer {
  send(to: string, options?: { signal?: AbortSignal; idempotencyKey?: string }): Promise<void>;
}
declare const mailer: Mailer;
declare const fakeMailer: Mailer & { sent: string[] };
declare function sendMail(to: string, options?: { signal?: AbortSignal; idempotencyKey?: string }): Promise<void>;
declare function resizeImage(file: string, width: number, options?: { signal?: AbortSignal }): Promise<void>;
declare function render(frame: number): Promise<void>;
declare function log(...values: unknown[]): void;
declare const reply: { status(code: number): { send(body: unknown): unknown } };

// A user's test imports its app (testing.md), and a tasks module its definitions (typescript.md).
declare module "*/src/app.js" {
  export function signUp(lh: import("leasehold").Leasehold, email: string): Promise<void>;
}
declare module "*/src/tasks.js" {
  export function createTasks(mailer: Mailer): import("leasehold").TaskHandlers;
}
declare module "*/tasks/definitions.js" {
  export const resize: import("leasehold").DefinedTask<"resize", import("leasehold").StandardSchemaV1<{ file: string }>>;
  export const sendEmail: import("leasehold").DefinedTask<"send-email", import("leasehold").StandardSchemaV1<{ to: string }>>;
}

// Packages the docs name that this repository does not install.
declare module "@opentelemetry/sdk-node" {
  export class NodeSDK {
    constructor(config?: object);
    start(): void;
  }
}
declare module "drizzle-orm/node-postgres" {
  export function drizzle(client: import("pg").PoolClient): any;
}
