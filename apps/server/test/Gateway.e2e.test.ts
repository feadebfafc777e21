/**
 * The whole request path through the real server process, driven by the
 * official `openai` client and raw HTTP, as a user sees it.
 */
import { connect } from "node:net"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { countTokens } from "gpt-tokenizer"
import OpenAI from "openai"
import { createKey, type RunningServer, startServer } from "./support/ServerProcess"

let server: RunningServer
let key: string
let client: OpenAI

beforeAll(async () => {
  server = await startServer({ SWARMGATE_BODY_TIMEOUT_MS: "800", SWARMGATE_MAX_BODY_BYTES: "200000" })
  key = (await createKey(server)).key
  client = new OpenAI({ apiKey: key, baseURL: `${server.baseUrl}/v1`, maxRetries: 0 })
}, 60_000)

afterAll(async () => {
  await server?.stop()
})

const post = (body: unknown, headers: Record<string, string> = {}) =>
  fetch(`${server.baseUrl}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json", ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
  })

const hello = {
  model: "swarm-prime",
  messages: [{ role: "user", content: "Explain how rivers shape valleys." }],
}

/** The exact envelope of spec §7.1, with `request_id` equal to the header. */
const expectError = async (
  response: Response,
  status: number,
  code: string,
  options: { type?: string; param?: string | null } = {},
) => {
  expect(response.status).toBe(status)
  const requestId = response.headers.get("x-request-id")
  expect(requestId).toMatch(/^req_[0-9a-f]{32}$/)
  const body = (await response.json()) as { error: Record<string, unknown>; request_id: string }
  expect(body.request_id).toBe(requestId)
  expect(Object.keys(body.error).sort()).toEqual(["code", "message", "param", "type"])
  expect(body.error.code).toBe(code)
  expect(typeof body.error.message).toBe("string")
  if (options.type !== undefined) expect(body.error.type).toBe(options.type)
  if (options.param !== undefined) expect(body.error.param).toBe(options.param)
  expect(response.headers.get("retry-after")).toBeNull()
  return body
}

const promptTokens = (messages: ReadonlyArray<{ content: string }>) =>
  3 + messages.reduce((sum, m) => sum + 3 + countTokens(m.content), 0)

describe("models", () => {
  it("lists the presets with the official client", async () => {
    const models = await client.models.list()
    const ids = models.data.map((m) => m.id)
    expect(ids).toContain("swarm-prime")
    expect(ids.length).toBeGreaterThanOrEqual(2)
    for (const model of models.data) {
      expect(model.object).toBe("model")
      expect(model.owned_by).toBe("swarm")
      expect(Number.isInteger(model.created)).toBe(true)
    }
  })

  it("refuses a missing key with 401 and the envelope", async () => {
    await expectError(await fetch(`${server.baseUrl}/v1/models`), 401, "invalid_api_key", {
      type: "invalid_request_error",
      param: null,
    })
  })
})

describe("chat completions", () => {
  it("answers with usage counted by the gateway", async () => {
    const completion = await client.chat.completions.create({
      ...hello,
      messages: [...hello.messages] as never,
    })
    const content = completion.choices[0]?.message.content ?? ""
    expect(completion.object).toBe("chat.completion")
    expect(completion.choices[0]?.message.role).toBe("assistant")
    expect(content.length).toBeGreaterThan(20)
    expect(["stop", "length"]).toContain(completion.choices[0]?.finish_reason)
    expect(completion.usage?.prompt_tokens).toBe(promptTokens(hello.messages))
    expect(completion.usage?.completion_tokens).toBe(countTokens(content))
    expect(completion.usage?.total_tokens).toBe(
      (completion.usage?.prompt_tokens ?? 0) + (completion.usage?.completion_tokens ?? 0),
    )
  })

  it("streams the standard chunk sequence with usage, then [DONE]", async () => {
    const response = await post({ ...hello, stream: true, stream_options: { include_usage: true } })
    expect(response.status).toBe(200)
    expect(response.headers.get("content-type")).toMatch(/^text\/event-stream/)
    expect(response.headers.get("x-request-id")).toMatch(/^req_/)
    const raw = await response.text()
    expect(raw.endsWith("data: [DONE]\n\n")).toBe(true)
    const events = raw
      .split("\n\n")
      .filter((e) => e.startsWith("data: ") && e !== "data: [DONE]")
      .map((e) => JSON.parse(e.slice(6)))
    expect(events[0].choices[0].delta).toEqual({ role: "assistant", content: "" })
    const usageChunk = events.at(-1)
    const finishChunk = events.at(-2)
    expect(usageChunk.choices).toEqual([])
    expect(["stop", "length"]).toContain(finishChunk.choices[0].finish_reason)
    const text = events
      .slice(1, -2)
      .map((e: { choices: Array<{ delta: { content: string } }> }) => e.choices[0]?.delta.content)
      .join("")
    expect(text.length).toBeGreaterThan(0)
    expect(usageChunk.usage.completion_tokens).toBe(countTokens(text))
    expect(usageChunk.usage.prompt_tokens).toBe(promptTokens(hello.messages))
    for (const event of events) {
      expect(event.object).toBe("chat.completion.chunk")
      expect(event.id).toBe(events[0].id)
    }
  })

  it("streams through the official client", async () => {
    const stream = await client.chat.completions.create({
      model: "swarm-swift",
      messages: [{ role: "user", content: "Say something about tea." }],
      stream: true,
      stream_options: { include_usage: true },
    })
    let text = ""
    let usage: OpenAI.CompletionUsage | null | undefined
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? ""
      if (chunk.usage) usage = chunk.usage
    }
    expect(text.length).toBeGreaterThan(0)
    expect(usage?.completion_tokens).toBe(countTokens(text))
  })

  it("caps the completion; the smaller of the two caps wins", async () => {
    const capped = await client.chat.completions.create({ ...hello, max_tokens: 7 } as never)
    expect(capped.choices[0]?.finish_reason).toBe("length")
    expect(capped.usage?.completion_tokens).toBe(7)
    const both = await client.chat.completions.create({
      ...hello,
      max_tokens: 9,
      max_completion_tokens: 4,
    } as never)
    expect(both.choices[0]?.finish_reason).toBe("length")
    expect(both.usage?.completion_tokens).toBe(4)
  })

  it("caps a stream too", async () => {
    const response = await post({ ...hello, stream: true, max_completion_tokens: 5 })
    const raw = await response.text()
    expect(raw).toContain('"finish_reason":"length"')
    const text = raw
      .split("\n\n")
      .filter((e) => e.startsWith("data: {"))
      .map((e) => JSON.parse(e.slice(6)).choices[0]?.delta?.content ?? "")
      .join("")
    expect(countTokens(text)).toBe(5)
  })

  it("yields valid JSON in JSON mode", async () => {
    for (const model of ["swarm-prime", "swarm-swift"]) {
      const completion = await client.chat.completions.create({
        model,
        messages: [{ role: "user", content: "Describe the weather in JSON." }],
        response_format: { type: "json_object" },
        max_tokens: 200,
      })
      expect(completion.choices[0]?.finish_reason).toBe("stop")
      expect(() => JSON.parse(completion.choices[0]?.message.content ?? "")).not.toThrow()
    }
  })
})

describe("refusals before the key", () => {
  it("404 with an empty body for other /v1 paths, without a key", async () => {
    for (const path of ["/v1/embeddings", "/v1/models/swarm-prime", "/v1", "/v1/chat"]) {
      const response = await fetch(`${server.baseUrl}${path}`, { method: "POST" })
      expect(response.status).toBe(404)
      expect(response.headers.get("x-request-id")).toMatch(/^req_/)
      expect(await response.text()).toBe("")
    }
  })

  it("405 with an empty body for a wrong method, without a key", async () => {
    for (const [method, path] of [
      ["GET", "/v1/chat/completions"],
      ["DELETE", "/v1/models"],
      ["POST", "/v1/models"],
    ] as const) {
      const response = await fetch(`${server.baseUrl}${path}`, { method })
      expect(response.status).toBe(405)
      expect(response.headers.get("x-request-id")).toMatch(/^req_/)
      expect(await response.text()).toBe("")
    }
  })
})

describe("keys and accounts", () => {
  it("401 for missing, malformed and unknown keys on both endpoints", async () => {
    const malformed = `${key.slice(0, -1)}${key.endsWith("a") ? "b" : "a"}`
    const unknown = (await createKey(server)).key.replace(/^(sk-swarm-)/, "$1")
    for (const authorization of [undefined, "Basic abc", `Bearer ${malformed}`, "Bearer sk-other-123"]) {
      const headers: Record<string, string> = authorization ? { authorization } : {}
      await expectError(await fetch(`${server.baseUrl}/v1/models`, { headers }), 401, "invalid_api_key")
      await expectError(
        await fetch(`${server.baseUrl}/v1/chat/completions`, {
          method: "POST",
          headers: { ...headers, "content-type": "application/json" },
          body: JSON.stringify(hello),
        }),
        401,
        "invalid_api_key",
      )
    }
    expect(unknown.length).toBe(key.length)
  })

  it("every 401 carries WWW-Authenticate: Bearer, with error=invalid_token when a key was sent (RFC 6750)", async () => {
    const malformed = `${key.slice(0, -1)}${key.endsWith("a") ? "b" : "a"}`
    const cases: ReadonlyArray<readonly [string | undefined, string]> = [
      [undefined, 'Bearer realm="swarmgate"'],
      ["Basic abc", 'Bearer realm="swarmgate"'],
      [`Bearer ${malformed}`, 'Bearer realm="swarmgate", error="invalid_token"'],
      ["Bearer sk-other-123", 'Bearer realm="swarmgate", error="invalid_token"'],
    ]
    for (const [authorization, expected] of cases) {
      const headers: Record<string, string> = authorization ? { authorization } : {}
      const models = await fetch(`${server.baseUrl}/v1/models`, { headers })
      expect(models.status).toBe(401)
      expect(models.headers.get("www-authenticate")).toBe(expected)
      const chat = await fetch(`${server.baseUrl}/v1/chat/completions`, {
        method: "POST",
        headers: { ...headers, "content-type": "application/json" },
        body: JSON.stringify(hello),
      })
      expect(chat.status).toBe(401)
      expect(chat.headers.get("www-authenticate")).toBe(expected)
    }
    const ok = await fetch(`${server.baseUrl}/v1/models`, { headers: { authorization: `Bearer ${key}` } })
    expect(ok.status).toBe(200)
    expect(ok.headers.get("www-authenticate")).toBeNull()
  })

  it("revoked and disabled keys stop working on the next request", async () => {
    const issued = await createKey(server)
    const ok = await fetch(`${server.baseUrl}/v1/models`, {
      headers: { authorization: `Bearer ${issued.key}` },
    })
    expect(ok.status).toBe(200)
    expect((await server.admin("PATCH", `/keys/${issued.keyId}`, { disabled: true })).status).toBe(200)
    await expectError(
      await fetch(`${server.baseUrl}/v1/models`, { headers: { authorization: `Bearer ${issued.key}` } }),
      401,
      "invalid_api_key",
    )
    expect((await server.admin("PATCH", `/keys/${issued.keyId}`, { disabled: false })).status).toBe(200)
    expect(
      (await fetch(`${server.baseUrl}/v1/models`, { headers: { authorization: `Bearer ${issued.key}` } }))
        .status,
    ).toBe(200)
    expect((await server.admin("POST", `/keys/${issued.keyId}/revoke`)).status).toBe(200)
    await expectError(await post(hello, { authorization: `Bearer ${issued.key}` }), 401, "invalid_api_key")
    // Revocation is final.
    await server.admin("PATCH", `/keys/${issued.keyId}`, { disabled: false })
    await expectError(
      await fetch(`${server.baseUrl}/v1/models`, { headers: { authorization: `Bearer ${issued.key}` } }),
      401,
      "invalid_api_key",
    )
  })

  it("expired keys are refused", async () => {
    // At least a second ahead (whole seconds), so that a busy machine still checks it unexpired first.
    const expiresAt = Math.floor(Date.now() / 1000) + 2
    const issued = await createKey(server, {}, { expires_at: expiresAt })
    expect(
      (await fetch(`${server.baseUrl}/v1/models`, { headers: { authorization: `Bearer ${issued.key}` } }))
        .status,
    ).toBe(200)
    await new Promise((r) => setTimeout(r, Math.max(0, expiresAt * 1000 + 100 - Date.now())))
    await expectError(
      await fetch(`${server.baseUrl}/v1/models`, { headers: { authorization: `Bearer ${issued.key}` } }),
      401,
      "invalid_api_key",
    )
  })

  it("403 for suspended and restricted accounts on both endpoints", async () => {
    for (const [status, code] of [
      ["suspended", "account_suspended"],
      ["restricted", "account_restricted"],
    ] as const) {
      const issued = await createKey(server)
      expect((await server.admin("PATCH", `/accounts/${issued.accountId}`, { status })).status).toBe(200)
      const headers = { authorization: `Bearer ${issued.key}` }
      await expectError(await fetch(`${server.baseUrl}/v1/models`, { headers }), 403, code, {
        type: "permission_error",
      })
      await expectError(await post(hello, headers), 403, code, { type: "permission_error" })
      await server.admin("PATCH", `/accounts/${issued.accountId}`, { status: "active" })
      expect((await fetch(`${server.baseUrl}/v1/models`, { headers })).status).toBe(200)
    }
  })
})

describe("request body", () => {
  it("415 when Content-Type is not application/json", async () => {
    await expectError(
      await post(JSON.stringify(hello), { "content-type": "text/plain" }),
      415,
      "unsupported_content_type",
    )
  })

  it("accepts application/json with a charset", async () => {
    expect((await post(hello, { "content-type": "application/json; charset=utf-8" })).status).toBe(200)
  })

  it("413 from Content-Length, before reading", async () => {
    const big = JSON.stringify({ ...hello, padding: "x".repeat(300_000) })
    await expectError(await post(big), 413, "request_too_large", { param: null })
  })

  it("413 while reading a chunked body, as a response (not a dropped connection)", async () => {
    const chunks = new ReadableStream({
      start(controller) {
        for (let i = 0; i < 50; i++) controller.enqueue(new TextEncoder().encode("x".repeat(10_000)))
        controller.close()
      },
    })
    const response = await fetch(`${server.baseUrl}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: chunks,
      duplex: "half",
    } as RequestInit)
    await expectError(response, 413, "request_too_large")
  })

  it("408 when the body does not arrive in time", async () => {
    const raw = await new Promise<string>((resolve, reject) => {
      const socket = connect(Number(new URL(server.baseUrl).port), "127.0.0.1")
      let data = ""
      socket.on("data", (chunk) => {
        data += chunk.toString()
      })
      socket.on("end", () => resolve(data))
      socket.on("error", reject)
      socket.write(
        `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"model":`,
      )
      setTimeout(() => socket.end(), 5_000)
    })
    expect(raw).toMatch(/^HTTP\/1\.1 408 /)
    const requestId = /x-request-id: (req_\w+)/i.exec(raw)?.[1]
    const body = JSON.parse(raw.slice(raw.indexOf("\r\n\r\n") + 4))
    expect(body.error.code).toBe("request_timeout")
    expect(body.request_id).toBe(requestId)
  })

  it("400 invalid_request when the body is not JSON", async () => {
    await expectError(await post("{not json"), 400, "invalid_request", { param: null })
  })

  it("422 with detail entries for shape errors", async () => {
    const response = await post({ model: "swarm-prime", messages: [{ role: "robot", content: "hi" }] })
    expect(response.status).toBe(422)
    expect(response.headers.get("x-request-id")).toMatch(/^req_/)
    const body = (await response.json()) as {
      detail: Array<{ loc: Array<string | number>; msg: string; type: string }>
    }
    expect(body.detail).toHaveLength(1)
    expect(body.detail[0]?.loc).toEqual(["body", "messages", 0, "role"])
    expect(typeof body.detail[0]?.msg).toBe("string")
    expect(typeof body.detail[0]?.type).toBe("string")
  })

  it("400 zdr_storage_not_supported for store: true", async () => {
    await expectError(await post({ ...hello, store: true }), 400, "zdr_storage_not_supported", {
      param: "store",
    })
    expect((await post({ ...hello, store: false })).status).toBe(200)
  })

  it("400 unsupported_content_type for audio and file parts", async () => {
    for (const part of [
      { type: "input_audio", input_audio: { data: "AAAA", format: "wav" } },
      { type: "file", file: { file_id: "file-1" } },
    ]) {
      await expectError(
        await post({
          model: "swarm-prime",
          messages: [{ role: "user", content: [{ type: "text", text: "listen" }, part] }],
        }),
        400,
        "unsupported_content_type",
        { param: "messages[0].content[1]" },
      )
    }
  })

  it("404 model_not_found for an unknown model", async () => {
    await expectError(await post({ ...hello, model: "swarm-nonexistent" }), 404, "model_not_found", {
      param: "model",
    })
  })

  it("400 invalid_request with param for parameters the service cannot honour", async () => {
    for (const [field, value] of [
      ["n", 2],
      ["tools", [{ type: "function", function: { name: "f", parameters: {} } }]],
      ["logprobs", true],
    ] as const) {
      await expectError(await post({ ...hello, [field]: value }), 400, "invalid_request", { param: field })
    }
  })

  it("accepts unknown additional properties", async () => {
    expect((await post({ ...hello, metadata: { a: 1 }, some_vendor_field: true })).status).toBe(200)
  })
})

describe("cancellation", () => {
  it("a client that disconnects cancels the node stream and frees the node", async () => {
    const slow = await startServer({ SWARMGATE_SIM_SPEED: "1" })
    try {
      const issued = await createKey(slow)
      const inFlight = async () => {
        const nodes = await slow.admin<{ data: Array<{ in_flight: number }> }>("GET", "/nodes")
        return nodes.body.data.reduce((sum, n) => sum + n.in_flight, 0)
      }
      const controller = new AbortController()
      const response = await fetch(`${slow.baseUrl}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${issued.key}`, "content-type": "application/json" },
        body: JSON.stringify({ ...hello, stream: true, max_tokens: 2000 }),
        signal: controller.signal,
      })
      const reader = response.body!.getReader()
      await reader.read()
      expect(await inFlight()).toBe(1)
      controller.abort()
      const deadline = Date.now() + 2_000
      while ((await inFlight()) !== 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20))
      expect(await inFlight()).toBe(0)
    } finally {
      await slow.stop()
    }
  }, 30_000)
})
