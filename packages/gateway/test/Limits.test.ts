import type { ServerResponse } from "node:http"
import { describe, expect, it } from "@effect/vitest"
import type { Account, Principal } from "@swarmgate/auth"
import { Dispatcher, Presets } from "@swarmgate/dispatch"
import { Effect, Exit, Layer, Scope } from "effect"
import * as Limits from "../src/Limits"

const presets = Presets.defaultPresets()

const account = (limits: Account["limits"]): Account => ({
  id: "acct_test" as Account["id"],
  name: "test",
  status: "active",
  paymentHold: false,
  balanceMicros: 0,
  monthlySpendLimitMicros: null,
  limits,
  createdAt: 0,
  email: null,
  emailVerified: true,
  closedAt: null,
})

const principal = (limits: Account["limits"]) => ({ account: account(limits) }) as unknown as Principal

const notStarted = () => ({ started: false })

/** Collects what `setHeader` received, as a response not yet started. */
const fakeResponse = () => {
  const headers: Record<string, string> = {}
  const res = {
    headersSent: false,
    setHeader: (name: string, value: string) => {
      headers[name] = value
    },
    removeHeader: (name: string) => {
      delete headers[name]
    },
  } as unknown as ServerResponse
  return { res, headers }
}

describe("formatReset", () => {
  it("writes durations the way OpenAI clients read them", () => {
    expect(Limits.formatReset(0)).toBe("0ms")
    expect(Limits.formatReset(17)).toBe("17ms")
    expect(Limits.formatReset(1_000)).toBe("1s")
    expect(Limits.formatReset(1_500)).toBe("1.5s")
    expect(Limits.formatReset(61_500)).toBe("1m1.5s")
    expect(Limits.formatReset(360_000)).toBe("6m0s")
    expect(Limits.formatReset(3_600_000)).toBe("1h0m0s")
    expect(Limits.formatReset(3_723_000)).toBe("1h2m3s")
  })
})

describe("limitsFor", () => {
  const config = { defaults: Limits.defaults, queueWaitMillis: 5_000 }

  it("takes the account's own limits and the defaults for the rest", () => {
    expect(Limits.limitsFor(account({ rpm: 5, concurrency: 1, queue: null }), config)).toEqual({
      rates: [
        { name: "rpm", limit: 5, periodMillis: 60_000 },
        { name: "rph", limit: Limits.defaults.rph, periodMillis: 3_600_000 },
      ],
      quotas: [
        { name: "daily", limit: Limits.defaults.daily, period: "day" },
        { name: "weekly", limit: Limits.defaults.weekly, period: "week" },
      ],
      concurrency: { limit: 1, queue: Limits.defaults.queue, maxWaitMillis: 5_000 },
    })
  })

  it("a default of none means no such limit; an account's 0 means nothing passes", () => {
    const none = {
      ...config,
      defaults: { concurrency: null, queue: null, rpm: null, rph: null, daily: null, weekly: 7 },
    }
    expect(Limits.limitsFor(account({ rph: 0 }), none)).toEqual({
      rates: [{ name: "rph", limit: 0, periodMillis: 3_600_000 }],
      quotas: [{ name: "weekly", limit: 7, period: "week" }],
      concurrency: undefined,
    })
  })
})

// Without the layer's periodic maintenance: under TestClock.setTime it would replay every period since 1970.
const DispatcherNoNodes = Layer.sync(Dispatcher.Dispatcher, () => Dispatcher.make(presets, []))

describe("admit", () => {
  it.effect("sets the x-ratelimit headers of the limit closest to refusing", () =>
    Effect.gen(function* () {
      const { res, headers } = fakeResponse()
      const scope = yield* Scope.make()
      yield* Scope.extend(
        Limits.admit(res, principal({ rpm: 10, rph: 3 }), "swarm-prime", notStarted()),
        scope,
      )
      expect(headers).toEqual({
        "x-ratelimit-limit-requests": "3",
        "x-ratelimit-remaining-requests": "2",
        "x-ratelimit-reset-requests": "20m0s",
      })
      // Refused later (never committed): the counts it did not use are not shown.
      yield* Scope.close(scope, Exit.void)
      expect(headers).toEqual({})
      const ran = fakeResponse()
      yield* Effect.scoped(
        Effect.flatMap(
          Limits.admit(ran.res, principal({ rpm: 10, rph: 3 }), "swarm-prime", notStarted()),
          (p) => p.commit,
        ),
      )
      expect(ran.headers["x-ratelimit-remaining-requests"]).toBe("2")
    }).pipe(Effect.provide(Limits.layer().pipe(Layer.provide(DispatcherNoNodes)))),
  )

  it.effect("a request that started is counted even if nothing committed its permit before the release", () =>
    Effect.gen(function* () {
      const who = principal({ rpm: 2 })
      const outcome = notStarted()
      yield* Effect.scoped(
        Effect.zipRight(
          Limits.admit(fakeResponse().res, who, "swarm-prime", outcome),
          Effect.sync(() => {
            outcome.started = true
          }),
        ),
      )
      const again = fakeResponse()
      yield* Effect.scoped(
        Effect.tap(Limits.admit(again.res, who, "swarm-prime", notStarted()), () =>
          // The first one counts: with this one in flight, none is left.
          expect(again.headers["x-ratelimit-remaining-requests"]).toBe("0"),
        ),
      )
    }).pipe(Effect.provide(Limits.layer().pipe(Layer.provide(DispatcherNoNodes)))),
  )
})
