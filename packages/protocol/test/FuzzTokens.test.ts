/**
 * Token counting on hostile text: it never throws, costs linear time, counts
 * ordinary text exactly as gpt-tokenizer does, and keeps its promises about
 * limits and truncation for any input.
 */
import { describe, expect, it } from "@effect/vitest"
import fc from "fast-check"
import { countTokens } from "gpt-tokenizer"
import { O200K_TOKEN_SPLIT_REGEX } from "gpt-tokenizer/encodingParams/constants"
import * as Tokens from "../src/Tokens"

const PLAIN = { disallowedSpecial: new Set<string>() }

/** Words, numbers, punctuation, whitespace and non-Latin scripts in short runs: text as people write it. */
const ordinary = fc
  .array(
    fc.oneof(
      fc.constantFrom("the", " river", " valley", "Ünïcode", " 漢字", "。", " שלום", " 😀", "\n", "\t", "  "),
      fc.stringMatching(/^[ -~]{0,12}$/),
      fc.string({ maxLength: 8, unit: "grapheme" }),
    ),
    { maxLength: 400 },
  )
  .map((parts) => parts.join(""))

/** Anything, including long runs of one character class and special-token text. */
const hostile = fc.oneof(
  ordinary,
  fc.string({ unit: "binary", maxLength: 300 }),
  fc
    .tuple(
      fc.constantFrom(" ", "a", "漢", "\n", "=", "\u0301", "1", "<|endoftext|>", "\ud800"),
      fc.nat({ max: 2_000 }),
    )
    .map(([c, n]) => c.repeat(n)),
)

