/**
 * A node's chunk shapes, learned by its first streams and kept for the rest,
 * read exactly what `JSON.parse` of every chunk gives: checked on generated
 * nodes whose streams differ in their ids, numbers, models and extra fields
 * (plain, escaped, malformed), carry role, text, finish, usage, error and odd
 * chunks, in two spacings, some cut or grown by a character.
 */
import { describe, expect, it } from "@effect/vitest"
import fc from "fast-check"
import { ChunkParser } from "../src/ChunkParser"
import { ChunkShapes } from "../src/ChunkShapes"
import { chunk, literal, reference } from "./support/Chunks"

const plain = fc.string({
  unit: fc.constantFrom("a", "Z", "1", "-", "_", " ", "é", "😀", "/", ":"),
  maxLength: 8,
})
/** A string value: mostly plain, sometimes escaped or not JSON at all. */
const stringValue = fc.oneof(
  { weight: 4, arbitrary: plain.map((t) => JSON.stringify(t)) },
  { weight: 1, arbitrary: literal },
)
/** A number value: mostly what nodes send, sometimes JSON's other forms, sometimes not JSON. */
const numberValue = fc.oneof(
  { weight: 4, arbitrary: fc.integer({ min: 0, max: 2_000_000_000 }).map(String) },
  { weight: 1, arbitrary: fc.double({ noNaN: true, noDefaultInfinity: true }).map(String) },
  {
    weight: 1,
    arbitrary: fc.constantFrom(
      "-1",
      "0",
      "1.5",
      "-0.25e3",
      "1E+2",
      "2e-3",
      "01",
      "1.",
      "-",
      "1e",
      "+1",
      ".5",
    ),
  },
)

interface Stream {
  readonly id: string
  readonly created: string
  readonly model: string
  readonly extra: string
  readonly spaced: boolean
  readonly chunks: ReadonlyArray<(s: Stream) => string>
}

const head = (s: Stream) =>
  s.spaced
    ? `{ "id": ${s.id}, "object": "chat.completion.chunk", "created": ${s.created}, "model": ${s.model}${s.extra}, "choices": [ { "index": 0, "delta": `
    : `{"id":${s.id},"object":"chat.completion.chunk","created":${s.created},"model":${s.model}${s.extra},"choices":[{"index":0,"delta":`

const finishValue = fc.constantFrom('"stop"', '"length"', "null", "1", '"st\\u006fp"')

/** Structures that trap a walk which follows the wrong value, each filled with two literals. */
const odd: ReadonlyArray<(a: string, b: string) => string> = [
  (a, b) => `{"choices":[{"delta":{"con\\u0074ent":${a},"role":${b}}}]}`,
  (a, b) => `{"ch\\u006fices":[{"delta":{"content":${a}}}],"choices":[{"delta":{"content":${b}}}]}`,
  (a, b) => `{"__proto__":{"content":${a}},"choices":[{"delta":{"content":${b}}}]}`,
  (a, b) => `[${a},{"choices":[{"delta":{"content":${b}}}]}]`,
  (a, b) => `{"choices":{"0":{"delta":{"content":${a}}},"x":${b}}}`,
  (a, b) => `{"choices":[{"message":{"content":${a}},"delta":{"content":${b}}}]}`,
  (a, b) => `{"choices":[{"delta":{"content":${a}},"message":{"content":${b}}}]}`,
  (a, b) => `{"choices":[{"delta":{},"logprobs":{"content":${a}},"x":${b}}]}`,
  (a, b) => `{"choices":[{"delta":{"content":${a}}},{"delta":{"content":${b}}}]}`,
  (a, b) => `{"choices":[[{"delta":{"content":${a}}}],{"delta":{"content":${b}}}]}`,
  (a, b) => `{"choices":[{"delta":[{"content":${a}}],"finish_reason":${b}}]}`,
  (a, b) => `{\n\t"choices" :\r\n[ {"delta":{ "content" :${a} } ,"finish_reason"\t:${b}} ] }`,
  (a, b) => `{"x":[[1,[2,${a}]],{"y":[]}],"choices":[{"delta":{"content":${b}}}]}`,
  (a, b) => `{"choices":[{"delta":{"content":null,"c":${a}},"finish_reason":${b}}]}`,
  (a, b) => `{"choices":[{"delta":{"content":{"a":${a}}},"finish_reason":"stop","f":${b}}]}`,
  (a, b) => `{"choices":[{"delta":{},"finish_reason":{"x":${a}}}],"y":${b}}`,
  (a, b) => `{"error":null,"choices":[{"delta":{"content":${a}}}],"e":${b}}`,
  (a, b) => `{"error":{"message":${a}},"choices":[{"delta":{"content":${b}}}]}`,
  (a, b) => `{"error":${a},"choices":[{"delta":{"content":${b}}}]}`,
  (a, b) =>
    `{"n":[${Array.from({ length: 70 }, (_, i) => i).join(",")}],"s":${a},"choices":[{"delta":{"content":${b}}}]}`,
]

