/**
 * Invariants of the limiter for random arrival sequences, under TestClock:
 * the window bound, exact Retry-After, and refusals/refunds without a trace.
 */
import { describe, expect, it } from "@effect/vitest"
import { Clock, Effect, Exit, FastCheck as fc, Scope, TestClock } from "effect"

import * as Quota from "../src/Quota"
import { counts } from "./support/Contract"

const memory = Effect.provide(Quota.Quota, Quota.layerMemory())

/** A rate limit whose parameters fit together: 1 ≤ burst ≤ limit. */
const rateLimit = (name: string, periods: ReadonlyArray<number>) =>
  fc
    .record({
      limit: fc.integer({ min: 1, max: 30 }),
      periodMillis: fc.oneof(fc.constantFrom(...periods), fc.integer({ min: 1_000, max: 3_600_000 })),
      burstShare: fc.double({ min: 0, max: 1, noNaN: true }),
    })
    .map(({ limit, periodMillis, burstShare }) => ({
      name,
      limit,
      periodMillis,
      burst: 1 + Math.floor(burstShare * (limit - 1)),
    }))

type Fate = "commit" | "refund"

const arrival = (maxGap: number) =>
  fc.record({
    gap: fc.integer({ min: 0, max: maxGap }),
    fate: fc.constantFrom<Fate>("commit", "commit", "refund"),
    /** How many later arrivals the request stays in flight before its fate (0 = at once). */
    holdFor: fc.integer({ min: 0, max: 4 }),
  })

const intervalMicros = (rate: Quota.RateLimit) => Math.ceil((rate.periodMillis * 1000) / rate.limit)

