/**
 * The billing service against a real ledger: the same suite on SQLite and on
 * PostgreSQL (a fresh database per suite when TEST_DATABASE_URL is set).
 */
import { SqlClient } from "@effect/sql"
import { describe, expect, layer } from "@effect/vitest"
import { Observed } from "@swarmgate/protocol"
import { Database, SqliteWriter, TestDatabase } from "@swarmgate/store"
import { Clock, Effect, Either, Exit, Fiber, FastCheck as fc, Layer, type Scope, TestClock } from "effect"
import * as Billing from "../src/Billing"
import * as LedgerCheck from "../src/LedgerCheck"
import * as RedisBilling from "../src/RedisBilling"
import { creditInSql, eventually, ledgerOf, PRICES, request, seed } from "./support/Fixtures"
import { describeRedis } from "./support/Redis"

const NOW = Date.UTC(2026, 10, 15, 12, 0, 0)

/** A billing service over the `SqlClient` in context: the memory book, or the Redis one. */
type MakeBilling = (
  options: Billing.BillingOptions,
) => Effect.Effect<Billing.BillingShape, unknown, SqlClient.SqlClient | Scope.Scope>

const errorTag = <A, E extends { _tag: string }, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.map(Effect.either(effect), Either.match({ onLeft: (e) => e._tag, onRight: () => "ok" }))

const expectLedgerOk = Effect.gen(function* () {
  const report = yield* LedgerCheck.check
  expect(report.problems).toEqual([])
  expect(report.ok).toBe(true)
  return report
})

