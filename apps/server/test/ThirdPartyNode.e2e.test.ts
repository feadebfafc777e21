/**
 * The gateway with a nodes file pointing at a minimal OpenAI-compatible
 * server written here (not node-sim): what such a server receives, and that
 * its answers reach clients as the gateway's own.
 */
import { mkdtempSync, writeFileSync } from "node:fs"
import { createServer, type IncomingMessage, type Server } from "node:http"
import type { AddressInfo } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import OpenAI from "openai"
import { chat, nodesOf } from "./support/NodeSimProcess"
import { createKey, type RunningServer, startServer } from "./support/ServerProcess"

let upstream: Server
let server: RunningServer
let key: string
const received: Array<{ body: Record<string, unknown>; headers: IncomingMessage["headers"] }> = []
let failNext = false

const WORDS = ["Hello", " from", " a", " third-party", " server."]

beforeAll(async () => {
  upstream = createServer((req, res) => {
    let raw = ""
    req.on("data", (chunk: Buffer) => {
      raw += chunk.toString()
    })
    req.on("end", () => {
      if (req.url !== "/v1/chat/completions" || req.method !== "POST") {
        res.writeHead(404)
        return res.end()
      }
      const body = JSON.parse(raw) as Record<string, unknown>
      received.push({ body, headers: req.headers })
      if (failNext) {
        res.writeHead(500, { "content-type": "application/json" })
        return res.end('{"error":{"message":"model crashed"}}')
      }
      const last = (body.messages as Array<{ content: unknown }>).at(-1)?.content
      res.writeHead(200, { "content-type": "text/event-stream" })
      const frame = (delta: object, finish: string | null) =>
        `data: ${JSON.stringify({ id: "cmpl-1", object: "chat.completion.chunk", model: body.model, choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`
      res.write(frame({ role: "assistant" }, null))
      // A server that hangs, before or after its first token, until the gateway gives up on it.
      if (last === "hang") return
      if (last === "hang after a word") return res.write(frame({ content: "Well," }, null))
      for (const word of WORDS) res.write(frame({ content: word }, null))
      res.end(`${frame({}, "stop")}data: [DONE]\n\n`)
    })
  })
  await new Promise<void>((resolve) => upstream.listen(0, "127.0.0.1", resolve))
  const dir = mkdtempSync(join(tmpdir(), "third-party-"))
  const nodesFile = join(dir, "nodes.json")
  writeFileSync(
    nodesFile,
    JSON.stringify([
      {
        id: "tiny-1",
        url: `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`,
        models: { "swarm-prime": "tiny-llama-vision", "swarm-swift": "tiny-llama" },
        capacity: 4,
        vision: true,
        api_key: "upstream-secret",
      },
    ]),
  )
  server = await startServer({
    SWARMGATE_NODES_FILE: nodesFile,
    SWARMGATE_PROBE_INTERVAL_MS: "60000",
    SWARMGATE_HEDGE_MS: "0",
    // The running-time limit, per preset: short for swift, the default for prime.
    SWARMGATE_PRESETS: JSON.stringify({ "swarm-swift": { timeout_ms: 1_500 } }),
  })
  key = (await createKey(server)).key
}, 60_000)

afterAll(async () => {
  await server?.stop()
  upstream?.closeAllConnections()
  await new Promise((resolve) => upstream?.close(resolve))
})

