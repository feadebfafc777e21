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
 * content. A chunk that has the fixed segments, a plain string literal or a
 * JSON number in each hole and a string literal in the content's is read
 * without a parse.
 *
 * This is exact, not a guess. JSON's grammar is context-free, so a string
 * token in place of another, or a number in place of a number, leaves the
 * document's structure as it was: the same keys, in the same objects and
 * arrays, hold the values that come out. A hole is only ever a value no field
 * the gateway reads depends on — never anything under `error`, nor
 * `choices[0].finish_reason`, nor a key, nor a literal `true`, `false` or
 * `null` — and the content's hole is `choices[0].delta.content`; a chunk with
 * a key twice in one object teaches nothing. What the shape says is then
 * checked once, by parsing the learned chunk with probe values in every hole:
 * its fields must come back as the chunk's own, with the probe as the content.
 */
import { BACKSLASH, type ChunkFields, closingQuote, fieldsOf, own, QUOTE } from "./ChunkFields"

const MINUS = 45
const ZERO = 48
const NINE = 57
const DOT = 46

/** Shapes a node may teach, and chunks offered to learn from: a node whose chunks all differ costs this much, once. */
const MAX_SHAPES = 8
const MAX_LESSONS = 32
/** Holes in one shape: a chunk with more values than this is not learned. */
const MAX_HOLES = 64

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

const isWhitespace = (c: number) => c === 32 || c === 9 || c === 10 || c === 13
const isDigit = (c: number) => c >= ZERO && c <= NINE

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
  if (e === 101 || e === 69) {
    const sign = text.charCodeAt(++i)
    if (sign === 43 || sign === MINUS) i++
    if (!isDigit(text.charCodeAt(i))) return -1
    while (isDigit(text.charCodeAt(i))) i++
  }
  return i
}

