/**
 * Token counting by the gateway itself (usage is never taken from a node):
 * `gpt-tokenizer` with o200k_base, and OpenAI's chat framing for prompts.
 */
import { countTokens, decode, encode } from "gpt-tokenizer"

/** Framing tokens around each message, and the reply primer, as OpenAI counts them. */
const PER_MESSAGE = 3
const REPLY_PRIMER = 3
/** Image inputs: 85 for `detail: low`, otherwise a 1024×1024 high-detail image's 765. */
export const IMAGE_TOKENS_LOW = 85
export const IMAGE_TOKENS_DEFAULT = 765

export interface CountableMessage {
  readonly content: string
  readonly name?: string | undefined
  readonly imageTokens: number
}

export const count = (text: string): number => (text.length === 0 ? 0 : countTokens(text))

export const promptTokens = (messages: ReadonlyArray<CountableMessage>): number => {
  let total = REPLY_PRIMER
  for (const m of messages) {
    total += PER_MESSAGE + count(m.content) + m.imageTokens
    if (m.name !== undefined) total += 1 + count(m.name)
  }
  return total
}

/** The longest prefix of `text` that is at most `tokens` tokens. */
export const truncate = (text: string, tokens: number): string =>
  tokens <= 0 ? "" : decode(encode(text).slice(0, tokens))
