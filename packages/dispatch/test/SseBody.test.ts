/**
 * A node's SSE body read by `SseBody` — the common chunks read where they lie
 * in the socket read, the rest through the SSE decoder an event at a time —
 * gives what the plain composition gives: every read's text decoded by
 * `SseDecoder.push`, every event's data read by `ChunkParser.parse`. Checked
 * after every read, on generated streams under any split of their bytes
 * (including inside a character or a line ending), with comments, ids, event
 * types, CRLF and CR endings, data split over lines, `[DONE]` anywhere, and
 * events longer than the limit.
 */
import { describe, expect, it, vi } from "@effect/vitest"
import { SseDecoder } from "@swarmgate/sse"
import { splitAt } from "@swarmgate/sse/testing"
import fc from "fast-check"
import { ChunkParser } from "../src/ChunkParser"
import { ChunkShapes } from "../src/ChunkShapes"
import type { NodeEvent } from "../src/NodeTransport"
import { finishOf, SseBody } from "../src/SseBody"
import { chunk, head, literal, text } from "./support/Chunks"

/** The reading before `SseBody`: what the transport did with each read. */
class Reference {
  private readonly decoder: SseDecoder.SseDecoder
  private readonly chunks = new ChunkParser()
  done = false
  finish: "stop" | "length" | undefined = undefined
  failure: string | undefined = undefined
  constructor(private readonly maxEventChars: number) {
    this.decoder = new SseDecoder.SseDecoder(maxEventChars)
  }
  read(bytes: Uint8Array, into: Array<NodeEvent>): void {
    if (this.failure !== undefined) return
    for (const event of this.decoder.push(bytes)) {
      if (this.done || this.failure !== undefined) continue
      if (event.data === "[DONE]") {
        this.done = true
        continue
      }
      const fields = this.chunks.parse(event.data)
      if (fields === undefined) {
        this.failure = `bad_event: ${event.data.slice(0, 200)}`
        continue
      }
      if (fields.error !== undefined) {
        this.failure = `node_error: ${fields.error.slice(0, 2_000)}`
        continue
      }
      if (fields.content !== undefined && fields.content.length > 0)
        into.push({ _tag: "Delta", text: fields.content })
      if (fields.finishReason !== undefined) this.finish = finishOf(fields.finishReason)
    }
    if (this.decoder.overflowed && this.failure === undefined)
      this.failure = `bad_event: an event longer than ${this.maxEventChars} characters`
  }
}

/** The common chunk with `text`: the same bytes around each text, as nodes send them. */
const common = (l: string) => `${head}{"content":${l}},"finish_reason":null}]}`

/** Mostly valid literals: an invalid one ends the stream (bad_event), and little is left to compare. */
const valid = fc.oneof(
  { weight: 30, arbitrary: text.map((t) => JSON.stringify(t)) },
  { weight: 1, arbitrary: literal },
)

const SMALL_LIMIT = 300
/** The length of a common chunk's `data:` line with an empty text. */
const LINE_WITHOUT_TEXT = `data: ${common('""')}`.length

/** One event of a stream; most in the common shape, the others what a node may also send. */
const event = fc.oneof(
  { weight: 40, arbitrary: valid.map((l) => `data: ${common(l)}\n\n`) },
  { weight: 1, arbitrary: chunk.map((c) => `data: ${c}\n\n`) },
  // A line break inside the JSON: data over two lines (a template may be learned with it), and a
  // raw line break within the template's bytes (two lines, the second not a field of SSE's).
  {
    weight: 2,
    arbitrary: valid.map((l) => `data: ${head}\ndata: {"content":${l}},"finish_reason":null}]}\n\n`),
  },
  { weight: 2, arbitrary: valid.map((l) => `data: ${head}\n{"content":${l}},"finish_reason":null}]}\n\n`) },
  {
    weight: 1,
    arbitrary: valid.map((l) => `data: ${head}{"content":${l}},"finish_reason":null}]\ndata: }\n\n`),
  },
  { weight: 1, arbitrary: valid.map((l) => `data: ${head}{"content":${l}},"finish_reason":null}]\n}\n\n`) },
  // The common chunk's bytes but for a finish reason of the same length as its `null`.
  { weight: 2, arbitrary: valid.map((l) => `data: ${head}{"content":${l}},"finish_reason":"st"}]}\n\n`) },
  // Around the smaller limit of the runs that have one: the decoder overflows on a line longer than it.
  {
    weight: 2,
    arbitrary: fc
      .integer({ min: -2, max: 2 })
      .map((d) => `data: ${common(JSON.stringify("x".repeat(SMALL_LIMIT - LINE_WITHOUT_TEXT + d)))}\n\n`),
  },
  { weight: 1, arbitrary: valid.map((l) => `: data: ${common(l)}\n\n`) },
  { weight: 1, arbitrary: valid.map((l) => `event: data: ${common(l)}\n\n`) },
  { weight: 1, arbitrary: valid.map((l) => `data:${common(l)}\n\n`) },
  { weight: 1, arbitrary: valid.map((l) => `id: 7\ndata: ${common(l)}\n\n`) },
  { weight: 1, arbitrary: valid.map((l) => `event: delta\ndata: ${common(l)}\n\n`) },
  { weight: 1, arbitrary: valid.map((l) => `data: ${common(l)}\nid: 8\n\n`) },
  {
    weight: 1,
    arbitrary: valid.map((l) => `data: ${head}{"content":\ndata: ${l}},"finish_reason":null}]}\n\n`),
  },
  { weight: 1, arbitrary: valid.map((l) => `data: ${common(l)}\r\n\r\n`) },
  { weight: 1, arbitrary: valid.map((l) => `data: ${common(l)}\r\r`) },
  { weight: 1, arbitrary: valid.map((l) => `data: ${common(l)}\n`) },
  { weight: 1, arbitrary: fc.constant(`data: ${head}{"content":"a\\\n"},"finish_reason":null}]}\n\n`) },
  {
    weight: 1,
    arbitrary: fc.constantFrom(
      "data: [DONE]\n\n",
      "data: [DONE]x\n\n",
      "data: [DONE]\ndata: 1\n\n",
      "data: [DONE]\r\n\r\n",
      ": keep-alive\n\n",
      "\n",
      "retry: 5\n\n",
      `data: ${head}{},"finish_reason":"stop"}]}\n\n`,
      `data: ${head}{},"finish_reason":"length"}]}\n\n`,
      'data: {"error":{"message":"overloaded"}}\n\n',
      "data: {bad\n\n",
    ),
  },
)

