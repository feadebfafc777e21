import { describe, expect, it } from "vitest"
import { Exchange, hasContent, networkCode } from "../src/Exchange"

const chunk = (content: string | null, extra = "") =>
  `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":${
    content === null ? "{}" : JSON.stringify({ content })
  },"finish_reason":null}]${extra}}\n\n`

const feed = (exchange: Exchange, parts: ReadonlyArray<string>, times: ReadonlyArray<number>) => {
  for (const [i, part] of parts.entries()) exchange.data(Buffer.from(part), times[i]!)
}

describe("Exchange (SSE)", () => {
  it("times every content event and ignores role, finish and usage events", () => {
    const tokens: Array<[number, number | undefined]> = []
    const exchange = new Exchange(100, (now, gap) => tokens.push([now, gap]))
    exchange.response(200, "text/event-stream; charset=utf-8")
    feed(
      exchange,
      [
        `data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n${chunk("Hel")}`,
        chunk("lo"),
        `${chunk(null)}data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7}}\n\ndata: [DONE]\n\n`,
      ],
      [110, 115, 130],
    )
    const outcome = exchange.finish(131)
    expect(tokens).toEqual([
      [110, undefined],
      [115, 5],
    ])
    expect(outcome).toMatchObject({
      ok: true,
      status: 200,
      firstTokenMillis: 110,
      endMillis: 131,
      outputTokens: 7,
      contentChunks: 2,
    })
  })

  it("reassembles events split anywhere, with CRLF line ends and comments", () => {
    const text = `: keep-alive\r\n\r\n${chunk("a")}${chunk("b")}data: [DONE]\n\n`.replace(/\n/g, "\r\n")
    const exchange = new Exchange(0, () => {})
    exchange.response(200, "text/event-stream")
    for (let i = 0; i < text.length; i += 7) exchange.data(Buffer.from(text.slice(i, i + 7)), i)
    expect(exchange.finish(1000)).toMatchObject({ ok: true, contentChunks: 2, outputTokens: 2 })
  })

  it("decodes a multi-byte character split across reads", () => {
    const bytes = Buffer.from(`${chunk("é🙂")}data: [DONE]\n\n`)
    const exchange = new Exchange(0, () => {})
    exchange.response(200, "text/event-stream")
    const cut = bytes.indexOf(Buffer.from("🙂")) + 2
    exchange.data(bytes.subarray(0, cut), 1)
    exchange.data(bytes.subarray(cut), 2)
    expect(exchange.finish(3)).toMatchObject({ ok: true, contentChunks: 1 })
  })

  it("reports the code of a final error event, and a stream without [DONE] as truncated", () => {
    const failed = new Exchange(0, () => {})
    failed.response(200, "text/event-stream")
    failed.data(
      Buffer.from(
        `${chunk("x")}data: {"error":{"message":"m","type":"server_error","code":"upstream_error"},"request_id":"r"}\n\n`,
      ),
      1,
    )
    expect(failed.finish(2)).toMatchObject({ ok: false, code: "upstream_error", contentChunks: 1 })

    const cut = new Exchange(0, () => {})
    cut.response(200, "text/event-stream")
    cut.data(Buffer.from(chunk("x")), 1)
    expect(cut.finish(2)).toMatchObject({ ok: false, code: "truncated" })
  })

  it("does not mistake the word error inside content for an error event", () => {
    const exchange = new Exchange(0, () => {})
    exchange.response(200, "text/event-stream")
    exchange.data(Buffer.from(`${chunk('the "error" word')}data: [DONE]\n\n`), 1)
    expect(exchange.finish(2)).toMatchObject({ ok: true, contentChunks: 1 })
  })
})

describe("Exchange (JSON and failures)", () => {
  it("takes the usage of a JSON answer; its first token is its end", () => {
    const exchange = new Exchange(10, () => {})
    exchange.response(200, "application/json")
    const body = JSON.stringify({
      choices: [{ message: { content: "hi" } }],
      usage: { completion_tokens: 12 },
    })
    exchange.data(Buffer.from(body.slice(0, 20)), 11)
    exchange.data(Buffer.from(body.slice(20)), 12)
    expect(exchange.finish(13)).toMatchObject({ ok: true, outputTokens: 12, firstTokenMillis: 13 })
  })

  it("names an HTTP error by its error.code, else by its status", () => {
    const limited = new Exchange(0, () => {})
    limited.response(429, "application/json")
    limited.data(
      Buffer.from('{"error":{"message":"slow down","type":"rate_limit_error","code":"rate_limit_exceeded"}}'),
      1,
    )
    expect(limited.finish(2)).toMatchObject({ ok: false, status: 429, code: "rate_limit_exceeded" })

    const bare = new Exchange(0, () => {})
    bare.response(502, "text/html")
    bare.data(Buffer.from("<html>bad gateway</html>"), 1)
    expect(bare.finish(2)).toMatchObject({ ok: false, status: 502, code: "http_502" })
  })

  it("tells a connection that never answered from a stream that broke", () => {
    const refused = new Exchange(0, () => {})
    expect(refused.fail(Object.assign(new Error("x"), { code: "ECONNREFUSED" }), 1)).toMatchObject({
      ok: false,
      status: 0,
      code: "connection_refused",
    })
    const broken = new Exchange(0, () => {})
    broken.response(200, "text/event-stream")
    broken.data(Buffer.from(chunk("a")), 1)
    expect(broken.fail(new Error("other side closed"), 2)).toMatchObject({
      code: "stream_broken",
      contentChunks: 1,
    })
    expect(broken.fail(new Error("x"), 3, "client_timeout")).toMatchObject({ code: "client_timeout" })
  })
})

describe("hasContent and networkCode", () => {
  it("sees non-empty content only", () => {
    expect(hasContent('{"delta":{"content":"x"}}')).toBe(true)
    expect(hasContent('{"delta":{"content": "x"}}')).toBe(true)
    expect(hasContent('{"delta":{"role":"assistant","content":""}}')).toBe(false)
    expect(hasContent('{"delta":{"content":null}}')).toBe(false)
    expect(hasContent('{"delta":{}}')).toBe(false)
  })

  it("maps both clients' socket errors to the same names", () => {
    expect(networkCode({ code: "UND_ERR_SOCKET" })).toBe("connection_reset")
    expect(networkCode({ code: "ECONNRESET" })).toBe("connection_reset")
    expect(networkCode({ message: "socket hang up" })).toBe("connection_reset")
    expect(networkCode({ cause: { code: "ECONNREFUSED" } })).toBe("connection_refused")
    expect(networkCode({ code: "UND_ERR_HEADERS_TIMEOUT" })).toBe("client_timeout")
    expect(networkCode(new Error("?"))).toBe("connection_error")
  })
})
