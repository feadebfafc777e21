import { describe, expect, it } from "@effect/vitest"
import { Chunk, Effect, Stream } from "effect"
import fc from "fast-check"
import { decodeSse, SseDecoder, type SseEvent } from "../src/SseDecoder"
import { DONE, encodeComment, encodeEvent, keepAlive } from "../src/SseEncoder"
import { splitAt } from "../src/testing"

const utf8 = (s: string) => new TextEncoder().encode(s)

const decodeAll = (chunks: ReadonlyArray<Uint8Array | string>): Array<SseEvent> => {
  const decoder = new SseDecoder()
  const events: Array<SseEvent> = []
  for (const chunk of chunks) events.push(...decoder.push(chunk))
  events.push(...decoder.end())
  return events
}

const event = (data: string, fields: Partial<Omit<SseEvent, "data">> = {}): SseEvent => ({
  event: undefined,
  id: undefined,
  data,
  ...fields,
})

// Mixes LF, CRLF and CR endings, a comment, multi-line data, ids and multi-byte characters.
const sample =
  "\uFEFF: hello\r\n" +
  `${encodeEvent({ delta: "héllo 👋 世界" })}` +
  "event: usage\r\nid: 7\r\ndata: line one\r\ndata:line two\r\n\r\n" +
  "data: after cr\r\r" +
  ": comment only\n\n" +
  `${keepAlive}` +
  "data\n\n" +
  "retry: 1500\nid\ndata: 🙂\n\n" +
  DONE +
  "data: truncated"

const sampleEvents: Array<SseEvent> = [
  event('{"delta":"héllo 👋 世界"}'),
  event("line one\nline two", { event: "usage", id: "7" }),
  event("after cr", { id: "7" }),
  event("", { id: "7" }),
  event("🙂"),
  event("[DONE]"),
]

