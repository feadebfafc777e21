import { describe, expect, it } from "@effect/vitest"
import { Chunk, Effect, Fiber, Option, Stream, TestClock } from "effect"
import {
  answerQuality,
  type GenerationInput,
  generate,
  isRingAnswer,
  keyPoints,
  makeProfiles,
  makeSimNode,
  type NodeProfile,
  noFailures,
  parseJudgeRequest,
  verdict,
} from "../src/index"
import { makePrng } from "../src/internal/Prng"

const question = "How do glaciers carve valleys in mountain ranges?"

const ask = (extra: Partial<GenerationInput> = {}): GenerationInput => ({
  messages: [{ role: "user", content: question }],
  maxTokens: 10_000,
  jsonMode: false,
  ...extra,
})

const textOf = (input: GenerationInput, draw: number) => generate(input, draw).pieces.join("")

const meanQuality = (input: GenerationInput, draws = 200) => {
  let total = 0
  for (let draw = 0; draw < draws; draw++) total += answerQuality(question, textOf(input, draw))
  return total / draws
}

/** The judge prompt as `@swarmgate/dispatch` consensus writes it. */
const judgePrompt = (a: string, b: string) => [
  { role: "system", content: "You judge answers." },
  {
    role: "user",
    content: `Question:\n<<<\n${question}\n>>>\n\nAnswer A:\n<<<\n${a}\n>>>\n\nAnswer B:\n<<<\n${b}\n>>>\n\nWhich answer is better? Reply with the single letter A or B.`,
  },
]

describe("answer quality", () => {
  it("a question has five fixed key points built from its topics", () => {
    const points = keyPoints(question)
    expect(points).toHaveLength(5)
    expect(keyPoints(question)).toEqual(points)
    expect(new Set(points).size).toBe(5)
    expect(points.join(" ")).toMatch(/glaciers|valleys|mountain ranges/)
    expect(keyPoints("What is photosynthesis?")).not.toEqual(points)
  })

  it("better nodes cover more key points on average, and answers of one node vary", () => {
    const low = meanQuality(ask({ quality: 0.3 }))
    const high = meanQuality(ask({ quality: 0.9 }))
    expect(high).toBeGreaterThan(low + 0.4)
    const scores = new Set(
      Array.from({ length: 50 }, (_, draw) => answerQuality(question, textOf(ask({ quality: 0.6 }), draw))),
    )
    expect(scores.size).toBeGreaterThan(2)
  })

  it("without a quality the text is exactly the plain generator's (no key points placed)", () => {
    for (let draw = 0; draw < 20; draw++)
      expect(answerQuality(question, textOf(ask(), draw))).toBeLessThan(0.01)
  })

  it("a seed pins the text whatever the node's quality", () => {
    expect(textOf(ask({ seed: 9, quality: 0.2 }), 1)).toBe(textOf(ask({ seed: 9, quality: 0.95 }), 2))
    expect(textOf(ask({ temperature: 0, quality: 0.2 }), 1)).toBe(
      textOf(ask({ temperature: 0, quality: 0.9 }), 5),
    )
  })

  it("still honours the cap and JSON mode with key points", () => {
    const capped = generate(ask({ quality: 1, maxTokens: 12 }), 3)
    expect(capped.pieces.length).toBeLessThanOrEqual(12)
    expect(capped.finishReason).toBe("length")
    for (let draw = 0; draw < 20; draw++) {
      const json = textOf(ask({ quality: 1, jsonMode: true, maxTokens: 200 }), draw)
      expect(() => JSON.parse(json)).not.toThrow()
    }
  })
})

describe("rings", () => {
  it("members of a ring send one identical, low-quality, marked answer per conversation", () => {
    const a = textOf(ask({ ring: "ring-0", quality: 0.9 }), 1)
    const b = textOf(ask({ ring: "ring-0", quality: 0.5, seed: 4 }), 777)
    expect(a).toBe(b)
    expect(isRingAnswer("ring-0", a)).toBe(true)
    expect(meanQuality(ask({ ring: "ring-0" }), 1)).toBeLessThan(0.5)
    for (let draw = 0; draw < 30; draw++)
      expect(isRingAnswer("ring-0", textOf(ask({ quality: 0.7 }), draw))).toBe(false)
  })

  it("makeProfiles marks the asked share of nodes dishonest, in the asked number of rings", () => {
    const honest = makeProfiles({ seed: 3, count: 20 })
    expect(honest.every((p) => p.ring === undefined)).toBe(true)
    const mixed = makeProfiles({ seed: 3, count: 20, dishonest: 0.4, rings: 2 })
    expect(mixed.filter((p) => p.ring !== undefined)).toHaveLength(8)
    expect(new Set(mixed.flatMap((p) => (p.ring === undefined ? [] : [p.ring])))).toEqual(
      new Set(["ring-0", "ring-1"]),
    )
    // Judging traits do not disturb the rest of the profile.
    expect(mixed.map(({ ring: _, ...rest }) => rest)).toEqual(honest)
    for (const p of honest) {
      expect(p.judgeNoise).toBeGreaterThanOrEqual(0.05)
      expect(p.judgeNoise).toBeLessThanOrEqual(0.45)
    }
    expect(() => makeProfiles({ seed: 1, count: 4, dishonest: 1.5 })).toThrow(RangeError)
  })
})

