/**
 * Hostile input against the real server process: arbitrary JSON and bytes,
 * every field with a wrong type, unicode edge cases, duplicate keys, nesting
 * 100,000 deep, strings near the body limit, odd headers. Every answer must be
 * a well-formed refusal with the documented status — never a 500, never a
 * hang — and nothing may change: the key's account has no money, so even a
 * request that passes every check is refused by billing (429
 * `insufficient_quota`) after it was tokenized and admitted, and the refusal
 * must leave balance, holds, spend, usage records and limiter counters as
 * they were.
 *
 * Bounded for CI: `SWARMGATE_FUZZ_SCALE` multiplies the runs (default 1),
 * `SWARMGATE_FUZZ_SEED` replays a failure.
 */
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import fc from "fast-check"
import { expectRefusal, type RawResponse, rawRequest } from "./support/RawHttp"
import { createKey, type RunningServer, startServer } from "./support/ServerProcess"

const SCALE = Number(process.env.SWARMGATE_FUZZ_SCALE ?? 1)
const SEED = process.env.SWARMGATE_FUZZ_SEED
const runs = (n: number) => ({
  numRuns: Math.max(1, Math.round(n * SCALE)),
  ...(SEED === undefined ? {} : { seed: Number(SEED) }),
})

const MAX_BODY = 2 * 1024 * 1024
const MAX_IMAGE = 500_000

let server: RunningServer
let port: number
let key: string
let keyId: string
let accountId: string
let before: unknown

const snapshot = async () => ({
  account: (await server.admin("GET", `/accounts/${accountId}`)).body,
  key: (await server.admin("GET", `/keys/${keyId}`)).body,
  usage: (await server.admin("GET", `/usage?account_id=${accountId}&limit=1000`)).body,
})

beforeAll(async () => {
  server = await startServer({
    SWARMGATE_MAX_BODY_BYTES: String(MAX_BODY),
    SWARMGATE_MAX_IMAGE_BYTES: String(MAX_IMAGE),
    SWARMGATE_SIM_SPEED: "Infinity",
  })
  port = Number(new URL(server.baseUrl).port)
  const issued = await createKey(server, { balance_usd: 0 })
  ;({ key, keyId, accountId } = issued)
  before = await snapshot()
}, 60_000)

afterAll(async () => {
  await server?.stop()
})

/** Statuses a refusal of a chat completion may have here; 429 only from billing (no money). */
const REFUSALS = new Set(["400", "404", "413", "415", "422", "429:insufficient_quota"])

const expectDocumented = (status: number, headers: Readonly<Record<string, string>>, body: string) => {
  const code = expectRefusal(status, headers, body)
  expect(REFUSALS.has(String(status)) || REFUSALS.has(`${status}:${code}`), `${status} ${body}`).toBe(true)
  return code
}

