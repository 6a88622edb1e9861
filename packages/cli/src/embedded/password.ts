/**
 * The embedded server's superuser password: random per data directory, kept in
 * `<data dir>/leasehold.password` (mode 0600, owned by the process that started the server).
 *
 * Inside the data directory because the password belongs to that cluster: it moves and is
 * deleted with it, and a fresh cluster never meets a stale password. PostgreSQL ignores
 * files it does not know in its data directory.
 *
 * The server is only ever given a SCRAM verifier, never the password itself, so neither
 * initdb's input file nor a statement log (log_statement=all) can reveal it.
 */
import { createHash, createHmac, pbkdf2Sync, randomBytes } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { EmbeddedPostgresError } from "leasehold/internal/errors";

export const PASSWORD_FILE = "leasehold.password";
/** What older Leasehold versions set for every cluster; such clusters are upgraded on start. */
export const LEGACY_PASSWORD = "leasehold";

export function newPassword(): string {
  return randomBytes(32).toString("base64url");
}

export function passwordFile(dataDir: string): string {
  return path.join(dataDir, PASSWORD_FILE);
}

/** An upgrade's new password, stored before the server is told, so a crash in between loses nothing. */
export function pendingPasswordFile(dataDir: string): string {
  return passwordFile(dataDir) + ".pending";
}

/**
 * The stored password, or undefined if there is none. As root we read it from a directory the
 * server user owns: a symlink or a FIFO planted there is refused, not followed.
 */
export function readPassword(file: string): string | undefined {
  let fd: number;
  try {
    fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW | fs.constants.O_NONBLOCK);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === "ENOENT") return undefined;
    if (code === "ELOOP") throw new EmbeddedPostgresError(`embedded PostgreSQL: ${file} is a symbolic link; it must be a plain file`);
    throw err;
  }
  try {
    const st = fs.fstatSync(fd);
    if (!st.isFile()) throw new EmbeddedPostgresError(`embedded PostgreSQL: ${file} is not a plain file`);
    // Someone loosened it; close it again (the password may already have been read).
    if ((st.mode & 0o077) !== 0) fs.fchmodSync(fd, 0o600);
    return fs.readFileSync(fd, "utf8").trim() || undefined;
  } finally {
    fs.closeSync(fd);
  }
}

/** Written whole or not at all: a temp file (0600 from the start), then a rename. */
export function writePassword(file: string, password: string): void {
  const tmp = `${file}.tmp-${process.pid}-${randomBytes(4).toString("hex")}`;
  try {
    fs.writeFileSync(tmp, password + "\n", { mode: 0o600, flag: "wx" });
    fs.renameSync(tmp, file);
  } finally {
    fs.rmSync(tmp, { force: true });
  }
}

/** The SCRAM-SHA-256 verifier PostgreSQL stores for `password` (RFC 5802, as libpq's PQencryptPasswordConn). */
export function scramVerifier(password: string, salt = randomBytes(16), iterations = 4096): string {
  const salted = pbkdf2Sync(password, salt, iterations, 32, "sha256");
  const clientKey = createHmac("sha256", salted).update("Client Key").digest();
  const storedKey = createHash("sha256").update(clientKey).digest();
  const serverKey = createHmac("sha256", salted).update("Server Key").digest();
  return `SCRAM-SHA-256$${iterations}:${salt.toString("base64")}$${storedKey.toString("base64")}:${serverKey.toString("base64")}`;
}
