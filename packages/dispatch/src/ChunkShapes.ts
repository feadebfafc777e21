/**
 * What a node's chunks look like, learned once per node and kept across its
 * streams: the bytes of a chunk with its scalar values cut out.
 *
 * A stream's template (`ChunkParser`) cannot outlive its stream: every chunk
 * carries the stream's `id` and `created`, so each stream began with full
 * parses — its first chunk, the first text (parsed, then parsed again to
 * prove the template) and the finish — about as much as reading all the other
 * chunks of a short answer. A shape is a chunk's text split at its string and
 * number values into fixed segments and holes, one of which may be the
 * content. A chunk that has the fixed segments, a JSON string literal or
 * number in each hole and a string literal in the content's is read without
 * a parse.
 *
 * This is exact, not a guess. JSON's grammar is context-free, so a string
 * token in place of another, or a number in place of a number, leaves the
 * document's structure as it was: the same keys, in the same objects and
 * arrays, hold the values that come out. A hole is only ever a value no field
 * the gateway reads depends on — never anything under `error`, nor
 * `choices[0].finish_reason`, nor a key, nor a literal `true`, `false` or
 * `null` — and the content's hole is `choices[0].delta.content`; a chunk with
 * a key twice in one object teaches nothing. That rests on the learning walk
 * below (`Walk.member` follows exactly what `fieldsOf` reads). As a check of
 * the walk, the learned chunk is parsed once more with a probe of its own in
 * every hole: its fields must come back as the chunk's own, with the
 * content's probe as the content.
 */
import { BACKSLASH, type ChunkFields, closingQuote, fieldsOf, isWhitespace, own, QUOTE } from "./ChunkFields"

const PLUS = 43
const COMMA = 44
const MINUS = 45
const DOT = 46
const ZERO = 48
const NINE = 57
const COLON = 58
const OPEN_ARRAY = 91
const CLOSE_ARRAY = 93
const OPEN_OBJECT = 123
const CLOSE_OBJECT = 125

/** Shapes a node may teach, and chunks offered to learn from: a node whose chunks all differ costs this much, once. */
const MAX_SHAPES = 8
const MAX_LESSONS = 32
/** Holes in one shape, nesting and length of a chunk learned from: nodes' chunks are short and flat. */
const MAX_HOLES = 64
const MAX_DEPTH = 32
const MAX_CHUNK_CHARS = 4_096

const LITERALS = ["true", "false", "null"] as const

enum Hole {
  String = 0,
  Number = 1,
  Content = 2,
}

/** What the learning walk knows of the value it is in: which of the gateway's fields it can reach. */
enum Place {
  /** Outside every field the gateway reads: values here are holes. */
  Free = 0,
  /** A field the gateway reads, or inside one: kept as it is. */
  Fixed = 1,
  /** The top-level value. */
  Top = 2,
  /** `choices`. */
  Choices = 3,
  /** `choices[0]`. */
  Choice = 4,
  /** `choices[0].delta`. */
  Delta = 5,
  /** `choices[0].delta.content`. */
  Content = 6,
}

const isDigit = (c: number) => c >= ZERO && c <= NINE
const isHex = (c: number) => isDigit(c) || (c >= 97 && c <= 102) || (c >= 65 && c <= 70)
/** What JSON allows after a backslash besides `u`: `"` `\` `/` `b` `f` `n` `r` `t`. */
const SHORT_ESCAPES = new Set([QUOTE, BACKSLASH, 47, 98, 102, 110, 114, 116])

/** The end of the JSON number at `at`, or -1 when none starts there. */
const numberEnd = (text: string, at: number): number => {
  let i = at
  if (text.charCodeAt(i) === MINUS) i++
  const first = text.charCodeAt(i)
  if (first === ZERO) i++
  else if (first > ZERO && first <= NINE) {
    i++
    while (isDigit(text.charCodeAt(i))) i++
  } else return -1
  if (text.charCodeAt(i) === DOT) {
    if (!isDigit(text.charCodeAt(++i))) return -1
    while (isDigit(text.charCodeAt(i))) i++
  }
  const e = text.charCodeAt(i)
  if (e === 101 /* e */ || e === 69 /* E */) {
    const sign = text.charCodeAt(++i)
    if (sign === PLUS || sign === MINUS) i++
    if (!isDigit(text.charCodeAt(i))) return -1
    while (isDigit(text.charCodeAt(i))) i++
  }
  return i
}

/** The end of the JSON string literal at `at` (escapes valid, no control character), or -1. */
const stringEnd = (text: string, at: number): number => {
  if (text.charCodeAt(at) !== QUOTE) return -1
  for (let i = at + 1; i < text.length; i++) {
    const c = text.charCodeAt(i)
    if (c === QUOTE) return i + 1
    if (c < 32) return -1
    if (c !== BACKSLASH) continue
    const escaped = text.charCodeAt(++i)
    if (escaped === 117 /* u */) {
      for (let k = 0; k < 4; k++) if (!isHex(text.charCodeAt(++i))) return -1
    } else if (!SHORT_ESCAPES.has(escaped)) return -1
  }
  return -1
}

