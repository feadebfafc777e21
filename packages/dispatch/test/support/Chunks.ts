/**
 * Chunks of a node's stream for property tests: mostly the common shape (the
 * same bytes around each text), sometimes not — other fields, spacing,
 * "content" in other places, errors, texts with quotes, escapes, control
 * characters and non-ASCII, written as JSON.stringify does, with \u escapes,
 * or raw (invalid JSON).
 */
import fc from "fast-check"

export const text = fc.oneof(
  fc.constantFrom("the", " the", "x"),
  fc.string({ unit: "grapheme", maxLength: 6 }),
  fc.string({
    unit: fc.constantFrom("a", '"', "\\", "\n", "\u0000", "\u001f", "é", "😀", "/"),
    maxLength: 5,
  }),
)

/** How a chunk's text is written as a JSON literal: as JSON.stringify does, with \u escapes, or raw (invalid). */
export const literal = fc.oneof(
  text.map((t) => JSON.stringify(t)),
  text.map((t) => `"${[...t].map((ch) => `\\u${ch.charCodeAt(0).toString(16).padStart(4, "0")}`).join("")}"`),
  text.map((t) => `"${t}"`),
)

export const head =
  '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":'

/** One chunk of a stream, mostly in the common shape, sometimes not. */
export const chunk = fc.oneof(
  { weight: 6, arbitrary: literal.map((l) => `${head}{"content":${l}},"finish_reason":null}]}`) },
  { weight: 1, arbitrary: literal.map((l) => `${head}{"content": ${l} },"finish_reason":"length"}]}`) },
  {
    weight: 1,
    arbitrary: literal.map((l) => `${head}{"role":"assistant","content":${l}},"finish_reason":null}]}`),
  },
  {
    weight: 1,
    arbitrary: fc
      .tuple(literal, literal)
      .map(([a, b]) => `${head}{"content":${a},"content":${b}},"finish_reason":null}]}`),
  },
  {
    weight: 1,
    arbitrary: fc
      .tuple(literal, literal)
      .map(
        ([a, b]) => `${head}{"content":${a}},"logprobs":{"content":[{"token":${b}}]},"finish_reason":null}]}`,
      ),
  },
  {
    weight: 1,
    arbitrary: literal.map(
      (l) => `{"choices":[{"index":1,"delta":{"content":"x"}},{"delta":{"content":${l}}}]}`,
    ),
  },
  {
    weight: 1,
    arbitrary: literal.map((l) => `${head}{"content":${l}},"finish_reason":null}],"error":{"message":${l}}}`),
  },
  { weight: 1, arbitrary: literal.map((l) => `${head}{"content":${l}},"finish_reason":null}]}x`) },
  {
    weight: 1,
    arbitrary: literal.map((l) => `${head}{"content":${l}},"finish_reason":null}],"error":null}`),
  },
  {
    weight: 1,
    arbitrary: fc.constantFrom(
      `${head}{},"finish_reason":"stop"}]}`,
      '{"choices":[],"usage":{"prompt_tokens":1}}',
      '{"error":"overloaded"}',
      "null",
      "5",
      '"content"',
      "[]",
      "{",
    ),
  },
)

/** The reading without a template: one `JSON.parse` per chunk. */
export const reference = (data: string) => {
  let chunk: unknown
  try {
    chunk = JSON.parse(data)
  } catch {
    return undefined
  }
  if (typeof chunk !== "object" || chunk === null)
    return { content: undefined, finishReason: undefined, error: undefined }
  const c = chunk as {
    choices?: unknown
    error?: unknown
  }
  const error = c.error
  const choice = Array.isArray(c.choices)
    ? (c.choices[0] as { delta?: { content?: unknown } | null; finish_reason?: unknown } | null | undefined)
    : undefined
  const content = choice?.delta?.content
  const finish = choice?.finish_reason
  return {
    content: typeof content === "string" ? content : undefined,
    finishReason: typeof finish === "string" ? finish : undefined,
    error:
      error === undefined || error === null
        ? undefined
        : typeof error === "string"
          ? error
          : typeof (error as { message?: unknown }).message === "string"
            ? ((error as { message: string }).message as string)
            : "",
  }
}
