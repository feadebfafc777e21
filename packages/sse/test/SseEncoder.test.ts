import { describe, expect, it } from "@effect/vitest"
import {
  DONE,
  encodeComment,
  encodeData,
  encodeEvent,
  keepAlive,
  SSE_HEADERS,
  sseHeadersWith,
} from "../src/SseEncoder"

const bytes = (s: string) => Array.from(new TextEncoder().encode(s))

describe("SseEncoder", () => {
  it("frames a JSON payload as one data line and a blank line", () => {
    expect(bytes(encodeData('{"a":1}'))).toEqual(bytes('data: {"a":1}\n\n'))
    expect(encodeData('{"a":1}')).toBe('data: {"a":1}\n\n')
  })

  it("encodes an object with JSON.stringify, escaping newlines and keeping unicode", () => {
    expect(encodeEvent({ content: "hé\nllo 👋" })).toBe('data: {"content":"hé\\nllo 👋"}\n\n')
  })

  it("splits a payload containing line breaks over several data lines", () => {
    expect(encodeData("a\nb\r\nc\rd")).toBe("data: a\ndata: b\ndata: c\ndata: d\n\n")
  })

  it("ends an OpenAI stream with the exact [DONE] frame", () => {
    expect(DONE).toBe("data: [DONE]\n\n")
  })

  it("keeps the connection alive with a comment frame", () => {
    expect(keepAlive).toBe(": keep-alive\n\n")
    expect(encodeComment("keep-alive")).toBe(keepAlive)
  })

  it("cannot smuggle a field through a comment", () => {
    expect(encodeComment("x\ndata: evil\r\nid: 1\rz")).toBe(": x data: evil id: 1 z\n\n")
  })

  it("sends headers that stop caching and proxy buffering", () => {
    expect(SSE_HEADERS).toEqual({
      "content-type": "text/event-stream; charset=utf-8",
      "cache-control": "no-cache",
      connection: "keep-alive",
      "x-accel-buffering": "no",
    })
  })

  it("adds one header to the same headers, in a new object each time", () => {
    const first = sseHeadersWith("x-request-id", "req_1")
    expect(first).toEqual({ ...SSE_HEADERS, "x-request-id": "req_1" })
    expect(sseHeadersWith("x-request-id", "req_2")).not.toBe(first)
    expect(first["x-request-id"]).toBe("req_1")
  })
})
