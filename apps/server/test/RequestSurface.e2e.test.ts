/**
 * The request surface beyond model and messages (issue 9): sampling
 * parameters, image parts and their limit, model capabilities — each row of
 * the README's request-field table, through the official client.
 */
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { ChatCompletionRequest } from "@swarmgate/protocol"
import { Arbitrary, FastCheck as fc } from "effect"
import { countTokens } from "gpt-tokenizer"
import OpenAI from "openai"
import { createKey, type RunningServer, startServer } from "./support/ServerProcess"

const MAX_IMAGE_BYTES = 3_000
let server: RunningServer
let client: OpenAI
let key: string

beforeAll(async () => {
  server = await startServer({
    SWARMGATE_SIM_SPEED: "200",
    SWARMGATE_MAX_IMAGE_BYTES: String(MAX_IMAGE_BYTES),
  })
  key = (await createKey(server, { balance_usd: 10_000 })).key
  client = new OpenAI({ apiKey: key, baseURL: `${server.baseUrl}/v1`, maxRetries: 0 })
}, 60_000)

afterAll(async () => {
  await server?.stop()
})

const ask = (content: string) => [{ role: "user" as const, content }]

const text = async (
  params: Omit<OpenAI.ChatCompletionCreateParamsNonStreaming, "model"> & { model?: string },
) => {
  const completion = await client.chat.completions.create({ model: "swarm-prime", ...params })
  return { content: completion.choices[0]?.message.content ?? "", completion }
}

/** The official client's error, with the status and body it received. */
const refusal = async (promise: Promise<unknown>) => {
  try {
    await promise
  } catch (error) {
    if (error instanceof OpenAI.APIError) return error
    throw error
  }
  throw new Error("expected a refusal")
}

const pngDataUrl = (bytes: number) => {
  const payload = Buffer.alloc(bytes, 7)
  return `data:image/png;base64,${payload.toString("base64")}`
}

describe("sampling parameters", () => {
  it("the same seed and request give the same text; another seed another text", async () => {
    const messages = ask("Describe a lighthouse at night.")
    const a = await text({ messages, seed: 1234 })
    const b = await text({ messages, seed: 1234 })
    const c = await text({ messages, seed: 999 })
    expect(a.content.length).toBeGreaterThan(0)
    expect(b.content).toBe(a.content)
    expect(c.content).not.toBe(a.content)
  })

  it("temperature 0 is deterministic", async () => {
    const messages = ask("What makes bread rise?")
    const a = await text({ messages, temperature: 0 })
    const b = await text({ messages, temperature: 0 })
    expect(b.content).toBe(a.content)
  })

  it("stop ends the output before the stop text with finish_reason stop", async () => {
    const messages = ask("Tell me about mountain weather and climbing.")
    const full = await text({ messages, seed: 77 })
    const words = full.content.split(" ")
    expect(words.length).toBeGreaterThan(8)
    const stop = ` ${words[6]}`
    const cut = await text({ messages, seed: 77, stop: [stop, "zzz-never"] })
    expect(cut.completion.choices[0]?.finish_reason).toBe("stop")
    expect(cut.content).toBe(full.content.slice(0, full.content.indexOf(stop)))
    expect(cut.content).not.toContain(stop)
  })

  it("accepts top_p, penalties and user", async () => {
    const { completion } = await text({
      messages: ask("Hello"),
      top_p: 0.5,
      presence_penalty: 1.5,
      frequency_penalty: -1,
      user: "user-42",
    })
    expect(completion.choices[0]?.message.content?.length).toBeGreaterThan(0)
  })

  it("refuses out-of-range values with 400 and the field as param", async () => {
    for (const [param, value] of [
      ["temperature", 2.5],
      ["top_p", 1.5],
      ["presence_penalty", -3],
      ["frequency_penalty", 2.1],
      ["stop", ["a", "b", "c", "d", "e"]],
      ["max_tokens", 0],
    ] as const) {
      const error = await refusal(text({ messages: ask("x"), [param]: value }))
      expect(error.status).toBe(400)
      expect(error.code).toBe("invalid_request")
      expect(error.param).toBe(param)
    }
  })
})

