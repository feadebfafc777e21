/**
 * The gateway's side of billing: how a request's end maps to a usage outcome,
 * and the hold around a request (settled even when the fiber is interrupted).
 */
import { SqlClient } from "@effect/sql"
import { describe, expect, it } from "@effect/vitest"
import { ApiKeys, type Principal, Repository } from "@swarmgate/auth"
import { Billing as BillingService, Prices } from "@swarmgate/billing"
import { Presets } from "@swarmgate/dispatch"
import { UpstreamError, UpstreamTimeout } from "@swarmgate/protocol"
import { Database } from "@swarmgate/store"
import { Cause, Deferred, Effect, Either, Exit, Fiber, FiberId, Layer, TestClock } from "effect"
import * as Billing from "../src/Billing"
import * as ChatCompletions from "../src/ChatCompletions"
import type { NormalizedRequest } from "../src/RequestPolicy"

const NOW = Date.UTC(2026, 10, 15, 12, 0, 0)
const PRESETS = Presets.defaultPresets()
const PRIME = PRESETS[0]!
const PRICES = Either.getOrThrow(Prices.resolve(PRESETS.map((p) => p.id)))

const StoreLayer = ApiKeys.layer().pipe(
  Layer.provideMerge(Repository.layer),
  Layer.provideMerge(Database.layer("sqlite::memory:")),
)
const BillingLayer = BillingService.layer({ prices: PRICES, shutdownWaitMillis: 0 })
const TestLayer = Layer.provideMerge(BillingLayer, StoreLayer)

const run = <A, E>(
  effect: Effect.Effect<
    A,
    E,
    BillingService.Billing | Repository.Repository | ApiKeys.ApiKeys | SqlClient.SqlClient
  >,
) =>
  // The clock is set before the service starts: its sweeper would otherwise wake for every interval since 1970.
  Effect.zipRight(TestClock.setTime(NOW), Effect.provide(effect, TestLayer))

const started = (patch: Partial<ChatCompletions.Outcome>): ChatCompletions.Outcome => ({
  ...ChatCompletions.newOutcome(),
  started: true,
  ...patch,
})

const request = (maxTokens: number): NormalizedRequest => ({
  preset: PRIME,
  model: PRIME.id,
  messages: [],
  stream: true,
  includeUsage: false,
  jsonMode: false,
  maxTokens,
  promptTokens: 20,
  sampling: {},
})

const principal = (balanceUsd: number) =>
  Effect.gen(function* () {
    const repo = yield* Repository.Repository
    const account = yield* repo.createAccount({ name: "Acme", balanceMicros: balanceUsd * 1_000_000 })
    const { key } = yield* repo.createKey(account.id, {})
    return { account, key } satisfies Principal
  })

const usageRows = (accountId: string) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) =>
      sql<{ outcome: string; completion_tokens: number; cost_micros: number }>`
      SELECT outcome, completion_tokens, cost_micros FROM usage_records WHERE account_id = ${accountId}`,
  )

describe("usageOutcome", () => {
  const interrupted = Exit.failCause(Cause.interrupt(FiberId.none))
  it("voids what never reached a node", () => {
    expect(Billing.usageOutcome(ChatCompletions.newOutcome(), Exit.void)).toBe("void")
    expect(Billing.usageOutcome(ChatCompletions.newOutcome(), interrupted)).toBe("void")
    expect(
      Billing.usageOutcome(ChatCompletions.newOutcome(), Exit.fail(new UpstreamTimeout({ message: "" }))),
    ).toBe("void")
  })

  it("takes the outcome the response wrote, else derives it from how the request ended", () => {
    expect(Billing.usageOutcome(started({ status: "completed" }), interrupted)).toBe("completed")
    expect(Billing.usageOutcome(started({ status: "upstream_error" }), Exit.void)).toBe("upstream_error")
    expect(Billing.usageOutcome(started({ status: "upstream_timeout" }), Exit.void)).toBe("upstream_timeout")
    expect(Billing.usageOutcome(started({}), interrupted)).toBe("client_disconnected")
    expect(Billing.usageOutcome(started({}), Exit.fail(new UpstreamTimeout({ message: "" })))).toBe(
      "upstream_timeout",
    )
    expect(Billing.usageOutcome(started({}), Exit.fail(new UpstreamError({ message: "" })))).toBe(
      "upstream_error",
    )
    expect(Billing.usageOutcome(started({}), Exit.die(new Error("bug")))).toBe("upstream_error")
  })
})

describe("hold", () => {
  it.effect("settles an interrupted request as client_disconnected with the tokens produced so far", () =>
    run(
      Effect.gen(function* () {
        const who = yield* principal(1)
        const outcome = ChatCompletions.newOutcome()
        const holding = yield* Deferred.make<void>()
        const fiber = yield* Effect.fork(
          Effect.scoped(
            Effect.gen(function* () {
              yield* Billing.hold(who, "req_disconnect", request(1_000), outcome)
              outcome.started = true
              outcome.completionTokens = 17
              yield* Deferred.succeed(holding, undefined)
              return yield* Effect.never
            }),
          ),
        )
        yield* Deferred.await(holding)
        const billing = yield* BillingService.Billing
        // 20 × 2.5 + 1000 × 10 µ$ held while it runs.
        expect((yield* billing.accountMoney([who.account.id])).get(who.account.id)?.heldMicros).toBe(10_050)
        yield* Fiber.interrupt(fiber)
        yield* billing.flush
        expect(yield* usageRows(who.account.id)).toEqual([
          { outcome: "client_disconnected", completion_tokens: 17, cost_micros: 220 },
        ])
        expect((yield* billing.accountMoney([who.account.id])).get(who.account.id)).toEqual({
          availableMicros: 1_000_000 - 220,
          heldMicros: 0,
          spentMonthMicros: 220,
        })
      }),
    ),
  )

  it.effect("voids a request refused before generation: no record, no charge", () =>
    run(
      Effect.gen(function* () {
        const who = yield* principal(1)
        const exit = yield* Effect.exit(
          Effect.scoped(
            Effect.zipRight(
              Billing.hold(who, "req_refused", request(100), ChatCompletions.newOutcome()),
              Effect.fail(new UpstreamError({ message: "no node" })),
            ),
          ),
        )
        expect(Exit.isFailure(exit)).toBe(true)
        const billing = yield* BillingService.Billing
        yield* billing.flush
        expect(yield* usageRows(who.account.id)).toEqual([])
        expect((yield* billing.accountMoney([who.account.id])).get(who.account.id)?.availableMicros).toBe(
          1_000_000,
        )
      }),
    ),
  )

  it.effect("refuses with the wire error before anything is held", () =>
    run(
      Effect.gen(function* () {
        const who = yield* principal(0)
        const exit = yield* Effect.exit(
          Effect.scoped(Billing.hold(who, "req_poor", request(100), ChatCompletions.newOutcome())),
        )
        expect(Exit.isFailure(exit) && Cause.failureOption(exit.cause)).toMatchObject({
          value: { _tag: "InsufficientQuota", status: 429, code: "insufficient_quota" },
        })
      }),
    ),
  )
})
