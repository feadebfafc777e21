import { describe, expect, it } from "@effect/vitest"
import fc from "fast-check"
import { defaultHealthOptions, MIN_PERCENTILE_SAMPLES, NodeHealth, percentile } from "../src/NodeHealth"

const options = { ...defaultHealthOptions, openMillis: 1_000, maxOpenMillis: 4_000 }

describe("NodeHealth: circuit", () => {
  it("opens after failureThreshold failures in a row, not before; a success resets the count", () => {
    const started = new NodeHealth(options)
    // First tokens followed by breaks are not successes.
    for (let i = 0; i < 3; i++) {
      started.firstToken(10, undefined)
      started.failure(i, "broke", undefined)
    }
    expect(started.circuit).toBe("open")
    const health = new NodeHealth(options)
    health.failure(0, "refused", undefined)
    health.failure(1, "refused", undefined)
    health.succeeded()
    health.failure(2, "refused", undefined)
    health.failure(3, "refused", undefined)
    expect(health.admits(4)).toBe(true)
    health.failure(4, "refused", undefined)
    expect(health.circuit).toBe("open")
    expect(health.admits(5)).toBe(false)
    expect(health.lastFailure).toBe("refused")
  })

  it("opens on a high error rate once there are enough samples, even without three in a row", () => {
    const health = new NodeHealth({
      ...options,
      failureThreshold: 100,
      minSamples: 10,
      errorRateThreshold: 0.5,
    })
    for (let i = 0; i < 40 && health.circuit === "closed"; i++) {
      if (i % 3 === 2) health.succeeded()
      else health.failure(i, "http_500", undefined)
    }
    expect(health.circuit).toBe("open")
    expect(health.requests).toBeGreaterThanOrEqual(10)
  })

  it("open → half-open after the cool-down, with exactly one trial let through", () => {
    const health = new NodeHealth(options)
    for (let i = 0; i < 3; i++) health.failure(0, "x", undefined)
    expect(health.admits(999)).toBe(false)
    expect(health.admits(1_000)).toBe(true)
    expect(health.circuit).toBe("half_open")
    const trial = health.start(1_000)
    expect(trial).toBeDefined()
    expect(health.admits(1_001)).toBe(false)
    // A cancelled trial makes way for another.
    health.abandon(trial)
    expect(health.admits(1_002)).toBe(true)
  })

  it("a successful trial closes the circuit; a failed one reopens it with a doubled cool-down, capped", () => {
    const health = new NodeHealth(options)
    for (let i = 0; i < 3; i++) health.failure(0, "x", undefined)
    health.admits(1_000)
    health.failure(1_000, "still down", health.start(1_000))
    expect(health.circuit).toBe("open")
    expect(health.admits(2_999)).toBe(false)
    expect(health.admits(3_000)).toBe(true)
    health.failure(3_000, "still down", health.start(3_000))
    expect(health.admits(6_999)).toBe(false)
    expect(health.admits(7_000)).toBe(true)
    health.failure(7_000, "still down", health.start(7_000))
    // 8 s would be next; the cap is 4 s.
    expect(health.admits(11_000)).toBe(true)
    health.firstToken(80, health.start(11_000))
    expect(health.circuit).toBe("closed")
    expect(health.errorRate).toBe(0)
    // Closed again, it takes three new failures to open.
    health.failure(11_001, "x", undefined)
    health.failure(11_002, "x", undefined)
    expect(health.circuit).toBe("closed")
  })

  it("a probe success closes a half-open circuit; failures of requests started earlier do not extend an open one", () => {
    const health = new NodeHealth(options)
    for (let i = 0; i < 3; i++) health.failure(0, "x", undefined)
    health.failure(500, "late", undefined)
    expect(health.admits(1_000)).toBe(true)
    health.probeSucceeded(health.start(1_000))
    expect(health.circuit).toBe("closed")
  })

  it("a stale trial token cannot free the current trial", () => {
    const health = new NodeHealth(options)
    for (let i = 0; i < 3; i++) health.failure(0, "x", undefined)
    health.admits(1_000)
    const first = health.start(1_000)
    health.failure(1_000, "x", first)
    health.admits(3_000)
    health.start(3_000)
    health.abandon(first)
    expect(health.admits(3_001)).toBe(false)
  })
})

