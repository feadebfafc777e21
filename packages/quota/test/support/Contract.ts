/**
 * The store contract: the same behaviour from the memory store (under
 * `TestClock`) and from a real Redis (real time, short periods).
 */
import { expect } from "@effect/vitest"
import { Cause, Deferred, Effect, Exit, Fiber, type Layer, Option, Ref, type Scope } from "effect"
import * as Quota from "../../src/Quota"

export interface ContractTarget {
  readonly name: string
  readonly layerWith: (options: Quota.QuotaOptions) => Layer.Layer<Quota.Quota>
  /** Lets time pass: `TestClock.adjust` in memory, a real sleep against Redis. */
  readonly advance: (millis: number) => Effect.Effect<void>
  /** Whether the clock can be set to a chosen instant (memory only: Redis keeps its own time). */
  readonly setTime: ((millis: number) => Effect.Effect<void>) | undefined
  /** Lets forked fibers reach their next wait (a yield under TestClock, a short sleep against Redis). */
  readonly settle: Effect.Effect<void>
}

export type Test = (name: string, body: () => Effect.Effect<void, unknown, Quota.Quota | Scope.Scope>) => void

let counter = 0
export const subject = (label: string) =>
  `${label}-${Date.now().toString(36)}-${(counter++).toString(36)}-${Math.random().toString(36).slice(2, 8)}`

const quota = Quota.Quota

/** Admits in a scope of its own and commits at once, like a request that runs. */
export const runOne = (request: Quota.AdmitRequest) =>
  Effect.scoped(
    Effect.flatMap(
      Effect.flatMap(quota, (q) => q.admit(request)),
      (admission): Effect.Effect<Quota.Admission> =>
        admission._tag === "Admitted"
          ? Effect.as(admission.permit.commit, admission)
          : Effect.succeed(admission),
    ),
  )

/** Admits in a scope of its own and never commits: refused later, say by billing. */
export const refusedLater = (request: Quota.AdmitRequest) =>
  Effect.scoped(Effect.flatMap(quota, (q) => q.admit(request)))

export const expectAdmitted = (admission: Quota.Admission) => {
  expect(admission._tag).toBe("Admitted")
  return admission as Extract<Quota.Admission, { _tag: "Admitted" }>
}

export const expectRefused = (
  admission: Quota.Admission,
  tag: "RateLimitExceeded" | "ConcurrencyLimitExceeded",
) => {
  expect(admission._tag).toBe("Refused")
  const refused = admission as Extract<Quota.Admission, { _tag: "Refused" }>
  expect(refused.error._tag).toBe(tag)
  return refused
}

const usage = (request: Quota.AdmitRequest, resources?: ReadonlyArray<string>) =>
  Effect.flatMap(quota, (q) => q.usage(request, resources))

/** Usage without the reset times, which move with the clock. */
export const counts = (usage: Quota.Usage) => ({
  concurrency: usage.concurrency,
  queued: usage.queued,
  rates: [...usage.rates].map(([resource, rates]) => [
    resource,
    rates.map((r) => [r.name, r.limit, r.remaining]),
  ]),
  quotas: usage.quotas.map((q) => [q.name, q.limit, q.remaining]),
})

const rate = (limit: number, periodMillis: number, burst?: number): Quota.Limits => ({
  rates: [{ name: "rate", limit, periodMillis, burst }],
})