describe("judges", () => {
  const good = textOf(ask({ quality: 1 }), 11)
  const bad = textOf(ask({ quality: 0 }), 12)

  it("recognise the judge prompt and nothing else", () => {
    expect(parseJudgeRequest(judgePrompt(good, bad))).toEqual({ question, answerA: good, answerB: bad })
    expect(parseJudgeRequest([{ role: "user", content: question }])).toBeUndefined()
  })

  it("an honest judge prefers the better answer in either position, more reliably with less noise", () => {
    const rate = (noise: number) => {
      let right = 0
      const rng = makePrng(5)
      for (let i = 0; i < 400; i++) {
        const flip = i % 2 === 0
        const request = flip
          ? { question, answerA: bad, answerB: good }
          : { question, answerA: good, answerB: bad }
        if (verdict({ judgeNoise: noise }, request, rng) === (flip ? "B" : "A")) right++
      }
      return right / 400
    }
    expect(answerQuality(question, good)).toBeGreaterThan(answerQuality(question, bad))
    expect(rate(0.05)).toBe(1)
    expect(rate(1)).toBeLessThan(rate(0.2))
    expect(rate(1)).toBeGreaterThan(0.5)
  })

  it("a dishonest judge votes for its ring's answer against a better one", () => {
    const ringAnswer = textOf(ask({ ring: "ring-0" }), 1)
    const rng = makePrng(8)
    for (let i = 0; i < 50; i++) {
      expect(
        verdict({ ring: "ring-0", judgeNoise: 0 }, { question, answerA: good, answerB: ringAnswer }, rng),
      ).toBe("B")
      expect(verdict({ judgeNoise: 0 }, { question, answerA: good, answerB: ringAnswer }, rng)).toBe("A")
      expect(
        verdict({ ring: "ring-1", judgeNoise: 0 }, { question, answerA: good, answerB: ringAnswer }, rng),
      ).toBe("A")
    }
  })

  it.effect("a sim node answers a judge prompt with one letter after its time to first token", () =>
    Effect.gen(function* () {
      const profile: NodeProfile = {
        id: "sim-judge",
        ttftMs: 100,
        ttftJitter: 0,
        tokensPerSecond: 50,
        capacity: 2,
        quality: 0.9,
        vision: false,
        failure: noFailures,
        judgeNoise: 0.01,
      }
      const node = makeSimNode(profile, { speed: 1, seed: 1 })
      const fiber = yield* Effect.fork(
        Stream.runCollect(node.generate({ messages: judgePrompt(bad, good), maxTokens: 4, jsonMode: false })),
      )
      yield* TestClock.adjust("99 millis")
      expect(Option.isNone(yield* Fiber.poll(fiber))).toBe(true)
      yield* TestClock.adjust("1 milli")
      expect(Chunk.toReadonlyArray(yield* Fiber.join(fiber))).toEqual([
        { _tag: "Piece", text: "B" },
        { _tag: "Finish", reason: "stop" },
      ])
    }),
  )

  it.effect("stallBeforeFirstToken: accepted, then silent until interrupted", () =>
    Effect.gen(function* () {
      const node = makeSimNode(
        {
          ...makeProfiles({ seed: 1, count: 1 })[0]!,
          failure: { ...noFailures, stallBeforeFirstToken: 1 },
        },
        { speed: 1, seed: 1 },
      )
      const fiber = yield* Effect.fork(Stream.runCollect(node.generate(ask())))
      yield* TestClock.adjust("1 hour")
      expect(Option.isNone(yield* Fiber.poll(fiber))).toBe(true)
      expect((yield* node.stats).active).toBe(1)
      yield* Fiber.interrupt(fiber)
      expect((yield* node.stats).active).toBe(0)
    }),
  )
})
