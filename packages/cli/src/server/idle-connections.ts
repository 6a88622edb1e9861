/**
 * Connections that send no request (they need no token) cannot hold the server's connection
 * cap. Without this, one address that opens connections and sends nothing fills
 * --max-connections, and every other client's connection is then dropped.
 *
 * - A connection that has sent nothing within the headers timeout is closed. Node's own
 *   headersTimeout starts at a request's first byte, so a connection that sends nothing at all
 *   would otherwise stay until the socket's idle timeout (90 s).
 * - One client address may keep only so many idle connections: ones with no request being
 *   answered, whether they never sent one or are kept alive between requests.
 *
 *
 * A connection with a request being answered (a claim's long poll, a job wait) is not idle
 * and never counted: only requests that got past the token check stay open that long.
 * When an address opens one idle connection too many, its oldest idle one is closed, not the
 * new one: a client behind the same address (a NAT, a proxy) whose request is on its way on
 * the new connection is not refused, and no one can hold more than the cap by opening more.
 */
import type http from "node:http";
import net from "node:net";

/**
 * The key connections are counted by: the IPv4 address, or an IPv6 address's /64 network
 * (one host is commonly given a whole /64, so counting single IPv6 addresses would not bound it).
 */
export function addressKey(address: string | undefined): string {
  if (address === undefined) return "unknown";
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address);
  if (mapped) return mapped[1]!;
  if (net.isIPv4(address) || !net.isIPv6(address)) return address;
  return expandIPv6(address).slice(0, 4).join(":") + "::/64";
}

/** The eight groups of an IPv6 address, "::" filled with zeros. */
function expandIPv6(address: string): string[] {
  const [head, tail] = address.split("%")[0]!.split("::") as [string, string | undefined];
  const left = head ? head.split(":") : [];
  const right = tail ? tail.split(":") : [];
  const zeros = tail === undefined ? [] : Array<string>(8 - left.length - right.length).fill("0");
  return [...left, ...zeros, ...right].map((g) => g.toLowerCase().replace(/^0+(?=.)/, ""));
}

/**
 * Closes a connection that has sent nothing within `firstRequestMs`,
 * and an address's oldest idle connection when it opens one beyond `maxIdlePerAddress`
 * (`onEvict` counts those).
 */
export function boundIdleConnections(
  server: http.Server,
  { firstRequestMs, maxIdlePerAddress }: { firstRequestMs: number; maxIdlePerAddress: number },
  onEvict: () => void,
): void {
  // Per address, its idle connections in the order they became idle (a Set keeps insertion order).
  const idle = new Map<string, Set<net.Socket>>();
  const answering = new WeakMap<net.Socket, number>();

  const markIdle = (socket: net.Socket) => {
    if (socket.destroyed) return;
    const key = addressKey(socket.remoteAddress);
    let sockets = idle.get(key);
    if (!sockets) idle.set(key, (sockets = new Set()));
    sockets.add(socket);
    while (sockets.size > maxIdlePerAddress) {
      const oldest = sockets.values().next().value!;
      sockets.delete(oldest);
      oldest.destroy();
      onEvict();
    }
  };
  const markBusy = (socket: net.Socket) => {
    const key = addressKey(socket.remoteAddress);
    const sockets = idle.get(key);
    if (!sockets?.delete(socket)) return;
    if (sockets.size === 0) idle.delete(key);
  };

  const firstRequestTimers = new WeakMap<net.Socket, NodeJS.Timeout>();

  server.on("connection", (socket: net.Socket) => {
    // One that has sent part of its headers is Node's to time out (with a 408), from that first byte.
    const timer = setTimeout(() => socket.bytesRead === 0 && socket.destroy(), firstRequestMs).unref();
    firstRequestTimers.set(socket, timer);
    socket.once("close", () => {
      clearTimeout(timer);
      markBusy(socket);
    });
    markIdle(socket);
  });
  server.on("request", (request: http.IncomingMessage, response: http.ServerResponse) => {
    const socket = request.socket;
    clearTimeout(firstRequestTimers.get(socket));
    answering.set(socket, (answering.get(socket) ?? 0) + 1);
    markBusy(socket);
    response.once("close", () => {
      const left = (answering.get(socket) ?? 1) - 1;
      answering.set(socket, left);
      if (left === 0) markIdle(socket);
    });
  });
}
