import { describe, expect, it } from "@effect/vitest"
import { makeProfiles } from "../src/index"

describe("makeProfiles", () => {
  it("gives the same profiles for the same seed and different ones for another seed", () => {
    expect(makeProfiles({ seed: 7, count: 16 })).toEqual(makeProfiles({ seed: 7, count: 16 }))
    expect(makeProfiles({ seed: 7, count: 16 })).not.toEqual(makeProfiles({ seed: 8, count: 16 }))
  })

  it("names nodes sim-00, sim-01, … and keeps every figure in its documented range", () => {
    const profiles = makeProfiles({ seed: 123, count: 40 })
    expect(profiles.map((profile) => profile.id).slice(0, 3)).toEqual(["sim-00", "sim-01", "sim-02"])
    expect(new Set(profiles.map((profile) => profile.id)).size).toBe(40)
    for (const profile of profiles) {
      expect(profile.ttftMs).toBeGreaterThanOrEqual(100)
      expect(profile.ttftMs).toBeLessThanOrEqual(400)
      expect(profile.ttftJitter).toBeGreaterThanOrEqual(0)
      expect(profile.ttftJitter).toBeLessThanOrEqual(1)
      expect(profile.tokensPerSecond).toBeGreaterThanOrEqual(30)
      expect(profile.tokensPerSecond).toBeLessThanOrEqual(120)
      expect(profile.capacity).toBeGreaterThanOrEqual(4)
      expect(profile.capacity).toBeLessThanOrEqual(16)
      expect(profile.quality).toBeGreaterThanOrEqual(0)
      expect(profile.quality).toBeLessThanOrEqual(1)
      expect(profile.failure).toEqual({ refuse: 0, failBeforeFirstToken: 0, breakMidStream: 0, stall: 0 })
    }
  })

  it("always has both vision and text-only nodes when there are at least two", () => {
    for (let seed = 0; seed < 200; seed++) {
      const visions = makeProfiles({ seed, count: 2 }).map((profile) => profile.vision)
      expect(visions).toContain(true)
      expect(visions).toContain(false)
    }
  })

  it("varies speed and latency across a swarm", () => {
    const profiles = makeProfiles({ seed: 1, count: 16 })
    expect(new Set(profiles.map((profile) => profile.ttftMs)).size).toBeGreaterThan(8)
    expect(new Set(profiles.map((profile) => profile.tokensPerSecond)).size).toBeGreaterThan(8)
  })

  it("rejects a negative or fractional count", () => {
    expect(() => makeProfiles({ seed: 1, count: -1 })).toThrow(RangeError)
    expect(() => makeProfiles({ seed: 1, count: 1.5 })).toThrow(RangeError)
  })
})
