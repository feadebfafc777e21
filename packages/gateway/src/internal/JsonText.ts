/**
 * The inside of `text`'s JSON string literal (what JSON.stringify writes
 * between the quotes). A streamed token is a few characters that need no
 * escape: a look at each is a third of JSON.stringify's cost, which also
 * makes a new string. Escaped: a quote, a backslash, a control character, a
 * surrogate (a lone one is written as `\uXXXX`; a pair is left to
 * JSON.stringify too, for simplicity).
 */
export const jsonInside = (text: string): string => {
  if (text.length <= LOOKED_AT) {
    let i = 0
    for (; i < text.length; i++) {
      const c = text.charCodeAt(i)
      if (c < 32 || c === 34 || c === 92 || (c >= 0xd800 && c <= 0xdfff)) break
    }
    if (i === text.length) return text
  }
  return JSON.stringify(text).slice(1, -1)
}

/** Longer texts are rare among tokens, and JSON.stringify's own scan is native. */
const LOOKED_AT = 32