describe("a third-party OpenAI-compatible node from the nodes file", () => {
  it("is the only node: the nodes file turns the embedded simulated swarm off", async () => {
    const nodes = await nodesOf(server)
    expect(nodes.map((n) => [n.id, n.source, n.state, n.circuit])).toEqual([
      ["tiny-1", "static", "active", "closed"],
    ])
    expect(nodes[0]!.models).toEqual({ "swarm-prime": "tiny-llama-vision", "swarm-swift": "tiny-llama" })
  })

  it("answers through the official client, with usage counted by the gateway", async () => {
    const client = new OpenAI({ apiKey: key, baseURL: `${server.baseUrl}/v1`, maxRetries: 0 })
    const completion = await client.chat.completions.create({
      model: "swarm-swift",
      messages: [{ role: "user", content: "Say hello." }],
      max_tokens: 50,
    })
    expect(completion.choices[0]?.message.content).toBe(WORDS.join(""))
    expect(completion.choices[0]?.finish_reason).toBe("stop")
    expect(completion.usage?.completion_tokens).toBeGreaterThan(0)
    const stream = await client.chat.completions.create({
      model: "swarm-swift",
      messages: [{ role: "user", content: "Say hello." }],
      stream: true,
    })
    let text = ""
    for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? ""
    expect(text).toBe(WORDS.join(""))
  })

  it("receives the node's own model name, the sampling fields, JSON mode, image parts and its key", async () => {
    received.length = 0
    const result = await chat(server.baseUrl, key, {
      model: "swarm-prime",
      stream: true,
      max_tokens: 40,
      temperature: 0.3,
      top_p: 0.9,
      seed: 5,
      stop: ["END"],
      presence_penalty: 0.1,
      frequency_penalty: 0.2,
      user: "alice",
      response_format: { type: "json_object" },
      messages: [
        { role: "system", content: "Answer in JSON." },
        {
          role: "user",
          content: [
            { type: "text", text: "What is in this image?" },
            { type: "image_url", image_url: { url: "https://example.com/cat.png" } },
          ],
        },
      ],
    })
    expect(result.status).toBe(200)
    expect(result.text).toBe(WORDS.join(""))
    const [{ body, headers }] = received as [(typeof received)[number]]
    expect(body).toEqual({
      model: "tiny-llama-vision",
      stream: true,
      max_tokens: 40,
      temperature: 0.3,
      top_p: 0.9,
      seed: 5,
      stop: ["END"],
      presence_penalty: 0.1,
      frequency_penalty: 0.2,
      user: "alice",
      response_format: { type: "json_object" },
      messages: [
        { role: "system", content: "Answer in JSON." },
        {
          role: "user",
          content: [
            { type: "text", text: "What is in this image?" },
            { type: "image_url", image_url: { url: "https://example.com/cat.png" } },
          ],
        },
      ],
    })
    expect(headers.authorization).toBe("Bearer upstream-secret")
    expect(headers["x-request-id"]).toBe(result.headers.get("x-request-id"))
  })

  it("the preset's running-time limit: 504 upstream_timeout before the first token, the final error event after it", async () => {
    const began = Date.now()
    const plain = await chat(server.baseUrl, key, {
      model: "swarm-swift",
      max_tokens: 10,
      messages: [{ role: "user", content: "hang" }],
    })
    expect(plain.status).toBe(504)
    expect(plain.body).toMatchObject({ error: { code: "upstream_timeout", type: "server_error" } })
    expect(Date.now() - began).toBeGreaterThanOrEqual(1_400)
    expect(Date.now() - began).toBeLessThan(5_000)
    const streamed = await chat(server.baseUrl, key, {
      model: "swarm-swift",
      stream: true,
      max_tokens: 10,
      messages: [{ role: "user", content: "hang after a word" }],
    })
    expect(streamed.status).toBe(200)
    expect(streamed.text).toBe("Well,")
    expect(streamed.done).toBe(false)
    expect(streamed.events.at(-1)).toMatchObject({ error: { code: "upstream_error", type: "server_error" } })
    const [node] = await nodesOf(server)
    expect(node!.in_flight).toBe(0)
  })

  it("a server error before the first token is 429 capacity_exhausted with Retry-After when no other node can take it", async () => {
    failNext = true
    try {
      const result = await chat(server.baseUrl, key, {
        model: "swarm-swift",
        max_tokens: 10,
        messages: [{ role: "user", content: "Hi" }],
      })
      // Nothing was generated: capacity (spec §7.3 rules 5–6), which a client retries; 502 is for failures after it started.
      expect(result.status).toBe(429)
      expect(result.body).toMatchObject({ error: { code: "capacity_exhausted", type: "server_error" } })
      const retryAfter = Number(result.headers.get("retry-after"))
      expect(retryAfter).toBeGreaterThanOrEqual(1)
      expect(retryAfter).toBeLessThanOrEqual(60)
      const [node] = await nodesOf(server)
      expect(node!.last_failure).toBe('http_500: {"error":{"message":"model crashed"}}')
    } finally {
      failNext = false
    }
  })
})
