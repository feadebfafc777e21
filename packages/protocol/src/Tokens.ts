/**
 * Token counting by the gateway itself (usage is never taken from a node):
 * `gpt-tokenizer` with o200k_base, and OpenAI's chat framing for prompts.
 *
 * The text is untrusted (prompts, node output), so counting never throws and
 * stays linear in the text:
 * - special-token text such as `<|endoftext|>` is ordinary text here (the
 *   library refuses it by default, which would be a 500);
 * - the library merges each pre-tokenizer piece in time quadratic in the
 *   piece's length (100,000 CJK characters in one piece take over a minute),
 *   so a piece longer than `MAX_PIECE` characters — an unbroken run of
 *   whitespace, of one repeated character, or of unpunctuated CJK — is counted
 *   in slices of `MAX_PIECE`. Every other piece, so all ordinary text, is
 *   counted exactly.
 */
import * as crypto from "node:crypto"
import { O200K_TOKEN_SPLIT_REGEX } from "gpt-tokenizer/encodingParams/constants"
import { encoding } from "./internal/O200kBase"

const { countTokens, decode, encode } = encoding

/** Framing tokens around each message, and the reply primer, as OpenAI counts them. */
const PER_MESSAGE = 3
const REPLY_PRIMER = 3
/** Image inputs: 85 for `detail: low`, otherwise a 1024×1024 high-detail image's 765. */
export const IMAGE_TOKENS_LOW = 85
export const IMAGE_TOKENS_DEFAULT = 765

/** Longest pre-tokenizer piece counted whole (a 128-character piece costs well under a millisecond). */
export const MAX_PIECE = 128

/** Characters of ordinary text cut at once by `segments` (`truncate`); longer messages are not remembered. */
const STRETCH = 65_536

const PLAIN = { disallowedSpecial: new Set<string>() }

export interface CountableMessage {
  readonly content: string
  readonly name?: string | undefined
  readonly imageTokens: number
}

const isHighSurrogate = (code: number) => code >= 0xd800 && code <= 0xdbff

function* slices(text: string): Generator<string> {
  for (let i = 0; i < text.length; ) {
    let end = Math.min(text.length, i + MAX_PIECE)
    if (end < text.length && isHighSurrogate(text.charCodeAt(end - 1))) end--
    yield text.slice(i, end)
    i = end
  }
}

/** `text` in consecutive parts the library may count whole: ordinary stretches, and long pieces in slices. */
function* segments(text: string): Generator<string> {
  if (text.length <= MAX_PIECE) {
    yield text
    return
  }
  let from = 0
  const pieces = text.matchAll(O200K_TOKEN_SPLIT_REGEX)
  while (true) {
    let next: IteratorResult<RegExpExecArray>
    try {
      next = pieces.next()
    } catch {
      // The split regex runs out of backtracking stack on a run of millions of letters: slice the rest.
      yield* slices(text.slice(from))
      return
    }
    if (next.done) break
    const piece = next.value[0]
    if (piece.length <= MAX_PIECE) {
      // Ordinary text goes out in stretches, so that a caller's limit can stop the scan early.
      if (next.value.index - from >= STRETCH) {
        yield text.slice(from, next.value.index)
        from = next.value.index
      }
      continue
    }
    if (next.value.index > from) yield text.slice(from, next.value.index)
    yield* slices(piece)
    from = next.value.index + piece.length
  }
  if (from < text.length) yield text.slice(from)
}

/**
 * Counts of short texts (a streamed token, a short message): a node's deltas
 * repeat the same few thousand strings, and a map lookup costs a small part
 * of a count. Bounded: emptied when full.
 */
const SHORT_TEXT = 32
const SHORT_CACHE_MAX = 16_384
const shortCounts = new Map<string, number>()

/** Puts `n` under `key` in a cache of at most `max` entries (emptied when full); returns `n`. */
const remember = (cache: Map<string, number>, max: number, key: string, n: number): number => {
  if (cache.size >= max) cache.clear()
  cache.set(key, n)
  return n
}

/**
 * The split regex, one instance driven by `lastIndex`: no match iterator per
 * text, and no match array per piece (`test`, not `exec`). Every character
 * starts a match of one of its alternatives (a letter, a number, a space, or
 * anything else as a symbol run), so the pieces are contiguous: each starts
 * where the last ended (test/FuzzTokens.test.ts holds this on hostile text).
 */
const SPLIT = new RegExp(O200K_TOKEN_SPLIT_REGEX.source, O200K_TOKEN_SPLIT_REGEX.flags)

/**
 * Pieces shorter than this are remembered by their text. V8 makes a substring
 * of 13 or more characters a view of the string it was cut from: remembering
 * one would keep the whole text (a prompt, an answer) alive.
 */
const REMEMBERED_PIECE = 13

/** `total` plus the tokens of `text` in slices of `MAX_PIECE`, stopping once past `limit`. */
const slicedCount = (text: string, total: number, limit: number): number => {
  for (const slice of slices(text)) {
    total += countTokens(slice, PLAIN)
    if (total > limit) return total
  }
  return total
}