const suite = (
  name: string,
  database: Layer.Layer<SqlClient.SqlClient, unknown>,
  make: MakeBilling = Billing.make,
) =>
  layer(database, { timeout: "120 seconds" })(name, (it) => {
    const billing = (options: Partial<Billing.BillingOptions> = {}) =>
      make({ prices: PRICES, shutdownWaitMillis: 0, ...options })

    it.scoped("holds the worst case, charges what ran and writes it in one group commit", () =>
      Effect.gen(function* () {
        yield* TestClock.setTime(NOW)
        const account = yield* seed(1_000_000)
        const b = yield* billing()
        const hold = yield* b.reserve(request(account, { promptTokens: 10, maxTokens: 50 }))
        // 10 × 100 + 50 × 200
        expect(hold.amountMicros).toBe(11_000)
        expect((yield* b.accountMoney([account.accountId])).get(account.accountId)).toEqual({
          availableMicros: 989_000,
          heldMicros: 11_000,
          spentMonthMicros: 0,
        })
        const entry = yield* b.settle(hold.requestId, { completionTokens: 20, outcome: "completed" })
        expect(entry).toMatchObject({ costMicros: 5_000, promptTokens: 10, completionTokens: 20 })
        expect((yield* b.accountMoney([account.accountId])).get(account.accountId)).toEqual({
          availableMicros: 995_000,
          heldMicros: 0,
          spentMonthMicros: 5_000,
        })
        expect((yield* b.keySpent([account.keyId])).get(account.keyId)).toBe(5_000)
        // Nothing on disk until the window passes: the request did not wait for a write.
        expect((yield* ledgerOf(account.accountId)).usage).toEqual([])
        yield* TestClock.adjust("50 millis")
        yield* eventually(Effect.map(ledgerOf(account.accountId), (l) => l.usage.length === 1))
        const ledger = yield* ledgerOf(account.accountId)
        expect(ledger.balance).toBe(995_000)
        expect(ledger.usage).toEqual([
          {
            requestId: hold.requestId,
            keyId: account.keyId,
            promptTokens: 10,
            completionTokens: 20,
            cost: 5_000,
            outcome: "completed",
          },
        ])
        expect(ledger.charges).toEqual([{ requestId: hold.requestId, amount: 5_000 }])
        yield* expectLedgerOk
      }),
    )

    it.scoped(
      "refuses with a No code only when a limit cannot pay the prompt and one token, checked in order",
      () =>
        Effect.gen(function* () {
          yield* TestClock.setTime(NOW)
          // The minimum of the default request: 10 × 100 + 1 × 200.
          const poor = yield* seed(1_199)
          const b = yield* billing()
          expect(yield* errorTag(b.reserve(request(poor)))).toBe("InsufficientQuota")
          expect(yield* errorTag(b.reserve(request(poor, { paymentHold: true })))).toBe("PaymentHold")
          // Balance and key limit both too low: the balance speaks first.
          expect(yield* errorTag(b.reserve(request(poor, { keySpendLimitMicros: 0 })))).toBe(
            "InsufficientQuota",
          )
          const rich = yield* seed(1_000_000)
          expect(yield* errorTag(b.reserve(request(rich, { monthlySpendLimitMicros: 1_199 })))).toBe(
            "AccountSpendLimitReached",
          )
          expect(yield* errorTag(b.reserve(request(rich, { keySpendLimitMicros: 1_199 })))).toBe(
            "BillingLimitExceeded",
          )
          // Exactly the minimum: served, with one completion token.
          const one = yield* b.reserve(request(rich, { monthlySpendLimitMicros: 1_200 }))
          expect([one.amountMicros, one.maxTokens]).toEqual([1_200, 1])
          yield* b.void(one.requestId)
          // A payment hold does not block while the usable balance lasts.
          expect(yield* errorTag(b.reserve(request(rich, { maxTokens: 40, paymentHold: true })))).toBe("ok")
          expect((yield* b.pending).holds).toBe(1)
        }),
    )

    it.scoped(
      "holds all that is left and caps the completion at what it buys when the worst case does not fit",
      () =>
        Effect.gen(function* () {
          yield* TestClock.setTime(NOW)
          const account = yield* seed(10_000)
          const b = yield* billing()
          // Worst case 11_000 > 10_000: 10 × 100 + 45 × 200 fits.
          const capped = yield* b.reserve(request(account))
          expect([capped.amountMicros, capped.maxTokens]).toEqual([10_000, 45])
          yield* b.void(capped.requestId)
          const rich = yield* seed(1_000_000)
          const byKey = yield* b.reserve(request(rich, { keySpendLimitMicros: 5_300 }))
          expect([byKey.amountMicros, byKey.maxTokens]).toEqual([5_200, 21])
          // What ran is charged, never more than the capped hold.
          const entry = yield* b.settle(byKey.requestId, { completionTokens: 21, outcome: "completed" })
          expect(entry?.costMicros).toBe(5_200)
          // 100 left under the key: not even the prompt and one token, so a No code from now on.
          expect(yield* errorTag(b.reserve(request(rich, { keySpendLimitMicros: 5_300 })))).toBe(
            "BillingLimitExceeded",
          )
        }),
    )

    it.scoped(
      "counts open holds, so concurrent reservations never jointly overspend; others' holds mean 429 concurrency",
      () =>
        Effect.gen(function* () {
          yield* TestClock.setTime(NOW)
          const account = yield* seed(3 * 11_000 + 10_999)
          const other = yield* seed(1_000_000)
          const b = yield* billing()
          const held = (rs: ReadonlyArray<Either.Either<Billing.Hold, { _tag: string }>>) =>
            rs.flatMap((r) => (Either.isRight(r) ? [r.right] : []))
          const tags = (rs: ReadonlyArray<Either.Either<Billing.Hold, { _tag: string }>>) =>
            rs.flatMap((r) => (Either.isLeft(r) ? [r.left._tag] : []))
          const burst = (input: () => Billing.ReserveInput) =>
            Effect.all(
              Array.from({ length: 20 }, () => Effect.either(b.reserve(input()))),
              { concurrency: "unbounded" },
            )
          const balance = yield* burst(() => request(account))
          // Three worst cases, then one capped at 10 × 100 + 49 × 200; the rest are held up by those.
          expect(
            held(balance)
              .map((h) => h.amountMicros)
              .sort(),
          ).toEqual([10_800, 11_000, 11_000, 11_000])
          expect(tags(balance)).toEqual(Array(16).fill("ConcurrencyLimitExceeded"))
          const key = yield* burst(() => request(other, { keySpendLimitMicros: 50_000 }))
          expect(held(key).reduce((sum, h) => sum + h.amountMicros, 0)).toBe(50_000)
          expect(tags(key)).toEqual(Array(15).fill("ConcurrencyLimitExceeded"))
          const month = yield* burst(() => request(other, { monthlySpendLimitMicros: 50_000 + 50_000 }))
          // 50_000 already held by the key's five: room for 50_000 more.
          expect(held(month).reduce((sum, h) => sum + h.amountMicros, 0)).toBe(50_000)
          expect(tags(month)).toEqual(Array(15).fill("ConcurrencyLimitExceeded"))
          const refused = tags(month)
          expect(refused).not.toContain("AccountSpendLimitReached")
        }),
    )

    it.scoped("a request held up only by other holds waits for them, up to its wait, then gets 429", () =>
      Effect.gen(function* () {
        yield* TestClock.setTime(NOW)
        const account = yield* seed(11_000)
        const b = yield* billing()
        const first = yield* b.reserve(request(account))
        const waiting = yield* Effect.fork(b.reserve(request(account, { waitMillis: 5_000 })))
        yield* TestClock.adjust("1 second")
        yield* b.settle(first.requestId, { completionTokens: 5, outcome: "completed" })
        // The money freed by the settlement (11_000 − 2_000) goes to the waiter, capped.
        yield* TestClock.adjust("100 millis")
        const second = yield* Fiber.join(waiting)
        expect([second.amountMicros, second.maxTokens]).toEqual([9_000, 40])
        // Nothing settles now: the wait runs out.
        const late = yield* Effect.fork(Effect.either(b.reserve(request(account, { waitMillis: 2_000 }))))
        yield* TestClock.adjust("2 seconds")
        const refused = yield* Fiber.join(late)
        expect(Either.isLeft(refused) && refused.left._tag).toBe("ConcurrencyLimitExceeded")
        expect(
          Either.isLeft(refused) &&
            refused.left._tag === "ConcurrencyLimitExceeded" &&
            refused.left.retryAfter,
        ).toBe(1)
        expect((yield* b.pending).holds).toBe(1)
      }),
    )

    it.scoped("settles exactly once; a void leaves no record and no charge", () =>
      Effect.gen(function* () {
        yield* TestClock.setTime(NOW)
        const account = yield* seed(100_000)
        const b = yield* billing()
        const first = yield* b.reserve(request(account))
        const second = yield* b.reserve(request(account))
        const settled = yield* Effect.all(
          Array.from({ length: 5 }, () =>
            b.settle(first.requestId, { completionTokens: 7, outcome: "client_disconnected" }),
          ),
          { concurrency: "unbounded" },
        )
        expect(settled.filter((s) => s !== undefined)).toHaveLength(1)
        expect(yield* b.void(first.requestId)).toBe(false)
        expect(yield* b.void(second.requestId)).toBe(true)
        expect(
          yield* b.settle(second.requestId, { completionTokens: 7, outcome: "completed" }),
        ).toBeUndefined()
        yield* b.flush
        const ledger = yield* ledgerOf(account.accountId)
        // 10 × 100 + 7 × 200
        expect(ledger.usage.map((u) => [u.requestId, u.cost, u.outcome])).toEqual([
          [first.requestId, 2_400, "client_disconnected"],
        ])
        expect(ledger.balance).toBe(97_600)
        expect((yield* b.accountMoney([account.accountId])).get(account.accountId)).toEqual({
          availableMicros: 97_600,
          heldMicros: 0,
          spentMonthMicros: 2_400,
        })
        yield* expectLedgerOk
      }),
    )

    it.scoped("an unsettled hold expires and its money returns; a late settlement charges nothing", () =>
      Effect.gen(function* () {
        yield* TestClock.setTime(NOW)
        const account = yield* seed(11_000)
        const b = yield* billing({ sweepMillis: 1_000 })
        const stale = yield* b.reserve(request(account, { ttlMillis: 3_000 }))
        // Only the stale hold stands in the way: 429, not a No code.
        expect(yield* errorTag(b.reserve(request(account)))).toBe("ConcurrencyLimitExceeded")
        yield* TestClock.adjust("2999 millis")
        expect((yield* b.pending).holds).toBe(1)
        // The sweeper runs every second on its own.
        yield* TestClock.adjust("1 second")
        yield* eventually(Effect.map(b.pending, (p) => p.holds === 0))
        expect((yield* b.accountMoney([account.accountId])).get(account.accountId)?.availableMicros).toBe(
          11_000,
        )
        expect(
          yield* b.settle(stale.requestId, { completionTokens: 50, outcome: "completed" }),
        ).toBeUndefined()
        // Due between two sweeps: expire voids it.
        const fresh = yield* b.reserve(request(account, { ttlMillis: 100 }))
        yield* TestClock.adjust("100 millis")
        expect(yield* b.expire).toBe(1)
        expect(yield* b.void(fresh.requestId)).toBe(false)
        yield* b.flush
        expect((yield* ledgerOf(account.accountId)).usage).toEqual([])
      }),
    )

    it.scoped("sees credit made by another process: at once on refresh, else on a refusal", () =>
      Effect.gen(function* () {
        yield* TestClock.setTime(NOW)
        const account = yield* seed(0)
        const b = yield* billing({ refreshMillis: 1_000 })
        expect(yield* errorTag(b.reserve(request(account)))).toBe("InsufficientQuota")
        yield* creditInSql(account.accountId, 11_000)
        // Within refreshMillis of the last look, a refusal does not read SQL again.
        expect(yield* errorTag(b.reserve(request(account)))).toBe("InsufficientQuota")
        yield* TestClock.adjust("1 second")
        expect(yield* errorTag(b.reserve(request(account)))).toBe("ok")
        yield* creditInSql(account.accountId, 5_000)
        yield* b.refresh([account.accountId])
        expect((yield* b.accountMoney([account.accountId])).get(account.accountId)).toMatchObject({
          availableMicros: 5_000,
          heldMicros: 11_000,
        })
      }),
    )

    it.scoped("a refresh racing unwritten charges neither loses nor double-counts them", () =>
      Effect.gen(function* () {
        yield* TestClock.setTime(NOW)
        const account = yield* seed(100_000)
        const b = yield* billing()
        const hold = yield* b.reserve(request(account))
        yield* b.settle(hold.requestId, { completionTokens: 50, outcome: "completed" })
        expect((yield* b.pending).unwritten).toBe(1)
        yield* b.refresh([account.accountId])
        expect((yield* b.accountMoney([account.accountId])).get(account.accountId)?.availableMicros).toBe(
          89_000,
        )
        yield* b.flush
        yield* b.refresh([account.accountId])
        expect((yield* b.accountMoney([account.accountId])).get(account.accountId)?.availableMicros).toBe(
          89_000,
        )
        expect((yield* ledgerOf(account.accountId)).balance).toBe(89_000)
      }),
    )

    it.effect("rebuilds balances and spend from the ledger at start; shutdown writes what is queued", () =>
      Effect.gen(function* () {
        yield* TestClock.setTime(NOW)
        const account = yield* seed(100_000)
        const settled = yield* Effect.scoped(
          Effect.gen(function* () {
            const b = yield* billing()
            const hold = yield* b.reserve(request(account))
            yield* b.settle(hold.requestId, { completionTokens: 30, outcome: "upstream_error" })
            // Open at shutdown: never charged.
            yield* b.reserve(request(account))
            return yield* b.accountMoney([account.accountId])
          }),
        )
        expect(settled.get(account.accountId)).toEqual({
          availableMicros: 100_000 - 7_000 - 11_000,
          heldMicros: 11_000,
          spentMonthMicros: 7_000,
        })
        const rebuilt = yield* Effect.scoped(
          Effect.flatMap(billing(), (b) =>
            Effect.all([b.accountMoney([account.accountId]), b.keySpent([account.keyId])]),
          ),
        )
        expect(rebuilt[0].get(account.accountId)).toEqual({
          availableMicros: 93_000,
          heldMicros: 0,
          spentMonthMicros: 7_000,
        })
        expect(rebuilt[1].get(account.keyId)).toBe(7_000)
        yield* expectLedgerOk
      }),
    )

    it.scoped("monthly spend resets at the UTC month boundary", () =>
      Effect.gen(function* () {
        const lastSecond = Date.UTC(2026, 0, 31, 23, 59, 59)
        yield* TestClock.setTime(lastSecond)
        const account = yield* seed(1_000_000)
        const b = yield* billing()
        const limited = { monthlySpendLimitMicros: 22_000 }
        for (let i = 0; i < 2; i++) {
          const hold = yield* b.reserve(request(account, limited))
          yield* b.settle(hold.requestId, { completionTokens: 50, outcome: "completed" })
        }
        expect(yield* errorTag(b.reserve(request(account, limited)))).toBe("AccountSpendLimitReached")
        yield* TestClock.adjust("999 millis")
        expect(yield* errorTag(b.reserve(request(account, limited)))).toBe("AccountSpendLimitReached")
        expect((yield* b.accountMoney([account.accountId])).get(account.accountId)?.spentMonthMicros).toBe(
          22_000,
        )
        yield* TestClock.adjust("1 millis") // 2026-02-01T00:00:00Z
        expect((yield* b.accountMoney([account.accountId])).get(account.accountId)?.spentMonthMicros).toBe(0)
        const february = yield* b.reserve(request(account, limited))
        yield* b.settle(february.requestId, { completionTokens: 50, outcome: "completed" })
        yield* b.flush
        // A process started in February counts only February's records.
        const restarted = yield* Effect.scoped(
          Effect.flatMap(billing(), (r) => r.accountMoney([account.accountId])),
        )
        expect(restarted.get(account.accountId)?.spentMonthMicros).toBe(11_000)
        expect((yield* ledgerOf(account.accountId)).balance).toBe(1_000_000 - 33_000)
      }),
    )

    it.scoped("a charge already in the ledger is not written twice, and does not block the batch", () =>
      Effect.gen(function* () {
        yield* TestClock.setTime(NOW)
        const account = yield* seed(100_000)
        const b = yield* billing()
        const lost = yield* b.reserve(request(account))
        const other = yield* b.reserve(request(account))
        const lostEntry = (yield* b.settle(lost.requestId, { completionTokens: 10, outcome: "completed" }))!
        yield* b.settle(other.requestId, { completionTokens: 20, outcome: "completed" })
        // As if a commit of `lost` had succeeded but its answer never arrived.
        const sql = yield* SqlClient.SqlClient
        yield* sql.withTransaction(
          Effect.gen(function* () {
            yield* sql`INSERT INTO usage_records ${sql.insert({
              request_id: lostEntry.requestId,
              account_id: lostEntry.accountId,
              key_id: lostEntry.keyId,
              model: lostEntry.model,
              prompt_tokens: lostEntry.promptTokens,
              completion_tokens: lostEntry.completionTokens,
              cost_micros: lostEntry.costMicros,
              outcome: lostEntry.outcome,
              started_at: lostEntry.startedAt,
              created_at: lostEntry.createdAt,
            })}`
            yield* sql`INSERT INTO balance_movements ${sql.insert({
              id: `chg_${lostEntry.requestId}`,
              account_id: lostEntry.accountId,
              kind: "charge",
              amount_micros: lostEntry.costMicros,
              request_id: lostEntry.requestId,
              created_at: lostEntry.createdAt,
            })}`
            yield* sql`UPDATE accounts SET balance_micros = balance_micros - ${lostEntry.costMicros}
              WHERE id = ${lostEntry.accountId}`
          }),
        )
        yield* b.flush
        const ledger = yield* ledgerOf(account.accountId)
        expect(ledger.usage).toHaveLength(2)
        expect(ledger.balance).toBe(100_000 - 3_000 - 5_000)
        expect((yield* b.pending).unwritten).toBe(0)
        yield* b.refresh([account.accountId])
        expect((yield* b.accountMoney([account.accountId])).get(account.accountId)?.availableMicros).toBe(
          92_000,
        )
        yield* expectLedgerOk
      }),
    )

    it.scoped("the ledger check reports drift", () =>
      Effect.gen(function* () {
        yield* TestClock.setTime(NOW)
        const account = yield* seed(100_000)
        const b = yield* billing()
        const hold = yield* b.reserve(request(account))
        yield* b.settle(hold.requestId, { completionTokens: 10, outcome: "completed" })
        yield* b.flush
        yield* expectLedgerOk
        const sql = yield* SqlClient.SqlClient
        yield* sql`UPDATE accounts SET balance_micros = balance_micros + 1 WHERE id = ${account.accountId}`
        yield* sql`UPDATE balance_movements SET amount_micros = amount_micros + 5 WHERE request_id = ${hold.requestId}`
        const report = yield* LedgerCheck.check
        expect(report.ok).toBe(false)
        expect(report.problems).toEqual(
          expect.arrayContaining([
            expect.objectContaining({ kind: "balance_drift", account_id: account.accountId }),
            expect.objectContaining({
              kind: "charge_mismatch",
              request_id: hold.requestId,
              cost_micros: 3_000,
            }),
          ]),
        )
        // Put it back for the suites that share this database.
        yield* sql`UPDATE accounts SET balance_micros = balance_micros - 1 WHERE id = ${account.accountId}`
        yield* sql`UPDATE balance_movements SET amount_micros = amount_micros - 5 WHERE request_id = ${hold.requestId}`
        yield* expectLedgerOk
      }),
    )

    const step = fc.oneof(
      fc.record({
        op: fc.constant("reserve" as const),
        account: fc.nat(2),
        maxTokens: fc.integer({ min: 1, max: 80 }),
        /** Through the plain calls the gateway uses (`reserveNow`…), or the Effect ones. */
        now: fc.boolean(),
      }),
      fc.record({
        op: fc.constant("settle" as const),
        hold: fc.nat(),
        completion: fc.nat(100),
        now: fc.boolean(),
      }),
      fc.record({ op: fc.constant("void" as const), hold: fc.nat(), now: fc.boolean() }),
      fc.record({ op: fc.constant("credit" as const), account: fc.nat(2), amount: fc.nat(20_000) }),
      fc.record({ op: fc.constant("tick" as const), millis: fc.nat(40_000) }),
    )

    it.effect.prop(
      "random concurrent reserve/settle/void/expire/credit keep the ledger exact, through either path; a No code only when a limit cannot pay the minimum",
      [fc.array(fc.array(step, { minLength: 1, maxLength: 6 }), { minLength: 1, maxLength: 12 })],
      ([rounds]) =>
        Effect.scoped(
          Effect.gen(function* () {
            yield* TestClock.setTime(NOW)
            const accounts = [yield* seed(30_000), yield* seed(5_000), yield* seed(60_000)]
            const monthly = [null, null, 70_000]
            const keyLimit = 40_000
            const b = yield* billing({ refreshMillis: 0 })
            const requestIds: Array<string> = []
            let credited = 30_000 + 5_000 + 60_000
            // The last reservation's answer, for the exact checks of a round that is one reservation.
            let reserved:
              | { account: number; result: Either.Either<Billing.Hold, { _tag: string }> }
              | undefined
            for (const round of rounds) {
              // Each round's steps run at once; rounds run one after the other.
              const run = (
                s: (typeof round)[number],
              ): Effect.Effect<unknown, unknown, SqlClient.SqlClient> => {
                switch (s.op) {
                  case "reserve": {
                    const input = request(accounts[s.account]!, {
                      maxTokens: s.maxTokens,
                      ttlMillis: 30_000,
                      monthlySpendLimitMicros: monthly[s.account]!,
                      keySpendLimitMicros: s.account === 0 ? keyLimit : null,
                    })
                    return Effect.map(
                      Effect.either(
                        s.now && b.reserveNow !== undefined
                          ? Effect.flatMap(Clock.currentTimeMillis, (now) => {
                              const decided = b.reserveNow!(input, now)
                              return decided === undefined ? b.reserve(input) : decided
                            })
                          : b.reserve(input),
                      ),
                      (r) => {
                        reserved = { account: s.account, result: r }
                        if (Either.isRight(r)) requestIds.push(r.right.requestId)
                      },
                    )
                  }
                  case "settle": {
                    if (requestIds.length === 0) return Effect.void
                    const id = requestIds[s.hold % requestIds.length]!
                    const settlement = { completionTokens: s.completion, outcome: "completed" as const }
                    return s.now && b.settleNow !== undefined
                      ? Effect.flatMap(Clock.currentTimeMillis, (now) =>
                          Effect.sync(() => b.settleNow!(id, settlement, now)),
                        )
                      : b.settle(id, settlement)
                  }
                  case "void": {
                    if (requestIds.length === 0) return Effect.void
                    const id = requestIds[s.hold % requestIds.length]!
                    return s.now && b.voidNow !== undefined ? Effect.sync(() => b.voidNow!(id)) : b.void(id)
                  }
                  case "credit":
                    credited += s.amount
                    return Effect.zipRight(
                      creditInSql(accounts[s.account]!.accountId, s.amount),
                      b.refresh([accounts[s.account]!.accountId]),
                    )
                  case "tick":
                    return Effect.zipRight(TestClock.adjust(s.millis), b.expire)
                }
              }
              // Suspended, so each step picks its hold when it runs, among the holds placed so far.
              yield* Effect.all(
                round.map((s) => Effect.suspend(() => run(s))),
                { concurrency: "unbounded", discard: true },
              )
              const money = yield* b.accountMoney(accounts.map((a) => a.accountId))
              for (const a of accounts)
                expect(money.get(a.accountId)!.availableMicros).toBeGreaterThanOrEqual(0)
              const spent = yield* b.keySpent(accounts.map((a) => a.keyId))
              expect(spent.get(accounts[0]!.keyId)!).toBeLessThanOrEqual(keyLimit)
              expect(money.get(accounts[2]!.accountId)!.spentMonthMicros).toBeLessThanOrEqual(70_000)
              if (round.length === 1 && round[0]!.op === "reserve" && reserved !== undefined) {
                // Alone, the answer is exact: what is left under each limit (settled spend only) after it
                // is what it saw. The minimum: 10 prompt tokens and one completion token.
                const minimum = 10 * 100 + 200
                const m = money.get(accounts[reserved.account]!.accountId)!
                const left: Record<string, number | undefined> = {
                  InsufficientQuota: m.availableMicros + m.heldMicros,
                  AccountSpendLimitReached:
                    monthly[reserved.account] == null
                      ? undefined
                      : monthly[reserved.account]! - m.spentMonthMicros,
                  BillingLimitExceeded:
                    reserved.account === 0 ? keyLimit - spent.get(accounts[0]!.keyId)! : undefined,
                }
                const r = reserved.result
                if (Either.isLeft(r) && r.left._tag !== "ConcurrencyLimitExceeded") {
                  expect(left[r.left._tag]).toBeLessThan(minimum)
                } else {
                  // Served, or held up by other holds: every limit could pay the minimum.
                  for (const l of Object.values(left))
                    if (l !== undefined) expect(l).toBeGreaterThanOrEqual(minimum)
                }
              }
              reserved = undefined
            }
            yield* TestClock.adjust("1 minute")
            yield* b.expire
            yield* b.flush
            expect(yield* b.pending).toEqual({ holds: 0, unwritten: 0 })
            let balances = 0
            let usage = 0
            for (const a of accounts) {
              const ledger = yield* ledgerOf(a.accountId)
              const money = (yield* b.accountMoney([a.accountId])).get(a.accountId)!
              expect(money).toMatchObject({ availableMicros: ledger.balance, heldMicros: 0 })
              expect((yield* b.keySpent([a.keyId])).get(a.keyId)).toBe(
                ledger.usage.reduce((s, u) => s + u.cost, 0),
              )
              expect(new Set(ledger.usage.map((u) => u.requestId)).size).toBe(ledger.usage.length)
              balances += ledger.balance
              usage += ledger.usage.reduce((s, u) => s + u.cost, 0)
            }
            // Money that left the balances is exactly what the usage records cost.
            expect(balances + usage).toBe(credited)
            yield* expectLedgerOk
          }),
        ),
      { fastCheck: { numRuns: 25 }, timeout: 60_000 },
    )

    it.scoped("a reservation for an account that is not loaded yet loads it once", () =>
      Effect.gen(function* () {
        yield* TestClock.setTime(NOW)
        const b = yield* billing()
        // Created after the service started, as by the admin API.
        const account = yield* seed(22_000)
        const results = yield* Effect.all(
          Array.from({ length: 10 }, () => errorTag(b.reserve(request(account)))),
          { concurrency: "unbounded" },
        )
        expect(results.filter((r) => r === "ok")).toHaveLength(2)
        const exit = yield* Effect.exit(b.reserve(request(account)))
        expect(Exit.isFailure(exit)).toBe(true)
      }),
    )
  })