class Shape {
  constructor(
    /** The fixed text before each hole, then after the last: one more than `holes`. */
    readonly fixed: ReadonlyArray<string>,
    readonly holes: ReadonlyArray<Hole>,
    readonly finishReason: string | undefined,
  ) {}
}

/**
 * The learning walk over a chunk that `JSON.parse` read: its fixed segments
 * and holes, unless it teaches nothing (a key twice in an object, too many
 * holes, too deep).
 */
class Walk {
  private at = 0
  private from = 0
  private depth = 0
  readonly fixed: Array<string> = []
  readonly holes: Array<Hole> = []

  constructor(private readonly text: string) {}

  private space(): void {
    while (isWhitespace(this.text.charCodeAt(this.at))) this.at++
  }

  private cut(kind: Hole, end: number): boolean {
    if (this.holes.length >= MAX_HOLES) return false
    this.fixed.push(this.text.slice(this.from, this.at))
    this.holes.push(kind)
    this.from = end
    this.at = end
    return true
  }

  /** The key string at `at` (the walk is on its opening quote), decoded; the walk moves past it. */
  private key(): string | undefined {
    const end = stringEnd(this.text, this.at)
    if (end < 0) return undefined
    const raw = this.text.slice(this.at, end)
    this.at = end
    return raw.includes("\\") ? (JSON.parse(raw) as string) : raw.slice(1, -1)
  }

  /** Where a member's value lies, by its container's place and the member's key or index (as `fieldsOf` reads). */
  private static member(container: Place, key: string | number): Place {
    switch (container) {
      case Place.Top:
        return key === "error" ? Place.Fixed : key === "choices" ? Place.Choices : Place.Free
      case Place.Choices:
        return key === 0 ? Place.Choice : Place.Free
      case Place.Choice:
        return key === "finish_reason" ? Place.Fixed : key === "delta" ? Place.Delta : Place.Free
      case Place.Delta:
        return key === "content" ? Place.Content : Place.Free
      case Place.Free:
        return Place.Free
      default:
        return Place.Fixed
    }
  }

  /** Walks the value at `at` in `place`; false when the chunk teaches nothing. */
  private value(place: Place): boolean {
    this.space()
    const text = this.text
    const c = text.charCodeAt(this.at)
    if (c === OPEN_OBJECT || c === OPEN_ARRAY) {
      // Chunks are shallow; the walk recurses where JSON.parse does not.
      if (++this.depth > MAX_DEPTH) return false
      // A container where the content's string is read is kept whole. Elsewhere `member` tells by the
      // key's kind: an array's indexes never match an object's keys, so a misplaced container is free.
      const inner = place === Place.Content ? Place.Fixed : place
      const walked = c === OPEN_OBJECT ? this.object(inner) : this.array(inner)
      this.depth--
      return walked
    }
    if (c === QUOTE) {
      const end = stringEnd(text, this.at)
      if (end < 0) return false
      if (place === Place.Content) return this.cut(Hole.Content, end)
      if (place === Place.Free) return this.cut(Hole.String, end)
      this.at = end
      return true
    }
    const numberAt = numberEnd(text, this.at)
    if (numberAt > this.at) {
      if (place === Place.Free) return this.cut(Hole.Number, numberAt)
      this.at = numberAt
      return true
    }
    for (const word of LITERALS)
      if (text.startsWith(word, this.at)) {
        this.at += word.length
        return true
      }
    return false
  }

  /** Past an opening bracket and any whitespace; true when `close` follows at once (empty), and past it. */
  private openedEmpty(close: number): boolean {
    this.at++
    this.space()
    if (this.text.charCodeAt(this.at) !== close) return false
    this.at++
    return true
  }

  /** After a member: past `close` (true), past a comma (false: a member follows), or undefined when neither. */
  private afterMember(close: number): boolean | undefined {
    this.space()
    const next = this.text.charCodeAt(this.at++)
    return next === close ? true : next === COMMA ? false : undefined
  }

  private object(place: Place): boolean {
    const text = this.text
    if (this.openedEmpty(CLOSE_OBJECT)) return true
    const keys = new Set<string>()
    for (;;) {
      this.space()
      if (text.charCodeAt(this.at) !== QUOTE) return false
      const key = this.key()
      // A key twice: JSON.parse keeps the last, and a shape does not follow which that is.
      if (key === undefined || keys.has(key)) return false
      keys.add(key)
      this.space()
      if (text.charCodeAt(this.at) !== COLON) return false
      this.at++
      if (!this.value(Walk.member(place, key))) return false
      const closed = this.afterMember(CLOSE_OBJECT)
      if (closed !== false) return closed === true
    }
  }

