/**
 * Bradley–Terry ranking of consensus candidates from judges' weighted
 * pairwise votes, and the reputations that weight those votes: pure
 * functions, no I/O.
 */

export interface Vote {
  readonly judge: string
  readonly winner: number
  readonly loser: number
  readonly weight: number
}

/**
 * Bradley–Terry strengths of `n` candidates from weighted votes, by the
 * minorisation–maximisation iteration (Hunter 2004). Each candidate also plays
 * `prior` virtual games, won and lost, against a reference of strength 1, so
 * a candidate nobody voted for stays at 1 and unanimous votes give finite
 * strengths. Strengths have geometric mean 1.
 */
export const bradleyTerry = (
  n: number,
  votes: ReadonlyArray<Pick<Vote, "winner" | "loser" | "weight">>,
  options: { readonly prior?: number; readonly iterations?: number } = {},
): Array<number> => {
  const prior = options.prior ?? 0.5
  const iterations = options.iterations ?? 200
  const wins = new Array<number>(n).fill(0)
  const games: Array<Array<number>> = Array.from({ length: n }, () => new Array<number>(n).fill(0))
  for (const vote of votes) {
    if (!(vote.weight > 0 && Number.isFinite(vote.weight)) || vote.winner === vote.loser) continue
    wins[vote.winner]! += vote.weight
    games[vote.winner]![vote.loser]! += vote.weight
    games[vote.loser]![vote.winner]! += vote.weight
  }
  let p = new Array<number>(n).fill(1)
  for (let it = 0; it < iterations; it++) {
    const next = p.map((pi, i) => {
      let denominator = (2 * prior) / (pi + 1)
      for (let j = 0; j < n; j++)
        if (j !== i && games[i]![j]! > 0) denominator += games[i]![j]! / (pi + p[j]!)
      return (wins[i]! + prior) / denominator
    })
    const mean = Math.exp(next.reduce((sum, v) => sum + Math.log(v), 0) / n)
    const normalised = next.map((v) => v / mean)
    const change = normalised.reduce((max, v, i) => Math.max(max, Math.abs(v - p[i]!)), 0)
    p = normalised
    if (change < 1e-9) break
  }
  return p
}

/** A judge's say: agreement above chance (reputation 0.5 → nothing, 1 → full), with a small floor. */
export const weightOf = (reputation: number): number => Math.max(0.02, 2 * reputation - 1)

/** Index of the strongest candidate; ties go to the earlier one. */
export const argmax = (values: ReadonlyArray<number>): number => {
  let best = 0
  for (let i = 1; i < values.length; i++) if (values[i]! > values[best]! + 1e-12) best = i
  return best
}

/** Learning rate of reputations, per vote. */
export const REPUTATION_RATE = 0.05

/**
 * Each judge's agreement with the consensus reached without its own votes
 * (so a judge cannot agree with itself), as per-judge [agreeing, total] counts.
 */
export const agreement = (
  n: number,
  votes: ReadonlyArray<Vote>,
): Map<string, { readonly agreed: number; readonly total: number }> => {
  const out = new Map<string, { agreed: number; total: number }>()
  for (const judge of new Set(votes.map((v) => v.judge))) {
    const own = votes.filter((v) => v.judge === judge)
    const others = votes.filter((v) => v.judge !== judge)
    if (others.length === 0) continue
    const strength = bradleyTerry(n, others)
    let agreed = 0
    for (const vote of own) {
      const a = strength[vote.winner]!
      const b = strength[vote.loser]!
      agreed += a > b + 1e-9 ? 1 : Math.abs(a - b) <= 1e-9 ? 0.5 : 0
    }
    out.set(judge, { agreed, total: own.length })
  }
  return out
}

/** Moves a reputation towards the judge's agreement rate, one small step per vote. */
export const updateReputation = (reputation: number, agreed: number, total: number): number => {
  let r = reputation
  for (let i = 0; i < total; i++) r += REPUTATION_RATE * (agreed / total - r)
  return Math.min(1, Math.max(0, r))
}
