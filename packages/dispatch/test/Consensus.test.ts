import { describe, expect, it } from "@effect/vitest"
import { parseJudgeRequest } from "@swarmgate/swarm-sim"
import { FastCheck as fc } from "effect"
import {
  agreement,
  argmax,
  bradleyTerry,
  judgeMessages,
  parseVerdict,
  updateReputation,
  type Vote,
  weightOf,
} from "../src/Consensus"

const vote = (winner: number, loser: number, judge = "j", weight = 1): Vote => ({
  judge,
  winner,
  loser,
  weight,
})

describe("judge prompt", () => {
  it("carries the question and both answers in the layout the simulator recognises", () => {
    const messages = judgeMessages("Why is the sky blue?", "Rayleigh scattering.", "Because it is.")
    expect(messages.map((m) => m.role)).toEqual(["system", "user"])
    expect(parseJudgeRequest(messages)).toEqual({
      question: "Why is the sky blue?",
      answerA: "Rayleigh scattering.",
      answerB: "Because it is.",
    })
  })

  it("reads A or B from the usual ways models answer", () => {
    expect(parseVerdict("A")).toBe("A")
    expect(parseVerdict(" B\n")).toBe("B")
    expect(parseVerdict("**A**")).toBe("A")
    expect(parseVerdict("Answer B is better.")).toBe("B")
    expect(parseVerdict("B.")).toBe("B")
    expect(parseVerdict("Both are bad")).toBeUndefined()
    expect(parseVerdict("")).toBeUndefined()
  })
})

describe("Bradley–Terry", () => {
  it("a candidate nobody voted on stays at 1; strengths have geometric mean 1", () => {
    expect(bradleyTerry(3, [])).toEqual([1, 1, 1])
    const p = bradleyTerry(3, [vote(0, 1), vote(0, 2), vote(1, 2)])
    expect(p.reduce((a, b) => a * b, 1)).toBeCloseTo(1)
    expect(p[0]).toBeGreaterThan(p[1]!)
    expect(p[1]).toBeGreaterThan(p[2]!)
  })

  it("weights matter: one heavy vote outweighs two light ones", () => {
    const p = bradleyTerry(2, [vote(0, 1, "a", 0.1), vote(0, 1, "b", 0.1), vote(1, 0, "c", 1)])
    expect(argmax(p)).toBe(1)
    // Zero-weight votes are ignored.
    expect(bradleyTerry(2, [vote(0, 1, "a", 0)])).toEqual([1, 1])
  })

  it("uses transitivity: beating the one who beat everyone else wins", () => {
    // 2 never met 1 directly but beat 0, which beat 1.
    const p = bradleyTerry(3, [vote(0, 1), vote(0, 1), vote(2, 0), vote(2, 0)])
    expect(argmax(p)).toBe(2)
  })

  it.prop(
    "the candidate that wins every game is the strongest; strengths are finite and positive",
    [
      fc.integer({ min: 2, max: 6 }),
      fc.array(fc.tuple(fc.nat(), fc.nat(), fc.double({ min: 0.05, max: 1 })), { maxLength: 40 }),
    ],
    ([n, raw]) => {
      const votes = raw
        .map(([a, b, w]) => ({ judge: "j", winner: a % n, loser: b % n, weight: w }))
        .filter((v) => v.winner !== v.loser && v.winner !== 0 && v.loser !== 0)
      // Candidate 0 beats everyone once more on top.
      for (let i = 1; i < n; i++) votes.push({ judge: "j", winner: 0, loser: i, weight: 1 })
      const losses = votes.filter((v) => v.loser === 0).length
      expect(losses).toBe(0)
      const p = bradleyTerry(n, votes)
      for (const v of p) expect(Number.isFinite(v) && v > 0).toBe(true)
      expect(argmax(p)).toBe(0)
    },
  )
})

describe("reputation", () => {
  it("weight is agreement above chance, with a floor", () => {
    expect(weightOf(1)).toBe(1)
    expect(weightOf(0.75)).toBeCloseTo(0.5)
    expect(weightOf(0.5)).toBe(0.02)
    expect(weightOf(0)).toBe(0.02)
  })

  it("agreement is measured against the consensus of the other judges", () => {
    // Three judges say 0 > 1, a fourth says 1 > 0.
    const votes = [vote(0, 1, "a"), vote(0, 1, "b"), vote(0, 1, "c"), vote(1, 0, "liar")]
    const seen = agreement(2, votes)
    expect(seen.get("a")).toEqual({ agreed: 1, total: 1 })
    expect(seen.get("liar")).toEqual({ agreed: 0, total: 1 })
    // Without its own vote, a judge of two against one faces a tie: half agreement, not full.
    expect(agreement(2, [vote(0, 1, "a"), vote(0, 1, "b"), vote(1, 0, "liar")]).get("a")).toEqual({
      agreed: 0.5,
      total: 1,
    })
    // A lone judge has nobody to agree with.
    expect(agreement(2, [vote(0, 1, "alone")]).size).toBe(0)
  })

  it("moves towards the agreement rate, a small step per vote, within 0..1", () => {
    const up = updateReputation(0.5, 3, 3)
    const down = updateReputation(0.5, 0, 3)
    expect(up).toBeGreaterThan(0.5)
    expect(down).toBeLessThan(0.5)
    expect(up - 0.5).toBeLessThan(0.2)
    let r = 0.75
    for (let i = 0; i < 500; i++) r = updateReputation(r, 1, 2)
    expect(r).toBeCloseTo(0.5, 2)
  })
})
