import { describe, expect, it } from "@effect/vitest"
import { Either, Schema } from "effect"
import fc from "fast-check"
import {
  ChatCompletionRequest,
  decodeChatCompletionRequest,
  type ValidationDetail,
  ValidationFailed,
} from "../src/index"
import { decodeCommon } from "../src/RequestDecoding"

const minimal = { model: "brand-prime", messages: [{ role: "user", content: "Hello" }] }

const ok = (body: unknown) => {
  const r = decodeChatCompletionRequest(body)
  if (Either.isLeft(r)) throw new Error(`expected success, got ${JSON.stringify(r.left.detail)}`)
  return r.right
}

const fail = (body: unknown): ReadonlyArray<ValidationDetail> => {
  const r = decodeChatCompletionRequest(body)
  if (Either.isRight(r)) throw new Error(`expected ValidationFailed, got ${JSON.stringify(r.right)}`)
  expect(r.left).toBeInstanceOf(ValidationFailed)
  return r.left.detail
}

const locs = (detail: ReadonlyArray<ValidationDetail>) => detail.map((d) => d.loc)
const at = (detail: ReadonlyArray<ValidationDetail>, loc: ReadonlyArray<string | number>) =>
  detail.filter((d) => JSON.stringify(d.loc) === JSON.stringify(loc))

/** Spec §2.6: `loc` array of strings or integers, `msg` string, `type` string; all required. */
const isWellFormed = (d: unknown): boolean => {
  if (typeof d !== "object" || d === null) return false
  const keys = Object.keys(d).sort()
  if (JSON.stringify(keys) !== JSON.stringify(["loc", "msg", "type"])) return false
  const { loc, msg, type } = d as Record<string, unknown>
  return (
    Array.isArray(loc) &&
    loc.length >= 1 &&
    loc[0] === "body" &&
    loc.every((p) => typeof p === "string" || (typeof p === "number" && Number.isInteger(p) && p >= 0)) &&
    typeof msg === "string" &&
    msg.length > 0 &&
    typeof type === "string" &&
    type.length > 0
  )
}

describe("decodeChatCompletionRequest: accepted bodies", () => {
  it("decodes a minimal valid request", () => {
    const req = ok(minimal)
    expect(req.model).toBe("brand-prime")
    expect(req.messages).toEqual([{ role: "user", content: "Hello" }])
    expect(req.stream).toBeUndefined()
  })

  it("accepts every role of spec §2.3", () => {
    for (const role of ["user", "system", "assistant"]) {
      expect(ok({ model: "m", messages: [{ role, content: "x" }] }).messages[0]!.role).toBe(role)
    }
  })

  it("accepts an empty message list shape-wise (policy is not the decoder's job)", () => {
    expect(ok({ model: "m", messages: [] }).messages).toEqual([])
  })

  it("accepts additional unknown properties (spec §2.4)", () => {
    const req = ok({ ...minimal, foo: 1, logit_bias: { "50256": -100 }, tools: [], nested: { a: [1, 2] } })
    expect(req.model).toBe("brand-prime")
  })

  it("accepts string content and content-part arrays", () => {
    const req = ok({
      model: "m",
      messages: [
        { role: "system", content: "Be brief." },
        {
          role: "user",
          content: [
            { type: "text", text: "What is in this image?" },
            { type: "image_url", image_url: { url: "https://example.com/a.png", detail: "low" } },
            { type: "image_url", image_url: { url: "data:image/png;base64,AAAA" } },
          ],
        },
      ],
    })
    expect(typeof req.messages[0]!.content).toBe("string")
    expect(req.messages[1]!.content).toHaveLength(3)
  })

  it("lets unknown content-part types through to policy (audio/file → unsupported_content_type, not 422)", () => {
    const req = ok({
      model: "m",
      messages: [
        { role: "user", content: [{ type: "input_audio", input_audio: { data: "x", format: "wav" } }] },
      ],
    })
    expect(req.messages[0]!.content).toEqual([
      { type: "input_audio", input_audio: { data: "x", format: "wav" } },
    ])
  })

  it("accepts null for every nullable optional field", () => {
    const req = ok({
      ...minimal,
      max_completion_tokens: null,
      max_tokens: null,
      stream: null,
      response_format: null,
      stream_options: null,
      temperature: null,
      top_p: null,
      presence_penalty: null,
      frequency_penalty: null,
      seed: null,
      stop: null,
      user: null,
      store: null,
      n: null,
    })
    expect(req.max_tokens).toBeNull()
    expect(req.max_completion_tokens).toBeNull()
    expect(req.response_format).toBeNull()
  })

  it("accepts the optional fields of spec §2.4 with values", () => {
    const req = ok({
      ...minimal,
      max_completion_tokens: 256,
      max_tokens: 128,
      stream: true,
      response_format: { type: "json_object" },
    })
    expect(req).toMatchObject({ max_completion_tokens: 256, max_tokens: 128, stream: true })
    expect(req.response_format).toEqual({ type: "json_object" })
  })

  it("decodes `store: true` (it is refused by policy with 400, not by the shape decoder)", () => {
    expect(ok({ ...minimal, store: true }).store).toBe(true)
  })
})

