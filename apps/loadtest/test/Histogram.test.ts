import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { Histogram } from "../src/Histogram"
import { seededRandom } from "../src/Runner"

const exactPercentile = (sorted: ReadonlyArray<number>, percent: number) =>
  sorted[Math.max(0, Math.ceil((percent / 100) * sorted.length) - 1)]!

describe("Histogram", () => {
  it("is exact below 2,048 ns", () => {
    const h = new Histogram()
    for (let v = 0; v < 2048; v++) h.record(v)
    expect(h.percentile(50)).toBe(1023)
    expect(h.percentile(100)).toBe(2047)
    expect(h.count).toBe(2048)
  })

  it("keeps percentiles within 0.1% of the exact ones over six orders of magnitude", () => {
    const random = seededRandom(7)
    const h = new Histogram()
    const samples: Array<number> = []
    for (let i = 0; i < 20_000; i++) {
      // Log-uniform between 1 µs and 1 s.
      const nanos = Math.round(10 ** (3 + random() * 6))
      samples.push(nanos)
      h.record(nanos)
    }
    samples.sort((a, b) => a - b)
    for (const p of [1, 10, 50, 90, 99, 99.9]) {
      const exact = exactPercentile(samples, p)
      expect(Math.abs(h.percentile(p) - exact) / exact).toBeLessThanOrEqual(0.001)
    }
  })

  it("places every value in a bucket that contains it (property)", () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 2 ** 44 }), (nanos) => {
        const h = new Histogram()
        h.record(nanos)
        h.record(nanos)
        // With one distinct value the answer is clamped to it: exact.
        expect(h.percentile(50)).toBe(nanos)
        const bins = h.logBinsMillis(10)
        expect(bins.reduce((sum, b) => sum + b.count, 0)).toBe(2)
      }),
    )
  })

  it("orders buckets as it orders values (property)", () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 2 ** 43 }), fc.integer({ min: 1, max: 2 ** 20 }), (a, d) => {
        const low = new Histogram()
        const high = new Histogram()
        low.record(a)
        low.record(a + 2 ** 43) // a far value so the percentile is the bucket's middle, not clamped
        high.record(a + d)
        high.record(a + 2 ** 43)
        expect(high.percentile(50)).toBeGreaterThanOrEqual(low.percentile(50))
      }),
    )
  })

  it("summarises in milliseconds, merges, and reports NaN when empty", () => {
    const a = new Histogram()
    const b = new Histogram()
    a.recordMillis(1)
    a.recordMillis(3)
    b.recordMillis(5)
    a.merge(b)
    const s = a.summaryMillis()
    expect(s.count).toBe(3)
    expect(s.min).toBe(1)
    expect(s.max).toBe(5)
    expect(s.mean).toBeCloseTo(3, 9)
    expect(Math.abs(s.p50 - 3) / 3).toBeLessThan(0.001)
    const empty = new Histogram().summaryMillis()
    expect(empty.count).toBe(0)
    expect(empty.p99).toBeNaN()
    expect(new Histogram().logBinsMillis()).toEqual([])
  })

  it("bins on a log scale with every sample counted once", () => {
    const h = new Histogram()
    for (let i = 1; i <= 1000; i++) h.recordMillis(i / 10)
    const bins = h.logBinsMillis(20)
    expect(bins).toHaveLength(20)
    expect(bins.reduce((sum, bin) => sum + bin.count, 0)).toBe(1000)
    for (let i = 1; i < bins.length; i++) expect(bins[i]!.lo).toBeCloseTo(bins[i - 1]!.hi, 9)
    expect(bins[0]!.lo).toBeCloseTo(0.1, 6)
  })
})
