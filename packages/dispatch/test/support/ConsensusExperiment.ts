/**
 * How often does the consensus strategy return the best answer it had? Runs
 * the real dispatcher (strategy `consensus`) on an in-process simulated swarm
 * with noisy judges and a share of dishonest, colluding nodes, and scores its
 * choice and three baselines on the same answers:
 *
 * - random: one of the answers, uniformly;
 * - majority: the answer most similar to the others (word-set Jaccard), a
 *   vote among answers without judges;
 * - reputation: the answer of the author the dispatcher trusts most (the
 *   reputation consensus maintains for its judges).
 *
 * "Best" is the simulator's ground truth (`answerQuality`: key points
 * covered); a choice counts when no other answer was strictly better.
 * Everything is seeded and time stands still (no delays at infinite speed):
 * the same options give the same numbers.
 */
import { answerQuality, makeProfiles, makeSimNode, type NodeProfile } from "@swarmgate/swarm-sim"
import { Effect, Random, Stream, TestContext } from "effect"
import * as Dispatcher from "../../src/Dispatcher"
import * as Presets from "../../src/Presets"
import * as SimTransport from "../../src/SimTransport"

export const QUESTIONS: ReadonlyArray<string> = [
  "How do glaciers carve valleys in mountain ranges?",
  "Why do desert plants store water in their stems?",
  "How does a reverse proxy improve the reliability of a web application?",
  "What makes sourdough bread rise without commercial yeast?",
  "How do vaccines train the immune system?",
  "Why do coastal cities flood more often than they used to?",
  "How should a small team plan database backups and restores?",
  "What drives the seasonal migration of monarch butterflies?",
  "How do central banks use interest rates to control inflation?",
  "Why do bridges need expansion joints?",
  "How does compound interest affect long-term savings?",
  "What causes the northern lights?",
  "How do coral reefs recover after bleaching events?",
  "Why is sleep important for memory consolidation?",
  "How do electric cars recover energy when braking?",
  "What should a city consider when designing bicycle lanes?",
]

export const STRATEGIES = ["consensus", "random", "majority", "reputation"] as const
export type Strategy = (typeof STRATEGIES)[number]

export interface LevelOptions {
  readonly seed: number
  readonly nodes: number
  /** Share of dishonest nodes (one colluding ring). */
  readonly dishonest: number
  readonly trials: number
  readonly k?: number | undefined
  readonly judges?: number | undefined
}

export interface LevelResult {
  readonly dishonest: number
  readonly trials: number
  /** Share of trials where the strategy's answer was among the best available. */
  readonly rates: Readonly<Record<Strategy, number>>
  /** Mean ground-truth quality of the chosen answers. */
  readonly quality: Readonly<Record<Strategy, number>>
  /** Share of trials where a colluders' answer was chosen. */
  readonly ringWins: Readonly<Record<Strategy, number>>
}

const words = (text: string) => new Set(text.toLowerCase().match(/[\p{L}\p{N}']+/gu) ?? [])

const jaccard = (a: ReadonlySet<string>, b: ReadonlySet<string>) => {
  let shared = 0
  for (const word of a) if (b.has(word)) shared++
  const union = a.size + b.size - shared
  return union === 0 ? 1 : shared / union
}

/** Index of the answer most similar, in total, to all the others. */
export const majorityBySimilarity = (texts: ReadonlyArray<string>): number => {
  const sets = texts.map(words)
  let best = 0
  let bestScore = -1
  sets.forEach((set, i) => {
    const score = sets.reduce((sum, other, j) => (i === j ? sum : sum + jaccard(set, other)), 0)
    if (score > bestScore + 1e-12) {
      best = i
      bestScore = score
    }
  })
  return best
}

const swarmOf = (options: LevelOptions): ReadonlyArray<NodeProfile> =>
  makeProfiles({ seed: options.seed, count: options.nodes, dishonest: options.dishonest, rings: 1 }).map(
    // Capacity is not the question here: every node is always free to answer or judge.
    (profile) => ({ ...profile, capacity: 1_000 }),
  )

export const runLevel = (options: LevelOptions): Effect.Effect<LevelResult> =>
  Effect.gen(function* () {
    const profiles = swarmOf(options)
    const ring = new Set(profiles.filter((p) => p.ring !== undefined).map((p) => p.id))
    const presets = Presets.defaultPresets("exp").map((preset) => ({
      ...preset,
      strategy: "consensus" as const,
      consensus: { ...preset.consensus, k: options.k ?? 3, judges: options.judges ?? 3 },
    }))
    const preset = presets[0]!
    const nodes = profiles.map((profile) =>
      SimTransport.fromSimNode(
        makeSimNode(profile, { speed: Number.POSITIVE_INFINITY, seed: options.seed }),
        presets,
      ),
    )
    const traces: Array<Dispatcher.ConsensusTrace> = []
    const dispatcher = Dispatcher.make(presets, nodes, { onConsensus: (trace) => traces.push(trace) })

    const hits: Record<Strategy, number> = { consensus: 0, random: 0, majority: 0, reputation: 0 }
    const quality: Record<Strategy, number> = { consensus: 0, random: 0, majority: 0, reputation: 0 }
    const ringWins: Record<Strategy, number> = { consensus: 0, random: 0, majority: 0, reputation: 0 }
    let counted = 0
    for (let trial = 0; trial < options.trials; trial++) {
      const question = QUESTIONS[trial % QUESTIONS.length]!
      const standing = new Map((yield* dispatcher.status).map((n) => [n.id, n.reputation]))
      const before = traces.length
      yield* Effect.scoped(
        Effect.flatMap(
          dispatcher.run(preset, {
            requestId: `exp-${trial}`,
            messages: [{ role: "user", content: question, images: [] }],
            maxTokens: 400,
            jsonMode: false,
            sampling: { temperature: 0.8 },
          }),
          (run) => Stream.runDrain(run.events),
        ),
      ).pipe(Effect.ignore)
      const trace = traces[before]
      if (trace === undefined) continue
      counted++
      const answers = trace.answers
      const scores = answers.map((a) => answerQuality(question, a.text))
      const best = Math.max(...scores)
      const byText = (text: string) => answers.findIndex((a) => a.text === text)
      const picks: Record<Strategy, number> = {
        consensus: byText(trace.candidates[trace.winner]!.text),
        random: yield* Random.nextIntBetween(0, answers.length),
        majority: majorityBySimilarity(answers.map((a) => a.text)),
        reputation: answers.reduce(
          (top, a, i) =>
            (standing.get(a.nodeId) ?? 0) > (standing.get(answers[top]!.nodeId) ?? 0) ? i : top,
          0,
        ),
      }
      for (const strategy of STRATEGIES) {
        const pick = picks[strategy]
        if (scores[pick]! >= best - 1e-9) hits[strategy]++
        quality[strategy] += scores[pick]!
        if (ring.has(answers[pick]!.nodeId)) ringWins[strategy]++
      }
    }
    const share = (counts: Record<Strategy, number>) =>
      Object.fromEntries(STRATEGIES.map((s) => [s, counted === 0 ? 0 : counts[s] / counted])) as Record<
        Strategy,
        number
      >
    return {
      dishonest: options.dishonest,
      trials: counted,
      rates: share(hits),
      quality: share(quality),
      ringWins: share(ringWins),
    }
  }).pipe(
    Effect.withRandom(Random.make(`experiment-${options.seed}-${options.dishonest}`)),
    // Measured latencies steer node choice: a test clock keeps them at 0, so runs repeat exactly.
    Effect.provide(TestContext.TestContext),
  )
