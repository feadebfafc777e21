/**
 * The two HTTP clients the generator can drive: undici's connection pool (the
 * default: the cheapest client per request in Node) and node:http with a
 * keep-alive agent. They share nothing but the Exchange, so running both
 * against the same server checks one measurement against the other.
 */
import { Agent as HttpAgent, request as httpRequest } from "node:http"
import { performance } from "node:perf_hooks"
import { Pool } from "undici"
import type { Exchange } from "./Exchange"
import type { ClientKind } from "./Options"

export interface Client {
  /** Sends `body`, feeds the answer into `exchange`, resolves at its end; rejects on a socket error or abort. */
  readonly send: (exchange: Exchange, signal: AbortSignal) => Promise<void>
  readonly close: () => Promise<void>
}

export interface ClientOptions {
  readonly endpoint: string
  readonly key: string
  readonly body: string
  readonly connections: number
  readonly timeoutMillis: number
  /** More request headers (a peer gateway's routing headers, for instance). */
  readonly headers?: Readonly<Record<string, string>> | undefined
}

const headersOf = (options: ClientOptions, length: number) => ({
  ...options.headers,
  authorization: `Bearer ${options.key}`,
  "content-type": "application/json",
  "content-length": String(length),
  accept: "application/json, text/event-stream",
})

const undiciClient = (options: ClientOptions): Client => {
  const url = new URL(options.endpoint)
  const pool = new Pool(url.origin, {
    connections: options.connections,
    keepAliveTimeout: 30_000,
    headersTimeout: options.timeoutMillis,
    bodyTimeout: options.timeoutMillis,
  })
  const body = Buffer.from(options.body)
  const headers = headersOf(options, body.length)
  const path = url.pathname + url.search
  return {
    send: async (exchange, signal) => {
      const response = await pool.request({ method: "POST", path, headers, body, signal })
      const type = response.headers["content-type"]
      exchange.response(response.statusCode, typeof type === "string" ? type : "")
      await new Promise<void>((resolve, reject) => {
        response.body.on("data", (chunk: Buffer) => exchange.data(chunk, performance.now()))
        response.body.once("end", resolve)
        response.body.once("error", reject)
      })
    },
    close: () => pool.destroy(),
  }
}

const nodeHttpClient = (options: ClientOptions): Client => {
  const url = new URL(options.endpoint)
  if (url.protocol !== "http:") throw new Error("--client http speaks plain http:// only")
  const agent = new HttpAgent({ keepAlive: true, maxSockets: options.connections, keepAliveMsecs: 30_000 })
  const body = Buffer.from(options.body)
  const headers = headersOf(options, body.length)
  return {
    send: (exchange, signal) =>
      new Promise<void>((resolve, reject) => {
        const req = httpRequest(
          {
            host: url.hostname,
            port: url.port,
            path: url.pathname + url.search,
            method: "POST",
            agent,
            headers,
            signal,
          },
          (res) => {
            const type = res.headers["content-type"]
            exchange.response(res.statusCode ?? 0, typeof type === "string" ? type : "")
            res.on("data", (chunk: Buffer) => exchange.data(chunk, performance.now()))
            res.once("end", resolve)
            res.once("error", reject)
            res.once("aborted", () => reject(Object.assign(new Error("aborted"), { code: "ECONNRESET" })))
          },
        )
        req.once("error", reject)
        req.end(body)
      }),
    close: async () => agent.destroy(),
  }
}

export const makeClient = (kind: ClientKind, options: ClientOptions): Client =>
  kind === "http" ? nodeHttpClient(options) : undiciClient(options)