describe("decodeChatCompletionRequest: 422 detail entries", () => {
  it("missing model and messages → two `missing` entries", () => {
    const detail = fail({})
    expect(at(detail, ["body", "model"])).toEqual([
      { loc: ["body", "model"], msg: "Field required", type: "missing" },
    ])
    expect(at(detail, ["body", "messages"])).toEqual([
      { loc: ["body", "messages"], msg: "Field required", type: "missing" },
    ])
    expect(detail).toHaveLength(2)
  })

  it("missing model only", () => {
    const detail = fail({ messages: minimal.messages })
    expect(detail).toEqual([{ loc: ["body", "model"], msg: "Field required", type: "missing" }])
  })

  it("missing messages only", () => {
    const detail = fail({ model: "m" })
    expect(detail).toEqual([{ loc: ["body", "messages"], msg: "Field required", type: "missing" }])
  })

  it("a body that is not an object is reported at [body]", () => {
    for (const body of [null, [], "x", 3, true]) {
      const detail = fail(body)
      expect(locs(detail)).toEqual([["body"]])
    }
  })

  it("wrong role → loc [body, messages, 0, role]", () => {
    const detail = fail({ model: "m", messages: [{ role: "bot", content: "x" }] })
    expect(locs(detail)).toEqual([["body", "messages", 0, "role"]])
    expect(detail[0]!.type).toBe("literal_error")
    expect(detail[0]!.msg).toContain("bot")
  })

  it("reports the index of the offending message", () => {
    const detail = fail({
      model: "m",
      messages: [
        { role: "user", content: "a" },
        { role: "tool", content: "b" },
      ],
    })
    expect(locs(detail)).toEqual([["body", "messages", 1, "role"]])
  })

  it("max_tokens 1.5 → int_type at [body, max_tokens]", () => {
    const detail = fail({ ...minimal, max_tokens: 1.5 })
    expect(detail).toHaveLength(1)
    expect(detail[0]).toMatchObject({ loc: ["body", "max_tokens"], type: "int_type" })
  })

  it("max_completion_tokens of the wrong type → int_type", () => {
    const detail = fail({ ...minimal, max_completion_tokens: "100" })
    expect(detail).toHaveLength(1)
    expect(detail[0]).toMatchObject({ loc: ["body", "max_completion_tokens"], type: "int_type" })
  })

  it("stream not a boolean → bool_type at [body, stream]", () => {
    const detail = fail({ ...minimal, stream: "yes" })
    expect(detail).toEqual([expect.objectContaining({ loc: ["body", "stream"], type: "bool_type" })])
  })

  it("text part without text → loc [body, messages, 0, content, 0, text]", () => {
    const detail = fail({ model: "m", messages: [{ role: "user", content: [{ type: "text" }] }] })
    expect(detail).toEqual([
      { loc: ["body", "messages", 0, "content", 0, "text"], msg: "Field required", type: "missing" },
    ])
  })

  it("image_url part without url → loc [..., image_url, url]", () => {
    const detail = fail({
      model: "m",
      messages: [{ role: "user", content: [{ type: "image_url", image_url: {} }] }],
    })
    expect(detail).toEqual([
      {
        loc: ["body", "messages", 0, "content", 0, "image_url", "url"],
        msg: "Field required",
        type: "missing",
      },
    ])
  })

  it("image_url part without image_url object → loc [..., image_url]", () => {
    const detail = fail({ model: "m", messages: [{ role: "user", content: [{ type: "image_url" }] }] })
    expect(locs(detail)).toEqual([["body", "messages", 0, "content", 0, "image_url"]])
  })

  it("content part without type → loc [..., content, 0, type]", () => {
    const detail = fail({ model: "m", messages: [{ role: "user", content: [{ text: "hi" }] }] })
    expect(locs(detail)).toEqual([["body", "messages", 0, "content", 0, "type"]])
  })

  it("content neither string nor list → one entry at [..., content]", () => {
    const detail = fail({ model: "m", messages: [{ role: "user", content: 5 }] })
    expect(locs(detail)).toEqual([["body", "messages", 0, "content"]])
  })

  it("multiple top-level errors are all reported", () => {
    const detail = fail({
      model: 5,
      messages: [{ role: "bot", content: "x" }, { role: "user" }],
      max_tokens: 1.5,
      stream: "yes",
    })
    expect(locs(detail)).toEqual(
      expect.arrayContaining([
        ["body", "model"],
        ["body", "messages", 0, "role"],
        ["body", "messages", 1, "content"],
        ["body", "max_tokens"],
        ["body", "stream"],
      ]),
    )
    expect(detail).toHaveLength(5)
  })

  it("multiple content-part errors are all reported", () => {
    const detail = fail({
      model: "m",
      messages: [
        {
          role: "user",
          content: [
            { type: "text", text: 1 },
            { type: "image_url", image_url: { url: 2 } },
          ],
        },
        { role: "user", content: [{ type: "text" }] },
      ],
    })
    expect(locs(detail)).toEqual([
      ["body", "messages", 0, "content", 0, "text"],
      ["body", "messages", 0, "content", 1, "image_url", "url"],
      ["body", "messages", 1, "content", 0, "text"],
    ])
  })

  // Known src bug (reported): content-part checks only run when the rest of the body decoded,
  // so a bad part next to any other error is silently dropped. Remove `.fails` once fixed.
  it("content-part errors are reported together with other field errors", () => {
    const detail = fail({ messages: [{ role: "user", content: [{ type: "text" }] }] })
    expect(locs(detail)).toEqual(
      expect.arrayContaining([
        ["body", "model"],
        ["body", "messages", 0, "content", 0, "text"],
      ]),
    )
  })

  // Known src bug (reported): a nested error inside a nullable object field is reported at the
  // field itself as "Input should be a valid object, got an object". Remove `.fails` once fixed.
  it("nested errors in nullable object fields point inside the object", () => {
    const detail = fail({ ...minimal, stream_options: { include_usage: 1 }, response_format: {} })
    expect(locs(detail)).toEqual(
      expect.arrayContaining([
        ["body", "stream_options", "include_usage"],
        ["body", "response_format", "type"],
      ]),
    )
  })
})

