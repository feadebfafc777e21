/**
 * The synchronous admission (`admitNow`, what the gateway uses on the memory
 * store) and the Effect one (`admit`) are the same limiter: for any sequence
 * of arrivals, commits, refunds and clock steps, two fresh services fed the
 * same sequence through either path make the same decisions, and concurrency
 * never exceeds its limit on the synchronous path.
 */
import { describe, expect, it } from "@effect/vitest"
import { Clock, Effect, Exit, FastCheck as fc, Scope, TestClock } from "effect"
import * as Quota from "../src/Quota"

type Step =
  | { readonly _tag: "Arrive"; readonly subject: number }
  | { readonly _tag: "Commit"; readonly pick: number }
  | { readonly _tag: "Release"; readonly pick: number }
  | { readonly _tag: "Wait"; readonly millis: number }

const step: fc.Arbitrary<Step> = fc.oneof(
  {
    weight: 4,
    arbitrary: fc.record({ _tag: fc.constant("Arrive" as const), subject: fc.integer({ min: 0, max: 2 }) }),
  },
  { weight: 2, arbitrary: fc.record({ _tag: fc.constant("Commit" as const), pick: fc.nat() }) },
  { weight: 3, arbitrary: fc.record({ _tag: fc.constant("Release" as const), pick: fc.nat() }) },
  {
    weight: 2,
    arbitrary: fc.record({ _tag: fc.constant("Wait" as const), millis: fc.integer({ min: 0, max: 20_000 }) }),
  },
)

const limitsArb = fc.record({
  rpm: fc.integer({ min: 0, max: 6 }),
  daily: fc.integer({ min: 0, max: 12 }),
  concurrency: fc.integer({ min: 0, max: 3 }),
})

/** One decision as the caller sees it: admitted, or the refusal's code and Retry-After. */
type Decision = string

interface Held {
  readonly commit: () => Effect.Effect<void>
  readonly release: () => Effect.Effect<void>
}

const run = (path: "now" | "effect", limits: Quota.Limits, steps: ReadonlyArray<Step>) =>
  Effect.gen(function* () {
    yield* TestClock.setTime(Date.UTC(2026, 10, 24, 12))
    const quota = yield* Effect.provide(Quota.Quota, Quota.layerMemory())
    const clock = yield* Effect.clock
    const held: Array<{ subject: number; permit: Held }> = []
    const decisions: Array<Decision> = []
    const running = [0, 0, 0]
    const maxConcurrent = [0, 0, 0]
    for (const s of steps) {
      switch (s._tag) {
        case "Arrive": {
          const request = { subject: `acct_${s.subject}`, resource: "m", limits }
          if (path === "now") {
            const admission = quota.admitNow(request, clock)
            // With a queue of 0 every decision is synchronous.
            expect(admission._tag).not.toBe("Async")
            if (admission._tag === "Admitted") {
              const { permit } = admission
              held.push({
                subject: s.subject,
                permit: {
                  commit: () => Effect.sync(permit.commit),
                  release: () => Effect.sync(permit.release),
                },
              })
              decisions.push("admitted")
            } else if (admission._tag === "Refused") {
              decisions.push(`${admission.error.code}:${admission.error.retryAfterSeconds}`)
              continue
            }
          } else {
            const scope = yield* Scope.make()
            const admission = yield* Scope.extend(quota.admit(request), scope)
            if (admission._tag === "Admitted") {
              const { permit } = admission
              held.push({
                subject: s.subject,
                permit: { commit: () => permit.commit, release: () => Scope.close(scope, Exit.void) },
              })
              decisions.push("admitted")
            } else {
              decisions.push(`${admission.error.code}:${admission.error.retryAfterSeconds}`)
              yield* Scope.close(scope, Exit.void)
              continue
            }
          }
          running[s.subject]!++
          maxConcurrent[s.subject] = Math.max(maxConcurrent[s.subject]!, running[s.subject]!)
          break
        }
        case "Commit": {
          if (held.length === 0) break
          yield* held[s.pick % held.length]!.permit.commit()
          break
        }
        case "Release": {
          if (held.length === 0) break
          const [gone] = held.splice(s.pick % held.length, 1)
          yield* gone!.permit.release()
          running[gone!.subject]!--
          break
        }
        case "Wait":
          yield* TestClock.adjust(s.millis)
          break
      }
    }
    decisions.push(`t=${yield* Clock.currentTimeMillis}`)
    return { decisions, maxConcurrent }
  })

describe("admitNow", () => {
  it.effect.prop(
    "decides exactly as admit, and never exceeds the concurrency limit",
    [limitsArb, fc.array(step, { minLength: 1, maxLength: 60 })],
    ([l, steps]) =>
      Effect.gen(function* () {
        const limits: Quota.Limits = {
          rates: [{ name: "rpm", limit: l.rpm, periodMillis: 60_000 }],
          quotas: [{ name: "daily", limit: l.daily, period: "day" }],
          concurrency: { limit: l.concurrency, queue: 0 },
        }
        const sync = yield* run("now", limits, steps)
        const viaEffect = yield* run("effect", limits, steps)
        expect(sync.decisions).toEqual(viaEffect.decisions)
        for (const peak of sync.maxConcurrent) expect(peak).toBeLessThanOrEqual(l.concurrency)
      }),
    { fastCheck: { numRuns: 150 } },
  )

  it.effect("a request that would wait in the queue is left to admit, and changes nothing", () =>
    Effect.gen(function* () {
      const quota = yield* Effect.provide(Quota.Quota, Quota.layerMemory())
      const clock = yield* Effect.clock
      const limits: Quota.Limits = { concurrency: { limit: 1, queue: 2 } }
      const first = quota.admitNow({ subject: "a", limits }, clock)
      expect(first._tag).toBe("Admitted")
      expect(quota.admitNow({ subject: "a", limits }, clock)._tag).toBe("Async")
      const usage = yield* quota.usage({ subject: "a", limits })
      expect([usage.concurrency, usage.queued]).toEqual([1, 0])
      if (first._tag === "Admitted") first.permit.release()
      expect((yield* quota.usage({ subject: "a", limits })).concurrency).toBe(0)
      expect(yield* quota.inFlight).toBe(0)
    }),
  )
})
