/**
 * One contract, two books: the memory book and the Redis book, driven by the
 * same random sequence of reservations, settlements, voids, expiries, credits
 * and month changes, must give the same answer at every step — the same
 * refusal (so the same order of checks), the same charge, the same balances,
 * holds and spend.
 */
import { randomBytes } from "node:crypto"
import { SqlClient } from "@effect/sql"
import { describe, expect, it } from "@effect/vitest"
import { Database } from "@swarmgate/store"
import { Clock, Effect, Either, FastCheck as fc, Layer, type Scope, TestClock } from "effect"
import * as Billing from "../src/Billing"
import * as RedisBilling from "../src/RedisBilling"
import { PRICES } from "./support/Fixtures"
import { describeRedis } from "./support/Redis"

// Shortly before a month ends, so that ticks cross into the next one.
const START = Date.UTC(2026, 0, 31, 22, 0, 0)
// No background sweeps, renewals or lease expiry: every step is explicit, so both books see the same.
const QUIET = { sweepMillis: 1e12, refreshMillis: 0, shutdownWaitMillis: 0 }

const accountSpec = fc.record({
  balance: fc.integer({ min: 0, max: 60_000 }),
  monthly: fc.option(fc.integer({ min: 0, max: 80_000 }), { nil: null }),
  paymentHold: fc.boolean(),
})
const keySpec = fc.record({
  account: fc.nat(),
  limit: fc.option(fc.integer({ min: 0, max: 70_000 }), { nil: null }),
})

type Step =
  | { readonly op: "reserve"; readonly key: number; readonly maxTokens: number; readonly ttl: number }
  | { readonly op: "settle"; readonly hold: number; readonly completion: number }
  | { readonly op: "void"; readonly hold: number }
  | { readonly op: "tick"; readonly millis: number }
  | { readonly op: "credit"; readonly account: number; readonly amount: number }

const step: fc.Arbitrary<Step> = fc.oneof(
  {
    weight: 5,
    arbitrary: fc.record({
      op: fc.constant("reserve" as const),
      key: fc.nat(),
      maxTokens: fc.integer({ min: 1, max: 200 }),
      ttl: fc.integer({ min: 1, max: 10_000 }),
    }),
  },
  {
    weight: 3,
    arbitrary: fc.record({ op: fc.constant("settle" as const), hold: fc.nat(), completion: fc.nat(250) }),
  },
  { weight: 1, arbitrary: fc.record({ op: fc.constant("void" as const), hold: fc.nat() }) },
  {
    weight: 1,
    arbitrary: fc.record({
      op: fc.constant("tick" as const),
      millis: fc.oneof(fc.integer({ min: 0, max: 5_000 }), fc.integer({ min: 0, max: 3 * 3_600_000 })),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      op: fc.constant("credit" as const),
      account: fc.nat(),
      amount: fc.integer({ min: 0, max: 20_000 }),
    }),
  },
)

/** Accounts and keys with the given ids, straight into one ledger. */
const seedLedger = (
  accounts: ReadonlyArray<{ id: string; balance: number }>,
  keys: ReadonlyArray<{ id: string; account: string }>,
) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    for (const a of accounts) {
      yield* sql`INSERT INTO accounts ${sql.insert({
        id: a.id,
        name: "contract",
        status: "active",
        payment_hold: 0,
        balance_micros: 0,
        monthly_spend_limit_micros: null,
        limits: "{}",
        created_at: START,
        updated_at: START,
      })}`
      yield* credit(a.id, a.balance)
    }
    for (const k of keys) {
      yield* sql`INSERT INTO api_keys ${sql.insert({
        id: k.id,
        account_id: k.account,
        key_hash: randomBytes(16).toString("hex"),
        prefix: "sk-swarm-tst",
        name: null,
        disabled: 0,
        revoked_at: null,
        expires_at: null,
        spend_limit_micros: null,
        created_at: START,
        updated_at: START,
      })}`
    }
  })

const credit = (accountId: string, amount: number) =>
  Effect.gen(function* () {
    if (amount === 0) return
    const sql = yield* SqlClient.SqlClient
    yield* sql`UPDATE accounts SET balance_micros = balance_micros + ${amount} WHERE id = ${accountId}`
    yield* sql`INSERT INTO balance_movements ${sql.insert({
      id: `mov_${randomBytes(8).toString("hex")}`,
      account_id: accountId,
      kind: "credit",
      amount_micros: amount,
      request_id: null,
      created_at: yield* Clock.currentTimeMillis,
    })}`
  })

interface Book {
  readonly billing: Billing.BillingShape
  readonly sql: Layer.Layer<SqlClient.SqlClient>
}

