/**
 * Server-Sent Events encoding for the streaming chat-completion path.
 *
 * Every function returns a complete frame (terminated by a blank line), so a
 * frame can be written to the socket as soon as it is produced.
 *
 * @since 0.1.0
 */

/** The terminal frame of an OpenAI-compatible stream. */
export const DONE = "data: [DONE]\n\n"

/** A comment frame: clients ignore it, proxies see traffic and keep the connection open. */
export const keepAlive = ": keep-alive\n\n"

/** Response headers for an event stream. */
export const SSE_HEADERS: Readonly<Record<string, string>> = Object.freeze({
  "content-type": "text/event-stream; charset=utf-8",
  "cache-control": "no-cache",
  connection: "keep-alive",
  // nginx buffers proxied responses by default, which would hold tokens back
  "x-accel-buffering": "no",
})

/**
 * `SSE_HEADERS` and one more header (a request id), as one new object: a
 * literal, ~20 ns, where `{ ...SSE_HEADERS, [name]: value }` took ~75 (a
 * spread of an object that is not frozen, then a new property, takes V8's
 * slow path: docs/ARCHITECTURE.md, "Object spread").
 */
export const sseHeadersWith = (name: string, value: string): Record<string, string> => ({
  "content-type": "text/event-stream; charset=utf-8",
  "cache-control": "no-cache",
  connection: "keep-alive",
  "x-accel-buffering": "no",
  [name]: value,
})

const lineBreak = /\r\n|\r|\n/

/**
 * One `data:` frame. `JSON.stringify` output never contains a raw line break,
 * so the common case is a single concatenation; a payload that does contain
 * line breaks is split over several `data:` lines, which a decoder joins back
 * with `\n` (a CR or CRLF comes back as LF).
 */
export const encodeData = (json: string): string => {
  if (json.indexOf("\n") === -1 && json.indexOf("\r") === -1) {
    return `data: ${json}\n\n`
  }
  return `data: ${json.split(lineBreak).join("\ndata: ")}\n\n`
}

/** `encodeData(JSON.stringify(obj))`. */
export const encodeEvent = (obj: unknown): string => encodeData(JSON.stringify(obj))

/**
 * A comment frame. A line break would end the comment and turn the rest into
 * a field, so line breaks become spaces.
 */
export const encodeComment = (text: string): string => `: ${text.replace(/\r\n|\r|\n/g, " ")}\n\n`
