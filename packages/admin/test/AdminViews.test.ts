/**
 * Admin views fed by the services of the request path: the live billing book
 * (available, held, spent, prices) and the limits (`usage_now`).
 */
import type { ServerResponse } from "node:http"
import { describe, expect, it } from "@effect/vitest"
import { ApiKeys, type Principal, Repository } from "@swarmgate/auth"
import { Billing as BillingService, Prices } from "@swarmgate/billing"
import { Dispatcher, Presets } from "@swarmgate/dispatch"
import { Limits } from "@swarmgate/gateway"
import { Database } from "@swarmgate/store"
import { Effect, Either, Exit, Layer, Scope, TestClock } from "effect"
import { type AdminResponse, getAccount, handleAdmin } from "../src/Admin"
import * as AdminLayers from "./support/AdminLayers"

const NOW = Date.UTC(2026, 10, 15, 12, 0, 0)
const PRESETS = Presets.defaultPresets()
const PRIME = PRESETS[0]!
const PRICES = Either.getOrThrow(Prices.resolve(PRESETS.map((p) => p.id)))

const StoreLayer = ApiKeys.layer().pipe(
  Layer.provideMerge(Repository.layer),
  Layer.provideMerge(Database.layer("sqlite::memory:")),
)
const AdminLayer = AdminLayers.outboxLayer().pipe(Layer.provideMerge(StoreLayer))
const BillingLayer = BillingService.layer({ prices: PRICES, shutdownWaitMillis: 0 })
const TestLayer = Layer.provideMerge(BillingLayer, AdminLayer)
const DispatcherNoNodes = Layer.sync(Dispatcher.Dispatcher, () => Dispatcher.make(PRESETS, []))

const run = <A, E>(
  effect: Effect.Effect<A, E, BillingService.Billing | Layer.Layer.Success<typeof AdminLayer>>,
) =>
  // The clock is set before the service starts: its sweeper would otherwise wake for every interval since 1970.
  Effect.zipRight(TestClock.setTime(NOW), Effect.provide(effect, TestLayer))

const principal = (balanceUsd: number) =>
  Effect.gen(function* () {
    const repo = yield* Repository.Repository
    const account = yield* repo.createAccount({ name: "Acme", balanceMicros: balanceUsd * 1_000_000 })
    const { key } = yield* repo.createKey(account.id, {})
    return { account, key } satisfies Principal
  })

const notStarted = () => ({ started: false })

/** A response not yet started, for `Limits.admit`'s headers. */
const fakeResponse = () =>
  ({
    headersSent: false,
    setHeader: () => undefined,
    removeHeader: () => undefined,
  }) as unknown as ServerResponse

// biome-ignore lint/suspicious/noExplicitAny: responses are JSON read by field
const json = (response: AdminResponse): any => response.body

const call = (method: string, path: string, body?: unknown) =>
  handleAdmin({ method, segments: path.split("/"), query: new URLSearchParams(), body })

describe("admin views with billing", () => {
  it.effect("show available, held and spent from the live book, and the prices", () =>
    run(
      Effect.gen(function* () {
        const who = yield* principal(1)
        const billing = yield* BillingService.Billing
        const input = {
          requestId: "req_a",
          accountId: who.account.id,
          keyId: who.key.id,
          model: PRIME.id,
          promptTokens: 20,
          maxTokens: 100,
          paymentHold: false,
          monthlySpendLimitMicros: null,
          keySpendLimitMicros: null,
          ttlMillis: 60_000,
        }
        // Each holds 20 × 2.5 + 100 × 10 = 1_050 µ$.
        yield* billing.reserve(input)
        yield* billing.reserve({ ...input, requestId: "req_b" })
        yield* billing.settle("req_a", { completionTokens: 10, outcome: "completed" })
        // Not yet written: the view still counts it.
        const account = json(yield* call("GET", `accounts/${who.account.id}`))
        expect(account).toMatchObject({ balance_usd: 0.9988, held_usd: 0.00105, spent_month_usd: 0.00015 })
        expect(json(yield* call("GET", `keys/${who.key.id}`)).spent_usd).toBe(0.00015)
        const credited = json(yield* call("POST", `accounts/${who.account.id}/credits`, { amount_usd: 1 }))
        expect(credited).toMatchObject({ balance_usd: 1.9988, held_usd: 0.00105 })
        expect(json(yield* call("GET", "prices"))).toEqual({ object: "list", data: Prices.view(PRICES) })
      }),
    ),
  )

  it.effect("without billing (the CLI), prices are not found and views come from the ledger", () =>
    Effect.provide(
      Effect.gen(function* () {
        yield* TestClock.setTime(NOW)
        expect((yield* call("GET", "prices")).status).toBe(404)
        const account = json(yield* call("POST", "accounts", { name: "A", balance_usd: 2 }))
        expect(account).toMatchObject({ balance_usd: 2, held_usd: 0, spent_month_usd: 0 })
      }),
      AdminLayer,
    ),
  )
})

describe("GET /admin/v1/accounts/{id}", () => {
  it.effect("shows usage_now where limits are admitted, per model for rates", () =>
    Effect.gen(function* () {
      yield* TestClock.setTime(Date.UTC(2026, 10, 18, 12))
      const repo = yield* Repository.Repository
      const created = yield* repo.createAccount({ name: "Acme", limits: { rpm: 2, daily: 5 } })
      const permitScope = yield* Scope.make()
      const permit = yield* Scope.extend(
        Limits.admit(
          fakeResponse(),
          { account: created } as unknown as Principal,
          "swarm-swift",
          notStarted(),
        ),
        permitScope,
      )
      yield* permit.commit
      const view = yield* getAccount(created.id)
      expect(view.usage_now).toEqual({
        concurrency: 1,
        queued: 0,
        rpm_remaining: { "swarm-prime": 2, "swarm-swift": 1 },
        rph_remaining: { "swarm-prime": 1_000, "swarm-swift": 999 },
        daily_remaining: 4,
        weekly_remaining: 49_999,
      })
      yield* Scope.close(permitScope, Exit.void)
      expect((yield* getAccount(created.id)).usage_now?.concurrency).toBe(0)
    }).pipe(Effect.provide(Layer.merge(AdminLayer, Limits.layer().pipe(Layer.provide(DispatcherNoNodes))))),
  )

  it.effect("has no usage_now without the limits service (the CLI)", () =>
    Effect.gen(function* () {
      const repo = yield* Repository.Repository
      const created = yield* repo.createAccount({ name: "Acme" })
      expect("usage_now" in (yield* getAccount(created.id))).toBe(false)
    }).pipe(Effect.provide(AdminLayer)),
  )
})
