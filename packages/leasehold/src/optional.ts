/**
 * Optional packages the library loads only when an option asks for them (NATS dispatch, the
 * embedded PostgreSQL): a web app that only enqueues never installs or loads them.
 */
import { ConfigError } from "./errors.js";

/** Imports `specifier` (a package, or a subpath of one); a missing package is a ConfigError saying what to install. */
export async function loadOptional<T>(specifier: string, neededFor: string): Promise<T> {
  const pkg = specifier
    .split("/")
    .slice(0, specifier.startsWith("@") ? 2 : 1)
    .join("/");
  try {
    return (await import(specifier)) as T;
  } catch (err) {
    const e = err as { code?: string; message?: string };
    if (e.code === "ERR_MODULE_NOT_FOUND" && e.message?.includes(`'${pkg}'`)) {
      throw new ConfigError(`${neededFor} needs the ${pkg} package: npm install ${pkg}`);
    }
    throw err;
  }
}
