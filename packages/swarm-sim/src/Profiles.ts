/** Seeded descriptions of simulated model nodes: how fast, how big, how good, how flaky. */
import { hashString, makePrng } from "./internal/Prng"

export interface NodeFailureRates {
  /** Refuses the request at once. */
  readonly refuse: number
  /** Fails after the time-to-first-token delay, before any piece. */
  readonly failBeforeFirstToken: number
  /** Fails after emitting some, but not all, pieces. */
  readonly breakMidStream: number
  /** Stops emitting and never completes. */
  readonly stall: number
  /** Accepts the request and never sends a first piece (absent: 0). */
  readonly stallBeforeFirstToken?: number | undefined
}

export interface NodeProfile {
  readonly id: string
  /** Mean time to first token. */
  readonly ttftMs: number
  /** Relative jitter (0..1) applied to the time to first token. */
  readonly ttftJitter: number
  readonly tokensPerSecond: number
  /** Concurrent generations the node is sized for. */
  readonly capacity: number
  /** Answer quality in 0..1. */
  readonly quality: number
  /** Whether the node accepts images. */
  readonly vision: boolean
  /** Probabilities, all 0 in generated profiles. */
  readonly failure: NodeFailureRates
  /** Standard deviation of the error this node makes when it judges two answers (absent: 0.15). */
  readonly judgeNoise?: number | undefined
  /**
   * Set on dishonest nodes: members of a ring send the ring's copied, low-effort answer and,
   * as judges, vote for any answer of their ring. A ring of one judges in its own favour.
   */
  readonly ring?: string | undefined
}

export const noFailures: NodeFailureRates = {
  refuse: 0,
  failBeforeFirstToken: 0,
  breakMidStream: 0,
  stall: 0,
}

const round2 = (value: number): number => Math.round(value * 100) / 100

export interface ProfileOptions {
  readonly seed: number
  readonly count: number
  /** Share of dishonest nodes, 0..1 (default 0). */
  readonly dishonest?: number | undefined
  /** How many colluding rings the dishonest nodes form (default 1). */
  readonly rings?: number | undefined
}

export const DEFAULT_JUDGE_NOISE = 0.15

export const makeProfiles = (options: ProfileOptions): ReadonlyArray<NodeProfile> => {
  const { count, seed } = options
  if (!Number.isInteger(count) || count < 0)
    throw new RangeError(`count must be a non-negative integer: ${count}`)
  const rng = makePrng(hashString(`profiles\u0000${seed}`))
  const width = Math.max(2, String(count - 1).length)
  const profiles: Array<NodeProfile> = []
  for (let i = 0; i < count; i++) {
    profiles.push({
      id: `sim-${String(i).padStart(width, "0")}`,
      ttftMs: 100 + rng.int(301),
      ttftJitter: round2(0.05 + rng.next() * 0.25),
      tokensPerSecond: 30 + rng.int(91),
      capacity: 4 + rng.int(13),
      quality: round2(0.5 + rng.next() * 0.45),
      vision: rng.chance(0.35),
      failure: noFailures,
    })
  }
  // Image requests must have somewhere to go, and routing must have something to skip.
  if (count >= 2) {
    const flip = (vision: boolean) => {
      const at = rng.int(count)
      profiles[at] = { ...profiles[at]!, vision }
    }
    if (!profiles.some((profile) => profile.vision)) flip(true)
    else if (profiles.every((profile) => profile.vision)) flip(false)
  }
  return withJudging(profiles, options)
}

/**
 * Judging traits come from a stream of draws of their own, so adding them left
 * every other figure of a seed's profiles as it was.
 */
const withJudging = (profiles: Array<NodeProfile>, options: ProfileOptions): Array<NodeProfile> => {
  const share = options.dishonest ?? 0
  if (!(share >= 0 && share <= 1)) throw new RangeError(`dishonest must be in 0..1: ${share}`)
  const rings = options.rings ?? 1
  if (!Number.isInteger(rings) || rings < 1)
    throw new RangeError(`rings must be a positive integer: ${rings}`)
  const rng = makePrng(hashString(`judging\u0000${options.seed}`))
  // Better models make better judges, with some spread.
  const judged = profiles.map((profile) => ({
    ...profile,
    judgeNoise: round2(0.05 + Math.max(0, 0.95 - profile.quality) * 0.6 + rng.next() * 0.1),
  }))
  const cheaters = rng.shuffle(judged.map((_, i) => i)).slice(0, Math.round(judged.length * share))
  cheaters.forEach((at, n) => {
    judged[at] = { ...judged[at]!, ring: `ring-${n % rings}` }
  })
  return judged
}