describe("decodeChatCompletionRequest: properties", () => {
  const check = (body: unknown) => {
    let result: ReturnType<typeof decodeChatCompletionRequest> | undefined
    expect(() => {
      result = decodeChatCompletionRequest(body)
    }).not.toThrow()
    if (Either.isRight(result!)) {
      expect(typeof result.right.model).toBe("string")
      expect(Array.isArray(result.right.messages)).toBe(true)
    } else {
      expect(result!.left).toBeInstanceOf(ValidationFailed)
      expect(result!.left.detail.length).toBeGreaterThan(0)
      for (const d of result!.left.detail) expect(isWellFormed(d), JSON.stringify(d)).toBe(true)
    }
  }

  it("never throws on arbitrary JSON; failures are non-empty, well-formed §2.6 entries", () => {
    fc.assert(fc.property(fc.jsonValue(), check), { numRuns: 500 })
  })

  it("never throws on arbitrary JS values", () => {
    fc.assert(fc.property(fc.anything(), check), { numRuns: 500 })
  })

  it("never throws on request-like bodies with arbitrary field values", () => {
    const anyOr = <T>(arb: fc.Arbitrary<T>) => fc.oneof(arb, fc.jsonValue())
    const part = anyOr(
      fc.oneof(
        fc.record({ type: fc.constant("text"), text: anyOr(fc.string()) }, { requiredKeys: ["type"] }),
        fc.record(
          {
            type: fc.constant("image_url"),
            image_url: anyOr(
              fc.record({ url: anyOr(fc.webUrl()), detail: anyOr(fc.constantFrom("low", "high")) }),
            ),
          },
          { requiredKeys: ["type"] },
        ),
        fc.record({ type: anyOr(fc.constantFrom("input_audio", "file")) }),
      ),
    )
    const message = anyOr(
      fc.record({
        role: anyOr(fc.constantFrom("user", "system", "assistant")),
        content: anyOr(fc.oneof(fc.string(), fc.array(part, { maxLength: 3 }))),
      }),
    )
    const body = fc.record({
      model: anyOr(fc.string()),
      messages: anyOr(fc.array(message, { maxLength: 3 })),
      max_tokens: anyOr(fc.oneof(fc.integer(), fc.constant(null))),
      max_completion_tokens: anyOr(fc.oneof(fc.integer(), fc.double(), fc.constant(null))),
      stream: anyOr(fc.boolean()),
      stream_options: anyOr(fc.record({ include_usage: anyOr(fc.boolean()) })),
      response_format: anyOr(fc.record({ type: anyOr(fc.string()) })),
      stop: anyOr(fc.oneof(fc.string(), fc.array(anyOr(fc.string())))),
    })
    fc.assert(fc.property(body, check), { numRuns: 1000 })
  })

  it("well-formed requests always decode", () => {
    const message = fc.record({
      role: fc.constantFrom("user", "system", "assistant"),
      content: fc.oneof(
        fc.string(),
        fc.array(
          fc.oneof(
            fc.record({ type: fc.constant("text"), text: fc.string() }),
            fc.record({ type: fc.constant("image_url"), image_url: fc.record({ url: fc.webUrl() }) }),
          ),
        ),
      ),
    })
    const body = fc.record(
      {
        model: fc.string(),
        messages: fc.array(message),
        max_tokens: fc.option(fc.nat()),
        max_completion_tokens: fc.option(fc.nat()),
        stream: fc.option(fc.boolean()),
        response_format: fc.option(fc.record({ type: fc.constantFrom("text", "json_object") })),
      },
      { requiredKeys: ["model", "messages"] },
    )
    fc.assert(
      fc.property(body, (b) => {
        const r = decodeChatCompletionRequest(b)
        expect(Either.isRight(r), Either.isLeft(r) ? JSON.stringify(r.left.detail) : "").toBe(true)
      }),
    )
  })
})