suite("Billing on SQLite", Database.layer("sqlite::memory:"))
// A file: the ledger's batches are written by its writer thread (SqliteWriter).
suite("Billing on a SQLite file", TestDatabase.layerSqliteFile("swarmgate_billing_file"))

TestDatabase.describePg(describe, "Billing on PostgreSQL", () => {
  suite("a fresh database", TestDatabase.layerPg("swarmgate_billing"))
})

// The same suite with the book in Redis (many instances): same answers, same ledger.
describeRedis(describe, "Billing on PostgreSQL with the book in Redis", (url, prefix) => {
  const redis: MakeBilling = (options) => RedisBilling.make({ ...options, url, prefix })
  TestDatabase.describePg(describe, "PostgreSQL", () => {
    suite("a fresh database", TestDatabase.layerPg("swarmgate_billing_redis"), redis)
  })
  suite("SQLite", Database.layer("sqlite::memory:"), redis)
  // Holds sent at the call (what the gateway uses scaled out): `reserve` rebuilt from `reserveSent`,
  // settlements through the hold's `resolve` (voids through `void`, whose answer the suite reads).
  const sentWith =
    (
      read: (
        holding: Billing.HoldSent,
      ) => Effect.Effect<Billing.Hold, Billing.ReserveRefusal | Billing.BillingUnavailable>,
      resolved: <A>(resolving: Effect.Effect<A>) => Effect.Effect<A> = (resolving) => resolving,
    ): MakeBilling =>
    (options) =>
      Effect.map(redis(options), (book): Billing.BillingShape => {
        const reserveSent = book.reserveSent
        if (reserveSent === undefined) throw new Error("the Redis book sends at the call")
        const holds = new Map<string, Billing.HoldSent>()
        return {
          ...book,
          reserve: (input) =>
            Effect.flatMap(Clock.currentTimeMillis, (now) => {
              const holding = reserveSent(input, now)
              holds.set(input.requestId, holding)
              return read(holding)
            }),
          settle: (requestId, settlement) =>
            Effect.flatMap(Clock.currentTimeMillis, (now) => {
              const holding = holds.get(requestId)
              holds.delete(requestId)
              return holding === undefined
                ? book.settle(requestId, settlement)
                : resolved(holding.resolve(settlement, now))
            }),
          void: (requestId) => {
            holds.delete(requestId)
            return book.void(requestId)
          },
        }
      })
  suite(
    "SQLite, holds sent at the call",
    Database.layer("sqlite::memory:"),
    sentWith((holding) => holding.hold),
  )
  // The same, the reply read by plain calls (the gateway's plain path): `Observed.observe` gives an
  // Exit for a hold placed at once, else the Effect that goes on.
  suite(
    "SQLite, holds sent at the call and observed",
    Database.layer("sqlite::memory:"),
    sentWith(
      (holding) =>
        Effect.async<Billing.Hold, Billing.ReserveRefusal | Billing.BillingUnavailable>((resume) =>
          Observed.observe(holding.hold, resume),
        ),
      // The settlement too, as a plain close reads it (`Observed`): by callback, never an Effect to run.
      (resolving) =>
        Effect.async((resume) =>
          Observed.observe(resolving, (result) =>
            resume(
              Exit.isExit(result) ? result : Effect.dieMessage("a sent hold's settlement needed a fiber"),
            ),
          ),
        ),
    ),
  )

  layer(Database.layer("sqlite::memory:"), { timeout: "120 seconds" })("a hold sent at the call", (it) => {
    // The gateway sends the hold with the admission, then may wait in the admission's queue first.
    it.scoped("is renewed from its reply on, while its owner has not waited for it yet", () =>
      Effect.gen(function* () {
        yield* TestClock.setTime(NOW)
        const account = yield* seed(100_000)
        const book = yield* RedisBilling.make({
          prices: PRICES,
          shutdownWaitMillis: 0,
          url,
          prefix,
          leaseMillis: 1_000,
        })
        const money = Effect.map(book.accountMoney([account.accountId]), (m) => m.get(account.accountId))
        const now = yield* Clock.currentTimeMillis
        const holding = book.reserveSent!(request(account), now)
        yield* eventually(Effect.map(money, (m) => m?.heldMicros === 11_000))
        // Three leases pass (the renewer runs every third of one), then the sweeper.
        for (let i = 0; i < 9; i++) {
          yield* TestClock.adjust("333 millis")
          yield* Effect.promise(() => new Promise((resolve) => setTimeout(resolve, 20)))
        }
        expect(yield* book.expire).toBe(0)
        expect((yield* holding.hold).amountMicros).toBe(11_000)
        expect((yield* money)?.heldMicros).toBe(11_000)
        const entry = yield* holding.resolve({ completionTokens: 7, outcome: "completed" }, now)
        expect(entry?.costMicros).toBe(2_400)
      }),
    )

    it.scoped("is voided even if its owner's resolution is interrupted while the answer is on its way", () =>
      Effect.gen(function* () {
        yield* TestClock.setTime(NOW)
        const account = yield* seed(100_000)
        const book = yield* redis({ prices: PRICES, shutdownWaitMillis: 0 })
        const money = Effect.map(book.accountMoney([account.accountId]), (m) => m.get(account.accountId))
        const now = yield* Clock.currentTimeMillis
        const holding = book.reserveSent!(request(account), now)
        const resolving = yield* Effect.fork(holding.resolve(undefined, now))
        yield* Effect.yieldNow()
        yield* Fiber.interrupt(resolving)
        expect(yield* holding.resolve(undefined, now)).toBeUndefined()
        expect((yield* money)?.heldMicros).toBe(0)
        expect((yield* book.pending).holds).toBe(0)
      }),
    )

    it.scoped("is resolved once by its owner: settled, or voided — also when nothing waited for it", () =>
      Effect.gen(function* () {
        yield* TestClock.setTime(NOW)
        const account = yield* seed(100_000)
        const poor = yield* seed(1_000)
        const book = yield* redis({ prices: PRICES, shutdownWaitMillis: 0 })
        const reserveSent = book.reserveSent!
        const money = Effect.map(book.accountMoney([account.accountId]), (m) => m.get(account.accountId))
        const now = yield* Clock.currentTimeMillis
        // Sent and never waited for (the admission refused first): its owner's void finds it.
        const unread = reserveSent(request(account), now)
        expect((yield* money)?.heldMicros).toBe(11_000)
        expect(yield* unread.resolve(undefined, now)).toBeUndefined()
        expect(yield* money).toEqual({ availableMicros: 100_000, heldMicros: 0, spentMonthMicros: 0 })
        // Waited for and settled: charged once, whatever resolves it again.
        const ran = reserveSent(request(account), now)
        expect((yield* ran.hold).amountMicros).toBe(11_000)
        const settlement = { completionTokens: 7, outcome: "completed" } as const
        expect((yield* ran.resolve(settlement, now))?.costMicros).toBe(2_400)
        expect(yield* ran.resolve(settlement, now)).toBeUndefined()
        // Refused: nothing placed, nothing to resolve.
        const refused = reserveSent(request(poor), now)
        expect(yield* errorTag(refused.hold)).toBe("InsufficientQuota")
        expect(yield* refused.resolve(settlement, now)).toBeUndefined()
        yield* book.flush
        expect((yield* ledgerOf(account.accountId)).usage.map((u) => u.cost)).toEqual([2_400])
        expect((yield* ledgerOf(poor.accountId)).usage).toEqual([])
        expect(yield* money).toEqual({ availableMicros: 97_600, heldMicros: 0, spentMonthMicros: 2_400 })
        expect((yield* book.pending).holds).toBe(0)
        yield* expectLedgerOk
      }),
    )
  })
})

