/**
 * A TCP proxy for fault injection, placed between the gateway and one of its
 * dependencies (Redis, PostgreSQL, a node). Modes, switchable at any time:
 *
 * - `pass`: bytes flow both ways.
 * - `cut`: every open connection is reset, and new ones are reset on accept
 *   (a crashed server or a dead link).
 * - `stall`: connections stay open but no byte moves either way (a partition,
 *   or a server that hangs); back in `pass`, what was held flows on in order.
 * - `latency`: every chunk is delayed by `latencyMillis` in each direction.
 */
import { connect, createServer, type Server, type Socket } from "node:net"

export type FaultMode = "pass" | "cut" | "stall" | "latency"

interface Pair {
  readonly client: Socket
  readonly upstream: Socket
}

export interface FaultProxy {
  readonly port: number
  readonly mode: FaultMode
  /** Connections currently open through the proxy. */
  readonly open: () => number
  /** Connections accepted since the start. */
  readonly accepted: () => number
  readonly set: (mode: FaultMode, options?: { readonly latencyMillis?: number }) => void
  /** `url` with its host and port replaced by the proxy's (`redis://…`, `postgres://…`, `http://…`). */
  readonly rewrite: (url: string) => string
  readonly close: () => Promise<void>
}

const reset = (socket: Socket) => {
  if (socket.destroyed) return
  if (typeof socket.resetAndDestroy === "function") socket.resetAndDestroy()
  else socket.destroy()
}

export const startFaultProxy = async (target: { host: string; port: number }): Promise<FaultProxy> => {
  let mode: FaultMode = "pass"
  let latencyMillis = 0
  let accepted = 0
  const pairs = new Set<Pair>()

  // One direction: `from` → `to`, honouring the mode per chunk and the receiver's backpressure.
  const relay = (from: Socket, to: Socket) => {
    let lastDelivery = 0
    from.on("data", (chunk: Buffer) => {
      const write = () => {
        if (to.destroyed) return
        if (!to.write(chunk)) {
          from.pause()
          to.once("drain", () => {
            if (mode !== "stall") from.resume()
          })
        }
      }
      // Each chunk arrives `latencyMillis` after it was sent, and never before one sent earlier
      // (also right after latency is switched off, while delayed chunks are still on their way).
      const now = Date.now()
      lastDelivery = Math.max(now + (mode === "latency" ? latencyMillis : 0), lastDelivery)
      if (lastDelivery > now) setTimeout(write, lastDelivery - now)
      else write()
    })
    from.on("end", () => to.end())
  }

  const server: Server = createServer((client) => {
    accepted++
    if (mode === "cut") return reset(client)
    const upstream = connect(target.port, target.host)
    const pair: Pair = { client, upstream }
    pairs.add(pair)
    const drop = () => {
      pairs.delete(pair)
      reset(client)
      reset(upstream)
    }
    client.on("error", drop)
    upstream.on("error", drop)
    client.on("close", drop)
    upstream.on("close", drop)
    relay(client, upstream)
    relay(upstream, client)
    if (mode === "stall") {
      client.pause()
      upstream.pause()
    }
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  const port = (server.address() as { port: number }).port

  const proxy: FaultProxy = {
    port,
    get mode() {
      return mode
    },
    open: () => pairs.size,
    accepted: () => accepted,
    set: (next, options = {}) => {
      mode = next
      latencyMillis = options.latencyMillis ?? latencyMillis
      for (const pair of [...pairs]) {
        if (next === "cut") {
          pairs.delete(pair)
          reset(pair.client)
          reset(pair.upstream)
        } else if (next === "stall") {
          pair.client.pause()
          pair.upstream.pause()
        } else {
          pair.client.resume()
          pair.upstream.resume()
        }
      }
    },
    rewrite: (url) => {
      const parsed = new URL(url)
      parsed.hostname = "127.0.0.1"
      parsed.port = String(port)
      return parsed.toString()
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const pair of pairs) {
          reset(pair.client)
          reset(pair.upstream)
        }
        pairs.clear()
        server.close(() => resolve())
      }),
  }
  return proxy
}