/** Tokens of one pre-tokenizer piece of at most `MAX_PIECE` characters. */
const pieceCount = (piece: string): number => {
  if (piece.length >= REMEMBERED_PIECE) return countTokens(piece, PLAIN)
  const known = shortCounts.get(piece)
  return known ?? remember(shortCounts, SHORT_CACHE_MAX, piece, countTokens(piece, PLAIN))
}

/**
 * Tokens of `text`: exact while at most `limit`; past it, some number above
 * `limit` (counting stops early, so a huge text costs what the limit allows).
 *
 * The sum of its pieces' counts: the library splits a text with the same
 * regex and merges within each piece only, so this is its count, piece by
 * piece — and most pieces are words met before, a map lookup instead of the
 * library's per-piece work (an 80-character answer: ~2× faster).
 */
export const count = (text: string, limit = Number.POSITIVE_INFINITY): number => {
  if (text.length === 0) return 0
  if (text.length <= SHORT_TEXT) {
    // Counted whole whatever the limit: the same number as below.
    const known = shortCounts.get(text)
    return known ?? remember(shortCounts, SHORT_CACHE_MAX, text, countTokens(text, PLAIN))
  }
  let total = 0
  let from = 0
  SPLIT.lastIndex = 0
  try {
    // An empty match would not move on (the split has none: every alternative takes a character).
    while (SPLIT.test(text) && SPLIT.lastIndex > from) {
      const to = SPLIT.lastIndex
      // A long piece in slices, as `segments` cuts it; the limit is looked at after each.
      total =
        to - from <= MAX_PIECE
          ? total + pieceCount(text.slice(from, to))
          : slicedCount(text.slice(from, to), total, limit)
      if (total > limit) return total
      from = to
    }
  } catch {
    // The split regex runs out of backtracking stack on a run of millions of letters.
  }
  // What the split did not reach (that run) is counted in slices.
  return from < text.length ? slicedCount(text.slice(from), total, limit) : total
}

/**
 * Exact counts of prompt messages, by a SHA-256 of their text: a conversation
 * sends its whole history again with each turn, and many requests share one
 * system prompt, so most of a long prompt was counted before. Hashing costs a
 * few percent of counting (4,000 characters: ~5 µs against ~200–400 µs on the
 * team's VM), and the prompts themselves are not kept. The key is the hash of
 * the caller's scope (the account: a hit is faster, and must not tell one
 * account what another sent), a NUL and the text, as UTF-8 in one call
 * (`crypto.hash`, Node ≥ 20.12: a third of a Hash object's cost for a short
 * message). Only well-formed texts are remembered: UTF-8 makes every lone
 * surrogate U+FFFD, so two texts that count differently would share a key.
 * Texts longer than `STRETCH` are not remembered either: hashing them would
 * cost what the limit saves. Bounded: emptied when full.
 */
const MESSAGE_CACHE_MAX = 16_384
const messageCounts = new Map<string, number>()

const sha256 =
  (crypto as { hash?: typeof crypto.hash }).hash !== undefined
    ? (text: string) => crypto.hash("sha256", text, "base64")
    : (text: string) => crypto.createHash("sha256").update(text, "utf8").digest("base64")

/** ES2024's `String.prototype.isWellFormed` (V8 in Node 20 has it; the project's lib is ES2022). */
const isWellFormed = (text: string): boolean =>
  (text as unknown as { isWellFormed(): boolean }).isWellFormed()

/** `count` of a prompt message's text, remembered when exact. */
const messageCount = (text: string, limit: number, scope: string): number => {
  if (text.length <= SHORT_TEXT || text.length > STRETCH || !isWellFormed(text)) return count(text, limit)
  const key = sha256(`${scope}\u0000${text}`)
  const known = messageCounts.get(key)
  // Exact, so also right when above `limit` ("some number above it").
  if (known !== undefined) return known
  const n = count(text, limit)
  return n <= limit ? remember(messageCounts, MESSAGE_CACHE_MAX, key, n) : n
}

/**
 * The prompt's tokens: exact while at most `limit`, otherwise some number above
 * it. Message counts are remembered per `scope` (the gateway's: the account).
 */
export const promptTokens = (
  messages: ReadonlyArray<CountableMessage>,
  limit = Number.POSITIVE_INFINITY,
  scope = "",
): number => {
  let total = REPLY_PRIMER
  for (const m of messages) {
    total += PER_MESSAGE + messageCount(m.content, limit - total, scope) + m.imageTokens
    if (m.name !== undefined) total += 1 + count(m.name, limit - total)
    if (total > limit) return total
  }
  return total
}

/** The longest prefix of `text` that is at most `tokens` tokens. */
export const truncate = (text: string, tokens: number): string => {
  if (tokens <= 0) return ""
  let kept = ""
  let used = 0
  for (const segment of segments(text)) {
    const ids = encode(segment, PLAIN)
    if (used + ids.length > tokens) {
      let cut = decode(ids.slice(0, tokens - used))
      // A cut inside a character decodes to U+FFFD, and a cut text may encode to more tokens than
      // it was cut from: shorten it until it is a prefix that fits.
      while (cut.length > 0 && (!segment.startsWith(cut) || count(cut) > tokens - used))
        cut = cut.slice(0, -1)
      return kept + cut
    }
    kept += segment
    used += ids.length
  }
  return kept
}
