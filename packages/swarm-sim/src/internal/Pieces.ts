const MAX_CHUNK = 10

/**
 * Splits text into word-like pieces that concatenate back to the text: each piece is
 * its leading whitespace plus one word (with its punctuation). Words too long to pass
 * as one token are split the way a BPE tokenizer would, without a leading space.
 * @internal
 */
export const toPieces = (text: string): Array<string> => {
  const pieces: Array<string> = []
  for (const match of text.matchAll(/\s*\S+|\s+$/g)) {
    const segment = match[0]
    if (segment.length < 15) {
      pieces.push(segment)
      continue
    }
    const lead = segment.length - segment.trimStart().length
    const word = segment.slice(lead)
    pieces.push(segment.slice(0, lead + MAX_CHUNK))
    for (let i = MAX_CHUNK; i < word.length; i += MAX_CHUNK) {
      pieces.push(word.slice(i, i + MAX_CHUNK))
    }
  }
  return pieces
}