const stream = fc.tuple(fc.boolean(), fc.array(event, { maxLength: 40 })).map(([bom, events]) => {
  const text = (bom ? "\uFEFF" : "") + events.join("")
  return new TextEncoder().encode(text)
})

/** Cuts: a byte offset, just after the n-th line break, or just before the n-th `data: ` (a read that starts with one). */
const cut = fc.oneof(
  fc.nat().map((n) => ({ at: "byte" as const, n })),
  fc.nat().map((n) => ({ at: "line" as const, n })),
  fc.nat().map((n) => ({ at: "data" as const, n })),
)

const DATA = new TextEncoder().encode("data: ")

const cutAt = (
  bytes: Uint8Array,
  cuts: ReadonlyArray<{ readonly at: "byte" | "line" | "data"; readonly n: number }>,
): Array<Uint8Array> => {
  const breaks: Array<number> = []
  const datas: Array<number> = []
  for (let i = 0; i < bytes.length; i++) {
    if (bytes[i] === 10 || bytes[i] === 13) breaks.push(i + 1)
    if (DATA.every((b, j) => bytes[i + j] === b)) datas.push(i)
  }
  const nth = (list: ReadonlyArray<number>, n: number) => (list.length === 0 ? 0 : list[n % list.length]!)
  const offsets = cuts.map((c) =>
    c.at === "byte" ? c.n % (bytes.length + 1) : c.at === "line" ? nth(breaks, c.n) : nth(datas, c.n),
  )
  return splitAt(bytes, offsets)
}

const state = (reader: Reference | SseBody, deltas: Array<NodeEvent>) => ({
  deltas: [...deltas],
  done: reader.done,
  finish: reader.finish,
  failure: reader.failure,
})

describe("SseBody", () => {
  const shapes = new ChunkShapes()
  it("reads any stream under any split as the SSE decoder and the chunk parser do, read after read", () => {
    fc.assert(
      fc.property(
        stream,
        fc.array(cut, { maxLength: 16 }),
        fc.constantFrom(1024 * 1024, SMALL_LIMIT),
        fc.boolean(),
        (bytes, cuts, maxEventChars, learned) => {
          // Half the streams read with the shapes earlier streams taught (one node), as HTTP nodes do.
          const body = new SseBody(maxEventChars, learned ? shapes : undefined)
          const reference = new Reference(maxEventChars)
          const got: Array<NodeEvent> = []
          const want: Array<NodeEvent> = []
          for (const [i, view] of cutAt(bytes, cuts).entries()) {
            // Sockets give Buffers; a view of another array must read the same.
            const part = i % 2 === 0 ? view : Buffer.from(view.buffer, view.byteOffset, view.byteLength)
            body.read(part, got)
            reference.read(part, want)
            expect(state(body, got)).toEqual(state(reference, want))
          }
        },
      ),
      { numRuns: 400 },
    )
  })

  it("reads the common chunks where they lie: the chunk parser parses only the first ones", () => {
    const parse = vi.spyOn(ChunkParser.prototype, "parse")
    try {
      const events = [
        `data: ${head}{"role":"assistant","content":""},"finish_reason":null}]}\n\n`,
        ...Array.from({ length: 100 }, (_, i) => `data: ${common(JSON.stringify(` w${i}`))}\n\n`),
        `data: ${head}{},"finish_reason":"length"}]}\n\n`,
        "data: [DONE]\n\n",
      ]
      const body = new SseBody()
      const deltas: Array<NodeEvent> = []
      body.read(new TextEncoder().encode(events.join("")), deltas)
      expect(deltas).toHaveLength(100)
      expect(deltas[99]).toEqual({ _tag: "Delta", text: " w99" })
      expect(body.finish).toBe("length")
      expect(body.done).toBe(true)
      // The role chunk, the first text (the template is learned from it) and the finish chunk.
      expect(parse).toHaveBeenCalledTimes(3)
    } finally {
      parse.mockRestore()
    }
  })
})