/** One chunk of a stream, given the stream's own values. */
const streamChunk: fc.Arbitrary<(s: Stream) => string> = fc.oneof(
  {
    weight: 2,
    arbitrary: fc.constant(
      (s: Stream) => `${head(s)}{"role":"assistant","content":""},"finish_reason":null}]}`,
    ),
  },
  {
    weight: 6,
    arbitrary: literal.map((l) => (s: Stream) => `${head(s)}{"content":${l}},"finish_reason":null}]}`),
  },
  { weight: 2, arbitrary: finishValue.map((f) => (s: Stream) => `${head(s)}{},"finish_reason":${f}}]}`) },
  {
    weight: 1,
    arbitrary: fc.tuple(numberValue, stringValue).map(
      ([n, v]) =>
        (s: Stream) =>
          `{"id":${s.id},"created":${s.created},"choices":[],"usage":{"prompt_tokens":${n},"note":${v}}}`,
    ),
  },
  {
    weight: 1,
    arbitrary: fc.tuple(stringValue, literal).map(
      ([v, l]) =>
        (s: Stream) =>
          `${head(s)}{"content":${l},"obfuscation":${v}},"finish_reason":null}]}`,
    ),
  },
  {
    weight: 1,
    arbitrary: literal.map(
      (l) => (s: Stream) => `${head(s)}{"content":${l}},"finish_reason":null}],"error":{"message":"x"}}`,
    ),
  },
  { weight: 1, arbitrary: chunk.map((c) => () => c) },
  {
    weight: 3,
    arbitrary: fc.tuple(fc.nat({ max: odd.length - 1 }), fc.oneof(stringValue, numberValue), literal).map(
      ([i, a, b]) =>
        () =>
          odd[i]!(a, b),
    ),
  },
)

/** A chunk cut or grown by one character somewhere: mostly not JSON any more. */
const mutated = (data: string, at: number, insert: string | undefined) => {
  const i = at % (data.length + 1)
  return insert === undefined
    ? data.slice(0, i) + data.slice(i + 1)
    : data.slice(0, i) + insert + data.slice(i)
}

const stream: fc.Arbitrary<
  Stream & { readonly mutations: ReadonlyArray<[number, number, string | undefined]> }
> = fc.record({
  id: stringValue,
  created: numberValue,
  model: stringValue,
  extra: fc.oneof(
    fc.constant(""),
    stringValue.map((v) => `,"system_fingerprint":${v}`),
    fc.constant(',"system_fingerprint":null'),
    numberValue.map((n) => `,"x":[${n},{"y":${n}}]`),
  ),
  spaced: fc.boolean(),
  chunks: fc.array(streamChunk, { minLength: 1, maxLength: 8 }),
  mutations: fc.array(
    fc.tuple(
      fc.nat(),
      fc.nat(),
      fc.option(fc.constantFrom('"', "\\", "1", ",", "}", " ", "\u0001", "x"), { nil: undefined }),
    ),
    { maxLength: 2 },
  ),
})

const read = (parser: ChunkParser, data: string) => {
  const fields = parser.parse(data)
  return fields === undefined ? undefined : { ...fields }
}

