/**
 * What a node's SSE body says, a socket read at a time: its text as deltas,
 * its finish reason, whether `[DONE]` came, or why it cannot be read on.
 *
 * Most of a stream is chunks that the node repeats but for their text, each
 * one `data:` line and a blank line. Those are read where they lie in the
 * read's text, by the chunk parser's template (`ChunkParser.parseAt`): no
 * line, event or data string is made for them, which was most of what a
 * streamed token cost to read. Anything else — the first chunks, before a
 * template exists; other fields or line endings; a template learned from
 * data over several lines; a control character in the text; an event split
 * across reads — goes through the SSE decoder an event at a time, exactly as
 * the whole read would (a property test holds the two ways to the same result
 * under any split of any stream).
 */
import { SseDecoder } from "@swarmgate/sse"
import { type ChunkFields, ChunkParser } from "./ChunkParser"
import type { ChunkShapes } from "./ChunkShapes"
import type { NodeEvent } from "./NodeTransport"

/** An SSE line or event longer than this ends the stream as `bad_event`: we never buffer an endless line. */
export const MAX_EVENT_CHARS = 1024 * 1024
/** How much of a node's error message is kept (an error event's here, an HTTP error body's in HttpTransport). */
export const MAX_ERROR_BODY = 2_000

export const finishOf = (reason: string): "stop" | "length" => (reason === "length" ? "length" : "stop")

const CHAR_D = 100
const LF = 10

export class SseBody {
  private readonly decoder: SseDecoder.SseDecoder
  private readonly chunks: ChunkParser
  /** The decoder's events of one step of a read's walk, handed on at once. */
  private readonly dispatched: Array<SseDecoder.SseEvent> = []
  /** `[DONE]` came: what follows is read (to free the connection) and ignored. */
  done = false
  /** The last finish reason the node sent. */
  finish: "stop" | "length" | undefined = undefined
  /** Why the body cannot be read on (`bad_event: …`, `node_error: …`); nothing is read after it. */
  failure: string | undefined = undefined

  /** `shapes`: the node's chunk shapes, shared by its streams (ChunkShapes.ts). */
  constructor(
    private readonly maxEventChars: number = MAX_EVENT_CHARS,
    shapes?: ChunkShapes,
  ) {
    this.decoder = new SseDecoder.SseDecoder(maxEventChars)
    this.chunks = new ChunkParser(shapes)
  }

  /** A socket read: the deltas it completes are appended to `into`. */
  read(bytes: Uint8Array, into: Array<NodeEvent>): void {
    if (this.failure !== undefined) return
    const decoder = this.decoder
    const text = decoder.decode(bytes)
    const events = this.dispatched
    let at = 0
    // Ends with the decoder's step that reaches the end of the text (which ends its walk).
    for (;;) {
      if (at < text.length && !this.done && decoder.betweenEvents) {
        const next = this.eventAt(text, at, into)
        if (next > 0) {
          at = next
          continue
        }
      }
      at = decoder.feedEvent(at, events)
      for (let i = 0; i < events.length; i++) this.event(events[i]!.data, into)
      events.length = 0
      if (at >= text.length || this.failure !== undefined || decoder.overflowed) break
    }
    if (decoder.overflowed && this.failure === undefined)
      this.failure = `bad_event: an event longer than ${this.maxEventChars} characters`
  }

  /** The event `data: <chunk>\n\n` at `at`, read in place; the index after it, or -1 when it is not one. */
  private eventAt(text: string, at: number, into: Array<NodeEvent>): number {
    if (text.charCodeAt(at) !== CHAR_D || !text.startsWith("data: ", at)) return -1
    if (text.startsWith("[DONE]\n\n", at + 6)) {
      this.done = true
      return at + 14
    }
    const end = this.chunks.parseAt(text, at + 6)
    // A longer event overflows the decoder (bad_event): that is the decoder's to say.
    if (
      end < 0 ||
      end - at > this.maxEventChars ||
      text.charCodeAt(end) !== LF ||
      text.charCodeAt(end + 1) !== LF
    )
      return -1
    this.fields(this.chunks.fields, into)
    return end + 2
  }

  private event(data: string, into: Array<NodeEvent>): void {
    if (this.done || this.failure !== undefined) return
    if (data === "[DONE]") {
      this.done = true
      return
    }
    const chunk = this.chunks.parse(data)
    if (chunk === undefined) {
      this.failure = `bad_event: ${data.slice(0, 200)}`
      return
    }
    this.fields(chunk, into)
  }

  private fields(chunk: ChunkFields, into: Array<NodeEvent>): void {
    if (chunk.error !== undefined) {
      this.failure = `node_error: ${chunk.error.slice(0, MAX_ERROR_BODY)}`
      return
    }
    if (chunk.content !== undefined && chunk.content.length > 0)
      into.push({ _tag: "Delta", text: chunk.content })
    if (chunk.finishReason !== undefined) this.finish = finishOf(chunk.finishReason)
  }
}
