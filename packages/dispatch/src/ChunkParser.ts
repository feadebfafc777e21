/**
 * Reads the fields the gateway needs from a node's `chat.completion.chunk`
 * events: `choices[0].delta.content`, `choices[0].finish_reason` and `error`.
 *
 * Within one stream a node repeats every chunk but its text (the same `id`,
 * `created`, `model`, …), so after one chunk has been parsed in full its
 * bytes around the content string are kept as a template. A later chunk that
 * has the template's exact bytes before and after one string literal is read
 * from that literal alone. This is exact, not a guess: JSON's grammar is
 * context-free, so the same bytes before a string token put the parser in the
 * same state, and the template was checked when it was made by parsing it
 * with each of two probe values in place of the text (each must come back as
 * the content, so the literal is that field and no other; one probe suffices
 * when the chunk's own text is not that probe). Anything else — other
 * bytes, an escape the fast read does not take, a control character — is
 * parsed in full with `JSON.parse`, exactly as without a template.
 *
 * A stream's first chunks are read by the node's shapes (`ChunkShapes`),
 * learned once per node, when one fits: a stream then begins without a full
 * parse, and a text chunk read by a shape is its stream's template at once,
 * with no proof of its own (the shape's was made when it was learned).
 */
import { BACKSLASH, type ChunkFields, closingQuote, fieldsOf, isWhitespace, own, QUOTE } from "./ChunkFields"
import type { ChunkShapes } from "./ChunkShapes"

export type { ChunkFields } from "./ChunkFields"

/**
 * Two probes, because a node's text may itself be one of them: a literal that
 * is not the content leaves the content as it was, so a probe other than the
 * chunk's own text can only come back as the content from the content's literal.
 */
export const PROBES: readonly [string, string] = ["swarmgate:template-probe:1", "swarmgate:template-probe:2"]
/** Templates a stream may make: a node whose chunks all differ costs at most this many extra parses. */
const MAX_TEMPLATES = 4

/** V8 copies slices shorter than this; longer ones point into (and keep alive) the string they came from. */
const SHORT = 13

/**
 * The string of the literal whose characters are `text[start, end)` (its
 * quotes outside), or undefined for a control character in it. A short plain
 * one is sliced; escapes, or a text long enough that a slice would keep the
 * whole socket read alive, are parsed.
 */
const literalText = (text: string, start: number, end: number): string | undefined => {
  let plain = end - start < SHORT
  for (let i = start; plain && i < end; i++) {
    const c = text.charCodeAt(i)
    if (c < 32) return undefined
    if (c === BACKSLASH) plain = false
  }
  if (plain) return text.slice(start, end)
  try {
    return JSON.parse(text.slice(start - 1, end + 1)) as string
  } catch {
    return undefined
  }
}

const LINE_BREAK = /[\r\n]/

export class ChunkParser {
  /** The template's bytes up to and including the content literal's opening quote; "" while none. */
  private prefix = ""
  /** The template's bytes after the content literal's closing quote. */
  private suffix = ""
  private templateFinish: string | undefined = undefined
  private templates = 0
  /** The template has no line break: a chunk of it can lie on one `data:` line (`parseAt`). */
  private oneLine = false
  /** The node's shape tried first: the one after the last this stream matched. */
  private nextShape = 0
  /** The fields of the last chunk read, reused for every chunk: callers read them before the next. */
  readonly fields: ChunkFields = { content: undefined, finishReason: undefined, error: undefined }

  /** `shapes`: the node's, shared by its streams' parsers (none: every stream learns on its own). */
  constructor(private readonly shapes?: ChunkShapes) {}

  /** The chunk's fields, or `undefined` when `data` is not JSON. The result is valid until the next call. */
  parse(data: string): ChunkFields | undefined {
    // `slice` + `===` compares at memory speed; `startsWith` goes a character at a time in V8.
    if (this.prefix.length > 0 && data.slice(0, this.prefix.length) === this.prefix) {
      const content = this.fromTemplate(data)
      if (content !== undefined) {
        this.fields.content = content
        this.fields.finishReason = this.templateFinish
        this.fields.error = undefined
        return this.fields
      }
    }
    const shapes = this.shapes
    if (shapes !== undefined && this.fromShape(shapes, data)) return this.fields
    let chunk: unknown
    try {
      chunk = JSON.parse(data)
    } catch {
      return undefined
    }
    if (typeof chunk !== "object" || chunk === null) {
      this.fields.content = undefined
      this.fields.finishReason = undefined
      this.fields.error = undefined
      return this.fields
    }
    const fields = fieldsOf(chunk, this.fields)
    if (
      fields.content !== undefined &&
      fields.content.length > 0 &&
      fields.error === undefined &&
      this.templates < MAX_TEMPLATES
    ) {
      this.templates++
      this.learn(data, fields.content, fields.finishReason)
    }
    shapes?.learn(data, fields)
    return fields
  }

