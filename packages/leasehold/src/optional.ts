/**
 * Optional packages the library loads only when an option asks for them (NATS dispatch, the
 * embedded PostgreSQL): a web app that only enqueues never installs or loads them.
 */
import { ConfigError } from "./errors.js";

export async function loadOptional<T>(name: string, neededFor: string): Promise<T> {
  try {
    return (await import(name)) as T;
  } catch (err) {
    const e = err as { code?: string; message?: string };
    if (e.code === "ERR_MODULE_NOT_FOUND" && e.message?.includes(`'${name}'`)) {
      throw new ConfigError(`${neededFor} needs the ${name} package: npm install ${name}`);
    }
    throw err;
  }
}
