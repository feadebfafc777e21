/**
 * The response shapes against samples in OpenAI's wire format. The samples are
 * typed with the `openai` SDK's own types (type-only import) so they stay
 * faithful to what OpenAI clients expect.
 */
import { describe, expect, it } from "@effect/vitest"
import { Either, Schema } from "effect"
import type OpenAI from "openai"
import {
  ChatCompletion,
  ChatCompletionChunk,
  catalogue,
  ErrorEnvelopeSchema,
  InternalError,
  ModelList,
  renderError,
  ValidationFailed,
} from "../src/index"

const decodes = <A, I>(schema: Schema.Schema<A, I>, u: unknown): boolean =>
  Either.isRight(Schema.decodeUnknownEither(schema)(u))

const completion = {
  id: "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
  object: "chat.completion",
  created: 1741569952,
  model: "brand-prime",
  choices: [
    {
      index: 0,
      message: {
        role: "assistant",
        content: "Hello! How can I assist you today?",
        refusal: null,
        annotations: [],
      },
      logprobs: null,
      finish_reason: "stop",
    },
  ],
  usage: {
    prompt_tokens: 19,
    completion_tokens: 10,
    total_tokens: 29,
    prompt_tokens_details: { cached_tokens: 0, audio_tokens: 0 },
    completion_tokens_details: {
      reasoning_tokens: 0,
      audio_tokens: 0,
      accepted_prediction_tokens: 0,
      rejected_prediction_tokens: 0,
    },
  },
  service_tier: "default",
  system_fingerprint: "fp_swarm",
} satisfies OpenAI.Chat.Completions.ChatCompletion

const chunks = [
  {
    id: "chatcmpl-123",
    object: "chat.completion.chunk",
    created: 1694268190,
    model: "brand-prime",
    system_fingerprint: "fp_swarm",
    choices: [{ index: 0, delta: { role: "assistant", content: "" }, logprobs: null, finish_reason: null }],
    usage: null,
  },
  {
    id: "chatcmpl-123",
    object: "chat.completion.chunk",
    created: 1694268190,
    model: "brand-prime",
    choices: [{ index: 0, delta: { content: "Hello" }, logprobs: null, finish_reason: null }],
  },
  {
    id: "chatcmpl-123",
    object: "chat.completion.chunk",
    created: 1694268190,
    model: "brand-prime",
    choices: [{ index: 0, delta: {}, logprobs: null, finish_reason: "length" }],
  },
  {
    id: "chatcmpl-123",
    object: "chat.completion.chunk",
    created: 1694268190,
    model: "brand-prime",
    choices: [],
    usage: { prompt_tokens: 9, completion_tokens: 12, total_tokens: 21 },
  },
] satisfies Array<OpenAI.Chat.Completions.ChatCompletionChunk>

const model = {
  id: "brand-prime",
  object: "model",
  created: 1686935002,
  owned_by: "swarm",
  capabilities: {
    streaming: true,
    json_mode: true,
    vision: false,
    max_context_tokens: 32768,
    max_output_tokens: 4096,
  },
} satisfies OpenAI.Models.Model & { capabilities: unknown }

const modelList = { object: "list", data: [model, { ...model, id: "brand-swift" }] }

describe("ChatCompletion", () => {
  it("decodes an OpenAI-style completion (extra fields ignored)", () => {
    const decoded = Schema.decodeUnknownSync(ChatCompletion)(completion)
    expect(decoded.choices[0]!.message.content).toBe("Hello! How can I assist you today?")
    expect(decoded.usage).toEqual({ prompt_tokens: 19, completion_tokens: 10, total_tokens: 29 })
  })

  it("accepts each finish_reason of spec §2.5", () => {
    for (const finish_reason of ["stop", "length", "content_filter"]) {
      expect(
        decodes(ChatCompletion, { ...completion, choices: [{ ...completion.choices[0], finish_reason }] }),
      ).toBe(true)
    }
  })

  it("rejects finish_reasons outside spec §2.5, a missing usage, non-integer counts and a wrong object", () => {
    const choice = completion.choices[0]
    expect(
      decodes(ChatCompletion, { ...completion, choices: [{ ...choice, finish_reason: "tool_calls" }] }),
    ).toBe(false)
    const { usage: _usage, ...noUsage } = completion
    expect(decodes(ChatCompletion, noUsage)).toBe(false)
    expect(decodes(ChatCompletion, { ...completion, choices: undefined })).toBe(false)
    expect(
      decodes(ChatCompletion, { ...completion, usage: { ...completion.usage, total_tokens: 29.5 } }),
    ).toBe(false)
    expect(decodes(ChatCompletion, { ...completion, object: "chat.completion.chunk" })).toBe(false)
  })
})

describe("ChatCompletionChunk", () => {
  it("decodes OpenAI-style chunks: role chunk, content chunk, finish chunk, usage chunk", () => {
    for (const chunk of chunks) expect(decodes(ChatCompletionChunk, chunk)).toBe(true)
    const last = Schema.decodeUnknownSync(ChatCompletionChunk)(chunks[3])
    expect(last.usage).toEqual({ prompt_tokens: 9, completion_tokens: 12, total_tokens: 21 })
  })

  it("rejects a completion object and an unknown finish_reason", () => {
    expect(decodes(ChatCompletionChunk, completion)).toBe(false)
    const bad = { ...chunks[2], choices: [{ index: 0, delta: {}, finish_reason: "function_call" }] }
    expect(decodes(ChatCompletionChunk, bad)).toBe(false)
  })
})

describe("ModelList", () => {
  it("decodes an OpenAI-style model list with our capabilities field", () => {
    const decoded = Schema.decodeUnknownSync(ModelList)(modelList)
    expect(decoded.data.map((m) => m.id)).toEqual(["brand-prime", "brand-swift"])
    expect(decodes(ModelList, { object: "list", data: [] })).toBe(true)
  })

  it("rejects a wrong `object`, a non-integer `created` and a missing capabilities field", () => {
    expect(decodes(ModelList, { ...modelList, object: "model" })).toBe(false)
    expect(decodes(ModelList, { object: "list", data: [{ ...model, created: "yesterday" }] })).toBe(false)
    const { capabilities: _c, ...bare } = model
    expect(decodes(ModelList, { object: "list", data: [bare] })).toBe(false)
  })
})

describe("ErrorEnvelopeSchema", () => {
  it("decodes every rendered catalogue error and the 500", () => {
    const errors = [
      ...catalogue.map(
        (C) =>
          new (C as unknown as new (p: Record<string, unknown>) => InstanceType<typeof C>)({
            message: "m",
            param: null,
            retryAfterSeconds: 5,
          }),
      ),
      new InternalError({ message: "Internal server error" }),
    ]
    for (const e of errors) {
      const body = JSON.parse(renderError(e, "req_x").body)
      const decoded = Schema.decodeUnknownSync(ErrorEnvelopeSchema)(body)
      expect(decoded.request_id).toBe("req_x")
      expect(decoded.error.code).toBe(e.code)
    }
  })

  it("does not decode the 422 detail body or the older message/type-only form", () => {
    const body = JSON.parse(renderError(new ValidationFailed({ detail: [] }), "req_x").body)
    expect(decodes(ErrorEnvelopeSchema, body)).toBe(false)
    expect(decodes(ErrorEnvelopeSchema, { error: { message: "m", type: "authentication_error" } })).toBe(
      false,
    )
  })
})
