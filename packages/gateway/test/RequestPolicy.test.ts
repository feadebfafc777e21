import { describe, expect, it } from "@effect/vitest"
import { Presets } from "@swarmgate/dispatch"
import { type ChatCompletionRequest, decodeChatCompletionRequest, Tokens } from "@swarmgate/protocol"
import { Effect, Either } from "effect"
import { countTokens } from "gpt-tokenizer"
import { normalize, type PresetView } from "../src/RequestPolicy"

const [prime, swift] = Presets.defaultPresets()
const views = new Map<string, PresetView>([
  [prime!.id, { preset: prime!, vision: true }],
  [swift!.id, { preset: swift!, vision: false }],
])

const run = (body: Record<string, unknown>, maxImageBytes = 1_000) => {
  const decoded = decodeChatCompletionRequest(body)
  if (Either.isLeft(decoded)) throw new Error(JSON.stringify(decoded.left.detail))
  return normalize(decoded.right as ChatCompletionRequest, body, (id) => views.get(id), maxImageBytes)
}

const base = { model: "swarm-prime", messages: [{ role: "user", content: "hello there" }] }

const refusal = (body: Record<string, unknown>, maxImageBytes?: number) =>
  Effect.flip(run(body, maxImageBytes)).pipe(
    Effect.map((e) => ({ tag: e._tag, code: e.code, status: e.status, param: e.param })),
  )