const post = async (body: string | Uint8Array, headers: Record<string, string> = {}) => {
  const response = await fetch(`${server.baseUrl}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json", ...headers },
    body,
  })
  const text = await response.text()
  const headerMap = Object.fromEntries(response.headers.entries())
  return { status: response.status, code: expectDocumented(response.status, headerMap, text), text }
}

const valid = { model: "swarm-prime", messages: [{ role: "user", content: "Hello" }] }

describe("arbitrary bodies", () => {
  it("arbitrary JSON values get a documented refusal", async () => {
    await fc.assert(
      fc.asyncProperty(fc.jsonValue({ maxDepth: 6 }), async (value) => {
        await post(JSON.stringify(value) ?? "null")
      }),
      runs(150),
    )
  }, 60_000)

  it("arbitrary bytes, and mangled valid JSON, get a documented refusal", async () => {
    const text = JSON.stringify(valid)
    const mangled = fc
      .array(fc.tuple(fc.nat({ max: text.length }), fc.nat({ max: 3 }), fc.string({ maxLength: 3 })), {
        minLength: 1,
        maxLength: 4,
      })
      .map((edits) =>
        edits.reduce((t, [at, cut, insert]) => t.slice(0, at) + insert + t.slice(at + cut), text),
      )
    await fc.assert(
      fc.asyncProperty(fc.oneof(fc.uint8Array({ maxLength: 2_000 }), mangled), async (body) => {
        await post(body)
      }),
      runs(150),
    )
  }, 60_000)
})

/** Every field of §2.4 with the JSON types it accepts; anything else must be a 422 naming the field. */
const FIELDS: Record<string, ReadonlyArray<string>> = {
  model: ["string"],
  messages: ["array"],
  max_completion_tokens: ["integer", "null"],
  max_tokens: ["integer", "null"],
  stream: ["boolean", "null"],
  stream_options: ["object", "null"],
  response_format: ["object", "null"],
  temperature: ["number", "integer", "null"],
  top_p: ["number", "integer", "null"],
  presence_penalty: ["number", "integer", "null"],
  frequency_penalty: ["number", "integer", "null"],
  seed: ["integer", "null"],
  stop: ["string", "array", "null"],
  user: ["string", "null"],
  store: ["boolean", "null"],
  n: ["integer", "null"],
}
const MESSAGE_FIELDS: Record<string, ReadonlyArray<string>> = {
  role: ["string"],
  content: ["string", "array"],
  name: ["string"],
}

const jsonType = (value: unknown) =>
  value === null
    ? "null"
    : Array.isArray(value)
      ? "array"
      : typeof value === "number"
        ? Number.isInteger(value)
          ? "integer"
          : "number"
        : typeof value

describe("wrong types", () => {
  it("a wrong JSON type in any field is a 422 whose detail names the field", async () => {
    const field = fc.constantFrom(...Object.keys(FIELDS))
    await fc.assert(
      fc.asyncProperty(field, fc.jsonValue({ maxDepth: 2 }), async (name, value) => {
        fc.pre(!FIELDS[name]!.includes(jsonType(value)))
        const response = await post(JSON.stringify({ ...valid, [name]: value }))
        expect(response.status).toBe(422)
        const detail = JSON.parse(response.text).detail as Array<{ loc: Array<unknown> }>
        expect(detail.some((d) => d.loc[0] === "body" && d.loc[1] === name)).toBe(true)
      }),
      runs(120),
    )
  }, 60_000)

  it("a wrong JSON type in a message field is a 422 whose detail names it", async () => {
    const field = fc.constantFrom(...Object.keys(MESSAGE_FIELDS))
    await fc.assert(
      fc.asyncProperty(field, fc.jsonValue({ maxDepth: 2 }), async (name, value) => {
        fc.pre(!MESSAGE_FIELDS[name]!.includes(jsonType(value)))
        const message = { role: "user", content: "Hi", [name]: value }
        const response = await post(JSON.stringify({ ...valid, messages: [message] }))
        expect(response.status).toBe(422)
        const detail = JSON.parse(response.text).detail as Array<{ loc: Array<unknown> }>
        expect(detail.some((d) => d.loc.join("/") === `body/messages/0/${name}`)).toBe(true)
      }),
      runs(60),
    )
  }, 60_000)
})

/** Characters that break naive code: lone surrogates, NUL, direction overrides, special-token text. */
const EDGE = [
  "\ud800",
  "\udfff",
  "\udbff\udfff",
  "\u0000",
  "\u202e",
  "\u200f",
  "\u200d",
  "\ufeff",
  "\u2028",
  "\u0301\u0301\u0301",
  "😀",
  "👩‍👩‍👧",
  "漢字",
  "עברית",
  "<|endoftext|>",
  "<|im_start|>",
  "<|fim_prefix|>",
  "\\",
  '"',
  "%00",
  " ".repeat(300),
  "a".repeat(300),
]
const edgy = fc
  .array(fc.oneof(fc.constantFrom(...EDGE), fc.string({ maxLength: 5, unit: "binary" })), { maxLength: 8 })
  .map((parts) => parts.join(""))

describe("unicode and odd values", () => {
  it("edge-case text anywhere in a request: tokenized and refused by billing, or refused earlier", async () => {
    const request = fc.record(
      {
        model: fc.oneof(fc.constant("swarm-prime"), fc.constant("swarm-swift"), edgy),
        content: edgy,
        name: edgy,
        stop: fc.oneof(
          edgy.filter((s) => s.length > 0),
          fc.array(edgy, { maxLength: 5 }),
        ),
        user: edgy,
        extra: fc.dictionary(edgy, edgy, { maxKeys: 3 }),
        parts: fc.array(fc.record({ type: fc.constant("text"), text: edgy }), { minLength: 1, maxLength: 3 }),
      },
      { requiredKeys: ["model", "content"] },
    )
    const codes = new Map<string, number>()
    await fc.assert(
      fc.asyncProperty(request, async (r) => {
        const message: Record<string, unknown> = { role: "user", content: r.parts ?? r.content }
        if (r.name !== undefined) message.name = r.name
        const body: Record<string, unknown> = { ...r.extra, model: r.model, messages: [message] }
        if (r.stop !== undefined) body.stop = r.stop
        if (r.user !== undefined) body.user = r.user
        const { status, code } = await post(JSON.stringify(body))
        codes.set(`${status}:${code}`, (codes.get(`${status}:${code}`) ?? 0) + 1)
      }),
      runs(150),
    )
    // The property reached the end of the path (tokenizing, admission, billing), not only the early checks.
    expect(codes.get("429:insufficient_quota") ?? 0).toBeGreaterThan(10)
  }, 60_000)

  it("duplicate keys: the last one wins, as in JSON.parse", async () => {
    const cases = [
      `{"model":"nope","model":"swarm-prime","messages":[{"role":"user","content":"x"}]}`,
      `{"model":"swarm-prime","messages":[{"role":"user","role":"robot","content":"x"}]}`,
      `{"model":"swarm-prime","messages":[],"messages":[{"role":"user","content":"x"}],"stream":true,"stream":"yes"}`,
      `{"model":"swarm-prime","messages":[{"role":"user","content":"x"}],"__proto__":{"admin":true},"constructor":{"prototype":{}}}`,
    ]
    const statuses = []
    for (const body of cases) statuses.push((await post(body)).status)
    expect(statuses).toEqual([429, 422, 422, 429])
  })
})

describe("size and depth", () => {
  it("nesting 100,000 deep, as the body or inside a field, is refused without a crash", async () => {
    const deep = (n: number) => "[".repeat(n) + "]".repeat(n)
    const deepObject = (n: number) => `${'{"a":'.repeat(n)}1${"}".repeat(n)}`
    const cases: Array<[string, number]> = [
      [deep(100_000), 422],
      [deepObject(100_000), 422],
      [`{"model":"swarm-prime","messages":${deep(100_000)}}`, 422],
      [`{"model":"swarm-prime","messages":[{"role":"user","content":${deep(50_000)}}]}`, 422],
      // An ignored extra property may nest deep; the request then runs on to billing.
      [`{"model":"swarm-prime","messages":[{"role":"user","content":"x"}],"extra":${deep(50_000)}}`, 429],
      [`{"model":"swarm-prime","messages":[{"role":"user","content":"x"}],"extra":${deep(150_000)}}`, 422],
    ]
    for (const [body, status] of cases) expect((await post(body)).status).toBe(status)
  }, 30_000)

  it("bodies with a million values are refused at once (422 too_long), not decoded value by value", async () => {
    const many = `{"model":"swarm-prime","messages":[${"1,".repeat(999_999)}1]}`
    const keys = `{"model":"swarm-prime","messages":[],${Array.from({ length: 150_000 }, (_, i) => `"k${i}":0`).join(",")}}`
    for (const body of [many, keys]) {
      const started = Date.now()
      const response = await post(body)
      expect(response.status).toBe(422)
      expect(JSON.parse(response.text).detail).toEqual([
        { loc: ["body"], msg: "The body holds more than 100000 JSON values", type: "too_long" },
      ])
      expect(Date.now() - started).toBeLessThan(2_000)
    }
  }, 30_000)

  it("prompts near the body limit are refused in well under a second each, and the server stays responsive", async () => {
    let cjk = ""
    for (let i = 0; i < 600_000; i++) cjk += String.fromCharCode(0x4e00 + ((i * 7919) % 20_000))
    const prompts = [
      " ".repeat(MAX_BODY - 200),
      "a".repeat(MAX_BODY - 200),
      "\n".repeat(MAX_BODY / 2 - 200),
      "漢".repeat(680_000),
      cjk,
      "<|endoftext|>".repeat(150_000),
      "😀".repeat(400_000),
      "\u0301".repeat(1_000_000),
    ]
    // A probe running alongside: the event loop must never be blocked for long.
    let worstProbe = 0
    let probing = true
    const probe = (async () => {
      while (probing) {
        const started = Date.now()
        await fetch(`${server.baseUrl}/healthz`)
        worstProbe = Math.max(worstProbe, Date.now() - started)
        await new Promise((r) => setTimeout(r, 20))
      }
    })()
    try {
      for (const content of prompts) {
        const body = JSON.stringify({ model: "swarm-prime", messages: [{ role: "user", content }] })
        expect(Buffer.byteLength(body)).toBeLessThanOrEqual(MAX_BODY)
        const started = Date.now()
        const response = await post(body)
        // Over the context (400 on messages), or counted within it and refused by billing.
        expect(["400:invalid_request", "429:insufficient_quota"]).toContain(
          `${response.status}:${response.code}`,
        )
        if (response.status === 400) expect(JSON.parse(response.text).error.param).toBe("messages")
        expect(Date.now() - started, `${content.slice(0, 3)}…`).toBeLessThan(1_500)
      }
    } finally {
      probing = false
      await probe
    }
    expect(worstProbe).toBeLessThan(1_000)
  }, 60_000)

  it("a body over the limit is 413, a data-URL image over its limit is 413 with the part as param", async () => {
    expect((await post("x".repeat(MAX_BODY + 1))).code).toBe("request_too_large")
    const image = `data:image/png;base64,${"A".repeat(Math.ceil((MAX_IMAGE * 4) / 3) + 8)}`
    const body = JSON.stringify({
      model: "swarm-prime",
      messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: image } }] }],
    })
    const response = await post(body)
    expect(response.code).toBe("request_too_large")
    expect(JSON.parse(response.text).error.param).toBe("messages[0].content[0]")
  })
})

describe("odd headers", () => {
  const request = (headers: ReadonlyArray<string>, body = JSON.stringify(valid)) =>
    `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n${headers.map((h) => `${h}\r\n`).join("")}\r\n${body}`
  const length = `Content-Length: ${Buffer.byteLength(JSON.stringify(valid))}`
  const auth = () => `Authorization: Bearer ${key}`

  const expectRaw = (response: RawResponse | undefined, status: number, code: string) => {
    expect(response, "a response, not a dropped connection").toBeDefined()
    expect(response!.status).toBe(status)
    expect(expectRefusal(response!.status, response!.headers, response!.body)).toBe(code)
  }

  it("duplicate Content-Type: the first one counts (node:http drops the rest)", async () => {
    expectRaw(
      await rawRequest(
        port,
        request([auth(), "Content-Type: text/plain", "Content-Type: application/json", length]),
      ),
      415,
      "unsupported_content_type",
    )
    expectRaw(
      await rawRequest(
        port,
        request([auth(), "Content-Type: application/json", "Content-Type: text/plain", length]),
      ),
      429,
      "insufficient_quota",
    )
  })

  it("Content-Type variants", async () => {
    for (const [type, status] of [
      ["APPLICATION/JSON", 429],
      ["application/json ; charset=utf-8", 429],
      ["application/json-patch+json", 415],
      ["application/jsonx", 415],
      ["text/json", 415],
      ["", 415],
    ] as const) {
      expect((await post(JSON.stringify(valid), { "content-type": type })).status, type).toBe(status)
    }
  })

  it("odd Authorization headers are 401 invalid_api_key, never a lookup error", async () => {
    const wellFormedUnknown = `${key.slice(0, 20)}${key.slice(21)}${key[20] === "a" ? "b" : "a"}`
    const headers = [
      [],
      ["Authorization:"],
      ["Authorization: Bearer"],
      ["Authorization: Bearer "],
      [`Authorization: Basic ${Buffer.from(`${key}:`).toString("base64")}`],
      [`Authorization: Bearer ${key} ${key}`],
      [`Authorization: Bearer ${key},${key}`],
      [`Authorization: Bearer ${key.toUpperCase()}`],
      [`Authorization: Bearer ${key}\u00e9`],
      [`Authorization: Bearer ${"A".repeat(8_000)}`],
      [`Authorization: Bearer ${wellFormedUnknown}`],
      [`Authorization: Bearer sk-swarm-${"0".repeat(49)}`],
      [`Authorization: Token ${key}`],
    ]
    for (const extra of headers) {
      const response = await rawRequest(port, request([...extra, "Content-Type: application/json", length]))
      expectRaw(response, 401, "invalid_api_key")
    }
    // Duplicate Authorization: node:http keeps the first.
    expectRaw(
      await rawRequest(
        port,
        request(["Authorization: Bearer nope", auth(), "Content-Type: application/json", length]),
      ),
      401,
      "invalid_api_key",
    )
    // Scheme case and surrounding whitespace do not matter.
    expectRaw(
      await rawRequest(
        port,
        request([`authorization:   bearer \t${key}  `, "Content-Type: application/json", length]),
      ),
      429,
      "insufficient_quota",
    )
  })

  it("malformed HTTP gets the envelope with a request id, not a bare status line", async () => {
    const body = JSON.stringify(valid)
    const cases = [
      request([auth(), "Content-Type: application/json", length, "Content-Length: 3"], body),
      request([auth(), "Content-Type: application/json", length, "Transfer-Encoding: chunked"], body),
      request(
        [auth(), "Content-Type: application/json", "Transfer-Encoding: chunked"],
        "zz\r\nxx\r\n0\r\n\r\n",
      ),
      request([auth(), "Content-Type: application/json", "Bad Header: x", length], body),
      request([auth(), "Content-Type: application/json", "X-Nul: a\u0000b", length], body),
      request([auth(), "Content-Type: application/json", `X-Big: ${"b".repeat(20_000)}`, length], body),
      `GET /v1/models HTTP/9.9\r\nHost: x\r\n\r\n`,
      `\u0000\u0001\u0002 / HTTP/1.1\r\n\r\n`,
    ]
    for (const raw of cases)
      expectRaw(await rawRequest(port, Buffer.from(raw, "latin1")), 400, "invalid_request")
  })
})

describe("afterwards", () => {
  it("the server is alive and nothing changed: balance, holds, spend, usage records, limiter counters", async () => {
    expect(server.process.exitCode).toBeNull()
    expect((await fetch(`${server.baseUrl}/healthz`)).status).toBe(200)
    expect(await snapshot()).toEqual(before)
    expect(server.output()).not.toMatch(/internal error/)
  })
})