describe("SseDecoder", () => {
  it("decodes the sample stream in one chunk", () => {
    expect(decodeAll([utf8(sample)])).toEqual(sampleEvents)
  })

  it("gives the same events for every split of the sample into two byte chunks", () => {
    const bytes = utf8(sample)
    for (let i = 0; i <= bytes.length; i++) {
      expect(decodeAll([bytes.subarray(0, i), bytes.subarray(i)])).toEqual(sampleEvents)
    }
  })

  it("gives the same events one byte at a time", () => {
    const bytes = utf8(sample)
    expect(decodeAll(splitAt(bytes, Array.from(bytes.keys())))).toEqual(sampleEvents)
  })

  it("gives the same events for any byte-split of the sample", () => {
    const bytes = utf8(sample)
    fc.assert(
      fc.property(fc.array(fc.nat({ max: bytes.length }), { maxLength: 40 }), (cuts) => {
        expect(decodeAll(splitAt(bytes, cuts))).toEqual(sampleEvents)
      }),
      { numRuns: 500 },
    )
  })

  it("decodes event by event (decode, then feedEvent from where the walk got to) what push decodes", () => {
    const bytes = utf8(sample)
    fc.assert(
      fc.property(fc.array(fc.nat({ max: bytes.length }), { maxLength: 40 }), (cuts) => {
        const decoder = new SseDecoder()
        const events: Array<SseEvent> = []
        for (const part of splitAt(bytes, cuts)) {
          const text = decoder.decode(part)
          let at = 0
          while (at < text.length) {
            const before = events.length
            const next = decoder.feedEvent(at, events)
            // Each step ends after a blank line (at most one event, and between events), or at the end of the text.
            expect(next).toBeGreaterThan(at)
            expect(events.length - before).toBeLessThanOrEqual(1)
            if (next < text.length) expect(decoder.betweenEvents).toBe(true)
            at = next
          }
        }
        events.push(...decoder.end())
        expect(events).toEqual(sampleEvents)
      }),
      { numRuns: 500 },
    )
  })

  it("stands between events only after a blank line, with nothing of a line or an event held", () => {
    const decoder = new SseDecoder()
    const events: Array<SseEvent> = []
    const walk = (chunk: string) => {
      const text = decoder.decode(utf8(chunk))
      for (let at = 0; at < text.length; ) at = decoder.feedEvent(at, events)
    }
    expect(decoder.betweenEvents).toBe(false) // not started
    walk("data: a\n\n")
    expect(decoder.betweenEvents).toBe(true)
    walk("data: b\n")
    expect(decoder.betweenEvents).toBe(false) // data held
    walk("\nevent: e\n")
    expect(decoder.betweenEvents).toBe(false) // a type held
    walk("\ndata: c")
    expect(decoder.betweenEvents).toBe(false) // a line partly read
    walk("\r\r")
    expect(decoder.betweenEvents).toBe(false) // the LF of a CRLF may come with the next chunk
    walk("\n")
    expect(decoder.betweenEvents).toBe(true)
    expect(events.map((e) => e.data)).toEqual(["a", "b", "c"])
  })

  it("round-trips any encoded payloads under any split, whatever the line endings", () => {
    fc.assert(
      fc.property(
        fc.array(fc.string({ unit: "binary" }), { minLength: 1, maxLength: 8 }),
        fc.constantFrom("\n", "\r\n", "\r"),
        fc.array(fc.nat(), { maxLength: 20 }),
        (payloads, eol, cuts) => {
          const text = payloads.map((p) => encodeEvent({ p }).replace(/\n/g, eol)).join("")
          const bytes = utf8(text)
          const decoded = decodeAll(
            splitAt(
              bytes,
              cuts.map((n) => n % (bytes.length + 1)),
            ),
          )
          expect(decoded.map((e) => JSON.parse(e.data).p)).toEqual(
            // lone surrogates do not survive UTF-8: compare with what TextEncoder makes of them
            payloads.map((p) => new TextDecoder().decode(utf8(p))),
          )
        },
      ),
    )
  })

  it("treats CRLF, CR and LF alike, including a CRLF split between chunks", () => {
    const expected = [event("a"), event("b"), event("c")]
    expect(decodeAll(["data: a\r\n\r\ndata: b\r\rdata: c\n\n"])).toEqual(expected)
    expect(decodeAll(["data: a\r", "\n\r", "\ndata: b\r", "\r", "data: c\n", "\n"])).toEqual(expected)
    // the byte chunk in between decodes to nothing: the pending CR must survive it
    expect(decodeAll([utf8("data: a\r"), new Uint8Array(0), utf8("\n\r\n")])).toEqual([event("a")])
  })

  it("ignores comments and unknown fields", () => {
    expect(decodeAll([`${encodeComment("ping")}: x\nfoo: bar\ndata: d\n: mid-event\n\n`])).toEqual([
      event("d"),
    ])
  })

  it("reads a chunk of three million lines without a colon in one pass", () => {
    // Each line's field is looked for within the line: a search to the text's end per line would be
    // ~10^13 steps here, minutes, past the test's timeout.
    expect(decodeAll([`${"x\n".repeat(3_000_000)}data: a\n\n`])).toEqual([event("a")])
  })

  it("joins data lines with LF and strips only one space after the colon", () => {
    expect(decodeAll(["data:a\ndata:  b\ndata\ndata: \n\n"])).toEqual([event("a\n b\n\n")])
  })

  it("reassembles a multi-byte character split across byte chunks", () => {
    const bytes = utf8("data: 👋é\n\n")
    // 👋 is 4 bytes starting at offset 6: cut inside it and inside é
    expect(
      decodeAll([bytes.subarray(0, 7), bytes.subarray(7, 9), bytes.subarray(9, 11), bytes.subarray(11)]),
    ).toEqual([event("👋é")])
  })

  it("replaces invalid UTF-8 instead of throwing", () => {
    expect(decodeAll([new Uint8Array([100, 97, 116, 97, 58, 0xff, 10, 10])])).toEqual([event("\uFFFD")])
  })

  it("decodes any bytes, valid UTF-8 or not, under any split, as WHATWG's TextDecoder reads them whole", () => {
    // Lead, continuation and invalid bytes, so that splits fall inside characters and broken ones.
    const byte = fc.constantFrom(
      0x41,
      0x0a,
      0xc3,
      0xa9,
      0xe2,
      0x82,
      0xac,
      0xf0,
      0x9f,
      0x98,
      0x80,
      0xff,
      0xed,
      0xa0,
    )
    fc.assert(
      fc.property(fc.array(byte, { maxLength: 40 }), fc.array(fc.nat(), { maxLength: 8 }), (raw, cuts) => {
        const bytes = new Uint8Array([...utf8("data: "), ...raw, 0x0a, 0x0a])
        const whole = new TextDecoder("utf-8", { ignoreBOM: true }).decode(bytes)
        expect(
          decodeAll(
            splitAt(
              bytes,
              cuts.map((n) => n % (bytes.length + 1)),
            ),
          ),
        ).toEqual(decodeAll([whole]))
      }),
      { numRuns: 1000 },
    )
  })

  it("does not dispatch a trailing event without a blank line at end of stream", () => {
    const decoder = new SseDecoder()
    expect(decoder.push("data: complete\n\ndata: partial\n")).toEqual([event("complete")])
    expect(decoder.end()).toEqual([])
  })

  it("carries the last event id over and lets an empty id reset it", () => {
    expect(decodeAll(["id: 1\ndata: a\n\ndata: b\n\nid\ndata: c\n\nid: x\u0000y\ndata: d\n\n"])).toEqual([
      event("a", { id: "1" }),
      event("b", { id: "1" }),
      event("c"),
      event("d"),
    ])
  })

  it("applies the event type to one event only, and drops an event with no data", () => {
    expect(decodeAll(["event: ping\n\nevent: a\ndata: 1\n\ndata: 2\n\n"])).toEqual([
      event("1", { event: "a" }),
      event("2"),
    ])
  })

  it("records only an all-digit retry", () => {
    const decoder = new SseDecoder()
    decoder.push("retry: 2500\n\nretry: 1e3\n\nretry: -1\n\n")
    expect(decoder.retry).toBe(2500)
  })

  it("strips a leading byte-order mark once", () => {
    // a later BOM stays part of the field name, which is then unknown and ignored
    expect(decodeAll([utf8("\uFEFF"), utf8("data: a\n\n\uFEFFdata: b\n\n")])).toEqual([event("a")])
    expect(decodeAll([utf8("\uFEFF\uFEFFdata: a\n\n")])).toEqual([])
  })

  it("can be reused after end", () => {
    const decoder = new SseDecoder()
    decoder.push("id: 1\ndata: half")
    decoder.end()
    expect(decoder.push("data: b\n\n")).toEqual([event("b")])
  })
})

