/**
 * Writing a stream to a slow reader: wait for `drain` when the socket buffer
 * is full, so the reader's pace reaches whoever produces the data instead of
 * piling up in memory.
 *
 * @since 0.1.0
 */
import type { ServerResponse } from "node:http"
import type { Socket } from "node:net"
import { Effect } from "effect"

/** What `node:http` keeps that says whether a response's head is out on a socket that is its own. */
interface Sent {
  readonly _headerSent?: boolean
  readonly _hasBody?: boolean
  readonly outputData?: ReadonlyArray<unknown>
}
interface Owned {
  readonly _httpMessage?: unknown
}

/**
 * Writes `data` as one chunk of the response's chunked body, straight to its
 * socket: one `write` of the framed text instead of `res.write`'s four pieces
 * (size, CRLF, data, CRLF), the cork around them and the tick that uncorks —
 * a streamed token's write costs ~35 % less measured alone (BENCHMARKS.md,
 * 2026-11-28). Only where `node:http` has already sent the head on this
 * socket with chunked framing, the response has a body, is not ended nor
 * corked, and node:http holds nothing back; otherwise (the head not out yet,
 * HTTP/1.0, HEAD, a socket not or no longer this response's, after `end`) it
 * is `res.write`, which refuses what it must. Returns whether everything was taken (`false`: wait for
 * `drained`).
 *
 * @since 0.1.0
 */
export const writeChunk = (res: ServerResponse, data: string): boolean => {
  const sent = res as ServerResponse & Sent
  // Nothing to frame; before the head is out, `res.write("")` still sends it, as it always did.
  if (data.length === 0) return sent._headerSent === true ? true : res.write(data)
  const socket = res.socket
  // Each field read as node:http 20 has it; one missing or renamed turns the direct write off, never on.
  if (
    socket === null ||
    res.writableEnded ||
    sent._headerSent !== true ||
    sent._hasBody !== true ||
    !res.chunkedEncoding ||
    // The response's own cork (`res.cork()`); the socket's, from node:http's last write this tick, keeps order.
    res.writableCorked > socket.writableCorked ||
    (socket as Socket & Owned)._httpMessage !== res ||
    !socket.writable ||
    !Array.isArray(sent.outputData) ||
    sent.outputData.length > 0
  )
    return res.write(data)
  return socket.write(`${Buffer.byteLength(data).toString(16)}\r\n${data}\r\n`)
}

/**
 * Calls `done` once the response's socket drained or the response closed
 * (whichever way the last write went: `res.write` or `writeChunk`'s own).
 * Returns the removal of the wait.
 *
 * @since 0.1.0
 */
export const drained = (res: ServerResponse, done: () => void): (() => void) => {
  const socket: Socket | null = res.socket
  let waiting = true
  const off = () => {
    if (!waiting) return
    waiting = false
    res.off("drain", once)
    res.off("close", once)
    socket?.off("drain", once)
  }
  const once = () => {
    off()
    done()
  }
  res.on("drain", once)
  res.on("close", once)
  socket?.on("drain", once)
  return off
}

/** Writes `data`; completes at once, or once the buffer drained (or the response closed). */
export const write = (res: ServerResponse, data: string): Effect.Effect<void> =>
  writeChunk(res, data)
    ? Effect.void
    : Effect.async<void>((resume) => {
        const off = drained(res, () => resume(Effect.void))
        return Effect.sync(off)
      })
