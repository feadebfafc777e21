/**
 * Incremental Server-Sent Events decoder following the WHATWG "event stream
 * interpretation" rules, for reading upstream node streams.
 *
 * It never throws: malformed input is either ignored (unknown fields, a
 * non-numeric `retry`) or decoded with U+FFFD replacement (invalid UTF-8).
 *
 * @since 0.1.0
 */
import { isAscii } from "node:buffer"
import { StringDecoder } from "node:string_decoder"
import * as Chunk from "effect/Chunk"
import * as Stream from "effect/Stream"

/** A dispatched event. */
export interface SseEvent {
  /** The `event:` field; `undefined` when absent or empty (a browser would report "message"). */
  readonly event: string | undefined
  /** The `data:` lines joined with `\n`. */
  readonly data: string
  /**
   * The last event ID of the stream at dispatch time. Per the spec it carries
   * over to later events until another `id:` field changes it; `undefined`
   * while it is empty (never set, or reset by an empty `id:`).
   */
  readonly id: string | undefined
}

const LF = 10
const CR = 13
const SPACE = 32
const COLON = 58
const BOM = 0xfeff
/** A walk's next CR not looked for yet. */
const UNKNOWN = -2

/** Whether `text[start, end)` is `name`. */
const isField = (text: string, start: number, end: number, name: string): boolean =>
  end - start === name.length && text.startsWith(name, start)

/**
 * Feed it chunks with `push`; each call returns the events completed by that
 * chunk. Lines may end with LF, CRLF or CR and may be split anywhere across
 * chunks, including inside a multi-byte UTF-8 character or between the CR and
 * LF of a CRLF.
 *
 * Byte and string chunks should not be interleaved in the middle of a
 * multi-byte character (the string would be placed before the pending bytes).
 */
export class SseDecoder {
  /**
   * With `maxEventChars`, a line or an event's data longer than that stops
   * the decoder: `overflowed` turns true and nothing more is decoded. An
   * upstream that never ends its line cannot make us buffer without bound.
   */
  constructor(private readonly maxEventChars: number = Number.POSITIVE_INFINITY) {}
  /** Set once a line or an event outgrew `maxEventChars`; the decoder ignores everything after. */
  overflowed = false
  // Node's decoder: the same text as WHATWG's TextDecoder (U+FFFD for each maximal invalid subpart, a
  // leading BOM kept), at a sixth of its cost per chunk in a stream.
  private readonly utf8 = new StringDecoder("utf8")
  /** Text after the last line terminator: the start of a line not yet complete. */
  private partial = ""
  /** The previous chunk ended with CR: an LF at the start of the next one belongs to it. */
  private afterCR = false
  private started = false
  private data = ""
  private hasData = false
  private eventType = ""
  private lastEventId = ""
  private reconnectionTime: number | undefined = undefined
  /** The text being walked by `feedEvent`, and its first CR at or after where the walk is (or -1: none). */
  private walk = ""
  private walkCR = UNKNOWN

  /** The last valid `retry:` value, in milliseconds. */
  get retry(): number | undefined {
    return this.reconnectionTime
  }

  push(chunk: Uint8Array | string): Array<SseEvent> {
    if (this.overflowed) return []
    const text = typeof chunk === "string" ? chunk : this.textOf(chunk)
    const events: Array<SseEvent> = []
    this.feed(text, events)
    return events
  }

  /**
   * Takes a byte chunk to be walked event by event: returns its text, which
   * `feedEvent` then reads from wherever the caller has got to, never going
   * back (a character split across chunks is held until its last byte
   * comes). The text is kept until the walk reaches its end.
   */
  decode(chunk: Uint8Array): string {
    this.walk = this.overflowed ? "" : this.textOf(chunk)
    this.walkCR = UNKNOWN
    return this.walk
  }

  /**
   * Whether the decoder stands between events: the stream started, no line
   * is partly read, no CR waits for the LF that may follow it, and the event
   * being built has no data and no type (after a blank line, or after only
   * `id:`, `retry:` or comment lines since). An event that lies whole in the
   * text as one `data:` line and a blank line would leave the decoder as it
   * finds it here, so a caller may read such an event itself and go on with
   * `feedEvent` after it.
   */
  get betweenEvents(): boolean {
    return (
      this.started &&
      !this.overflowed &&
      !this.afterCR &&
      this.partial.length === 0 &&
      !this.hasData &&
      this.eventType.length === 0
    )
  }

  /**
   * Reads the text of the last `decode` from `start` up to and including
   * the first blank line (the end of an event, dispatched into `events` when
   * it has data) and returns where it stopped: after that line, or the
   * text's length, the rest kept for the next chunk (and the walk over).
   * `start` is where the last step stopped, or past events the caller read
   * itself: never back. Walking a text event by event decodes what `push`
   * would.
   */
  feedEvent(start: number, events: Array<SseEvent>): number {
    const text = this.walk
    const stopped = this.overflowed ? text.length : this.feedFrom(text, start, events, true)
    // At its end the walk lets its text go: a stream that waits long between reads keeps no read.
    if (stopped >= text.length) this.walk = ""
    return stopped
  }

