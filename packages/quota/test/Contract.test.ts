/**
 * One contract, two stores: memory (under TestClock) and a real Redis.
 */
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { type AdmissionUnavailable, Observed } from "@swarmgate/protocol"
import { Effect, Exit, Fiber, Layer, Scope, TestClock } from "effect"
import * as Quota from "../src/Quota"
import * as RedisStore from "../src/stores/Redis"
import { contract, expectAdmitted, expectRefused, failureOf, runOne, subject } from "./support/Contract"
import {
  deleteKeys,
  expiryReport,
  randomPrefix,
  redisUrl,
  requireRedis,
  skipRedis,
  warnIfSkipped,
} from "./support/Redis"

const yields = Effect.repeatN(Effect.yieldNow(), 20)

describe("memory store", () => {
  contract(
    {
      name: "memory",
      layerWith: (options) => Quota.layerMemory(options),
      advance: (millis) => TestClock.adjust(millis),
      setTime: (millis) => TestClock.setTime(millis),
      settle: yields,
    },
    (name, body) => it.effect(name, () => Effect.scoped(body()).pipe(Effect.provide(Quota.layerMemory()))),
  )
})

warnIfSkipped("Redis store contract")

describe.skipIf(skipRedis)("redis store", () => {
  const url = redisUrl ?? ""
  const prefix = randomPrefix("contract")
  const layerWith = (options: Quota.QuotaOptions) =>
    Quota.layerRedis({ ...options, url: requireRedis("redis store"), prefix, pollMillis: 10 })

  beforeAll(() => {
    requireRedis("redis store")
  })

  afterAll(async () => {
    if (url) await deleteKeys(url, prefix)
  })

  contract(
    {
      name: "redis",
      layerWith,
      advance: (millis) => Effect.sleep(millis),
      setTime: undefined,
      settle: Effect.sleep(80),
    },
    (name, body) => it.live(name, () => Effect.scoped(body()).pipe(Effect.provide(layerWith({}))), 20_000),
  )

  // The same contract through `admitSent` (what the gateway uses scaled out): the scoped admission
  // rebuilt from it, the release owed to the scope put in place before the first wait.
  const sentLayerWith = (
    options: Quota.QuotaOptions,
    read: (sent: Quota.AdmissionSent) => Effect.Effect<Quota.Admission, AdmissionUnavailable> = (sent) =>
      sent.admission,
    release: (released: Effect.Effect<void>) => Effect.Effect<void> = (released) => released,
  ) =>
    Layer.effect(
      Quota.Quota,
      Effect.map(Quota.Quota, (q): Quota.QuotaShape => {
        const admitSent = q.admitSent
        if (admitSent === undefined) throw new Error("the Redis store sends at the call")
        return {
          ...q,
          admit: (request) =>
            Effect.flatMap(Effect.all([Effect.clock, Effect.scope]), ([clock, scope]) => {
              const sent = admitSent(request, clock)
              return Effect.zipRight(
                Scope.addFinalizer(
                  scope,
                  Effect.suspend(() => release(sent.release(false))),
                ),
                read(sent),
              )
            }),
        }
      }),
    ).pipe(Layer.provide(layerWith(options)))

  contract(
    {
      name: "redis, sent at the call",
      layerWith: sentLayerWith,
      advance: (millis) => Effect.sleep(millis),
      setTime: undefined,
      settle: Effect.sleep(80),
    },
    (name, body) =>
      it.live(
        `sent at the call: ${name}`,
        () => Effect.scoped(body()).pipe(Effect.provide(sentLayerWith({}))),
        20_000,
      ),
  )

  // The same, the decision read by plain calls (the gateway's plain path): `Observed.observe` gives
  // an Exit for an admission at once, else the Effect that goes on.
  // The release too, as a plain close reads it (`Observed`): by callback, never an Effect to run.
  const observedLayerWith = (options: Quota.QuotaOptions) =>
    sentLayerWith(
      options,
      (sent) =>
        Effect.async<Quota.Admission, AdmissionUnavailable>((resume) =>
          Observed.observe(sent.admission, resume),
        ),
      (released) =>
        Effect.async<void>((resume) =>
          Observed.observe(released, (result) =>
            resume(
              Exit.isExit(result) ? result : Effect.dieMessage("a sent admission's release needed a fiber"),
            ),
          ),
        ),
    )
  contract(
    {
      name: "redis, sent at the call and observed",
      layerWith: observedLayerWith,
      advance: (millis) => Effect.sleep(millis),
      setTime: undefined,
      settle: Effect.sleep(80),
    },
    (name, body) =>
      it.live(
        `sent and observed: ${name}`,
        () => Effect.scoped(body()).pipe(Effect.provide(observedLayerWith({}))),
        20_000,
      ),
  )

  it.live("a sent admission is released by its owner even when nothing read its decision", () =>
    Effect.gen(function* () {
      const q = yield* Quota.Quota
      const request = {
        subject: subject("unread"),
        resource: "m",
        limits: {
          rates: [{ name: "rpm", limit: 3, periodMillis: 60_000 }],
          quotas: [{ name: "daily", limit: 5, period: "day" as const }],
          concurrency: { limit: 1 },
        },
      }
      const clock = yield* Effect.clock
      const unread = q.admitSent!(request, clock)
      expect(yield* q.inFlight).toBe(1)
      // Released unread and uncommitted: the slot and the reservations go, nothing is charged.
      yield* unread.release(false)
      yield* unread.release(false)
      expect(yield* q.inFlight).toBe(0)
      const after = yield* q.usage(request, ["m"])
      expect([after.concurrency, after.rates.get("m")?.[0]?.remaining, after.quotas[0]?.remaining]).toEqual([
        0, 3, 5,
      ])
      // A started request's release commits what nothing committed yet.
      const started = q.admitSent!(request, clock)
      expectAdmitted(yield* started.admission)
      expect(started.committed()).toBe(false)
      yield* started.release(true)
      expect(started.committed()).toBe(true)
      const charged = yield* q.usage(request, ["m"])
      expect([
        charged.concurrency,
        charged.rates.get("m")?.[0]?.remaining,
        charged.quotas[0]?.remaining,
      ]).toEqual([0, 2, 4])
    }).pipe(Effect.provide(layerWith({}))),
  )

  it.live(
    "a holder that stops renewing (a crashed instance) loses its slot and reservations within one lease",
    () =>
      Effect.gen(function* () {
        // The raw store: nothing renews, as after a crash.
        const store = yield* RedisStore.make({ url, prefix, leaseMillis: 400 })
        const request = Quota.normalize({
          subject: subject("crash"),
          resource: "m",
          limits: {
            rates: [{ name: "rpm", limit: 1, periodMillis: 60_000 }],
            concurrency: { limit: 1 },
          },
        })
        expect((yield* store.admit(request, "crashed"))._tag).toBe("Admitted")
        expect((yield* store.admit(request, "next"))._tag).toBe("RateLimited")
        yield* Effect.sleep(500)
        expect((yield* store.admit(request, "next"))._tag).toBe("Admitted")
        const state = yield* store.usage(request, ["m"])
        expect(state.concurrency).toBe(1)
        expect(state.rates.get("m")?.[0]?.remaining).toBe(0)
      }).pipe(Effect.scoped),
  )

  it.live("a commit sent later (with a renewal or the release) counts from when it was decided, once", () =>
    Effect.gen(function* () {
      const store = yield* RedisStore.make({ url, prefix })
      const request = Quota.normalize({
        subject: subject("late-commit"),
        resource: "m",
        limits: {
          rates: [{ name: "rpm", limit: 1, periodMillis: 60_000 }],
          quotas: [{ name: "daily", limit: 3, period: "day" }],
        },
      })
      expect((yield* store.admit(request, "first"))._tag).toBe("Admitted")
      // Generation started 5 s ago; the renewal delivers the commit and the release carries it again.
      yield* store.renew(request, "first", true, 5_000_000)
      yield* store.release(request, "first", true, 5_000_000)
      const next = yield* store.admit(request, "second")
      if (next._tag !== "RateLimited") throw new Error(`expected RateLimited, got ${next._tag}`)
      // The minute's window opened at the first token, not at the release: ~55 s left, not 60.
      expect(next.waitMicros).toBeGreaterThan(54_000_000)
      expect(next.waitMicros).toBeLessThanOrEqual(55_000_000)
      const usage = yield* store.usage(request, ["m"])
      expect(usage.quotas[0]?.remaining).toBe(2)
    }).pipe(Effect.scoped),
  )

  it.live("a long request's commit reaches Redis with its next lease renewal, before the release", () =>
    Effect.gen(function* () {
      const own = randomPrefix("renewal-commit")
      const who = subject("renewal-commit")
      const request = {
        subject: who,
        limits: { quotas: [{ name: "daily", limit: 5, period: "day" as const }] },
      }
      const counted = Effect.promise(async () => {
        const { Redis } = await import("ioredis")
        const redis = new Redis(url)
        try {
          return await redis.hget(`${own}{${encodeURIComponent(who)}}:q`, "daily#c")
        } finally {
          redis.disconnect()
        }
      })
      yield* Effect.gen(function* () {
        yield* Effect.scoped(
          Effect.gen(function* () {
            const permit = yield* Quota.admit(request)
            yield* permit.commit
            expect(yield* counted).toBeNull()
            // Renewed every 100 ms with a 300 ms lease.
            yield* Effect.sleep(250)
            expect(yield* counted).toBe("1")
          }),
        )
        expect(yield* counted).toBe("1")
      }).pipe(Effect.provide(Quota.layerRedis({ url, prefix: own, leaseMillis: 300 })))
      yield* Effect.promise(() => deleteKeys(url, own))
    }),
  )

  it.live("a running request renews its lease and keeps its slot", () =>
    Effect.gen(function* () {
      const request = { subject: subject("renew"), limits: { concurrency: { limit: 1 } } }
      const layer = Quota.layerRedis({ url, prefix, leaseMillis: 300, pollMillis: 10 })
      yield* Effect.gen(function* () {
        const holder = yield* Effect.fork(Effect.scoped(Effect.zipRight(Quota.admit(request), Effect.never)))
        yield* Effect.sleep(1_000)
        expectRefused(yield* runOne(request), "ConcurrencyLimitExceeded")
        yield* Fiber.interrupt(holder)
        expectAdmitted(yield* runOne(request))
      }).pipe(Effect.provide(layer))
    }),
  )

  it.live("every key expires; an idle limiter leaves only its small bookkeeping behind", () =>
    Effect.gen(function* () {
      const own = randomPrefix("expiry")
      const request = {
        subject: subject("expiry"),
        resource: "m",
        limits: {
          rates: [{ name: "fast", limit: 10, periodMillis: 1_000 }],
          quotas: [{ name: "daily", limit: 100, period: "day" as const }],
          concurrency: { limit: 2, queue: 2 },
        },
      }
      yield* Effect.gen(function* () {
        for (let i = 0; i < 5; i++) expectAdmitted(yield* runOne(request))
        expectAdmitted(yield* Effect.scoped(Effect.flatMap(Quota.Quota, (q) => q.admit(request))))
      }).pipe(Effect.provide(Quota.layerRedis({ url, prefix: own })))
      const busy = yield* Effect.promise(() => expiryReport(url, own))
      expect(busy.forever).toEqual([])
      expect(busy.keys.map((k) => k.slice(k.indexOf("}") + 1)).sort()).toEqual([":m", ":q", ":r:m"])
      yield* Effect.sleep(1_700)
      const idle = yield* Effect.promise(() => expiryReport(url, own))
      expect(idle.forever).toEqual([])
      // The day's count and the hold-time average stay (with their expiry); rates, slots and reservations are gone.
      expect(idle.keys.map((k) => k.slice(k.indexOf("}") + 1)).sort()).toEqual([":m", ":q"])
      yield* Effect.promise(() => deleteKeys(url, own))
    }),
  )

  it.live("numbers survive the Lua round trip exactly (microsecond times near 2^51)", () =>
    Effect.gen(function* () {
      const request = {
        subject: subject("exact"),
        resource: "m",
        limits: { rates: [{ name: "r", limit: 7, periodMillis: 3_600_000, burst: 2 }] },
      }
      yield* Effect.gen(function* () {
        expectAdmitted(yield* runOne(request))
        expectAdmitted(yield* runOne(request))
        const refused = expectRefused(yield* runOne(request), "RateLimitExceeded")
        // 3600 s / 7 rounded up to the microsecond, minus the little time that passed.
        expect(refused.error.retryAfter).toBe(515)
        expect(refused.rates[0]?.resetMillis).toBeGreaterThan(1_028_000)
        expect(refused.rates[0]?.resetMillis).toBeLessThanOrEqual(1_028_572)
      }).pipe(Effect.provide(layerWith({})))
    }),
  )
})

