/**
 * HTTP/1.1 over a bare socket, for requests no HTTP client would send
 * (duplicate or broken headers, slow dribbles, endless bodies), and the one
 * check every refusal must pass: the error envelope of spec §7.1 (or the 422
 * body of §2.6) with `request_id` equal to the `x-request-id` header.
 */
import { connect, type Socket } from "node:net"
import { expect } from "vitest"

export interface RawResponse {
  readonly status: number
  readonly headers: Readonly<Record<string, string>>
  readonly body: string
}

/** Parses the first response in `raw` once it is complete (by Content-Length); undefined before that. */
export const parseResponse = (raw: Buffer): RawResponse | undefined => {
  const end = raw.indexOf("\r\n\r\n")
  if (end < 0) return undefined
  const lines = raw.subarray(0, end).toString("latin1").split("\r\n")
  const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(lines[0] ?? "")?.[1])
  const headers: Record<string, string> = {}
  for (const line of lines.slice(1)) {
    const colon = line.indexOf(":")
    if (colon > 0) headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim()
  }
  const length = Number(headers["content-length"] ?? 0)
  if (raw.length < end + 4 + length) return undefined
  return { status, headers, body: raw.subarray(end + 4, end + 4 + length).toString("utf8") }
}

export interface RawExchange {
  readonly socket: Socket
  /** The first complete response, or undefined if the connection closed (or the wait ran out) without one. */
  readonly response: Promise<RawResponse | undefined>
  /** Resolves when the server closed the connection. */
  readonly closed: Promise<void>
}

/** Opens a connection, writes `data` (if any), and collects the first response. */
export const rawExchange = (port: number, data?: string | Buffer, waitMillis = 10_000): RawExchange => {
  const socket = connect(port, "127.0.0.1")
  let received = Buffer.alloc(0)
  const closed = new Promise<void>((resolve) => socket.once("close", () => resolve()))
  const response = new Promise<RawResponse | undefined>((resolve) => {
    const timer = setTimeout(() => resolve(undefined), waitMillis)
    socket.on("data", (chunk: Buffer) => {
      received = Buffer.concat([received, chunk])
      const parsed = parseResponse(received)
      if (parsed !== undefined) {
        clearTimeout(timer)
        resolve(parsed)
      }
    })
    socket.once("close", () => {
      clearTimeout(timer)
      resolve(parseResponse(received))
    })
  })
  socket.on("error", () => {})
  if (data !== undefined) socket.write(data)
  return { socket, response, closed }
}

/** One request over its own connection; the connection is closed once the response is in. */
export const rawRequest = async (port: number, data: string | Buffer, waitMillis = 10_000) => {
  const exchange = rawExchange(port, data, waitMillis)
  const response = await exchange.response
  exchange.socket.destroy()
  return response
}

export const REQUEST_ID = /^req_[0-9a-f]{32}$/

/**
 * A well-formed refusal: a 422 `detail` body, or the §7.1 envelope with the
 * header's request id. Returns the error code (`validation_failed` for 422).
 */
export const expectRefusal = (status: number, headers: Readonly<Record<string, string>>, body: string) => {
  const requestId = headers["x-request-id"]
  expect(requestId, `x-request-id on ${status}`).toMatch(REQUEST_ID)
  expect(headers["content-type"]).toMatch(/^application\/json/)
  const parsed = JSON.parse(body) as Record<string, unknown>
  if (status === 422) {
    expect(Object.keys(parsed)).toEqual(["detail"])
    const detail = parsed.detail as Array<Record<string, unknown>>
    expect(detail.length).toBeGreaterThan(0)
    for (const entry of detail) {
      expect(Object.keys(entry).sort()).toEqual(["loc", "msg", "type"])
      expect(Array.isArray(entry.loc)).toBe(true)
      for (const part of entry.loc as Array<unknown>) expect(["string", "number"]).toContain(typeof part)
      expect(typeof entry.msg).toBe("string")
      expect(typeof entry.type).toBe("string")
    }
    return "validation_failed"
  }
  const error = parsed.error as Record<string, unknown>
  expect(Object.keys(parsed).sort()).toEqual(["error", "request_id"])
  expect(parsed.request_id).toBe(requestId)
  expect(Object.keys(error).sort()).toEqual(["code", "message", "param", "type"])
  expect(typeof error.message).toBe("string")
  expect(typeof error.code).toBe("string")
  expect(error.param === null || typeof error.param === "string").toBe(true)
  return error.code as string
}

/** Status and code of a `fetch` refusal, after the same checks. */
export const refusalOf = async (response: Response) => {
  const body = await response.text()
  const headers = Object.fromEntries(response.headers.entries())
  return { status: response.status, code: expectRefusal(response.status, headers, body), body }
}
