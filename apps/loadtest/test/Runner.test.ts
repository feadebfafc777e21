import { createServer, type Server } from "node:http"
import type { AddressInfo } from "node:net"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { ClientKind, LoadOptions } from "../src/Options"
import { run, seededRandom } from "../src/Runner"

/**
 * A server with a known error mix: every 5th request a 429 with a code,
 * every 7th stream broken after one chunk, the rest a 3-chunk stream or a
 * JSON answer with usage.
 */
let server: Server
let url = ""
let requests = 0

beforeAll(async () => {
  server = createServer((req, res) => {
    let raw = ""
    req.on("data", (c: Buffer) => {
      raw += c.toString()
    })
    req.on("end", () => {
      const n = ++requests
      const body = JSON.parse(raw) as { stream?: boolean }
      if (n % 5 === 0) {
        res.writeHead(429, { "content-type": "application/json" })
        return res.end('{"error":{"message":"m","type":"rate_limit_error","code":"rate_limit_exceeded"}}')
      }
      if (body.stream !== true) {
        const text = '{"choices":[{"message":{"content":"a b c"}}],"usage":{"completion_tokens":3}}'
        res.writeHead(200, { "content-type": "application/json", "content-length": String(text.length) })
        return res.end(text)
      }
      res.writeHead(200, { "content-type": "text/event-stream" })
      res.write('data: {"choices":[{"delta":{"content":"a"}}]}\n\n')
      if (n % 7 === 0) return setTimeout(() => res.destroy(), 2)
      setTimeout(() => {
        res.write('data: {"choices":[{"delta":{"content":"b"}}]}\n\n')
        res.end(
          'data: {"choices":[{"delta":{"content":"c"}}]}\n\ndata: {"choices":[],"usage":{"completion_tokens":3}}\n\ndata: [DONE]\n\n',
        )
      }, 2)
    })
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1/chat/completions`
})

afterAll(async () => {
  server.closeAllConnections()
  await new Promise((resolve) => server.close(resolve))
})

const options = (over: Partial<LoadOptions>): LoadOptions => ({
  url,
  key: "k",
  model: "m",
  stream: true,
  maxTokens: 16,
  prompt: "p",
  extra: {},
  concurrency: 4,
  rate: undefined,
  durationMillis: 800,
  warmupMillis: 100,
  timeoutMillis: 5000,
  client: "undici",
  slo: undefined,
  seed: 1,
  ...over,
})

describe("run", () => {
  for (const client of ["undici", "http"] as Array<ClientKind>)
    it(`measures streams and sorts the error mix by code (${client} client)`, async () => {
      const result = await run(options({ client }))
      const { succeeded, failed, total } = result.requests
      expect(succeeded).toBeGreaterThan(20)
      expect(total).toBe(succeeded + failed)
      expect(Object.keys(result.errors).sort()).toEqual(["rate_limit_exceeded", "stream_broken"])
      // About 1 in 5 refused and 1 in 7 broken (some of those are refusals too).
      expect(result.errors.rate_limit_exceeded! / total).toBeGreaterThan(0.12)
      expect(result.errors.rate_limit_exceeded! / total).toBeLessThan(0.28)
      expect(result.tokens.output_total).toBe(succeeded * 3)
      expect(result.latency_ms.ttft.count).toBe(succeeded)
      // a→b waits 2 ms; b and c leave in one write.
      // Gaps count by arrival, requests by their end: the window's edges may split a few.
      expect(Math.abs(result.latency_ms.itl.count - succeeded * 2)).toBeLessThanOrEqual(8)
      expect(result.latency_ms.itl.p99).toBeGreaterThan(1.5)
      expect(result.latency_ms.itl.p50).toBeLessThan(1.5)
      expect(result.latency_ms.e2e.p50).toBeGreaterThan(result.latency_ms.ttft.p50)
      expect(result.client.max_in_flight).toBe(4)
      expect(result.client.in_flight_at_end).toBeLessThanOrEqual(4)
      expect(result.client.streaming_at_end).toBeLessThanOrEqual(result.client.in_flight_at_end)
    })

  it("sends JSON bodies and counts their usage", async () => {
    const result = await run(options({ stream: false, durationMillis: 500 }))
    expect(result.requests.succeeded).toBeGreaterThan(20)
    expect(result.tokens.output_total).toBe(result.requests.succeeded * 3)
    expect(result.latency_ms.itl.count).toBe(0)
    expect(Object.keys(result.errors)).toEqual(["rate_limit_exceeded"])
  })

  it("keeps an open loop's rate and counts latency from the arrival", async () => {
    const result = await run(options({ stream: false, rate: 200, concurrency: 64, durationMillis: 1000 }))
    expect(result.config.mode).toBe("open")
    // Poisson at 200/s over 1.1 s: 220 ± 3σ (≈ 45).
    expect(result.requests.total).toBeGreaterThan(150)
    expect(result.requests.total).toBeLessThan(290)
  })

  it("stops early on its signal and reports what it measured", async () => {
    const stop = new AbortController()
    setTimeout(() => stop.abort(), 400)
    const started = Date.now()
    const result = await run(options({ durationMillis: 60_000 }), { signal: stop.signal })
    expect(Date.now() - started).toBeLessThan(5000)
    expect(result.window_s).toBeLessThan(1)
    expect(result.requests.succeeded).toBeGreaterThan(0)
  })
})

describe("seededRandom", () => {
  it("repeats for a seed and stays in [0, 1)", () => {
    const a = seededRandom(3)
    const b = seededRandom(3)
    const values = Array.from({ length: 1000 }, () => a())
    expect(values).toEqual(Array.from({ length: 1000 }, () => b()))
    expect(Math.min(...values)).toBeGreaterThanOrEqual(0)
    expect(Math.max(...values)).toBeLessThan(1)
  })
})