  /**
   * The text of a byte chunk. An ASCII chunk while no character is split
   * (nodes' streams are mostly ASCII) is its bytes as they are, without
   * UTF-8's validation: half the cost, the same text.
   */
  private textOf(chunk: Uint8Array): string {
    const utf8 = this.utf8 as StringDecoder & { readonly lastNeed?: number }
    // `lastNeed`: the bytes a split character still needs (Node's own field; absent, the slow way).
    if (utf8.lastNeed === 0 && isAscii(chunk))
      return (
        Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength)
      ).toString("latin1")
    return utf8.write(chunk)
  }

  /**
   * Ends the stream. Per the spec an event not yet terminated by a blank line
   * is discarded, not dispatched, so a truncated upstream response cannot pass
   * off half an event as a whole one; the result is therefore always empty.
   * The decoder is reset and may be reused for a new stream.
   */
  end(): Array<SseEvent> {
    const events: Array<SseEvent> = []
    this.feed(this.utf8.end(), events)
    this.partial = ""
    this.afterCR = false
    this.started = false
    this.data = ""
    this.hasData = false
    this.eventType = ""
    this.lastEventId = ""
    this.reconnectionTime = undefined
    this.overflowed = false
    this.walk = ""
    this.walkCR = UNKNOWN
    return events
  }

  private feed(text: string, events: Array<SseEvent>): void {
    this.feedFrom(text, 0, events, false)
  }

  /** The lines of `text` from `start`; with `once`, up to the first blank line only. Returns where it stopped. */
  private feedFrom(text: string, start: number, events: Array<SseEvent>, once: boolean): number {
    const length = text.length
    if (start >= length) return length
    if (!this.started) {
      this.started = true
      if (text.charCodeAt(start) === BOM) start++
    }
    if (this.afterCR) {
      this.afterCR = false
      if (start < length && text.charCodeAt(start) === LF) start++
    }
    // Line ends found by indexOf (native, fast on long runs) rather than a look at every character. A
    // walk keeps its next CR: a text without one would be searched to its end again for every event.
    let nextLF = text.indexOf("\n", start)
    let nextCR =
      once && this.walkCR !== UNKNOWN && (this.walkCR === -1 || this.walkCR >= start)
        ? this.walkCR
        : text.indexOf("\r", start)
    while (!this.overflowed) {
      if (nextLF !== -1 && nextLF < start) nextLF = text.indexOf("\n", start)
      if (nextCR !== -1 && nextCR < start) nextCR = text.indexOf("\r", start)
      let i = nextLF === -1 ? nextCR : nextCR === -1 ? nextLF : Math.min(nextLF, nextCR)
      if (i === -1) break
      const c = text.charCodeAt(i)
      let blank: boolean
      if (this.partial.length > 0) {
        const line = this.partial + text.slice(start, i)
        this.partial = ""
        if (line.length > this.maxEventChars) {
          this.overflow()
          return length
        }
        blank = line.length === 0
        this.line(line, 0, line.length, events)
      } else {
        if (i - start > this.maxEventChars) {
          this.overflow()
          return length
        }
        blank = i === start
        // The line read where it lies: only its value is sliced (one string per line, not three).
        this.line(text, start, i, events)
      }
      if (c === CR) {
        if (i + 1 < length) {
          if (text.charCodeAt(i + 1) === LF) i++
        } else {
          this.afterCR = true
        }
      }
      start = i + 1
      if (once && blank) {
        this.walkCR = nextCR
        return start
      }
    }
    if (start < length && !this.overflowed) {
      this.partial = this.partial.length > 0 ? this.partial + text.slice(start) : text.slice(start)
      if (this.partial.length > this.maxEventChars) this.overflow()
    }
    return length
  }

  private overflow(): void {
    this.overflowed = true
    this.partial = ""
    this.data = ""
    this.hasData = false
  }

  /** The line `text[start, end)`. */
  private line(text: string, start: number, end: number, events: Array<SseEvent>): void {
    if (end === start) {
      this.dispatch(events)
      return
    }
    // Searched within the line only: `indexOf` would run on past it, to the end of the text, for every
    // line without a colon (quadratic in a chunk of such lines).
    let colon = -1
    for (let i = start; i < end; i++)
      if (text.charCodeAt(i) === COLON) {
        colon = i
        break
      }
    if (colon === start) return
    const fieldEnd = colon === -1 ? end : colon
    const value =
      colon === -1
        ? ""
        : text.slice(text.charCodeAt(colon + 1) === SPACE && colon + 1 < end ? colon + 2 : colon + 1, end)
    // The field compared where it lies: no string made for it.
    if (isField(text, start, fieldEnd, "data")) {
      if (this.hasData) {
        this.data = `${this.data}\n${value}`
        if (this.data.length > this.maxEventChars) this.overflow()
      } else {
        this.data = value
        this.hasData = true
      }
    } else if (isField(text, start, fieldEnd, "event")) this.eventType = value
    else if (isField(text, start, fieldEnd, "id")) {
      if (value.indexOf("\u0000") === -1) this.lastEventId = value
    } else if (isField(text, start, fieldEnd, "retry")) {
      if (/^[0-9]+$/.test(value)) this.reconnectionTime = Number(value)
    }
  }

  private dispatch(events: Array<SseEvent>): void {
    if (this.hasData) {
      events.push({
        event: this.eventType.length > 0 ? this.eventType : undefined,
        data: this.data,
        id: this.lastEventId.length > 0 ? this.lastEventId : undefined,
      })
    }
    this.data = ""
    this.hasData = false
    this.eventType = ""
  }
}

/**
 * Decodes a byte stream into events. Each run of the resulting stream gets its
 * own decoder, so the stream can be run more than once.
 */
export const decodeSse = <E, R>(bytes: Stream.Stream<Uint8Array, E, R>): Stream.Stream<SseEvent, E, R> =>
  Stream.suspend(() => {
    const decoder = new SseDecoder()
    return bytes.pipe(
      Stream.mapChunks((chunk) => {
        const out: Array<SseEvent> = []
        for (const bytes of chunk) {
          const events = decoder.push(bytes)
          for (let i = 0; i < events.length; i++) out.push(events[i]!)
        }
        return Chunk.unsafeFromArray(out)
      }),
      Stream.concat(Stream.suspend(() => Stream.fromIterable(decoder.end()))),
    )
  })