/** Runs of each kind of character the split regex treats apart, of any length around MAX_PIECE / 2. */
const runs = fc
  .array(
    fc
      .tuple(
        fc.constantFrom(
          ...["a", "A", "漢", "😀", "\u0301", "'s", "!", "=", "/", "\n", "\r", " ", "\t", "1", "\ud800", "é"],
          // Every kind of space JavaScript's \s knows, and neighbours it does not (NEL, zero-width space).
          ...["\v", "\f", "\u00a0", "\u1680", "\u2000", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f"],
          ...["\u3000", "\ufeff", "\u0085", "\u200b", "\u180e", "\u1fff", "\u2030"],
        ),
        fc.nat({ max: 140 }),
      )
      .map(([c, n]) => c.repeat(n)),
    { maxLength: 12 },
  )
  .map((parts) => parts.join(""))

describe("Tokens", () => {
  it("splits any text into contiguous, non-empty pieces (what counting by pieces rests on)", () => {
    fc.assert(
      fc.property(fc.oneof(runs, hostile, fc.string({ unit: "binary", maxLength: 400 })), (text) => {
        let end = 0
        for (const match of text.matchAll(O200K_TOKEN_SPLIT_REGEX)) {
          expect(match.index).toBe(end)
          expect(match[0].length).toBeGreaterThan(0)
          end += match[0].length
        }
        expect(end).toBe(text.length)
      }),
      { numRuns: 2_000 },
    )
  })

  it("counts run-heavy text without long pieces exactly as gpt-tokenizer does; any, within a limit", () => {
    fc.assert(
      fc.property(runs, fc.nat({ max: 400 }), (text, limit) => {
        const full = Tokens.count(text)
        const long = [...text.matchAll(O200K_TOKEN_SPLIT_REGEX)].some(
          ([piece]) => piece.length > Tokens.MAX_PIECE,
        )
        if (!long) expect(full).toBe(countTokens(text, PLAIN))
        const limited = Tokens.count(text, limit)
        if (full <= limit) expect(limited).toBe(full)
        else expect(limited).toBeGreaterThan(limit)
      }),
      { numRuns: 500 },
    )
  })

  it("counts ordinary text exactly as gpt-tokenizer does", () => {
    fc.assert(
      fc.property(ordinary, (text) => {
        expect(Tokens.count(text)).toBe(countTokens(text, PLAIN))
      }),
      { numRuns: 300 },
    )
  })

  it("counts short texts (remembered once counted) exactly, with or without a limit, every time", () => {
    fc.assert(
      fc.property(fc.string({ unit: "grapheme", maxLength: 32 }), fc.nat({ max: 40 }), (text, limit) => {
        const exact = countTokens(text, PLAIN)
        for (let i = 0; i < 2; i++) {
          expect(Tokens.count(text)).toBe(exact)
          const limited = Tokens.count(text, limit)
          if (exact <= limit) expect(limited).toBe(exact)
          else expect(limited).toBeGreaterThan(limit)
        }
      }),
      { numRuns: 500 },
    )
  })

  it("counts across the ordinary stretches of a long text exactly", () => {
    const text =
      "In 2024 the river's valley — 谷 — was 12.5 km wide!\n  def f(x):\n    return x**2  # 😀\n".repeat(
        3_000,
      )
    expect(Tokens.count(text)).toBe(countTokens(text, PLAIN))
  })

  it("never throws; a limit gives the exact count within it and more than it beyond", () => {
    fc.assert(
      fc.property(hostile, fc.nat({ max: 600 }), (text, limit) => {
        const full = Tokens.count(text)
        const limited = Tokens.count(text, limit)
        if (full <= limit) expect(limited).toBe(full)
        else expect(limited).toBeGreaterThan(limit)
      }),
      { numRuns: 300 },
    )
  })

  it("truncates to at most the cap, as a prefix", () => {
    fc.assert(
      fc.property(hostile, fc.nat({ max: 50 }), (text, cap) => {
        const kept = Tokens.truncate(text, cap)
        expect(Tokens.count(kept)).toBeLessThanOrEqual(cap)
        expect(text.startsWith(kept)).toBe(true)
      }),
      { numRuns: 300 },
    )
  })

  it("prompt counts remembered per message equal the counts, whatever the limit (limited first, then whole)", () => {
    const message = fc.record({
      content: hostile,
      name: fc.option(fc.constantFrom("alice", "tool_1"), { nil: undefined }),
      imageTokens: fc.constantFrom(0, Tokens.IMAGE_TOKENS_LOW),
    })
    fc.assert(
      fc.property(fc.array(message, { maxLength: 4 }), fc.nat({ max: 3_000 }), (messages, limit) => {
        let exact = 3
        for (const m of messages)
          exact +=
            3 +
            Tokens.count(m.content) +
            m.imageTokens +
            (m.name === undefined ? 0 : 1 + Tokens.count(m.name))
        // Limited first (a miss that may stop early and so is not remembered), then whole, then limited again.
        for (const within of [limit, Number.POSITIVE_INFINITY, limit]) {
          const counted = Tokens.promptTokens(messages, within)
          if (exact <= within) expect(counted).toBe(exact)
          else expect(counted).toBeGreaterThan(within)
        }
      }),
      { numRuns: 300 },
    )
  })

  it("texts that UTF-8 would make one (lone surrogates) keep their own remembered counts", () => {
    const replaced = "\ufffd".repeat(300)
    const lone = "\ud800".repeat(300)
    expect(Tokens.count(replaced)).not.toBe(Tokens.count(lone))
    for (const text of [replaced, lone, replaced, lone])
      expect(Tokens.promptTokens([{ content: text, imageTokens: 0 }])).toBe(3 + 3 + Tokens.count(text))
  })

  it("remembered counts are kept per scope, and the same in each", () => {
    const text = "A system prompt long enough to be remembered, shared by two accounts."
    const exact = 3 + 3 + Tokens.count(text)
    expect(Tokens.promptTokens([{ content: text, imageTokens: 0 }], Number.POSITIVE_INFINITY, "acct_a")).toBe(
      exact,
    )
    expect(Tokens.promptTokens([{ content: text, imageTokens: 0 }], Number.POSITIVE_INFINITY, "acct_b")).toBe(
      exact,
    )
    expect(Tokens.promptTokens([{ content: text, imageTokens: 0 }], Number.POSITIVE_INFINITY, "acct_a")).toBe(
      exact,
    )
  })

  it("stops counting a long piece at the limit (a huge text costs what the limit allows)", () => {
    // Millions of letters in one piece that the split regex still matches (CJK runs overflow it).
    let seed = 7
    let letters = ""
    for (let i = 0; i < 2_000_000; i++) {
      seed = (seed * 16_807) % 2_147_483_647
      letters += String.fromCharCode(97 + (seed % 26))
    }
    for (const limit of [0, 1_000, 5_000]) {
      const counted = Tokens.count(letters, limit)
      expect(counted).toBeGreaterThan(limit)
      // Past the limit by at most one slice's tokens.
      expect(counted).toBeLessThanOrEqual(limit + Tokens.MAX_PIECE)
    }
    const prompt = Tokens.promptTokens([{ content: letters, imageTokens: 0 }], 2_000)
    expect(prompt).toBeGreaterThan(2_000)
    expect(prompt).toBeLessThanOrEqual(2_000 + Tokens.MAX_PIECE + 6)
  })

  it("costs linear time on runs that make the tokenizer's merge quadratic", () => {
    let cjk = ""
    for (let i = 0; i < 300_000; i++) cjk += String.fromCharCode(0x4e00 + ((i * 7919) % 20_000))
    for (const text of [" ".repeat(2_000_000), "a".repeat(2_000_000), "漢".repeat(1_000_000), cjk]) {
      const started = performance.now()
      Tokens.count(text, 32_767)
      Tokens.promptTokens([{ content: text, imageTokens: 0 }], 32_767)
      expect(performance.now() - started, text.slice(0, 2)).toBeLessThan(1_000)
    }
  })
})