describe("decodeCommon: the hand check of the common request", () => {
  const schemaDecode = Schema.decodeUnknownEither(ChatCompletionRequest, { errors: "all" })

  const scalar = fc.oneof(
    fc.string({ maxLength: 4 }),
    fc.integer(),
    fc.double({ noNaN: true, noDefaultInfinity: true }),
    fc.boolean(),
    fc.constant(null),
    fc.constant(2 ** 60),
  )
  const anyValue = fc.oneof(
    scalar,
    fc.array(scalar, { maxLength: 3 }),
    fc.dictionary(fc.string({ maxLength: 3 }), scalar, { maxKeys: 2 }),
  )
  const maybe = <T>(arb: fc.Arbitrary<T>) => fc.option(fc.oneof(arb, anyValue), { nil: undefined, freq: 2 })
  const message = fc.record(
    {
      role: fc.oneof(fc.constantFrom("system", "user", "assistant", "tool"), anyValue),
      content: fc.oneof(
        { weight: 5, arbitrary: fc.string({ maxLength: 8 }) },
        { weight: 1, arbitrary: fc.constant([{ type: "text", text: "hi" }]) },
        { weight: 1, arbitrary: anyValue },
      ),
      name: fc.oneof(fc.string({ maxLength: 3 }), anyValue),
      extra: anyValue,
    },
    { requiredKeys: ["role", "content"] },
  )
  const body = fc
    .record(
      {
        model: fc.oneof(
          { weight: 5, arbitrary: fc.string({ maxLength: 5 }) },
          { weight: 1, arbitrary: anyValue },
        ),
        messages: fc.oneof(
          { weight: 5, arbitrary: fc.array(message, { maxLength: 4 }) },
          { weight: 1, arbitrary: anyValue },
        ),
        max_tokens: maybe(fc.integer()),
        max_completion_tokens: maybe(fc.integer()),
        stream: maybe(fc.boolean()),
        stream_options: maybe(
          fc.record({ include_usage: fc.oneof(fc.boolean(), anyValue), other: scalar }, { requiredKeys: [] }),
        ),
        response_format: maybe(fc.constant({ type: "json_object" })),
        temperature: maybe(fc.double({ noNaN: true, noDefaultInfinity: true })),
        top_p: maybe(fc.double({ noNaN: true, noDefaultInfinity: true })),
        presence_penalty: maybe(fc.double({ noNaN: true, noDefaultInfinity: true })),
        frequency_penalty: maybe(fc.double({ noNaN: true, noDefaultInfinity: true })),
        seed: maybe(fc.integer()),
        stop: maybe(
          fc.oneof(fc.string({ maxLength: 3 }), fc.array(fc.string({ maxLength: 3 }), { maxLength: 3 })),
        ),
        user: maybe(fc.string({ maxLength: 3 })),
        store: maybe(fc.boolean()),
        n: maybe(fc.integer()),
        metadata: maybe(scalar),
      },
      { requiredKeys: [] },
    )
    .map((b) => JSON.parse(JSON.stringify(b)) as unknown)

  it("gives exactly what the schema gives wherever it answers", () => {
    fc.assert(
      fc.property(body, (b) => {
        const common = decodeCommon(b)
        if (common === undefined) return
        const full = schemaDecode(b)
        expect(Either.isRight(full)).toBe(true)
        if (Either.isRight(full)) {
          expect(common).toStrictEqual(full.right)
          expect(Object.keys(common)).toEqual(Object.keys(full.right))
        }
      }),
      { numRuns: 3000 },
    )
  })

  // A count, not a property: over a fixed sample (a random one holds ~17 valid bodies in 3,000, too
  // few for a ratio that must not fail by chance).
  it("answers for most valid bodies", () => {
    let answered = 0
    let valid = 0
    for (const b of fc.sample(body, { numRuns: 20_000, seed: 14 })) {
      if (Either.isLeft(schemaDecode(b))) continue
      valid++
      if (decodeCommon(b) !== undefined) answered++
    }
    expect(valid).toBeGreaterThan(50)
    expect(answered).toBeGreaterThan(valid / 4)
  })

  it("takes the common request and leaves content parts, response_format and odd shapes to the schema", () => {
    expect(decodeCommon(minimal)).toStrictEqual(ok(minimal))
    const parts = { ...minimal, messages: [{ role: "user", content: [{ type: "text", text: "hi" }] }] }
    expect(decodeCommon(parts)).toBeUndefined()
    expect(decodeCommon({ ...minimal, response_format: { type: "json_object" } })).toBeUndefined()
    expect(decodeCommon({ ...minimal, extra: { nested: true } })).toBeUndefined()
    expect(decodeCommon({ ...minimal, seed: 2 ** 60 })).toBeUndefined()
    expect(decodeCommon([minimal])).toBeUndefined()
  })
})
