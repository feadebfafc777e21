/**
 * The chunk parser reads exactly what `JSON.parse` of every chunk would give,
 * whether a chunk is read in full or from a stream's template: checked on
 * generated streams whose chunks share prefixes, differ in their text (quotes,
 * escapes, control characters, non-ASCII), in their other fields, in their
 * spacing, and carry "content" in other places.
 */
import { describe, expect, it } from "@effect/vitest"
import fc from "fast-check"
import { ChunkParser, PROBES } from "../src/ChunkParser"
import { chunk, head, literal, reference } from "./support/Chunks"

const read = (parser: ChunkParser, data: string) => {
  const fields = parser.parse(data)
  return fields === undefined ? undefined : { ...fields }
}

/** Chunk shapes that trap a template taken from the wrong literal. */
const shapes: ReadonlyArray<(l: string) => string> = [
  (l) => `${head}{"content":${l}},"finish_reason":null}]}`,
  (l) => `{"choices":[{"message":{"content":"lead"},"delta":{"content":${l}}}]}`,
  (l) => `${head}{"content":"first","content":${l}},"finish_reason":null}]}`,
  (l) => `{"choices":[{"index":1,"delta":{"content":"x"}},{"delta":{"content":${l}}}]}`,
  (l) => `{"error":{"content":${l}},"choices":[{"delta":{"content":${l}}}]}`,
  (l) => `${head}{"content":${l}},"finish_reason":"length"}]}`,
  // The node's own text equal to a probe: a literal elsewhere must not pass for the content.
  (l) => `{"a":{"content":${l}},"choices":[{"delta":{"content":${JSON.stringify(PROBES[0])}}}]}`,
  (l) => `{"choices":[{"delta":{"content":${l},"content":${JSON.stringify(PROBES[1])}}}]}`,
]

describe("ChunkParser", () => {
  it("reads streams of one or two shapes, each chunk as JSON.parse would", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: shapes.length - 1 }),
        fc.integer({ min: 0, max: shapes.length - 1 }),
        fc.array(fc.tuple(fc.boolean(), literal), { maxLength: 20 }),
        (a, b, stream) => {
          const parser = new ChunkParser()
          for (const [second, l] of stream) {
            const data = shapes[second ? b : a]!(l)
            expect(read(parser, data)).toEqual(reference(data))
          }
        },
      ),
      { numRuns: 1000 },
    )
  })

  it("reads every chunk of a stream as JSON.parse would", () => {
    fc.assert(
      fc.property(fc.array(chunk, { maxLength: 30 }), (stream) => {
        const parser = new ChunkParser()
        for (const data of stream) expect(read(parser, data)).toEqual(reference(data))
      }),
      { numRuns: 500 },
    )
  })

  it("reads a common stream's chunks from its template: same text as a full parse", () => {
    const parser = new ChunkParser()
    const tokens = ["Hello", ",", ' wor\\"ld', "\\u00e9", " \\n", "😀"]
    const got = tokens.map((t) => parser.parse(`${head}{"content":"${t}"},"finish_reason":null}]}`)?.content)
    expect(got).toEqual(["Hello", ",", ' wor"ld', "é", " \n", "😀"])
    expect(parser.parse(`${head}{},"finish_reason":"stop"}]}`)).toEqual({
      content: undefined,
      finishReason: "stop",
      error: undefined,
    })
    // A raw control character is not JSON: not read from the template either.
    expect(parser.parse(`${head}{"content":"a\u0001"},"finish_reason":null}]}`)).toBeUndefined()
  })
})