/** The end of the plain string literal (no escape, no control character) at `at`, or -1. */
const plainStringEnd = (text: string, at: number): number => {
  if (text.charCodeAt(at) !== QUOTE) return -1
  for (let i = at + 1; i < text.length; i++) {
    const c = text.charCodeAt(i)
    if (c === QUOTE) return i + 1
    if (c < 32 || c === BACKSLASH) return -1
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
 * and holes, or undefined when it teaches nothing (a key twice in an object,
 * too many holes, an error).
 */
class Walk {
  private at = 0
  private from = 0
  readonly fixed: Array<string> = []
  readonly holes: Array<Hole> = []
  /** The original text of each hole, to check that the cut puts the chunk back together. */
  readonly values: Array<string> = []
  failed = false

  constructor(private readonly text: string) {}

  private space(): void {
    while (isWhitespace(this.text.charCodeAt(this.at))) this.at++
  }

  private cut(kind: Hole, end: number): void {
    if (this.holes.length >= MAX_HOLES) {
      this.failed = true
      return
    }
    this.fixed.push(this.text.slice(this.from, this.at))
    this.holes.push(kind)
    this.values.push(this.text.slice(this.at, end))
    this.from = end
  }

  /** The key string at `at` (the walk is on its opening quote), decoded. */
  private key(): string | undefined {
    const end = closingQuote(this.text, this.at + 1)
    if (end < 0) return undefined
    const raw = this.text.slice(this.at, end + 1)
    this.at = end + 1
    try {
      return raw.includes("\\") ? (JSON.parse(raw) as string) : raw.slice(1, -1)
    } catch {
      return undefined
    }
  }

  /** Where a member's value goes, by its container's place and the member's key or index. */
  private static member(container: Place, key: string | number): Place {
    switch (container) {
      case Place.Fixed:
        return Place.Fixed
      case Place.Top:
        return key === "error" ? Place.Fixed : key === "choices" ? Place.Choices : Place.Free
      case Place.Choices:
        return key === 0 ? Place.Choice : Place.Free
      case Place.Choice:
        return key === "finish_reason" ? Place.Fixed : key === "delta" ? Place.Delta : Place.Free
      case Place.Delta:
        return key === "content" ? Place.Content : Place.Free
      default:
        return Place.Free
    }
  }

  /** Walks the value at `at` in `place`; false when the chunk teaches nothing. */
  value(place: Place): boolean {
    if (this.failed) return false
    this.space()
    const text = this.text
    const c = text.charCodeAt(this.at)
    if (c === 123 /* { */ || c === 91 /* [ */) {
      // A container where a scalar is read (the content, say) is kept whole, as is all that is under it.
      const inner = place === Place.Content ? Place.Fixed : place
      return c === 123 ? this.object(inner) : this.array(inner)
    }
    if (c === QUOTE) {
      const end = closingQuote(text, this.at + 1)
      if (end < 0) return false
      if (place === Place.Content) this.cut(Hole.Content, end + 1)
      // A string with an escape is kept as it is: a hole takes plain strings only.
      else if (place === Place.Free && plainStringEnd(text, this.at) === end + 1)
        this.cut(Hole.String, end + 1)
      this.at = end + 1
      return !this.failed
    }
    const numberAt = numberEnd(text, this.at)
    if (numberAt > this.at) {
      if (place === Place.Free) this.cut(Hole.Number, numberAt)
      this.at = numberAt
      return !this.failed
    }
    for (const word of ["true", "false", "null"])
      if (text.startsWith(word, this.at)) {
        this.at += word.length
        return true
      }
    return false
  }

  private object(place: Place): boolean {
    const text = this.text
    this.at++
    this.space()
    if (text.charCodeAt(this.at) === 125 /* } */) {
      this.at++
      return true
    }
    const keys = new Set<string>()
    for (;;) {
      this.space()
      if (text.charCodeAt(this.at) !== QUOTE) return false
      const key = this.key()
      // A key twice: JSON.parse keeps the last, and a shape does not follow which that is.
      if (key === undefined || keys.has(key)) return false
      keys.add(key)
      this.space()
      if (text.charCodeAt(this.at) !== 58 /* : */) return false
      this.at++
      if (!this.value(Walk.member(place, key))) return false
      this.space()
      const next = text.charCodeAt(this.at++)
      if (next === 125 /* } */) return true
      if (next !== 44 /* , */) return false
    }
  }

  private array(place: Place): boolean {
    const text = this.text
    this.at++
    this.space()
    if (text.charCodeAt(this.at) === 93 /* ] */) {
      this.at++
      return true
    }
    for (let index = 0; ; index++) {
      if (!this.value(Walk.member(place, index))) return false
      this.space()
      const next = text.charCodeAt(this.at++)
      if (next === 93 /* ] */) return true
      if (next !== 44 /* , */) return false
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

const PROBE_STRING = '"swarmgate:shape-probe"'
const PROBE_NUMBER = "7"
const PROBE_CONTENT = ["swarmgate:shape-probe:1", "swarmgate:shape-probe:2"] as const

export class ChunkShapes {
  private readonly shapes: Array<Shape> = []
  private lessons = 0
  /** Set by `match`: where the content's literal lies (its quotes outside), or -1 when the shape has none. */
  contentStart = -1
  contentEnd = -1

  /** How many shapes were learned. */
  get size(): number {
    return this.shapes.length
  }

  /**
   * Learns the shape of `data`, which `JSON.parse` read as `fields` (no
   * error), when it is a new one and the node may still teach.
   */
  learn(data: string, fields: ChunkFields): void {
    if (this.shapes.length >= MAX_SHAPES || this.lessons >= MAX_LESSONS || fields.error !== undefined) return
    this.lessons++
    const walk = new Walk(data)
    if (!walk.all() || walk.failed) return
    const { fixed, holes, values } = walk
    let whole = fixed[0]!
    for (let i = 0; i < holes.length; i++) whole += values[i]! + fixed[i + 1]!
    if (whole !== data) return
    const content = holes.indexOf(Hole.Content)
    if (content < 0 !== (fields.content === undefined)) return
    // Every hole given a probe at once: the fields must be the chunk's own, the content the probe.
    const probe = fields.content === PROBE_CONTENT[0] ? PROBE_CONTENT[1] : PROBE_CONTENT[0]
    let probed = fixed[0]!
    for (let i = 0; i < holes.length; i++)
      probed +=
        (holes[i] === Hole.Content
          ? JSON.stringify(probe)
          : holes[i] === Hole.String
            ? PROBE_STRING
            : PROBE_NUMBER) + fixed[i + 1]!
    let read: ChunkFields
    try {
      const parsed: unknown = JSON.parse(probed)
      if (typeof parsed !== "object" || parsed === null) return
      read = fieldsOf(parsed, { content: undefined, finishReason: undefined, error: undefined })
    } catch {
      return
    }
    if (
      read.content !== (content < 0 ? undefined : probe) ||
      read.finishReason !== fields.finishReason ||
      read.error !== undefined
    )
      return
    this.shapes.push(new Shape(fixed.map(own), holes, fields.finishReason))
  }

  /**
   * The shape `data` is an instance of, if any: its content's literal then
   * lies at `contentStart`…`contentEnd` (its characters, quotes outside; not
   * yet checked for escapes and control characters, which the caller reads).
   */
  match(data: string): Shape | undefined {
    for (const shape of this.shapes) if (this.instance(shape, data)) return shape
    return undefined
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
          at = plainStringEnd(data, at)
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