describe("decodeSse", () => {
  it.effect("decodes a chunked byte stream", () =>
    Effect.gen(function* () {
      const bytes = utf8(sample)
      const events = yield* Stream.runCollect(
        decodeSse(Stream.fromIterable(splitAt(bytes, [3, 17, 18, 40, 41, 42, 90]))),
      )
      expect(Chunk.toReadonlyArray(events)).toEqual(sampleEvents)
    }),
  )

  it.effect("starts afresh on every run", () =>
    Effect.gen(function* () {
      const stream = decodeSse(Stream.make(utf8("id: 1\ndata: a\n\ndata: trailing")))
      const first = yield* Stream.runCollect(stream)
      const second = yield* Stream.runCollect(stream)
      expect(Chunk.toReadonlyArray(second)).toEqual(Chunk.toReadonlyArray(first))
      expect(Chunk.toReadonlyArray(first)).toEqual([event("a", { id: "1" })])
    }),
  )

  it.effect("passes upstream failures through", () =>
    Effect.gen(function* () {
      const error = yield* Stream.runCollect(
        decodeSse(Stream.concat(Stream.make(utf8("data: a\n\n")), Stream.fail("upstream closed" as const))),
      ).pipe(Effect.flip)
      expect(error).toBe("upstream closed")
    }),
  )
})

describe("SseDecoder bounds", () => {
  it("a line or an event's data longer than maxEventChars stops the decoder", () => {
    const lines = new SseDecoder(100)
    expect(lines.push("data: ok\n\n")).toEqual([event("ok")])
    expect(lines.push(`data: ${"x".repeat(60)}`)).toEqual([])
    expect(lines.overflowed).toBe(false)
    expect(lines.push("y".repeat(60))).toEqual([])
    expect(lines.overflowed).toBe(true)
    expect(lines.push("\n\ndata: later\n\n")).toEqual([])
    const data = new SseDecoder(100)
    for (let i = 0; i < 3; i++) data.push(`data: ${"z".repeat(40)}\n`)
    expect(data.overflowed).toBe(true)
    expect(data.push("\n")).toEqual([])
    // A whole over-long line in one push, and reuse after end().
    const whole = new SseDecoder(100)
    expect(whole.push(`data: ${"w".repeat(200)}\n\n`)).toEqual([])
    expect(whole.overflowed).toBe(true)
    whole.end()
    expect(whole.push("data: again\n\n")).toEqual([event("again")])
  })
})
