/**
 * The o200k_base encoding, its ranks read from the library's own data file
 * (`gpt-tokenizer/data/o200k_base.tiktoken`: a base64 token and its rank per
 * line) rather than from its generated module, a 2.2 MB array literal. Parsing
 * that module as JavaScript left ~20 MB of the parser's memory with the
 * process for good (glibc keeps it) and made it a third of the server's
 * bundle; read as data, the same table costs its strings and map only.
 *
 * Each token is what the library's generator (`src/codegen/generateJsBpe.ts`)
 * makes of it: its text when the bytes are UTF-8 that encodes back to the
 * same length (a leading byte-order mark does not: the decoder drops it),
 * otherwise the bytes. A test holds the table equal to the module's.
 */
import { readFileSync } from "node:fs"
import { createRequire } from "node:module"
import { GptEncoding } from "gpt-tokenizer/GptEncoding"

export type Rank = string | Array<number>

const utf8 = new TextDecoder("utf-8", { fatal: true })

/** A token's bytes as the library's table holds them. */
const tokenOf = (bytes: Buffer): Rank => {
  let ascii = true
  for (let i = 0; i < bytes.length; i++) {
    if (bytes[i]! >= 0x80) {
      ascii = false
      break
    }
  }
  if (ascii) return bytes.toString("latin1")
  try {
    const text = utf8.decode(bytes)
    if (Buffer.byteLength(text) === bytes.length) return text
  } catch {
    // Not UTF-8 on its own (part of a character): kept as bytes.
  }
  return Array.from(bytes)
}

/** The ranks in `text` (a `.tiktoken` file): index = rank; a rank the file skips is "" (as the library's). */
export const parseRanks = (text: string): Array<Rank> => {
  const ranks: Array<Rank> = []
  let at = 0
  while (at < text.length) {
    let end = text.indexOf("\n", at)
    if (end < 0) end = text.length
    const space = text.indexOf(" ", at)
    if (space < 0 || space > end) throw new Error(`o200k_base: malformed line at offset ${at}`)
    const rank = Number.parseInt(text.slice(space + 1, end), 10)
    // Ranks come in ascending order: a bad or repeated one is a broken file, never a silent overwrite.
    if (!Number.isSafeInteger(rank) || rank < ranks.length)
      throw new Error(`o200k_base: bad or repeated rank at offset ${at}`)
    while (ranks.length < rank) ranks.push("")
    ranks[rank] = tokenOf(Buffer.from(text.slice(at, space), "base64"))
    at = end + 1
  }
  return ranks
}

const dataFile = () => createRequire(import.meta.url).resolve("gpt-tokenizer/data/o200k_base.tiktoken")

/** Read once, at the first import; the file ships with the library, so a failure here is a broken install. */
export const encoding = GptEncoding.getEncodingApi("o200k_base", () =>
  parseRanks(readFileSync(dataFile(), "latin1")),
)
