/**
 * The bare Node.js gateway the benchmark compares against: node:http in front,
 * undici (`request` on a keep-alive pool, default) or the global `fetch`
 * (what swarmgate's HTTP transport uses) behind, and no policy at all — no
 * auth, no parsing, no accounting. Bodies and SSE bytes pass through as they
 * come; a slow reader pauses the upstream; a client that leaves aborts it.
 *
 *   node --import tsx bench/proxy.ts --port 0 --upstream http://127.0.0.1:8101 [--client undici|fetch]
 */
import { createServer, type IncomingMessage, type ServerResponse } from "node:http"
import type { AddressInfo } from "node:net"
import { parseArgs } from "node:util"
import { Pool } from "undici"

const { values } = parseArgs({
  options: {
    port: { type: "string", default: "0" },
    upstream: { type: "string" },
    client: { type: "string", default: "undici" },
    connections: { type: "string", default: "4096" },
  },
})
if (values.upstream === undefined) throw new Error("--upstream is required")
const upstream = new URL(values.upstream)
const pool = new Pool(upstream.origin, { connections: Number(values.connections), keepAliveTimeout: 60_000 })

const readBody = (req: IncomingMessage) =>
  new Promise<Buffer>((resolve, reject) => {
    const chunks: Array<Buffer> = []
    req.on("data", (chunk: Buffer) => chunks.push(chunk))
    req.once("end", () => resolve(Buffer.concat(chunks)))
    req.once("error", reject)
  })

const forwardedHeaders = (req: IncomingMessage) => ({
  "content-type": req.headers["content-type"] ?? "application/json",
  accept: req.headers.accept ?? "*/*",
})

const responseHeaders = (type: string | null | undefined, length: string | null | undefined) => {
  const headers: Record<string, string> = { "content-type": type ?? "application/octet-stream" }
  if (length !== null && length !== undefined) headers["content-length"] = length
  return headers
}

const viaUndici = async (req: IncomingMessage, res: ServerResponse, body: Buffer) => {
  const abort = new AbortController()
  res.once("close", () => {
    if (!res.writableFinished) abort.abort()
  })
  const response = await pool.request({
    method: "POST",
    path: req.url ?? "/",
    headers: forwardedHeaders(req),
    body,
    signal: abort.signal,
  })
  const header = (name: string) => {
    const value = response.headers[name]
    return Array.isArray(value) ? value[0] : value
  }
  res.writeHead(response.statusCode, responseHeaders(header("content-type"), header("content-length")))
  const source = response.body
  source.on("data", (chunk: Buffer) => {
    if (!res.write(chunk)) {
      source.pause()
      res.once("drain", () => source.resume())
    }
  })
  await new Promise<void>((resolve, reject) => {
    source.once("end", resolve)
    source.once("error", reject)
  })
  res.end()
}

const viaFetch = async (req: IncomingMessage, res: ServerResponse, body: Buffer) => {
  const abort = new AbortController()
  res.once("close", () => {
    if (!res.writableFinished) abort.abort()
  })
  const response = await fetch(new URL(req.url ?? "/", upstream), {
    method: "POST",
    headers: forwardedHeaders(req),
    body,
    signal: abort.signal,
  })
  res.writeHead(
    response.status,
    responseHeaders(response.headers.get("content-type"), response.headers.get("content-length")),
  )
  if (response.body !== null) {
    const reader = response.body.getReader()
    for (let read = await reader.read(); !read.done; read = await reader.read())
      if (!res.write(read.value)) await new Promise((resolve) => res.once("drain", resolve))
  }
  res.end()
}

const forward = values.client === "fetch" ? viaFetch : viaUndici

const server = createServer({ keepAliveTimeout: 60_000 }, (req, res) => {
  readBody(req)
    .then((body) => forward(req, res, body))
    .catch(() => {
      if (!res.headersSent) {
        res.writeHead(502, { "content-type": "application/json" })
        res.end('{"error":{"message":"upstream failed","type":"server_error","code":"upstream_error"}}')
      } else res.destroy()
    })
})
server.listen(Number(values.port), "127.0.0.1", () => {
  const { port } = server.address() as AddressInfo
  console.log(JSON.stringify({ event: "listening", host: "127.0.0.1", port }))
})
process.once("SIGTERM", () => process.exit(0))
