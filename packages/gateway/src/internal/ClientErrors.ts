/**
 * Requests node:http would answer (or drop) before the listener sees them —
 * a malformed request line or header, conflicting lengths, headers over the
 * size limit, headers not complete within the headers timeout, an `Expect`
 * it cannot meet, `CONNECT` — get an `x-request-id` like every other answer
 * (spec §1), and the error envelope where a §7 code applies, not Node's bare
 * status line or a dropped connection.
 */
import { type IncomingMessage, type ServerResponse, STATUS_CODES } from "node:http"
import type { Duplex } from "node:stream"
import { type ApiError, InvalidRequest, RequestTimeout, renderError } from "@swarmgate/protocol"
import { newRequestId } from "../RequestId"

const errorFor = (code: string | undefined): ApiError => {
  switch (code) {
    case "ERR_HTTP_REQUEST_TIMEOUT":
      return new RequestTimeout({ message: "The request did not arrive in time." })
    case "HPE_HEADER_OVERFLOW":
      return new InvalidRequest({ message: "The request headers are too large.", param: null })
    default:
      return new InvalidRequest({ message: "The request is not valid HTTP/1.1.", param: null })
  }
}

/** The `clientError` listener of the server: answers when nothing was sent on the connection yet, then closes it. */
export const onClientError = (error: Error & { readonly code?: string }, socket: Duplex) => {
  // Like Node's default: never write into the middle of a response already on its way.
  const inFlight = (socket as { _httpMessage?: { headersSent?: boolean } | null })._httpMessage
  if (error.code !== "ECONNRESET" && socket.writable && !inFlight?.headersSent) {
    const requestId = newRequestId()
    const rendered = renderError(errorFor(error.code), requestId)
    const headers = rendered.headers
    headers.connection = "close"
    const head = Object.entries(headers)
      .map(([name, value]) => `${name}: ${value}\r\n`)
      .join("")
    socket.end(`HTTP/1.1 ${rendered.status} ${STATUS_CODES[rendered.status]}\r\n${head}\r\n${rendered.body}`)
    // A peer that never reads must not keep the socket: gone within a second either way.
    setTimeout(() => socket.destroy(), 1_000).unref()
    return
  }
  socket.destroy()
}

/** The `checkExpectation` listener: an `Expect` other than `100-continue` is 417, empty, with its request id. */
export const onUnmetExpectation = (_req: IncomingMessage, res: ServerResponse) => {
  res.writeHead(417, { "x-request-id": newRequestId(), "content-length": "0", connection: "close" })
  res.end()
}

/** The `connect` listener: `CONNECT` is a method no path here accepts (405 with `Allow`), never a dropped connection. */
export const onConnect = (_req: IncomingMessage, socket: Duplex) => {
  socket.on("error", () => socket.destroy())
  socket.end(
    `HTTP/1.1 405 ${STATUS_CODES[405]}\r\nallow: GET, HEAD, POST\r\nx-request-id: ${newRequestId()}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n`,
  )
  setTimeout(() => socket.destroy(), 1_000).unref()
}