const outcomeOf = <A>(effect: Effect.Effect<A, { readonly _tag: string }>) =>
  Effect.map(Effect.either(effect), Either.match({ onLeft: (e) => e._tag, onRight: () => "held" }))

describeRedis(describe, "the memory book and the Redis book", (url, prefix) => {
  it.effect.prop(
    "agree on every refusal, charge, expiry, balance and spend",
    [
      fc.array(accountSpec, { minLength: 1, maxLength: 3 }),
      fc.array(keySpec, { minLength: 1, maxLength: 4 }),
      fc.array(step, { minLength: 1, maxLength: 40 }),
    ],
    ([accountSpecs, keySpecs, steps]) =>
      Effect.scoped(
        Effect.gen(function* () {
          yield* TestClock.setTime(START)
          const run = randomBytes(4).toString("hex")
          const accounts = accountSpecs.map((spec, i) => ({ ...spec, id: `acct_${run}_${i}` }))
          const keys = keySpecs.map((spec, i) => ({
            ...spec,
            id: `key_${run}_${i}`,
            account: accounts[spec.account % accounts.length]!,
          }))
          const open = (
            make: Effect.Effect<Billing.BillingShape, unknown, SqlClient.SqlClient | Scope.Scope>,
          ) =>
            Effect.gen(function* () {
              const context = yield* Layer.build(Database.layer("sqlite::memory:"))
              const sql = Layer.succeedContext(context)
              yield* seedLedger(
                accounts,
                keys.map((k) => ({ id: k.id, account: k.account.id })),
              ).pipe(Effect.provide(sql))
              const billing = yield* make.pipe(Effect.provide(sql))
              return { billing, sql } satisfies Book
            })
          const memory = yield* open(Billing.make({ prices: PRICES, ...QUIET }))
          const redis = yield* open(
            RedisBilling.make({ prices: PRICES, ...QUIET, url, prefix, leaseMillis: 1e12 }),
          )
          const books = [memory, redis] as const
          const holds: Array<string> = []
          let n = 0

          const both = <A>(use: (book: Book) => Effect.Effect<A, unknown>) =>
            Effect.all(books.map(use)) as Effect.Effect<[A, A], unknown>

          for (const s of steps) {
            switch (s.op) {
              case "reserve": {
                const key = keys[s.key % keys.length]!
                const input = {
                  requestId: `req_${run}_${n++}`,
                  accountId: key.account.id,
                  keyId: key.id,
                  model: "m",
                  promptTokens: 10,
                  maxTokens: s.maxTokens,
                  paymentHold: key.account.paymentHold,
                  monthlySpendLimitMicros: key.account.monthly,
                  keySpendLimitMicros: key.limit,
                  ttlMillis: s.ttl,
                }
                const [a, b] = yield* both((book) => outcomeOf(book.billing.reserve(input)))
                expect(b, `reserve ${input.requestId}`).toBe(a)
                if (a === "held") holds.push(input.requestId)
                break
              }
              case "settle": {
                if (holds.length === 0) break
                const id = holds[s.hold % holds.length]!
                const settlement = { completionTokens: s.completion, outcome: "completed" as const }
                const [a, b] = yield* both((book) => book.billing.settle(id, settlement))
                expect(b?.costMicros, `settle ${id}`).toBe(a?.costMicros)
                break
              }
              case "void": {
                if (holds.length === 0) break
                const id = holds[s.hold % holds.length]!
                const [a, b] = yield* both((book) => book.billing.void(id))
                expect(b, `void ${id}`).toBe(a)
                break
              }
              case "tick": {
                yield* TestClock.adjust(s.millis)
                const [a, b] = yield* both((book) => book.billing.expire)
                expect(b, "expired").toBe(a)
                break
              }
              case "credit": {
                const account = accounts[s.account % accounts.length]!
                yield* both((book) =>
                  Effect.zipRight(
                    credit(account.id, s.amount).pipe(Effect.provide(book.sql)),
                    book.billing.refresh([account.id]),
                  ),
                )
                break
              }
            }
            const ids = accounts.map((a) => a.id)
            const [moneyA, moneyB] = yield* both((book) => book.billing.accountMoney(ids))
            expect(Object.fromEntries(moneyB)).toEqual(Object.fromEntries(moneyA))
            const keyIds = keys.map((k) => k.id)
            const [spentA, spentB] = yield* both((book) => book.billing.keySpent(keyIds))
            expect(Object.fromEntries(spentB)).toEqual(Object.fromEntries(spentA))
          }
        }),
      ),
    { fastCheck: { numRuns: 40 }, timeout: 60_000 },
  )
})
