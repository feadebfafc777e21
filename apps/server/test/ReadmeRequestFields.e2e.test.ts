/**
 * The README's "Request fields" table, claim by claim, against the running
 * server over raw HTTP: every refusal it names (status, code, `param` or the
 * 422 shape) and every value it says is accepted. If the README and the code
 * drift apart, one of these cases fails; fix whichever is wrong.
 */
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { createKey, type RunningServer, startServer } from "./support/ServerProcess"

let server: RunningServer
let key: string

beforeAll(async () => {
  server = await startServer({ SWARMGATE_SIM_SPEED: "200" })
  key = (await createKey(server, { balance_usd: 10_000 })).key
}, 60_000)

afterAll(async () => {
  await server?.stop()
})

const MESSAGES = [{ role: "user", content: "Say something short." }]

const post = async (body: Record<string, unknown>) => {
  const response = await fetch(`${server.baseUrl}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "swarm-swift", messages: MESSAGES, max_tokens: 8, ...body }),
  })
  const text = await response.text()
  return { status: response.status, body: text.startsWith("{") ? JSON.parse(text) : text, text }
}

/** What the README promises for one body: 200, a 400-family refusal with its code and param, or 422. */
type Claim =
  | { readonly ok: true }
  | { readonly status: number; readonly code: string; readonly param: string | null }
  | { readonly invalid: true }

const ok: Claim = { ok: true }
const invalid: Claim = { invalid: true }
const refused = (param: string | null, code = "invalid_request", status = 400): Claim => ({
  status,
  code,
  param,
})

/** [README row, request body overrides, what the README says happens]. */
const CASES: ReadonlyArray<readonly [string, Record<string, unknown>, Claim]> = [
  ["model: missing", { model: undefined }, invalid],
  ["model: not a string", { model: 7 }, invalid],
  ["model: unknown", { model: "swarm-nope" }, refused("model", "model_not_found", 404)],
  ["messages: wrong shape", { messages: "hi" }, invalid],
  ["messages: a role outside the three", { messages: [{ role: "tool", content: "x" }] }, invalid],
  ["messages: empty list", { messages: [] }, refused("messages")],
  ["messages: content parts", { messages: [{ role: "user", content: [{ type: "text", text: "hi" }] }] }, ok],
  ["max_tokens: 2^53 is clamped", { max_tokens: 2 ** 53 }, ok],
  ["max_tokens: 1e300 is clamped", { max_tokens: 1e300 }, ok],
  ["max_completion_tokens: 2^53 is clamped", { max_tokens: undefined, max_completion_tokens: 2 ** 53 }, ok],
  ["max_tokens: 1.5", { max_tokens: 1.5 }, invalid],
  ["max_tokens: a string", { max_tokens: "10" }, invalid],
  ["max_tokens: 0", { max_tokens: 0 }, refused("max_tokens")],
  ["max_tokens: negative", { max_tokens: -1 }, refused("max_tokens")],
  [
    "max_completion_tokens: 0",
    { max_tokens: undefined, max_completion_tokens: 0 },
    refused("max_completion_tokens"),
  ],
  ["stream: not a boolean", { stream: "yes" }, invalid],
  ["stream_options without stream", { stream_options: { include_usage: true } }, refused("stream_options")],
  ["response_format: text", { response_format: { type: "text" } }, ok],
  ["response_format: json_object", { response_format: { type: "json_object" } }, ok],
  [
    "response_format: json_schema",
    { response_format: { type: "json_schema", json_schema: { name: "x", schema: {} } } },
    refused("response_format"),
  ],
  ["response_format: another type", { response_format: { type: "xml" } }, refused("response_format")],
  ["seed: an integer", { seed: 42 }, ok],
  ["seed: not an integer", { seed: 1.5 }, invalid],
  ["temperature: 0", { temperature: 0 }, ok],
  ["temperature: 2", { temperature: 2 }, ok],
  ["temperature: above 2", { temperature: 2.5 }, refused("temperature")],
  ["temperature: below 0", { temperature: -0.1 }, refused("temperature")],
  ["stop: a string", { stop: "." }, ok],
  ["stop: four strings", { stop: ["a", "b", "c", "d"] }, ok],
  ["stop: five strings", { stop: ["a", "b", "c", "d", "e"] }, refused("stop")],
  ["stop: an empty string", { stop: "" }, refused("stop")],
  ["stop: an empty string in a list", { stop: ["a", ""] }, refused("stop")],
  ["top_p: 1", { top_p: 1 }, ok],
  ["top_p: above 1", { top_p: 1.5 }, refused("top_p")],
  ["presence_penalty: 2", { presence_penalty: 2 }, ok],
  ["presence_penalty: above 2", { presence_penalty: 2.5 }, refused("presence_penalty")],
  ["frequency_penalty: below -2", { frequency_penalty: -2.5 }, refused("frequency_penalty")],
  ["user: 256 characters", { user: "u".repeat(256) }, ok],
  ["user: 257 characters", { user: "u".repeat(257) }, refused("user")],
  ["store: false", { store: false }, ok],
  ["store: true", { store: true }, refused("store", "zdr_storage_not_supported")],
  ["n: 1", { n: 1 }, ok],
  ["n: 2", { n: 2 }, refused("n")],
  ["tools: []", { tools: [] }, ok],
  [
    "tools: a tool",
    { tools: [{ type: "function", function: { name: "f", parameters: {} } }] },
    refused("tools"),
  ],
  ["tool_choice: none", { tool_choice: "none" }, ok],
  ["tool_choice: auto", { tool_choice: "auto" }, refused("tool_choice")],
  ["logprobs: false", { logprobs: false }, ok],
  ["logprobs: true", { logprobs: true }, refused("logprobs")],
  ["logit_bias: {}", { logit_bias: {} }, ok],
  ["logit_bias: a bias", { logit_bias: { "50256": -100 } }, refused("logit_bias")],
  ["modalities: text", { modalities: ["text"] }, ok],
  ["modalities: audio", { modalities: ["text", "audio"] }, refused("modalities")],
  ["top_logprobs: 3", { top_logprobs: 3 }, refused("top_logprobs")],
  ["parallel_tool_calls: true", { parallel_tool_calls: true }, refused("parallel_tool_calls")],
  ["functions: a function", { functions: [{ name: "f", parameters: {} }] }, refused("functions")],
  ["function_call: auto", { function_call: "auto" }, refused("function_call")],
  ["audio: a voice", { audio: { voice: "alloy", format: "mp3" } }, refused("audio")],
  ["prediction: content", { prediction: { type: "content", content: "x" } }, refused("prediction")],
  ["web_search_options: {}", { web_search_options: {} }, refused("web_search_options")],
  ["any other property", { some_future_field: { nested: true } }, ok],
]

describe("README: request fields", () => {
  for (const [name, overrides, claim] of CASES) {
    it(name, async () => {
      const result = await post(overrides)
      if ("ok" in claim) {
        expect(result.status, result.text).toBe(200)
        expect(result.body.object).toBe("chat.completion")
      } else if ("invalid" in claim) {
        expect(result.status, result.text).toBe(422)
        expect(result.body.detail.length).toBeGreaterThan(0)
        expect(result.body.detail[0].loc[0]).toBe("body")
      } else {
        expect(
          { status: result.status, code: result.body.error?.code, param: result.body.error?.param },
          result.text,
        ).toEqual(claim)
      }
    })
  }

  it("max_tokens and max_completion_tokens: the smaller wins, and reaching it gives finish_reason length", async () => {
    for (const [a, b] of [
      [3, 40],
      [40, 3],
    ]) {
      const result = await post({
        messages: [{ role: "user", content: "Tell a long story." }],
        max_tokens: a,
        max_completion_tokens: b,
      })
      expect(result.status, result.text).toBe(200)
      expect(result.body.usage.completion_tokens).toBe(3)
      expect(result.body.choices[0].finish_reason).toBe("length")
    }
  })

  it("no cap means the preset's max_output_tokens", async () => {
    const models = await fetch(`${server.baseUrl}/v1/models`, { headers: { authorization: `Bearer ${key}` } })
    const listed = (await models.json()) as {
      data: Array<{ id: string; capabilities: { max_output_tokens: number } }>
    }
    const cap = listed.data.find((m) => m.id === "swarm-swift")!.capabilities.max_output_tokens
    expect(cap).toBeGreaterThan(0)
    const result = await post({ max_tokens: undefined })
    expect(result.status, result.text).toBe(200)
    expect(result.body.usage.completion_tokens).toBeLessThanOrEqual(cap)
  })

  it("stream_options.include_usage: every chunk carries usage null, a last chunk with empty choices carries the usage", async () => {
    const response = await fetch(`${server.baseUrl}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({
        model: "swarm-swift",
        messages: MESSAGES,
        max_tokens: 8,
        stream: true,
        stream_options: { include_usage: true },
      }),
    })
    expect(response.status).toBe(200)
    const events = (await response.text())
      .split("\n\n")
      .filter((e) => e.startsWith("data: ") && e !== "data: [DONE]")
      .map((e) => JSON.parse(e.slice(6)))
    const last = events.at(-1)
    expect(last.choices).toEqual([])
    expect(last.usage.completion_tokens).toBeGreaterThan(0)
    for (const event of events.slice(0, -1)) expect(event.usage).toBeNull()
  })

  it("response_format json_object: the content is valid JSON unless the cap cuts it", async () => {
    const result = await post({ response_format: { type: "json_object" }, max_tokens: 200 })
    expect(result.status).toBe(200)
    if (result.body.choices[0].finish_reason === "stop")
      expect(() => JSON.parse(result.body.choices[0].message.content)).not.toThrow()
  })
})