describe("image content parts", () => {
  it("a vision preset answers about the image and bills its tokens", async () => {
    const url = pngDataUrl(1_500)
    const { content, completion } = await text({
      messages: [
        {
          role: "user",
          content: [
            { type: "text", text: "What is in this picture?" },
            { type: "image_url", image_url: { url, detail: "low" } },
          ],
        },
      ],
    })
    expect(content).toContain("image/png")
    expect(content).toContain("1500")
    // 3 reply primer + 3 framing + text tokens + 85 for a low-detail image.
    expect(completion.usage?.prompt_tokens).toBe(3 + 3 + countTokens("What is in this picture?") + 85)
  })

  it("an image over the size limit is 413 request_too_large with the part as param", async () => {
    const error = await refusal(
      text({
        messages: [
          {
            role: "user",
            content: [
              { type: "text", text: "Look" },
              { type: "image_url", image_url: { url: pngDataUrl(MAX_IMAGE_BYTES + 1) } },
            ],
          },
        ],
      }),
    )
    expect(error.status).toBe(413)
    expect(error.code).toBe("request_too_large")
    expect(error.param).toBe("messages[0].content[1]")
  })

  it("an image to a preset without vision is 400 with the part as param", async () => {
    const error = await refusal(
      text({
        model: "swarm-swift",
        messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: pngDataUrl(100) } }] }],
      }),
    )
    expect(error.status).toBe(400)
    expect(error.code).toBe("invalid_request")
    expect(error.param).toBe("messages[0].content[0]")
  })

  it("audio and file parts are 400 unsupported_content_type", async () => {
    for (const part of [
      { type: "input_audio", input_audio: { data: "AAAA", format: "wav" } },
      { type: "file", file: { file_id: "file-abc" } },
    ]) {
      const error = await refusal(text({ messages: [{ role: "user", content: [part] }] } as never))
      expect(error.status).toBe(400)
      expect(error.code).toBe("unsupported_content_type")
      expect(error.param).toBe("messages[0].content[0]")
    }
  })
})

describe("model capabilities", () => {
  it("lists capabilities and enforces the context limit", async () => {
    const models = (await client.models.list()).data as unknown as Array<{
      id: string
      capabilities: {
        vision: boolean
        max_context_tokens: number
        max_output_tokens: number
        json_mode: boolean
      }
    }>
    const prime = models.find((m) => m.id === "swarm-prime")!
    const swift = models.find((m) => m.id === "swarm-swift")!
    expect(prime.capabilities.vision).toBe(true)
    expect(swift.capabilities.vision).toBe(false)
    expect(swift.capabilities.json_mode).toBe(true)
    const tooLong = " word".repeat(swift.capabilities.max_context_tokens)
    const error = await refusal(text({ model: "swarm-swift", messages: ask(tooLong) }))
    expect(error.status).toBe(400)
    expect(error.param).toBe("messages")
  })

  it("clamps a token cap above max_output_tokens", async () => {
    const { completion } = await text({ model: "swarm-swift", messages: ask("Hi"), max_tokens: 1_000_000 })
    expect(completion.choices[0]?.finish_reason).toBe("stop")
  })
})

describe("any request the schema accepts", () => {
  const documented = new Set([
    "400:invalid_request",
    "400:unsupported_content_type",
    "400:zdr_storage_not_supported",
    "404:model_not_found",
    "413:request_too_large",
  ])
  const request = Arbitrary.make(ChatCompletionRequest)
  const arbitrary = fc.record({
    request,
    model: fc.oneof(fc.constantFrom("swarm-prime", "swarm-swift"), fc.string({ maxLength: 12 })),
    cap: fc.option(fc.integer({ min: 1, max: 50 }), { nil: undefined }),
  })

  it("gets a 200 or a documented refusal, never a 500", async () => {
    await fc.assert(
      fc.asyncProperty(arbitrary, async ({ request, model, cap }) => {
        const body = {
          ...request,
          model,
          ...(cap === undefined ? {} : { max_tokens: cap, max_completion_tokens: null }),
        }
        const response = await fetch(`${server.baseUrl}/v1/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
          body: JSON.stringify(body),
        })
        const raw = await response.text()
        if (response.status === 200) return
        if (response.status === 422) {
          // Only content parts are looser in the schema than in their own shape checks.
          expect(JSON.parse(raw).detail.length).toBeGreaterThan(0)
          return
        }
        const parsed = JSON.parse(raw)
        expect(documented.has(`${response.status}:${parsed.error.code}`), raw).toBe(true)
        expect(parsed.request_id).toBe(response.headers.get("x-request-id"))
      }),
      { numRuns: 60, seed: 20261122 },
    )
  }, 120_000)
})
