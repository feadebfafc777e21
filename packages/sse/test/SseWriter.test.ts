/**
 * `writeChunk` frames chunks itself on the response's socket: the bytes on
 * the wire must be exactly what `res.write` would have sent, in order with
 * node:http's own writes, and never chunk framing where the response is not
 * chunked (HTTP/1.0).
 */
import { createServer, type Server, type ServerResponse } from "node:http"
import type { AddressInfo } from "node:net"
import { connect } from "node:net"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import * as SseWriter from "../src/SseWriter"

let server: Server
let port = 0
/** How the test's handler writes its body after the head. */
let write: (res: ServerResponse) => void = () => undefined

beforeAll(async () => {
  server = createServer((_req, res) => {
    res.writeHead(200, { "content-type": "text/event-stream" })
    write(res)
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  port = (server.address() as AddressInfo).port
})

afterAll(async () => {
  server.closeAllConnections()
  await new Promise((resolve) => server.close(resolve))
})

/** The raw bytes of one request's response (the connection closed by the server after it). */
const raw = (request: string) =>
  new Promise<string>((resolve, reject) => {
    const socket = connect(port, "127.0.0.1", () => socket.write(request))
    const parts: Array<Buffer> = []
    socket.on("data", (part) => parts.push(part))
    socket.on("end", () => resolve(Buffer.concat(parts).toString("utf8")))
    socket.on("error", reject)
  })

const body = (response: string) => response.slice(response.indexOf("\r\n\r\n") + 4)

describe("SseWriter", () => {
  it("frames each chunk by its UTF-8 length, in order with node:http's own writes", async () => {
    let viaNodeHttp = 0
    write = (res) => {
      const original = res.write.bind(res) as (data: string) => boolean
      res.write = ((data: string) => {
        viaNodeHttp++
        return original(data)
      }) as typeof res.write
      // The first write goes through node:http (the head is not out yet); the rest straight to the socket.
      expect(SseWriter.writeChunk(res, "data: a\n\n")).toBe(true)
      SseWriter.writeChunk(res, "data: ünï €\n\n")
      res.write(": node:http's own\n\n")
      SseWriter.writeChunk(res, "")
      SseWriter.writeChunk(res, "data: z\n\n")
      res.end()
    }
    const response = await raw("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    expect(response).toMatch(/^HTTP\/1\.1 200 OK\r\n/)
    expect(response).toMatch(/\r\ntransfer-encoding: chunked\r\n/i)
    // Sizes in hex bytes: "data: ünï €\n\n" is 17 bytes (0x11) in 13 characters.
    expect(body(response)).toBe(
      "9\r\ndata: a\n\n\r\n" +
        "11\r\ndata: ünï €\n\n\r\n" +
        "13\r\n: node:http's own\n\n\r\n" +
        "9\r\ndata: z\n\n\r\n" +
        "0\r\n\r\n",
    )
    // The head's write and node:http's own: the other two went to the socket directly.
    expect(viaNodeHttp).toBe(2)
  })

  it("puts nothing on the wire after end: a late chunk is node:http's to refuse", async () => {
    let refused = false
    write = (res) => {
      res.on("error", () => {
        refused = true
      })
      SseWriter.writeChunk(res, "data: a\n\n")
      res.end()
      SseWriter.writeChunk(res, "data: late\n\n")
    }
    const response = await raw("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    expect(body(response)).toBe("9\r\ndata: a\n\n\r\n0\r\n\r\n")
    expect(refused).toBe(true)
  })

  it("keeps pipelined responses whole: the one waiting for the socket is written by node:http", async () => {
    write = (res) => {
      const name = res.req.url === "/1" ? "one" : "two"
      SseWriter.writeChunk(res, `data: ${name}-a\n\n`)
      SseWriter.writeChunk(res, `data: ${name}-b\n\n`)
      setTimeout(() => {
        SseWriter.writeChunk(res, `data: ${name}-c\n\n`)
        res.end()
      }, 30)
    }
    const response = await raw(
      "GET /1 HTTP/1.1\r\nHost: x\r\n\r\nGET /2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    const [first, second] = response.split(/(?=HTTP\/1\.1 200 OK\r\n)/)
    const chunks = (name: string) =>
      ["a", "b", "c"]
        .map((c) => `data: ${name}-${c}\n\n`)
        .map((data) => `${Buffer.byteLength(data).toString(16)}\r\n${data}\r\n`)
        .join("")
    expect(body(first!)).toBe(`${chunks("one")}0\r\n\r\n`)
    expect(body(second!)).toBe(`${chunks("two")}0\r\n\r\n`)
  })

  it("writes no chunk framing to an HTTP/1.0 client", async () => {
    write = (res) => {
      SseWriter.writeChunk(res, "data: a\n\n")
      SseWriter.writeChunk(res, "data: b\n\n")
      res.end()
    }
    const response = await raw("GET / HTTP/1.0\r\nHost: x\r\n\r\n")
    expect(response).toMatch(/^HTTP\/1\.1 200 OK\r\n/)
    expect(body(response)).toBe("data: a\n\ndata: b\n\n")
  })

  it.effect("write completes once what it wrote drained", () =>
    Effect.gen(function* () {
      let written = 0
      const listeners = { before: 0, after: 0 }
      write = (res) => {
        res.write(": open\n\n")
        listeners.before = res.socket?.listenerCount("drain") ?? -1
        // Far more than a socket buffer: some writes must wait for drain, and all arrive.
        const block = `data: ${"x".repeat(64 * 1024)}\n\n`
        Effect.runPromise(
          Effect.gen(function* () {
            for (let i = 0; i < 64; i++) {
              yield* SseWriter.write(res, block)
              written++
            }
            listeners.after = res.socket?.listenerCount("drain") ?? -1
            res.end()
          }),
        )
      }
      const response = yield* Effect.promise(() =>
        raw("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
      )
      expect(written).toBe(64)
      expect(body(response).split("data: ").length - 1).toBe(64)
      // Every wait took its listener off the socket again.
      expect(listeners.after).toBe(listeners.before)
    }),
  )
})