describe("GCRA properties", () => {
  it.effect.prop(
    "charged requests in any window of length W never exceed burst + rate·W",
    [rateLimit("r", [1_000, 60_000, 3_600_000]), fc.array(arrival(90_000), { minLength: 1, maxLength: 150 })],
    ([rate, arrivals]) =>
      Effect.gen(function* () {
        const quota = yield* memory
        const request = { subject: "s", resource: "m", limits: { rates: [rate] } }
        const commits: Array<number> = []
        const open: Array<{ scope: Scope.CloseableScope; permit: Quota.Permit; fate: Fate; left: number }> =
          []
        const settle = (all: boolean) =>
          Effect.gen(function* () {
            for (const entry of [...open]) {
              if (!all && --entry.left > 0) continue
              if (entry.fate === "commit") {
                yield* entry.permit.commit
                commits.push(yield* Clock.currentTimeMillis)
              }
              yield* Scope.close(entry.scope, Exit.void)
              open.splice(open.indexOf(entry), 1)
            }
          })
        for (const next of arrivals) {
          yield* TestClock.adjust(next.gap)
          yield* settle(false)
          const scope = yield* Scope.make()
          const admission = yield* Scope.extend(quota.admit(request), scope)
          if (admission._tag === "Refused") {
            yield* Scope.close(scope, Exit.void)
            continue
          }
          open.push({ scope, permit: admission.permit, fate: next.fate, left: next.holdFor })
          if (next.holdFor === 0) yield* settle(true)
        }
        yield* settle(true)
        const interval = intervalMicros(rate)
        for (let i = 0; i < commits.length; i++) {
          for (let j = i; j < commits.length; j++) {
            const windowMicros = (commits[j]! - commits[i]!) * 1000
            const charged = j - i + 1
            // burst + W / interval, and so also burst + W · limit / period (the interval is rounded up).
            expect((charged - rate.burst) * interval).toBeLessThanOrEqual(windowMicros)
            expect((charged - rate.burst) * rate.periodMillis * 1000).toBeLessThanOrEqual(
              windowMicros * rate.limit,
            )
          }
        }
      }),
    { timeout: 120_000, fastCheck: { numRuns: 200 } },
  )

  it.effect.prop(
    "Retry-After is exact: a retry after it is admitted, one a second earlier is not",
    [
      rateLimit("per-minute", [60_000]),
      rateLimit("per-hour", [3_600_000]),
      fc.array(fc.integer({ min: 0, max: 20_000 }), { minLength: 1, maxLength: 120 }),
    ],
    ([minute, hour, gaps]) =>
      Effect.gen(function* () {
        const quota = yield* memory
        const request = { subject: "s", resource: "m", limits: { rates: [minute, hour] } }
        const attempt = Effect.scoped(
          Effect.flatMap(
            quota.admit(request),
            (a): Effect.Effect<Quota.Admission> =>
              a._tag === "Admitted" ? Effect.as(a.permit.commit, a) : Effect.succeed(a),
          ),
        )
        for (const gap of gaps) {
          yield* TestClock.adjust(gap)
          const first = yield* attempt
          if (first._tag === "Admitted") continue
          const retryAfter = first.error.retryAfter!
          expect(first.error._tag).toBe("RateLimitExceeded")
          expect(retryAfter).toBeGreaterThanOrEqual(1)
          expect(retryAfter).toBeLessThanOrEqual(3600)
          if (retryAfter > 1) {
            yield* TestClock.adjust((retryAfter - 1) * 1000)
            expect((yield* attempt)._tag).toBe("Refused")
            yield* TestClock.adjust(1000)
          } else {
            yield* TestClock.adjust(retryAfter * 1000)
          }
          expect((yield* attempt)._tag).toBe("Admitted")
        }
      }),
    { timeout: 120_000, fastCheck: { numRuns: 100 } },
  )

  it.effect.prop(
    "refused requests and refunded ones change no state",
    [
      fc.record({
        rpm: fc.integer({ min: 0, max: 6 }),
        rph: fc.integer({ min: 1, max: 20 }),
        burst: fc.integer({ min: 1, max: 6 }),
        daily: fc.integer({ min: 0, max: 25 }),
        weekly: fc.integer({ min: 0, max: 40 }),
        concurrency: fc.integer({ min: 0, max: 3 }),
      }),
      fc.array(
        fc.record({
          step: arrival(30_000),
          resource: fc.constantFrom("a", "b"),
          /** Extra requests, on the second store only, that end without a commit: refused, or refunded later. */
          noise: fc.array(
            fc.record({ resource: fc.constantFrom("a", "b"), holdFor: fc.integer({ min: 0, max: 3 }) }),
            { maxLength: 2 },
          ),
        }),
        { minLength: 1, maxLength: 80 },
      ),
    ],
    ([limits, steps]) =>
      Effect.gen(function* () {
        yield* TestClock.setTime(Date.UTC(2026, 10, 22, 22, 0, 0))
        const plain = yield* memory
        const noisy = yield* memory
        const limitsOf: Quota.Limits = {
          rates: [
            {
              name: "rpm",
              limit: limits.rpm,
              periodMillis: 60_000,
              burst: Math.min(limits.burst, Math.max(1, limits.rpm)),
            },
            { name: "rph", limit: limits.rph, periodMillis: 3_600_000 },
          ],
          quotas: [
            { name: "daily", limit: limits.daily, period: "day" },
            { name: "weekly", limit: limits.weekly, period: "week" },
          ],
          concurrency: { limit: limits.concurrency, queue: 0 },
        }
        const request = (resource: string) => ({ subject: "s", resource, limits: limitsOf })
        type Open = { scope: Scope.CloseableScope; permit: Quota.Permit; fate: Fate; left: number }
        const open = { plain: [] as Array<Open>, noisy: [] as Array<Open>, noise: [] as Array<Open> }
        const settle = (list: Array<Open>) =>
          Effect.gen(function* () {
            for (const entry of [...list]) {
              if (entry.left-- > 0) continue
              if (entry.fate === "commit") yield* entry.permit.commit
              yield* Scope.close(entry.scope, Exit.void)
              list.splice(list.indexOf(entry), 1)
            }
          })
        const step = (
          quota: Quota.QuotaShape,
          list: Array<Open>,
          resource: string,
          fate: Fate,
          holdFor: number,
        ) =>
          Effect.gen(function* () {
            const scope = yield* Scope.make()
            const admission = yield* Scope.extend(quota.admit(request(resource)), scope)
            if (admission._tag === "Refused") {
              yield* Scope.close(scope, Exit.void)
              return {
                tag: admission.error._tag,
                retryAfter: admission.error.retryAfter,
                rates: admission.rates,
              }
            }
            if (fate === "commit" && holdFor === 0) yield* admission.permit.commit
            if (holdFor === 0) yield* Scope.close(scope, Exit.void)
            else list.push({ scope, permit: admission.permit, fate, left: holdFor })
            return { tag: "Admitted", retryAfter: undefined, rates: admission.permit.rates }
          })
        for (const { step: s, resource, noise } of steps) {
          yield* TestClock.adjust(s.gap)
          yield* settle(open.plain)
          yield* settle(open.noisy)
          yield* settle(open.noise)
          for (const extra of noise) yield* step(noisy, open.noise, extra.resource, "refund", extra.holdFor)
          const a = yield* step(plain, open.plain, resource, s.fate, s.holdFor)
          const b = yield* step(noisy, open.noisy, resource, s.fate, s.holdFor)
          if (open.noise.length === 0) {
            expect(b).toEqual(a)
          } else if (b.tag !== a.tag) {
            // A request in flight may change answers; then the two histories rightly part ways.
            return
          }
        }
        for (const entry of open.noise) entry.left = 0
        yield* settle(open.noise)
        const resources = ["a", "b"]
        expect(counts(yield* noisy.usage(request("a"), resources))).toEqual(
          counts(yield* plain.usage(request("a"), resources)),
        )
        const next = (quota: Quota.QuotaShape) => step(quota, [], "a", "commit", 0)
        expect(yield* next(noisy)).toEqual(yield* next(plain))
      }),
    { timeout: 120_000, fastCheck: { numRuns: 300 } },
  )
})