describe("ChunkShapes", () => {
  it("a node's streams, read through the shapes its first streams taught, give what JSON.parse gives", () => {
    fc.assert(
      fc.property(fc.array(stream, { minLength: 1, maxLength: 12 }), (streams) => {
        const shapes = new ChunkShapes()
        for (const s of streams) {
          const parser = new ChunkParser(shapes)
          s.chunks.forEach((make, i) => {
            const mutation = s.mutations.find(([index]) => index % s.chunks.length === i)
            const data = mutation === undefined ? make(s) : mutated(make(s), mutation[1], mutation[2])
            expect(read(parser, data)).toEqual(reference(data))
          })
        }
      }),
      { numRuns: 3000 },
    )
  })

  it("each structure, learned from one chunk, reads the next with other values as JSON.parse would", () => {
    const value = fc.oneof(stringValue, numberValue, literal)
    fc.assert(
      fc.property(
        fc.nat({ max: odd.length - 1 }),
        fc.array(fc.tuple(value, value), { minLength: 2, maxLength: 4 }),
        (i, fills) => {
          const shapes = new ChunkShapes()
          for (const [a, b] of fills) {
            const data = odd[i]!(a, b)
            expect(read(new ChunkParser(shapes), data)).toEqual(reference(data))
          }
        },
      ),
      { numRuns: 3000 },
    )
  })

  it("a node's later streams begin without a full parse", () => {
    const shapes = new ChunkShapes()
    const chunks = (n: number) => {
      const s: Stream = {
        id: `"chatcmpl-${n}"`,
        created: String(1_700_000_000 + n),
        model: '"m"',
        extra: "",
        spaced: false,
        chunks: [],
      }
      return [
        `${head(s)}{"role":"assistant","content":""},"finish_reason":null}]}`,
        ...["Hello", " there", "!"].map(
          (t) => `${head(s)}{"content":${JSON.stringify(t)}},"finish_reason":null}]}`,
        ),
        `${head(s)}{},"finish_reason":"stop"}]}`,
      ]
    }
    const parse = JSON.parse
    let parses = 0
    JSON.parse = ((text: string) => {
      parses++
      return parse(text)
    }) as typeof JSON.parse
    try {
      const readAll = (n: number) => {
        const parser = new ChunkParser(shapes)
        return chunks(n).map((data) => read(parser, data))
      }
      const first = readAll(1)
      const learning = parses
      parses = 0
      const second = readAll(2)
      expect(parses).toBe(0)
      expect(learning).toBeGreaterThan(0)
      expect(second).toEqual(first)
      expect(second.map((f) => f?.content)).toEqual(["", "Hello", " there", "!", undefined])
      expect(second.at(-1)?.finishReason).toBe("stop")
      // Another finish reason is another shape: parsed (and its shape proven: a second parse), not read as "stop".
      const parser = new ChunkParser(shapes)
      expect(read(parser, chunks(3)[4]!.replace('"stop"', '"length"'))?.finishReason).toBe("length")
      expect(parses).toBe(2)
    } finally {
      JSON.parse = parse
    }
    expect(shapes.size).toBe(4)
  })

  it("learns nothing from a chunk with a key twice, an error, or nesting deeper than chunks go", () => {
    const shapes = new ChunkShapes()
    const learn = (data: string) => shapes.learn(data, new ChunkParser().parse(data)!)
    learn('{"choices":[{"delta":{"content":"a","content":"b"}}]}')
    learn('{"choices":[{"delta":{"con\\u0074ent":"a","content":"b"}}]}')
    learn('{"choices":[{"delta":{"content":"a"}}],"error":{"message":"down"}}')
    const deep = `{"choices":[{"delta":{"content":"hi"}}],"x":${"[".repeat(5_000)}${"]".repeat(5_000)}}`
    learn(deep)
    expect(shapes.size).toBe(0)
    // What it did not learn, a parser with the shapes still reads as JSON.parse does.
    expect(new ChunkParser(shapes).parse(deep)?.content).toBe("hi")
  })

  it("a hole takes any string literal with valid escapes, and nothing else", () => {
    const shapes = new ChunkShapes()
    const data = '{"id":"c\\u0031","choices":[{"delta":{"content":"a"}}]}'
    shapes.learn(data, new ChunkParser().parse(data)!)
    expect(shapes.size).toBe(1)
    const chunk = (id: string) => `{"id":${id},"choices":[{"delta":{"content":"zz"}}]}`
    for (const id of ['"c2"', '"\\n\\t\\"\\\\\\/\\b\\f\\r\\uABcd"', '""'])
      expect(shapes.match(chunk(id))).toBe(0)
    for (const id of ['"\\x"', '"\\u12g4"', '"a\u0001"', '"a', "7", "null"])
      expect(shapes.match(chunk(id))).toBe(-1)
  })
})
