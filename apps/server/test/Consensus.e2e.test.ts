/**
 * swarm-prime as shipped: the consensus strategy (k authors, peer judges),
 * used the way a client uses any preset.
 */
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { countTokens } from "gpt-tokenizer"
import OpenAI from "openai"
import { createKey, type RunningServer, startServer } from "./support/ServerProcess"

let server: RunningServer
let client: OpenAI
let accountId: string

const noLimits = { rpm: 10_000, rph: 100_000, daily: 100_000, weekly: 100_000, concurrency: 64, queue: 64 }

beforeAll(async () => {
  // "{}": the shipped presets, no test override.
  server = await startServer({ SWARMGATE_PRESETS: "{}", SWARMGATE_SIM_SPEED: "50" })
  const issued = await createKey(server, { balance_usd: 100, limits: noLimits })
  accountId = issued.accountId
  client = new OpenAI({ apiKey: issued.key, baseURL: `${server.baseUrl}/v1`, maxRetries: 0 })
}, 60_000)

afterAll(async () => {
  await server?.stop()
})

const inFlight = async () => {
  const nodes = await server.admin<{ data: Array<{ in_flight: number }> }>("GET", "/nodes")
  return nodes.body.data.reduce((sum, n) => sum + n.in_flight, 0)
}

const settle = async () => {
  const deadline = Date.now() + 5_000
  while ((await inFlight()) !== 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 25))
  return inFlight()
}

describe("swarm-prime runs consensus by default", () => {
  it("answers through the official client, usage counted on the returned answer, every node released", async () => {
    const completion = await client.chat.completions.create({
      model: "swarm-prime",
      messages: [{ role: "user", content: "Why do leaves change colour in autumn?" }],
    })
    const content = completion.choices[0]?.message.content ?? ""
    expect(content.length).toBeGreaterThan(20)
    expect(completion.usage?.completion_tokens).toBe(countTokens(content))
    expect(await settle()).toBe(0)
    // Usage records are group-committed: give the writer a moment.
    interface UsageRecord {
      readonly request_id: string
      readonly completion_tokens: number
      readonly outcome: string
    }
    let record: UsageRecord | undefined
    for (let i = 0; i < 40 && record === undefined; i++) {
      const usage = await server.admin<{ data: Array<UsageRecord> }>("GET", `/usage?account_id=${accountId}`)
      record = usage.body.data.find((r) => completion.id.endsWith(r.request_id.replace(/^req_/, "")))
      if (record === undefined) await new Promise((r) => setTimeout(r, 50))
    }
    expect(record?.completion_tokens).toBe(completion.usage?.completion_tokens)
    expect(record?.outcome).toBe("completed")
  })

  it("streams the chosen answer with usage, then [DONE]", async () => {
    const stream = await client.chat.completions.create({
      model: "swarm-prime",
      messages: [{ role: "user", content: "Explain tides briefly." }],
      stream: true,
      stream_options: { include_usage: true },
      max_tokens: 40,
    })
    let text = ""
    let usage: OpenAI.CompletionUsage | null | undefined
    let finish: string | null | undefined
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? ""
      finish = chunk.choices[0]?.finish_reason ?? finish
      if (chunk.usage) usage = chunk.usage
    }
    expect(text.length).toBeGreaterThan(0)
    expect(usage?.completion_tokens).toBe(countTokens(text))
    expect(usage?.completion_tokens).toBeLessThanOrEqual(40)
    expect(["stop", "length"]).toContain(finish)
    expect(await settle()).toBe(0)
  })

  it("honours JSON mode and the seed", async () => {
    const ask = () =>
      client.chat.completions.create({
        model: "swarm-prime",
        messages: [{ role: "user", content: "Give me the facts about Mars as JSON." }],
        response_format: { type: "json_object" },
        seed: 7,
        max_tokens: 200,
      })
    const [a, b] = [await ask(), await ask()]
    expect(() => JSON.parse(a.choices[0]?.message.content ?? "")).not.toThrow()
    expect(b.choices[0]?.message.content).toBe(a.choices[0]?.message.content)
  })

  it("a client that leaves mid-stream frees every author and judge", async () => {
    const controller = new AbortController()
    const stream = await client.chat.completions.create(
      {
        model: "swarm-prime",
        messages: [{ role: "user", content: "Tell a long story about a lighthouse keeper." }],
        stream: true,
        max_tokens: 2_000,
      },
      { signal: controller.signal },
    )
    try {
      for await (const _ of stream) {
        controller.abort()
      }
    } catch {
      // The abort ends the iteration.
    }
    expect(await settle()).toBe(0)
  })
})