describe("when the store is unreachable", () => {
  const down = { url: "redis://127.0.0.1:1", prefix: "unreachable:", commandTimeoutMillis: 200 }
  const request = {
    subject: "acct",
    resource: "m",
    limits: { rates: [{ name: "rpm", limit: 1, periodMillis: 60_000 }] },
  }

  it.live("fails closed by default: 503 admission_unavailable, and nothing stays in flight", () =>
    Effect.gen(function* () {
      const q = yield* Quota.Quota
      const exit = yield* Effect.exit(Effect.scoped(q.admit(request)))
      expect(Exit.isFailure(exit)).toBe(true)
      expect(failureOf(exit)).toMatchObject({
        _tag: "AdmissionUnavailable",
        status: 503,
        code: "admission_unavailable",
      })
      expect((failureOf(exit) as { retryAfter: number }).retryAfter).toBeLessThanOrEqual(60)
      expect(yield* q.inFlight).toBe(0)
    }).pipe(Effect.provide(Quota.layerRedis(down))),
  )

  it.live("fails open when configured: admitted without limits", () =>
    Effect.gen(function* () {
      const q = yield* Quota.Quota
      for (let i = 0; i < 3; i++) {
        const admission = yield* Effect.scoped(q.admit(request))
        expect(admission._tag).toBe("Admitted")
      }
      expect(yield* q.inFlight).toBe(0)
    }).pipe(Effect.provide(Quota.layerRedis({ ...down, onStoreFailure: "open" }))),
  )
})