export const contract = (target: ContractTarget, test: Test) => {
  const { advance, settle } = target

  test("admits the burst, then refuses with the wait until one more request conforms", () =>
    Effect.gen(function* () {
      const request = { subject: subject("burst"), resource: "m", limits: rate(4, 2_000) }
      for (let i = 0; i < 4; i++) {
        const admitted = expectAdmitted(yield* runOne(request))
        expect(admitted.permit.rates[0]?.remaining).toBe(3 - i)
      }
      const refused = expectRefused(yield* runOne(request), "RateLimitExceeded")
      expect(refused.error.retryAfter).toBe(1)
      expect(refused.rates).toEqual([
        { name: "rate", limit: 4, remaining: 0, resetMillis: expect.any(Number) },
      ])
      expect(refused.rates[0]!.resetMillis).toBeGreaterThan(1_500)
      expect(refused.rates[0]!.resetMillis).toBeLessThanOrEqual(2_000)
      yield* advance(520)
      expectAdmitted(yield* runOne(request))
      expectRefused(yield* runOne(request), "RateLimitExceeded")
    }))

  test("rate limits count per resource, quotas per subject", () =>
    Effect.gen(function* () {
      const who = subject("resources")
      const limits: Quota.Limits = {
        rates: [{ name: "rate", limit: 2, periodMillis: 60_000 }],
        quotas: [{ name: "daily", limit: 3, period: "day" }],
      }
      expectAdmitted(yield* runOne({ subject: who, resource: "a", limits }))
      expectAdmitted(yield* runOne({ subject: who, resource: "a", limits }))
      expectRefused(yield* runOne({ subject: who, resource: "a", limits }), "RateLimitExceeded")
      expectAdmitted(yield* runOne({ subject: who, resource: "b", limits }))
      const refused = expectRefused(
        yield* runOne({ subject: who, resource: "b", limits }),
        "RateLimitExceeded",
      )
      expect(refused.error.message).toContain("daily")
      const state = yield* usage({ subject: who, limits }, ["a", "b", "c"])
      expect(state.quotas).toEqual([
        { name: "daily", limit: 3, remaining: 0, resetMillis: expect.any(Number) },
      ])
      expect(state.rates.get("a")?.[0]?.remaining).toBe(0)
      expect(state.rates.get("b")?.[0]?.remaining).toBe(1)
      expect(state.rates.get("c")?.[0]?.remaining).toBe(2)
    }))

  test("a request released without commit leaves no trace", () =>
    Effect.gen(function* () {
      const request = {
        subject: subject("refund"),
        resource: "m",
        limits: {
          rates: [{ name: "rpm", limit: 3, periodMillis: 60_000 }],
          quotas: [
            { name: "daily", limit: 3, period: "day" as const },
            { name: "weekly", limit: 3, period: "week" as const },
          ],
          concurrency: { limit: 1 },
        },
      }
      const before = yield* usage(request)
      for (let i = 0; i < 10; i++) expectAdmitted(yield* refusedLater(request))
      expect(counts(yield* usage(request))).toEqual(counts(before))
      for (let i = 0; i < 3; i++) expectAdmitted(yield* runOne(request))
      expectRefused(yield* runOne(request), "RateLimitExceeded")
    }))

  test("reservations hold back rates, quotas and slots while in flight", () =>
    Effect.gen(function* () {
      const request = {
        subject: subject("inflight"),
        resource: "m",
        limits: { rates: [{ name: "rpm", limit: 2, periodMillis: 60_000 }], quotas: [] },
      }
      const quotaRequest = {
        subject: subject("inflight-q"),
        limits: { quotas: [{ name: "daily", limit: 1, period: "day" as const }] },
      }
      yield* Effect.scoped(
        Effect.gen(function* () {
          const q = yield* quota
          expectAdmitted(yield* q.admit(request))
          expectAdmitted(yield* q.admit(request))
          expectRefused(yield* runOne(request), "RateLimitExceeded")
          expectAdmitted(yield* q.admit(quotaRequest))
          // Held back by a request that may still be refunded: worth a retry soon.
          const refused = expectRefused(yield* runOne(quotaRequest), "RateLimitExceeded")
          expect(refused.error.retryAfter).toBe(1)
        }),
      )
      expectAdmitted(yield* runOne(request))
      expectAdmitted(yield* runOne(quotaRequest))
    }))

  test("the daily quota refuses until the next UTC midnight (Retry-After capped at 3600)", () =>
    Effect.gen(function* () {
      if (target.setTime) yield* target.setTime(Date.UTC(2026, 10, 18, 23, 20, 0))
      const request = {
        subject: subject("daily"),
        limits: { quotas: [{ name: "daily", limit: 2, period: "day" as const }] },
      }
      expectAdmitted(yield* runOne(request))
      expectAdmitted(yield* runOne(request))
      const refused = expectRefused(yield* runOne(request), "RateLimitExceeded")
      const now = Date.now()
      const untilMidnight = Math.ceil(
        (Date.UTC(
          new Date(now).getUTCFullYear(),
          new Date(now).getUTCMonth(),
          new Date(now).getUTCDate() + 1,
        ) -
          now) /
          1000,
      )
      if (target.setTime) {
        expect(refused.error.retryAfter).toBe(2_400)
        const state = yield* usage(request)
        expect(state.quotas[0]).toEqual({ name: "daily", limit: 2, remaining: 0, resetMillis: 2_400_000 })
        yield* advance(2_399_000)
        expectRefused(yield* runOne(request), "RateLimitExceeded")
        yield* advance(1_000)
        expectAdmitted(yield* runOne(request))
      } else {
        expect(Math.abs(refused.error.retryAfter! - Math.min(3_600, untilMidnight))).toBeLessThanOrEqual(1)
      }
    }))

  test("the weekly quota runs from Monday 00:00 UTC", () =>
    Effect.gen(function* () {
      if (target.setTime) yield* target.setTime(Date.UTC(2026, 10, 22, 23, 30, 0)) // a Sunday
      const request = {
        subject: subject("weekly"),
        limits: { quotas: [{ name: "weekly", limit: 1, period: "week" as const }] },
      }
      expectAdmitted(yield* runOne(request))
      const refused = expectRefused(yield* runOne(request), "RateLimitExceeded")
      const state = yield* usage(request)
      const now = Date.now()
      const day = new Date(now).getUTCDay()
      const midnight = Date.UTC(
        new Date(now).getUTCFullYear(),
        new Date(now).getUTCMonth(),
        new Date(now).getUTCDate(),
      )
      const monday = midnight + ((8 - day) % 7 || 7) * 86_400_000
      if (target.setTime) {
        expect(refused.error.retryAfter).toBe(1_800)
        expect(state.quotas[0]?.resetMillis).toBe(1_800_000)
        yield* advance(1_800_000)
        expectAdmitted(yield* runOne(request))
      } else {
        expect(Math.abs(state.quotas[0]!.resetMillis - (monday - now))).toBeLessThan(2_000)
      }
    }))

  test("concurrency: refused when slots and queue are full, admitted once a slot frees", () =>
    Effect.gen(function* () {
      const request = { subject: subject("slots"), limits: { concurrency: { limit: 2, queue: 0 } } }
      const release = yield* Deferred.make<void>()
      const holders = yield* Effect.forkAll(
        [1, 2].map(() =>
          Effect.scoped(
            Effect.flatMap(Quota.admit(request), (permit) =>
              Effect.zipRight(permit.commit, Deferred.await(release)),
            ),
          ),
        ),
      )
      yield* settle
      expect((yield* usage(request)).concurrency).toBe(2)
      const refused = expectRefused(yield* runOne(request), "ConcurrencyLimitExceeded")
      expect(refused.error.retryAfter).toBeGreaterThanOrEqual(1)
      expect(refused.error.retryAfter).toBeLessThanOrEqual(60)
      yield* Deferred.succeed(release, undefined)
      yield* Fiber.join(holders)
      expect((yield* usage(request)).concurrency).toBe(0)
      expectAdmitted(yield* runOne(request))
    }))

  test("the queue is FIFO and bounded; a refused request is never queued", () =>
    Effect.gen(function* () {
      const request = {
        subject: subject("fifo"),
        limits: { concurrency: { limit: 1, queue: 2, maxWaitMillis: 30_000 } },
      }
      const order = yield* Ref.make<Array<string>>([])
      const gates = new Map<string, Deferred.Deferred<void>>()
      const holder = (name: string) =>
        Effect.gen(function* () {
          const gate = yield* Deferred.make<void>()
          gates.set(name, gate)
          return yield* Effect.fork(
            Effect.scoped(
              Effect.gen(function* () {
                yield* Quota.admit(request)
                yield* Ref.update(order, (o) => [...o, name])
                yield* Deferred.await(gate)
              }),
            ),
          )
        })
      const a = yield* holder("a")
      yield* settle
      const b = yield* holder("b")
      yield* settle
      const c = yield* holder("c")
      yield* settle
      expect(yield* Ref.get(order)).toEqual(["a"])
      expect(yield* usage(request)).toMatchObject({ concurrency: 1, queued: 2 })
      expectRefused(yield* runOne(request), "ConcurrencyLimitExceeded")
      expect(yield* usage(request)).toMatchObject({ concurrency: 1, queued: 2 })
      yield* Deferred.succeed(gates.get("a")!, undefined)
      yield* Fiber.join(a)
      yield* settle
      expect(yield* Ref.get(order)).toEqual(["a", "b"])
      yield* Deferred.succeed(gates.get("b")!, undefined)
      yield* Fiber.join(b)
      yield* settle
      expect(yield* Ref.get(order)).toEqual(["a", "b", "c"])
      yield* Deferred.succeed(gates.get("c")!, undefined)
      yield* Fiber.join(c)
      expect(yield* usage(request)).toMatchObject({ concurrency: 0, queued: 0 })
    }))

  test("a queue wait that runs out is refused and leaves no trace", () =>
    Effect.gen(function* () {
      const request = {
        subject: subject("timeout"),
        resource: "m",
        limits: {
          rates: [{ name: "rpm", limit: 5, periodMillis: 60_000 }],
          quotas: [{ name: "daily", limit: 5, period: "day" as const }],
          concurrency: { limit: 1, queue: 1, maxWaitMillis: 300 },
        },
      }
      const gate = yield* Deferred.make<void>()
      const holder = yield* Effect.fork(
        Effect.scoped(
          Effect.flatMap(Quota.admit(request), (p) => Effect.zipRight(p.commit, Deferred.await(gate))),
        ),
      )
      yield* settle
      const before = yield* usage(request)
      const waiter = yield* Effect.fork(runOne(request))
      yield* settle
      expect((yield* usage(request)).queued).toBe(1)
      yield* advance(400)
      const refused = expectRefused(yield* Fiber.join(waiter), "ConcurrencyLimitExceeded")
      expect(refused.error.retryAfter).toBeGreaterThanOrEqual(1)
      expect(refused.error.retryAfter).toBeLessThanOrEqual(60)
      const after = yield* usage(request)
      expect(after.queued).toBe(0)
      expect(counts(after).quotas).toEqual(counts(before).quotas)
      expect(after.rates.get("m")?.[0]?.remaining).toBe(before.rates.get("m")?.[0]?.remaining)
      yield* Deferred.succeed(gate, undefined)
      yield* Fiber.join(holder)
    }))

  test("interrupting a queued or running request releases its place exactly once", () =>
    Effect.gen(function* () {
      const request = {
        subject: subject("interrupt"),
        limits: { concurrency: { limit: 1, queue: 1, maxWaitMillis: 30_000 } },
      }
      const running = yield* Effect.fork(
        Effect.scoped(Effect.flatMap(Quota.admit(request), (p) => Effect.zipRight(p.commit, Effect.never))),
      )
      yield* settle
      const queued = yield* Effect.fork(runOne(request))
      yield* settle
      expect(yield* usage(request)).toMatchObject({ concurrency: 1, queued: 1 })
      yield* Fiber.interrupt(queued)
      expect(yield* usage(request)).toMatchObject({ concurrency: 1, queued: 0 })
      yield* Fiber.interrupt(running)
      expect(yield* usage(request)).toMatchObject({ concurrency: 0, queued: 0 })
      expectAdmitted(yield* runOne(request))
      expect(yield* usage(request)).toMatchObject({ concurrency: 0, queued: 0 })
    }))

  test("a limit of 0 admits nothing", () =>
    Effect.gen(function* () {
      const who = subject("zero")
      const rateRefusal = expectRefused(
        yield* runOne({ subject: who, limits: rate(0, 60_000) }),
        "RateLimitExceeded",
      )
      expect(rateRefusal.error.retryAfter).toBe(60)
      expectRefused(
        yield* runOne({ subject: who, limits: { quotas: [{ name: "daily", limit: 0, period: "day" }] } }),
        "RateLimitExceeded",
      )
      const busy = expectRefused(
        yield* runOne({ subject: who, limits: { concurrency: { limit: 0, queue: 5 } } }),
        "ConcurrencyLimitExceeded",
      )
      expect(busy.error.retryAfter).toBe(60)
    }))

  test("the instance's in-flight bound answers 503 admission_unavailable", () =>
    Effect.gen(function* () {
      const request = { subject: subject("bound"), limits: { concurrency: { limit: 10 } } }
      const held = yield* Effect.forkAll(
        [1, 2].map(() => Effect.scoped(Effect.zipRight(Quota.admit(request), Effect.never))),
      )
      yield* settle
      const q = yield* quota
      expect(yield* q.inFlight).toBe(2)
      const bounded = yield* Effect.exit(Effect.scoped(q.admit(request)))
      expect(failureOf(bounded)).toMatchObject({ _tag: "AdmissionUnavailable", retryAfter: 1 })
      expect((yield* usage(request)).concurrency).toBe(2)
      yield* Fiber.interrupt(held)
      expect(yield* q.inFlight).toBe(0)
      expectAdmitted(yield* runOne(request))
    }).pipe(Effect.provide(target.layerWith({ maxInFlight: 2 }))))
}

/** The failure reason of an exit, for `toMatchObject`. */
export const failureOf = <A, E>(exit: Exit.Exit<A, E>) =>
  Exit.isFailure(exit) ? Option.getOrUndefined(Cause.failureOption(exit.cause)) : undefined