  /** Reads `data` by one of the node's shapes into `fields`; a text chunk's bytes become the stream's template. */
  private fromShape(shapes: ChunkShapes, data: string): boolean {
    const shape = shapes.match(data, this.nextShape)
    if (shape < 0) return false
    const start = shapes.contentStart
    const end = shapes.contentEnd
    const content = start < 0 ? undefined : literalText(data, start, end)
    // A control character or a bad escape in the text: not JSON, as JSON.parse will say.
    if (start >= 0 && content === undefined) return false
    this.nextShape = shape + 1
    const finishReason = shapes.finishReasonOf(shape)
    this.fields.content = content
    this.fields.finishReason = finishReason
    this.fields.error = undefined
    if (content !== undefined && content.length > 0 && this.templates < MAX_TEMPLATES) {
      this.templates++
      this.keep(data, start - 1, end, finishReason)
    }
    return true
  }

  /** The text of a chunk that starts with the template's prefix, if its literal is plain and its rest the template's. */
  private fromTemplate(data: string): string | undefined {
    const start = this.prefix.length
    const end = closingQuote(data, start)
    if (end < 0 || data.length - end - 1 !== this.suffix.length || data.slice(end + 1) !== this.suffix)
      return undefined
    return literalText(data, start, end)
  }

  /**
   * `parse` of a chunk that lies in `text` from `from` (an SSE event read
   * where it lies, not sliced out): when it is the template's prefix, a
   * literal and the template's suffix, its fields (as `parse` gives them)
   * and the index after it; otherwise -1, and the caller parses it as usual.
   * The chunk is one line: a line break in the literal ends the look, and a
   * template learned from data over several lines (a line break between its
   * JSON tokens) is not used here.
   */
  parseAt(text: string, from: number): number {
    const prefix = this.prefix
    if (!this.oneLine || text.slice(from, from + prefix.length) !== prefix) return -1
    const start = from + prefix.length
    let end = start
    for (; end < text.length; end++) {
      const c = text.charCodeAt(end)
      if (c === QUOTE) break
      if (c < 32) return -1
      // An escaped character is no line break either.
      if (c === BACKSLASH && ++end < text.length && text.charCodeAt(end) < 32) return -1
    }
    const after = end + 1 + this.suffix.length
    if (end >= text.length || text.slice(end + 1, after) !== this.suffix) return -1
    const content = literalText(text, start, end)
    if (content === undefined) return -1
    this.fields.content = content
    this.fields.finishReason = this.templateFinish
    this.fields.error = undefined
    return after
  }

  /** Finds the literal that is `choices[0].delta.content` in `data`, and keeps what surrounds it. */
  private learn(data: string, content: string, finishReason: string | undefined): void {
    let at = data.indexOf('"content"')
    while (at >= 0) {
      let i = at + 9
      while (i < data.length && isWhitespace(data.charCodeAt(i))) i++
      if (data.charCodeAt(i) === 58 /* : */) {
        i++
        while (i < data.length && isWhitespace(data.charCodeAt(i))) i++
        if (data.charCodeAt(i) === QUOTE) {
          const end = closingQuote(data, i + 1)
          if (end > 0 && this.verify(data, i, end, content, finishReason)) {
            this.keep(data, i, end, finishReason)
            return
          }
        }
      }
      at = data.indexOf('"content"', at + 1)
    }
  }

  /** The bytes of `data` around its content's literal (quotes at `open` and `close`) as the template. */
  private keep(data: string, open: number, close: number, finishReason: string | undefined): void {
    this.prefix = own(data.slice(0, open + 1))
    this.suffix = own(data.slice(close + 1))
    this.oneLine = !LINE_BREAK.test(this.prefix) && !LINE_BREAK.test(this.suffix)
    this.templateFinish = finishReason
  }

  /**
   * Whether the literal at `open`…`close` is the content of `data` (whose
   * content is `content`): with a probe other than `content` in its place,
   * that probe is the content. A literal that is not the content's would
   * have left `content`, the key of another field would have taken the
   * content away: one parse instead of one per probe.
   */
  private verify(
    data: string,
    open: number,
    close: number,
    content: string,
    finishReason: string | undefined,
  ): boolean {
    const probe = content === PROBES[0] ? PROBES[1] : PROBES[0]
    try {
      const probed = JSON.parse(
        `${data.slice(0, open)}${JSON.stringify(probe)}${data.slice(close + 1)}`,
      ) as object
      const fields = fieldsOf(probed, { content: undefined, finishReason: undefined, error: undefined })
      return fields.content === probe && fields.finishReason === finishReason && fields.error === undefined
    } catch {
      return false
    }
  }
}
