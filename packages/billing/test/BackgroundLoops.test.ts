/**
 * A book's background loops go on after a defect, and the Redis book's are
 * independent of each other: a ledger
 * write that hangs (here: PostgreSQL waiting on a row another transaction
 * locked) must not keep a lapsed hold's money held. The CI failure this
 * guards against: 0.008192 USD held for minutes after a Redis outage.
 */
import { SqlClient } from "@effect/sql"
import { describe, expect, it } from "@effect/vitest"
import { TestDatabase } from "@swarmgate/store"
import { Deferred, Effect, Fiber, Logger, TestClock } from "effect"
import * as BackgroundLoop from "../src/internal/BackgroundLoop"
import * as LedgerCheck from "../src/LedgerCheck"
import * as RedisBilling from "../src/RedisBilling"
import { eventually, PRICES, request, seed } from "./support/Fixtures"
import { describeRedis } from "./support/Redis"

describe("a background loop", () => {
  it.scoped("logs a round's defect and runs the next round a second later", () =>
    Effect.gen(function* () {
      const logged: Array<unknown> = []
      const logger = Logger.make(({ message }) => logged.push(message))
      let rounds = 0
      yield* BackgroundLoop.fork(
        "test loop",
        Effect.suspend(() => {
          rounds++
          return rounds === 1 ? Effect.die(new Error("boom")) : Effect.never
        }),
      ).pipe(Effect.provide(Logger.replace(Logger.defaultLogger, logger)))
      yield* TestClock.adjust("999 millis")
      expect(rounds).toBe(1)
      expect(JSON.stringify(logged)).toContain("billing: test loop failed; it goes on")
      yield* TestClock.adjust("1 millis")
      expect(rounds).toBe(2)
    }),
  )
})

describeRedis(describe, "the Redis book's background loops", (url, prefix) => {
  TestDatabase.describePg(describe, "PostgreSQL", () => {
    it.live(
      "keeps no lapsed hold's money held; the charges are written once it moves",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          const account = yield* seed(1_000_000)
          const b = yield* RedisBilling.make({
            prices: PRICES,
            url,
            prefix,
            shutdownWaitMillis: 0,
            leaseMillis: 300,
            sweepMillis: 100,
            flushMillis: 5,
          })
          // Another transaction holds the account's row: every ledger write for it waits.
          const locked = yield* Deferred.make<void>()
          const unlock = yield* Deferred.make<void>()
          // Before the book's own finalizer (which writes what is queued) even if the test fails.
          yield* Effect.addFinalizer(() => Deferred.succeed(unlock, undefined))
          const locker = yield* Effect.fork(
            sql.withTransaction(
              Effect.gen(function* () {
                yield* sql`SELECT id FROM accounts WHERE id = ${account.accountId} FOR UPDATE`
                yield* Deferred.succeed(locked, undefined)
                yield* Deferred.await(unlock)
              }),
            ),
          )
          yield* Deferred.await(locked)
          // Two charges, some sweeps apart: every loop that writes the ledger is stuck on one.
          const charges = []
          for (let i = 0; i < 2; i++) {
            const hold = yield* b.reserve(request(account))
            charges.push(yield* b.settle(hold.requestId, { completionTokens: 5, outcome: "completed" }))
            yield* Effect.sleep("250 millis")
          }
          expect(charges.every((c) => c !== undefined)).toBe(true)
          // A hold nobody settles, past its expiry soon (long enough to be seen held on a busy
          // machine): a sweep returns its money while the ledger writes still wait.
          yield* b.reserve(request(account, { ttlMillis: 1_500 }))
          const held = Effect.map(
            b.accountMoney([account.accountId]),
            (money) => money.get(account.accountId)?.heldMicros,
          )
          expect(yield* held).toBeGreaterThan(0)
          yield* eventually(
            Effect.map(held, (micros) => micros === 0),
            6_000,
          )
          // The lock goes; the stuck writes finish and the ledger holds both charges, once each.
          yield* Deferred.succeed(unlock, undefined)
          yield* Fiber.join(locker)
          yield* eventually(
            Effect.map(
              sql<{
                n: unknown
              }>`SELECT COUNT(*) AS n FROM usage_records WHERE account_id = ${account.accountId}`,
              (rows) => Number(rows[0]!.n) === 2,
            ),
            10_000,
          )
          const report = yield* LedgerCheck.check
          expect(report.problems).toEqual([])
        }).pipe(Effect.scoped, Effect.provide(TestDatabase.layerPg("swarmgate_billing_loops"))),
      { timeout: 60_000 },
    )
  })
})
