/**
 * What the harness's real servers share: finding a Debian program (nats-server, pgbouncer) and a
 * free port to start it on.
 */
import fs from "node:fs";
import net from "node:net";
import path from "node:path";

/**
 * The program `name` on the PATH or in /usr/sbin, /usr/local/sbin (where Debian puts servers),
 * or undefined. The environment variable `envVar` names one instead (or "none": treat it as absent).
 */
export function findProgram(name: string, envVar: string): string | undefined {
  const given = process.env[envVar];
  if (given) return given === "none" ? undefined : given;
  const dirs = [...(process.env.PATH ?? "").split(path.delimiter), "/usr/sbin", "/usr/local/sbin"];
  for (const dir of dirs) {
    if (!dir) continue;
    const file = path.join(dir, name);
    try {
      fs.accessSync(file, fs.constants.X_OK);
      return file;
    } catch {
      // not here
    }
  }
  return undefined;
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address() as net.AddressInfo;
      srv.close(() => resolve(port));
    });
  });
}
