/**
 * Simulated judges: a node asked to compare two answers (the judge prompt of
 * `@swarmgate/dispatch` consensus) answers "A" or "B" from what it sees of
 * their quality, blurred by its judging noise. Dishonest nodes vote for their
 * ring's answers whatever their quality.
 */
import type { Prng } from "./internal/Prng"
import { DEFAULT_JUDGE_NOISE, type NodeProfile } from "./Profiles"
import { answerQuality, isRingAnswer } from "./TextGenerator"

export interface JudgeRequest {
  readonly question: string
  readonly answerA: string
  readonly answerB: string
}

export type Verdict = "A" | "B"

const BLOCK =
  /^Question:\n<<<\n([\s\S]*?)\n>>>\n\nAnswer A:\n<<<\n([\s\S]*?)\n>>>\n\nAnswer B:\n<<<\n([\s\S]*?)\n>>>\n/

/** Recognises the judge prompt in the last user message; undefined for any other request. */
export const parseJudgeRequest = (
  messages: ReadonlyArray<{ readonly role: string; readonly content: string }>,
): JudgeRequest | undefined => {
  const last = messages.at(-1)
  if (last === undefined || last.role !== "user") return undefined
  const match = BLOCK.exec(last.content)
  if (match === null) return undefined
  return { question: match[1]!, answerA: match[2]!, answerB: match[3]! }
}

/** Standard normal draw (Box–Muller). */
const gaussian = (rng: Prng): number => {
  const u = Math.max(rng.next(), 1e-12)
  return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * rng.next())
}

export const verdict = (
  judge: Pick<NodeProfile, "judgeNoise" | "ring">,
  request: JudgeRequest,
  rng: Prng,
): Verdict => {
  if (judge.ring !== undefined) {
    const a = isRingAnswer(judge.ring, request.answerA)
    const b = isRingAnswer(judge.ring, request.answerB)
    if (a !== b) return a ? "A" : "B"
  }
  const noise = judge.judgeNoise ?? DEFAULT_JUDGE_NOISE
  const a = answerQuality(request.question, request.answerA) + noise * gaussian(rng)
  const b = answerQuality(request.question, request.answerB) + noise * gaussian(rng)
  return a > b ? "A" : a < b ? "B" : rng.chance(0.5) ? "A" : "B"
}