describe("NodeHealth: latency", () => {
  it("tracks TTFT and tokens/s as moving averages", () => {
    const health = new NodeHealth(options)
    expect(health.ttftMillis).toBeUndefined()
    health.firstToken(100, undefined)
    expect(health.ttftMillis).toBe(100)
    health.firstToken(200, undefined)
    expect(health.ttftMillis).toBeCloseTo(120)
    health.succeeded(50, 1_000)
    health.succeeded(100, 1_000)
    expect(health.tokensPerSecond).toBeCloseTo(60)
  })

  it("p95 comes from the recent window, only once there are enough samples", () => {
    const health = new NodeHealth({ ...options, window: 20 })
    for (let i = 1; i <= 7; i++) health.firstToken(i, undefined)
    expect(health.p95()).toBeUndefined()
    for (let i = 8; i <= 20; i++) health.firstToken(i, undefined)
    expect(health.p95()).toBe(19)
    // Asked again after one new sample (it replaces the oldest, 1): recomputed, not the cached value.
    health.firstToken(1_000, undefined)
    expect(health.p95()).toBe(20)
    // The window forgets: twenty slow samples replace the fast ones.
    for (let i = 0; i < 20; i++) health.firstToken(1_000, undefined)
    expect(health.p95()).toBe(1_000)
  })

  it("the window holds the last `window` first-token times in order, and p95 is their nearest-rank percentile", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 24 }),
        // Few distinct values, so that equal times are common (the one that leaves may have twins).
        fc.array(
          fc.oneof(
            fc.integer({ min: 0, max: 6 }),
            fc.double({ min: 0, max: 1e6, noNaN: true }),
            fc.constant(Number.POSITIVE_INFINITY),
          ),
          {
            maxLength: 120,
          },
        ),
        (window, times) => {
          const health = new NodeHealth({ ...options, window })
          times.forEach((time, i) => {
            health.firstToken(time, undefined)
            const recent = times.slice(Math.max(0, i + 1 - window), i + 1)
            expect(health.recentTtfts()).toEqual([...recent].sort((a, b) => a - b))
            const expected = recent.length < MIN_PERCENTILE_SAMPLES ? undefined : percentile(recent, 0.95)
            expect(health.p95()).toBe(expected)
          })
        },
      ),
    )
  })

  it("a first-token time that is not a number changes nothing", () => {
    const health = new NodeHealth({ ...options, window: 8 })
    for (let i = 1; i <= 8; i++) health.firstToken(i * 10, undefined)
    const average = health.ttftMillis
    health.firstToken(Number.NaN, undefined)
    expect(health.ttftMillis).toBe(average)
    expect(health.recentTtfts()).toEqual([10, 20, 30, 40, 50, 60, 70, 80])
    expect(health.p95()).toBe(80)
  })

  it("p95 of a window not yet full counts only the samples it holds", () => {
    const health = new NodeHealth({ ...options, window: 20 })
    for (let i = 10; i >= 1; i--) health.firstToken(i, undefined)
    expect(health.p95()).toBe(10)
    expect(health.p95()).toBe(10)
  })

  it("a slow sample (a lost hedge) only ever raises the estimate", () => {
    const health = new NodeHealth(options)
    health.firstToken(100, undefined)
    health.slow(50)
    expect(health.ttftMillis).toBe(100)
    health.slow(600)
    expect(health.ttftMillis).toBeGreaterThan(100)
  })

  it("percentile is nearest-rank", () => {
    expect(percentile([], 0.95)).toBeUndefined()
    expect(percentile([5], 0.95)).toBe(5)
    expect(percentile([3, 1, 2, 4], 0.5)).toBe(2)
    expect(
      percentile(
        Array.from({ length: 100 }, (_, i) => i + 1),
        0.95,
      ),
    ).toBe(95)
  })
})