// The book's batches on a SQLite file go through its writer thread, whatever fiber flushes them.
let threadTransactions = 0
const countingWriter = Layer.effect(
  SqliteWriter.SqliteWriter,
  Effect.map(SqliteWriter.SqliteWriter, (writer) =>
    writer === undefined
      ? undefined
      : {
          transaction: (statements: ReadonlyArray<SqliteWriter.Statement>) =>
            Effect.zipRight(
              Effect.sync(() => {
                threadTransactions++
              }),
              writer.transaction(statements),
            ),
        },
  ),
)

layer(Layer.provideMerge(countingWriter, TestDatabase.layerSqliteFile("swarmgate_billing_thread")))(
  "Billing on a SQLite file",
  (it) => {
    it.scoped("writes its batches on the writer thread, also when flushed from a fiber without it", () =>
      Effect.gen(function* () {
        yield* TestClock.setTime(NOW)
        const account = yield* seed(1_000_000)
        const b = yield* Billing.make({ prices: PRICES, shutdownWaitMillis: 0 })
        const hold = yield* b.reserve(request(account))
        yield* b.settle(hold.requestId, { completionTokens: 5, outcome: "completed" })
        const before = threadTransactions
        yield* b.flush.pipe(Effect.provideService(SqliteWriter.SqliteWriter, undefined))
        expect(threadTransactions - before).toBe(1)
        expect((yield* ledgerOf(account.accountId)).usage).toHaveLength(1)
      }),
    )
  },
)
