/**
 * What the gateway reads from a node's `chat.completion.chunk`, and the
 * little text scanning its readers share (`ChunkParser`, `ChunkShapes`).
 */

/** What one chunk says: the text, the finish reason, the node's error message. */
export interface ChunkFields {
  content: string | undefined
  finishReason: string | undefined
  error: string | undefined
}

interface ChoiceChunk {
  readonly choices?: ReadonlyArray<{
    readonly delta?: { readonly content?: unknown } | null
    readonly finish_reason?: unknown
  } | null> | null
  readonly error?: { readonly message?: unknown } | string | null
}

/** The fields of a parsed chunk (an object), into `into`: `choices[0].delta.content`, `choices[0].finish_reason`, `error`. */
export const fieldsOf = (parsed: object, into: ChunkFields): ChunkFields => {
  const chunk = parsed as ChoiceChunk
  const error = chunk.error
  into.error =
    error === undefined || error === null
      ? undefined
      : typeof error === "string"
        ? error
        : typeof error.message === "string"
          ? error.message
          : ""
  const choice = Array.isArray(chunk.choices) ? chunk.choices[0] : undefined
  const content = choice?.delta?.content
  into.content = typeof content === "string" ? content : undefined
  const finish = choice?.finish_reason
  into.finishReason = typeof finish === "string" ? finish : undefined
  return into
}

export const QUOTE = 34
export const BACKSLASH = 92

/** JSON's whitespace between tokens: space, tab, line feed, carriage return. */
export const isWhitespace = (c: number) => c === 32 || c === 9 || c === 10 || c === 13

/** The index of the quote that closes the string literal opened just before `from`, or -1. */
export const closingQuote = (text: string, from: number): number => {
  for (let i = from; i < text.length; i++) {
    const c = text.charCodeAt(i)
    if (c === QUOTE) return i
    if (c === BACKSLASH) i++
  }
  return -1
}

/**
 * A copy that does not keep the socket read it was sliced from alive: slicing a
 * concatenation flattens it into a new string of its own length first.
 */
export const own = (text: string) => `${text} `.slice(0, -1)
