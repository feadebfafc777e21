import { describe, expect, it } from "@effect/vitest"
import { FastCheck } from "effect"
import { type GenerationInput, generate } from "../src/index"

const ask = (content: string, extra: Partial<GenerationInput> = {}): GenerationInput => ({
  messages: [
    { role: "system", content: "You are a helpful assistant." },
    { role: "user", content },
  ],
  maxTokens: 10_000,
  jsonMode: false,
  ...extra,
})

const text = (input: GenerationInput, randomSeed: number) => generate(input, randomSeed).pieces.join("")

const prompts = [
  "How do I configure nginx as a reverse proxy for a Node.js application?",
  "What is photosynthesis?",
  "hi",
  "Compare Redis and PostgreSQL for caching session data in a busy web shop, and explain the trade-offs around durability, memory cost and failover for a small team that runs everything on two virtual machines.",
]

const sentencesOf = (value: string) => value.match(/[^.!?]+[.!?]/g)?.map((sentence) => sentence.trim()) ?? []

describe("generate", () => {
  it("repeats itself for the same request seed, whatever the random draw", () => {
    const input = ask(prompts[0]!, { seed: 42 })
    expect(text(input, 1)).toBe(text(input, 999_999))
    expect(text(input, 1)).not.toBe(text(ask(prompts[0]!, { seed: 43 }), 1))
  })

  it("is deterministic at temperature 0 without a seed", () => {
    const input = ask(prompts[1]!, { temperature: 0 })
    expect(text(input, 0.123)).toBe(text(input, 0.987))
  })

  it("varies with the random draw when neither seed nor temperature 0 is given", () => {
    const input = ask(prompts[1]!, { temperature: 0.7 })
    const outputs = new Set([1, 2, 3, 4, 5, 6, 7, 8, 0.25, 0.75].map((randomSeed) => text(input, randomSeed)))
    expect(outputs.size).toBe(10)
  })

  it("emits short word-like pieces that concatenate into the text", () => {
    for (const prompt of prompts) {
      for (let randomSeed = 0; randomSeed < 30; randomSeed++) {
        const { pieces } = generate(ask(prompt), randomSeed)
        expect(pieces[0]).not.toMatch(/^\s/)
        for (const piece of pieces) {
          expect(piece.length).toBeGreaterThan(0)
          expect(piece.length).toBeLessThan(15)
          expect(piece).toMatch(/^ ?\S+$/)
        }
      }
    }
  })

  it("answers at a natural length between 20 and 200 pieces, longer for longer prompts", () => {
    const average = (prompt: string) => {
      let total = 0
      for (let randomSeed = 0; randomSeed < 50; randomSeed++) {
        const { finishReason, pieces } = generate(ask(prompt), randomSeed)
        expect(finishReason).toBe("stop")
        expect(pieces.length).toBeGreaterThanOrEqual(20)
        expect(pieces.length).toBeLessThanOrEqual(200)
        total += pieces.length
      }
      return total / 50
    }
    expect(average(prompts[3]!)).toBeGreaterThan(average(prompts[2]!))
  })

  it("weaves the prompt's content words into the answer, not its stopwords", () => {
    const answer = text(ask("Why do desert plants store water in their stems?"), 3)
    expect(answer).toMatch(/desert plants|water|stems/)
    const openers = [0, 1, 2, 3, 4].map((randomSeed) => text(ask("Tell me about photosynthesis"), randomSeed))
    for (const opener of openers) expect(opener.toLowerCase()).toContain("photosynthesis")
  })

  it("reads the last user message of a conversation", () => {
    const input: GenerationInput = {
      messages: [
        { role: "user", content: "Tell me about volcanoes" },
        { role: "assistant", content: "Volcanoes are openings in the crust." },
        { role: "user", content: "And what about glaciers?" },
      ],
      maxTokens: 500,
      jsonMode: false,
    }
    const answers = [1, 2, 3].map((randomSeed) => text(input, randomSeed))
    for (const answer of answers) expect(answer).toContain("glaciers")
  })

  it("writes varied sentences and does not repeat one within an answer", () => {
    const all = new Set<string>()
    for (const prompt of prompts) {
      for (let randomSeed = 0; randomSeed < 10; randomSeed++) {
        const sentences = sentencesOf(text(ask(prompt), randomSeed))
        expect(new Set(sentences).size).toBe(sentences.length)
        for (const sentence of sentences) all.add(sentence)
      }
    }
    expect(all.size).toBeGreaterThan(150)
  })

  it.prop(
    "stops at exactly maxTokens pieces with finish reason length when the answer is longer",
    { randomSeed: FastCheck.integer(), maxTokens: FastCheck.integer({ min: 0, max: 19 }) },
    ({ maxTokens, randomSeed }) => {
      const full = generate(ask(prompts[0]!), randomSeed)
      const capped = generate(ask(prompts[0]!, { maxTokens }), randomSeed)
      expect(capped.finishReason).toBe("length")
      expect(capped.pieces).toEqual(full.pieces.slice(0, maxTokens))
    },
  )

  it("finishes with stop when the answer fits in maxTokens", () => {
    const full = generate(ask(prompts[1]!), 5)
    const exact = generate(ask(prompts[1]!, { maxTokens: full.pieces.length }), 5)
    expect(exact).toEqual({ pieces: full.pieces, finishReason: "stop" })
  })

  it.prop(
    "produces parseable JSON in JSON mode that fits maxTokens from 16 pieces up",
    {
      randomSeed: FastCheck.integer(),
      maxTokens: FastCheck.integer({ min: 16, max: 400 }),
      prompt: FastCheck.constantFrom(...prompts),
    },
    ({ maxTokens, prompt, randomSeed }) => {
      const { finishReason, pieces } = generate(ask(prompt, { jsonMode: true, maxTokens }), randomSeed)
      expect(finishReason).toBe("stop")
      expect(pieces.length).toBeLessThanOrEqual(maxTokens)
      const parsed = JSON.parse(pieces.join(""))
      expect(typeof parsed.answer).toBe("string")
      expect(parsed.answer.length).toBeGreaterThan(0)
      expect(Array.isArray(parsed.topics)).toBe(true)
      expect(parsed.confidence).toBeGreaterThan(0)
    },
  )

  it("cuts JSON below 16 pieces with finish reason length", () => {
    const { finishReason, pieces } = generate(ask(prompts[0]!, { jsonMode: true, maxTokens: 5 }), 1)
    expect(finishReason).toBe("length")
    expect(pieces).toHaveLength(5)
    expect(pieces[0]).toBe('{"answer":')
  })

  it("ends before the first stop string, even inside a piece or across pieces", () => {
    const input = ask(prompts[0]!, { seed: 7 })
    const full = text(input, 0)
    const word = full.split(" ")[4]!
    const cases = [
      word,
      word.slice(1, 3),
      full.slice(10, 25),
      "zzz-not-there",
      full.split(". ")[1]!.slice(0, 6),
    ]
    for (const stop of cases) {
      const { finishReason, pieces } = generate({ ...input, stop: ["never-occurs", stop] }, 0)
      const at = full.indexOf(stop)
      expect(finishReason).toBe("stop")
      expect(pieces.join("")).toBe(at < 0 ? full : full.slice(0, at))
      expect(pieces.join("")).not.toContain(stop)
    }
  })

  it("reports length when maxTokens runs out before the stop string", () => {
    const input = ask(prompts[0]!, { seed: 7 })
    const full = generate(input, 0).pieces
    const stop = full.join("").slice(full.slice(0, 15).join("").length).slice(0, 12)
    expect(full.join("").indexOf(stop)).toBeGreaterThan(full.slice(0, 3).join("").length)
    const result = generate({ ...input, stop: [stop], maxTokens: 3 }, 0)
    expect(result).toEqual({ pieces: full.slice(0, 3), finishReason: "length" })
  })

  it("acknowledges images with their media type and size", () => {
    const one = text(
      ask("What is in this picture?", { images: [{ mediaType: "image/png", bytes: 2048 }] }),
      1,
    )
    expect(one.startsWith("I see an image (image/png, 2048 bytes).")).toBe(true)
    const two = text(
      ask("Compare these", {
        images: [
          { mediaType: "image/jpeg", bytes: 5000 },
          { mediaType: "image/webp", bytes: 77 },
        ],
      }),
      1,
    )
    expect(two.startsWith("I see 2 images (image/jpeg, 5000 bytes; image/webp, 77 bytes).")).toBe(true)
  })
})
