import { describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Effect, Either, Exit, FastCheck as fc } from "effect"
import * as Prices from "../src/Prices"

const MODELS = ["swarm-prime", "swarm-swift"]

describe("Prices", () => {
  it("defaults go by the preset suffix, whatever the brand", () => {
    const table = Either.getOrThrow(Prices.resolve(["acme-prime", "acme-swift"]))
    expect(table.get("acme-prime")).toEqual({
      promptMicrosPerMillion: 2_500_000,
      completionMicrosPerMillion: 10_000_000,
    })
    expect(table.get("acme-swift")).toEqual({
      promptMicrosPerMillion: 150_000,
      completionMicrosPerMillion: 600_000,
    })
  })

  it("overrides one or both prices of a model", () => {
    const table = Either.getOrThrow(
      Prices.resolve(MODELS, {
        "swarm-swift": { completion_usd_per_million: 1.25 },
        "swarm-prime": { prompt_usd_per_million: 0, completion_usd_per_million: 0 },
      }),
    )
    expect(table.get("swarm-swift")).toEqual({
      promptMicrosPerMillion: 150_000,
      completionMicrosPerMillion: 1_250_000,
    })
    expect(table.get("swarm-prime")).toEqual({ promptMicrosPerMillion: 0, completionMicrosPerMillion: 0 })
  })

  it("refuses unknown models and fields, bad values, and models left without a price", () => {
    const reason = (overrides: unknown, models = MODELS) =>
      Either.match(Prices.resolve(models, overrides), { onLeft: (e) => e.reason, onRight: () => "ok" })
    expect(reason({ "swarm-prim": { prompt_usd_per_million: 1 } })).toMatch(/unknown model 'swarm-prim'/)
    expect(reason({ "swarm-prime": { prompt: 1 } })).toMatch(/unknown field 'prompt'/)
    expect(reason({ "swarm-prime": { prompt_usd_per_million: -1 } })).toMatch(/from 0 to 1000/)
    expect(reason({ "swarm-prime": { prompt_usd_per_million: "2" } })).toMatch(/from 0 to 1000/)
    expect(reason({ "swarm-prime": { prompt_usd_per_million: 1001 } })).toMatch(/from 0 to 1000/)
    expect(reason([])).toMatch(/JSON object/)
    expect(reason({}, ["swarm-prime", "swarm-ultra"])).toMatch(/no price for swarm-ultra/)
    expect(
      reason({ "swarm-ultra": { prompt_usd_per_million: 1, completion_usd_per_million: 2 } }, [
        "swarm-ultra",
      ]),
    ).toBe("ok")
  })

  it("costs whole micro-dollars, rounded up", () => {
    const price = { promptMicrosPerMillion: 2_500_000, completionMicrosPerMillion: 10_000_000 }
    expect(Prices.costMicros(price, 0, 0)).toBe(0)
    expect(Prices.costMicros(price, 1, 0)).toBe(3) // 2.5 µ$
    expect(Prices.costMicros(price, 2, 0)).toBe(5)
    expect(Prices.costMicros(price, 1_000_000, 1_000_000)).toBe(12_500_000)
  })

  it.prop(
    "the cost never decreases with more tokens and is within 1 µ$ of the exact price",
    [fc.nat(1_000_000_000), fc.nat(1_000_000_000), fc.nat(1_000_000), fc.nat(1_000_000), fc.nat(1_000)],
    ([prompt, completion, p, c, extra]) => {
      const price = { promptMicrosPerMillion: prompt, completionMicrosPerMillion: completion }
      const cost = Prices.costMicros(price, p, c)
      expect(Prices.costMicros(price, p, c + extra)).toBeGreaterThanOrEqual(cost)
      expect(Prices.costMicros(price, p + extra, c)).toBeGreaterThanOrEqual(cost)
      const exact = BigInt(p) * BigInt(prompt) + BigInt(c) * BigInt(completion)
      const micros = BigInt(cost) * 1_000_000n
      expect(micros >= exact && micros - exact < 1_000_000n).toBe(true)
    },
  )

  it.effect("reads SWARMGATE_PRICES, or a file, not both", () =>
    Effect.gen(function* () {
      const withEnv = (env: Record<string, string>) =>
        Effect.exit(
          Effect.withConfigProvider(
            Prices.fromConfig(MODELS),
            ConfigProvider.fromMap(new Map(Object.entries(env))),
          ),
        )
      const ok = yield* withEnv({ SWARMGATE_PRICES: '{"swarm-prime":{"prompt_usd_per_million":3}}' })
      expect(Exit.isSuccess(ok) && ok.value.get("swarm-prime")?.promptMicrosPerMillion).toBe(3_000_000)
      expect(Exit.isFailure(yield* withEnv({ SWARMGATE_PRICES: "{nope" }))).toBe(true)
      expect(
        Exit.isFailure(yield* withEnv({ SWARMGATE_PRICES: "{}", SWARMGATE_PRICES_FILE: "/x.json" })),
      ).toBe(true)
      expect(Exit.isFailure(yield* withEnv({ SWARMGATE_PRICES_FILE: "/nonexistent/prices.json" }))).toBe(true)
      expect(Exit.isSuccess(yield* withEnv({}))).toBe(true)
    }),
  )

  it("shows prices in USD per million tokens", () => {
    expect(Prices.view(Either.getOrThrow(Prices.resolve(MODELS)))).toEqual([
      { model: "swarm-prime", prompt_usd_per_million: 2.5, completion_usd_per_million: 10 },
      { model: "swarm-swift", prompt_usd_per_million: 0.15, completion_usd_per_million: 0.6 },
    ])
  })
})