describe("RequestPolicy", () => {
  it.effect("normalises a plain request with the preset's cap and the gateway's prompt count", () =>
    Effect.gen(function* () {
      const request = yield* run(base)
      expect(request.maxTokens).toBe(prime!.maxOutputTokens)
      expect(request.promptTokens).toBe(3 + 3 + countTokens("hello there"))
      expect(request.stream).toBe(false)
      expect(request.jsonMode).toBe(false)
      expect(request.messages).toEqual([{ role: "user", content: "hello there", images: [] }])
    }),
  )

  it.effect("the smaller cap wins and caps are clamped to the preset", () =>
    Effect.gen(function* () {
      expect((yield* run({ ...base, max_tokens: 50, max_completion_tokens: 20 })).maxTokens).toBe(20)
      expect((yield* run({ ...base, max_tokens: 10, max_completion_tokens: null })).maxTokens).toBe(10)
      expect((yield* run({ ...base, max_tokens: 10_000_000 })).maxTokens).toBe(prime!.maxOutputTokens)
      // Beyond 2^53 a cap is still an integer, and clamped like any other (README: request fields).
      expect((yield* run({ ...base, max_tokens: 2 ** 53 })).maxTokens).toBe(prime!.maxOutputTokens)
      expect((yield* run({ ...base, max_completion_tokens: 1e300 })).maxTokens).toBe(prime!.maxOutputTokens)
    }),
  )

  it.effect("refuses store: true before anything else", () =>
    Effect.gen(function* () {
      expect(yield* refusal({ ...base, model: "nope", store: true })).toMatchObject({
        code: "zdr_storage_not_supported",
        param: "store",
      })
    }),
  )

  it.effect("unknown models are 404 with param model", () =>
    Effect.gen(function* () {
      expect(yield* refusal({ ...base, model: "swarm-unknown" })).toMatchObject({
        status: 404,
        param: "model",
      })
    }),
  )

  it.effect("refuses parameters it cannot honour, accepts their neutral values", () =>
    Effect.gen(function* () {
      for (const [field, value] of [
        ["n", 3],
        ["tools", [{ type: "function" }]],
        ["tool_choice", "auto"],
        ["logprobs", true],
        ["top_logprobs", 2],
        ["logit_bias", { "1": 2 }],
        ["modalities", ["text", "audio"]],
        ["response_format", { type: "json_schema", json_schema: {} }],
        ["stream_options", { include_usage: true }],
        ["temperature", -0.1],
        ["temperature", 2.01],
        ["top_p", 1.5],
        ["presence_penalty", 2.5],
        ["frequency_penalty", -3],
        ["user", "u".repeat(257)],
        ["stop", ""],
      ] as const) {
        expect(yield* refusal({ ...base, [field]: value })).toMatchObject({
          code: "invalid_request",
          param: field,
        })
      }
      for (const [field, value] of [
        ["n", 1],
        ["tools", []],
        ["tool_choice", "none"],
        ["logprobs", false],
        ["logit_bias", {}],
        ["modalities", ["text"]],
        ["response_format", { type: "json_object" }],
        ["temperature", 2],
        ["top_p", 0],
        ["presence_penalty", -2],
        ["frequency_penalty", 2],
      ] as const) {
        yield* run({ ...base, [field]: value })
      }
    }),
  )

  it.effect("content parts: text joined, audio and file refused, unknown types refused", () =>
    Effect.gen(function* () {
      const request = yield* run({
        ...base,
        messages: [
          {
            role: "user",
            content: [
              { type: "text", text: "a" },
              { type: "text", text: "b" },
            ],
          },
        ],
      })
      expect(request.messages[0]?.content).toBe("a\nb")
      for (const type of ["input_audio", "file"]) {
        expect(yield* refusal({ ...base, messages: [{ role: "user", content: [{ type }] }] })).toMatchObject({
          status: 400,
          code: "unsupported_content_type",
          param: "messages[0].content[0]",
        })
      }
      expect(
        yield* refusal({ ...base, messages: [{ role: "user", content: [{ type: "video" }] }] }),
      ).toMatchObject({
        code: "invalid_request",
        param: "messages[0].content[0].type",
      })
    }),
  )

  it.effect("images: size limit 413, vision required, tokens counted by detail", () =>
    Effect.gen(function* () {
      const image = (bytes: number, detail?: string) => ({
        type: "image_url",
        image_url: {
          url: `data:image/png;base64,${Buffer.alloc(bytes).toString("base64")}`,
          ...(detail ? { detail } : {}),
        },
      })
      const ok = yield* run({ ...base, messages: [{ role: "user", content: [image(1_000, "low")] }] })
      expect(ok.messages[0]?.images[0]).toMatchObject({ mediaType: "image/png", bytes: 1_000 })
      expect(ok.promptTokens).toBe(3 + 3 + Tokens.IMAGE_TOKENS_LOW)
      const high = yield* run({ ...base, messages: [{ role: "user", content: [image(10)] }] })
      expect(high.promptTokens).toBe(3 + 3 + Tokens.IMAGE_TOKENS_DEFAULT)
      expect(
        yield* refusal({ ...base, messages: [{ role: "user", content: [image(1_001)] }] }),
      ).toMatchObject({
        status: 413,
        param: "messages[0].content[0]",
      })
      expect(
        yield* refusal({ ...base, model: "swarm-swift", messages: [{ role: "user", content: [image(10)] }] }),
      ).toMatchObject({ status: 400, param: "messages[0].content[0]" })
      const remote = yield* run({
        ...base,
        messages: [
          {
            role: "user",
            content: [{ type: "image_url", image_url: { url: "https://x.test/cat.JPG?s=1" } }],
          },
        ],
      })
      expect(remote.messages[0]?.images[0]?.mediaType).toBe("image/jpeg")
      expect(
        yield* refusal({
          ...base,
          messages: [
            { role: "user", content: [{ type: "image_url", image_url: { url: "ftp://x/cat.png" } }] },
          ],
        }),
      ).toMatchObject({ param: "messages[0].content[0].image_url.url" })
    }),
  )

  it.effect("a prompt beyond the context is refused; the cap shrinks to what is left", () =>
    Effect.gen(function* () {
      const long = " word".repeat(swift!.maxContextTokens)
      expect(
        yield* refusal({ ...base, model: "swarm-swift", messages: [{ role: "user", content: long }] }),
      ).toMatchObject({ param: "messages" })
      const nearlyFull = " word".repeat(swift!.maxContextTokens - 100)
      const request = yield* run({
        ...base,
        model: "swarm-swift",
        messages: [{ role: "user", content: nearlyFull }],
      })
      expect(request.maxTokens).toBe(swift!.maxContextTokens - request.promptTokens)
    }),
  )
})

describe("Tokens", () => {
  it("truncates to an exact token count", () => {
    const text = "The quick brown fox jumps over the lazy dog again and again."
    for (const n of [0, 1, 5, 9]) expect(countTokens(Tokens.truncate(text, n))).toBe(n)
    expect(Tokens.count("")).toBe(0)
  })

  it("counts names in the framing", () => {
    expect(Tokens.promptTokens([{ content: "hi", name: "bob", imageTokens: 0 }])).toBe(
      3 + 3 + countTokens("hi") + 1 + countTokens("bob"),
    )
  })
})