  private array(place: Place): boolean {
    if (this.openedEmpty(CLOSE_ARRAY)) return true
    for (let index = 0; ; index++) {
      if (!this.value(Walk.member(place, index))) return false
      const closed = this.afterMember(CLOSE_ARRAY)
      if (closed !== false) return closed === true
    }
  }

  /** The whole chunk: a value, then only whitespace. */
  all(): boolean {
    if (!this.value(Place.Top)) return false
    this.space()
    if (this.at !== this.text.length) return false
    this.fixed.push(this.text.slice(this.from))
    return true
  }
}

/** A probe of its own for hole `i`: a string, a number or (the content) a text other than the chunk's. */
const probeOf = (kind: Hole, i: number, content: string): string =>
  kind === Hole.Number
    ? String(1000 + i)
    : JSON.stringify(
        kind === Hole.String
          ? `swarmgate:shape-probe:${i}`
          : content === "swarmgate:shape-probe:content"
            ? "swarmgate:shape-probe:text"
            : "swarmgate:shape-probe:content",
      )

export class ChunkShapes {
  private readonly shapes: Array<Shape> = []
  private lessons = 0
  /** Set by `match` for the caller to read at once: where the content's literal lies (quotes outside), or -1. */
  contentStart = -1
  contentEnd = -1

  /** How many shapes were learned. */
  get size(): number {
    return this.shapes.length
  }

  /**
   * Learns the shape of `data`, which `JSON.parse` read as the object whose
   * fields are `fields` (no error), when it is a new one and the node may
   * still teach. Never throws.
   */
  learn(data: string, fields: ChunkFields): void {
    if (
      this.shapes.length >= MAX_SHAPES ||
      this.lessons >= MAX_LESSONS ||
      fields.error !== undefined ||
      data.length > MAX_CHUNK_CHARS
    )
      return
    this.lessons++
    try {
      const walk = new Walk(data)
      if (!walk.all()) return
      const { fixed, holes } = walk
      const contents = holes.filter((h) => h === Hole.Content).length
      if (contents !== (fields.content === undefined ? 0 : 1)) return
      let probed = fixed[0]!
      for (let i = 0; i < holes.length; i++)
        probed += probeOf(holes[i]!, i, fields.content ?? "") + fixed[i + 1]!
      const parsed: unknown = JSON.parse(probed)
      if (typeof parsed !== "object" || parsed === null) return
      const read = fieldsOf(parsed, { content: undefined, finishReason: undefined, error: undefined })
      const content = holes.indexOf(Hole.Content)
      const probe = content < 0 ? undefined : JSON.parse(probeOf(Hole.Content, content, fields.content ?? ""))
      if (read.content !== probe || read.finishReason !== fields.finishReason || read.error !== undefined)
        return
      this.shapes.push(new Shape(fixed.map(own), holes, fields.finishReason))
    } catch {
      // Not JSON after all, or a walk that met what it does not know: nothing learned.
    }
  }

  /**
   * The index of the shape `data` is an instance of, or -1: its content's
   * literal then lies at `contentStart`…`contentEnd` (its characters, quotes
   * outside; not yet checked for escapes and control characters, which the
   * caller reads). Shapes are tried from `from` on, round: a stream's chunks
   * come in the order its node's first streams taught them (role, text,
   * finish), so the one after the last matched is most often the next.
   */
  match(data: string, from = 0): number {
    const shapes = this.shapes
    const n = shapes.length
    for (let k = 0; k < n; k++) {
      const i = (from + k) % n
      if (this.instance(shapes[i]!, data)) return i
    }
    return -1
  }

  /** The finish reason every instance of shape `i` carries. */
  finishReasonOf(i: number): string | undefined {
    return this.shapes[i]!.finishReason
  }

  private instance(shape: Shape, data: string): boolean {
    const { fixed, holes } = shape
    let at = 0
    this.contentStart = -1
    this.contentEnd = -1
    for (let i = 0; i < holes.length; i++) {
      const before = fixed[i]!
      if (data.slice(at, at + before.length) !== before) return false
      at += before.length
      switch (holes[i]) {
        case Hole.String:
          at = stringEnd(data, at)
          break
        case Hole.Number:
          at = numberEnd(data, at)
          break
        default: {
          if (data.charCodeAt(at) !== QUOTE) return false
          const end = closingQuote(data, at + 1)
          if (end < 0) return false
          this.contentStart = at + 1
          this.contentEnd = end
          at = end + 1
        }
      }
      if (at < 0) return false
    }
    const last = fixed[holes.length]!
    return data.length - at === last.length && data.slice(at) === last
  }
}
