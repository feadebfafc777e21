/**
 * The Redis book while Redis is unreachable (a proxy in front of the test
 * Redis is cut and restored): `closed` refuses new holds but account views
 * and credits keep working from the ledger; `open` holds against the
 * instance's own memory book, and its charges reach the shared book once
 * Redis is back.
 */
import { createServer, type Server, type Socket, connect as tcpConnect } from "node:net"
import { describe, expect, it } from "@effect/vitest"
import { Database } from "@swarmgate/store"
import { Effect, Either } from "effect"
import { Redis } from "ioredis"
import * as LedgerCheck from "../src/LedgerCheck"
import * as RedisBilling from "../src/RedisBilling"
import { creditInSql, eventually, ledgerOf, PRICES, request, seed } from "./support/Fixtures"
import { describeRedis } from "./support/Redis"

/** A TCP proxy to Redis that can be cut (connections dropped, port closed) and restored on the same port. */
const proxy = async (target: URL) => {
  const sockets = new Set<Socket>()
  let server: Server | undefined
  let port = 0
  const listen = () =>
    new Promise<void>((resolve) => {
      server = createServer((client) => {
        const upstream = tcpConnect(Number(target.port || 6379), target.hostname)
        for (const s of [client, upstream]) {
          sockets.add(s)
          s.on("close", () => sockets.delete(s))
          s.on("error", () => undefined)
        }
        client.pipe(upstream).pipe(client)
      })
      server.listen(port, "127.0.0.1", () => {
        const address = server!.address()
        if (typeof address === "object" && address !== null) port = address.port
        resolve()
      })
    })
  await listen()
  return {
    url: () => `redis://127.0.0.1:${port}`,
    cut: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy()
        server!.close(() => resolve())
      }),
    restore: listen,
  }
}

const tagOf = <A, E extends { _tag: string }, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.map(Effect.either(effect), Either.match({ onLeft: (e) => e._tag, onRight: () => "ok" }))

describeRedis(describe, "the Redis book while Redis is unreachable", (url, prefix) => {
  {
    const options = { prices: PRICES, shutdownWaitMillis: 0, leaseMillis: 300, sweepMillis: 100 }

    it.live(
      "closed: new holds are refused; account views and credits keep working from the ledger",
      () =>
        Effect.gen(function* () {
          const redis = yield* Effect.promise(() => proxy(new URL(url)))
          const account = yield* seed(100_000)
          const b = yield* RedisBilling.make({ ...options, url: redis.url(), prefix: `${prefix}closed:` })
          const hold = yield* b.reserve(request(account))
          yield* b.settle(hold.requestId, { completionTokens: 20, outcome: "completed" })
          yield* b.flush
          yield* Effect.promise(redis.cut)
          expect(yield* tagOf(b.reserve(request(account)))).toBe("BillingUnavailable")
          yield* creditInSql(account.accountId, 1_000)
          yield* b.refresh([account.accountId])
          // 10 × 100 + 20 × 200 charged; the credit is in the ledger.
          expect((yield* b.accountMoney([account.accountId])).get(account.accountId)).toEqual({
            availableMicros: 96_000,
            heldMicros: 0,
            spentMonthMicros: 5_000,
          })
          expect((yield* b.keySpent([account.keyId])).get(account.keyId)).toBe(5_000)
          yield* Effect.promise(redis.restore)
          // Back: holds again, and the credit made meanwhile reached the shared book.
          yield* eventually(Effect.map(tagOf(b.reserve(request(account))), (tag) => tag === "ok"))
          expect((yield* b.accountMoney([account.accountId])).get(account.accountId)?.availableMicros).toBe(
            96_000 - 11_000,
          )
        }).pipe(Effect.scoped, Effect.provide(Database.layer("sqlite::memory:"))),
      20_000,
    )

    it.live(
      "a settlement made while Redis is away is charged once it is back, within its hold's lease",
      () =>
        Effect.gen(function* () {
          const redis = yield* Effect.promise(() => proxy(new URL(url)))
          const account = yield* seed(100_000)
          const b = yield* RedisBilling.make({
            ...options,
            leaseMillis: 10_000,
            commandTimeoutMillis: 200,
            url: redis.url(),
            prefix: `${prefix}late:`,
          })
          const hold = yield* b.reserve(request(account))
          yield* Effect.promise(redis.cut)
          // The request ran; its settlement cannot reach Redis.
          expect(
            yield* b.settle(hold.requestId, { completionTokens: 20, outcome: "completed" }),
          ).toBeUndefined()
          yield* Effect.promise(redis.restore)
          // 10 × 100 + 20 × 200, charged once Redis answers — long before the 10 s lease lapses.
          yield* eventually(
            Effect.map(b.accountMoney([account.accountId]), (money) => {
              const m = money.get(account.accountId)
              return m?.availableMicros === 95_000 && m.heldMicros === 0 && m.spentMonthMicros === 5_000
            }),
            5_000,
          )
          yield* b.flush
          expect((yield* ledgerOf(account.accountId)).usage.map((u) => u.cost)).toEqual([5_000])
          expect((yield* LedgerCheck.check).problems).toEqual([])
        }).pipe(Effect.scoped, Effect.provide(Database.layer("sqlite::memory:"))),
      20_000,
    )

    it.live(
      "a settlement kept past its hold's lease: charged once or returned, never both",
      () =>
        Effect.gen(function* () {
          const redis = yield* Effect.promise(() => proxy(new URL(url)))
          const account = yield* seed(100_000)
          const b = yield* RedisBilling.make({
            ...options,
            commandTimeoutMillis: 200,
            url: redis.url(),
            prefix: `${prefix}lapsed:`,
          })
          const hold = yield* b.reserve(request(account))
          yield* Effect.promise(redis.cut)
          yield* b.settle(hold.requestId, { completionTokens: 20, outcome: "completed" })
          // Away for longer than the 300 ms lease: once back, the sweep and the late settlement race.
          yield* Effect.sleep(1_000)
          yield* Effect.promise(redis.restore)
          yield* eventually(
            Effect.map(
              b.accountMoney([account.accountId]),
              (money) => money.get(account.accountId)?.heldMicros === 0,
            ),
            5_000,
          )
          // Past the late settlement's next round: nothing moves after the hold is resolved.
          yield* Effect.sleep(1_500)
          yield* b.flush
          const available = (yield* b.accountMoney([account.accountId])).get(
            account.accountId,
          )?.availableMicros
          const usage = (yield* ledgerOf(account.accountId)).usage.map((u) => u.cost)
          expect([100_000, 95_000]).toContain(available)
          expect(usage).toEqual(available === 95_000 ? [5_000] : [])
          expect((yield* LedgerCheck.check).problems).toEqual([])
        }).pipe(Effect.scoped, Effect.provide(Database.layer("sqlite::memory:"))),
      20_000,
    )

    it.live(
      "open: holds against the instance's memory book, and its charges reach the shared book when Redis is back",
      () =>
        Effect.gen(function* () {
          const redis = yield* Effect.promise(() => proxy(new URL(url)))
          const account = yield* seed(100_000)
          const b = yield* RedisBilling.make({
            ...options,
            url: redis.url(),
            prefix: `${prefix}open:`,
            onRedisFailure: "open",
          })
          const first = yield* b.reserve(request(account))
          yield* b.settle(first.requestId, { completionTokens: 20, outcome: "completed" })
          yield* b.flush
          yield* Effect.promise(redis.cut)
          const during = yield* b.reserve(request(account, { keySpendLimitMicros: 100_000 }))
          const entry = yield* b.settle(during.requestId, { completionTokens: 30, outcome: "completed" })
          expect(entry?.costMicros).toBe(7_000)
          expect((yield* b.accountMoney([account.accountId])).get(account.accountId)?.availableMicros).toBe(
            88_000,
          )
          yield* b.flush
          expect((yield* ledgerOf(account.accountId)).usage.map((u) => u.cost)).toEqual(
            expect.arrayContaining([5_000, 7_000]),
          )
          yield* Effect.promise(redis.restore)
          // The shared book itself (not the memory book's view) learns of the charge made while it was away.
          const shared = new Redis(url)
          yield* Effect.addFinalizer(() => Effect.sync(() => shared.disconnect()))
          const book = `${prefix}open:{billing}:`
          yield* eventually(
            Effect.promise(async () => {
              const [balance, spent] = await Promise.all([
                shared.hget(`${book}a:${account.accountId}`, "bal"),
                shared.hget(`${book}k:${account.keyId}`, "spent"),
              ])
              return balance === "88000" && spent === "12000"
            }),
            5_000,
          )
          const report = yield* LedgerCheck.check
          expect(report.problems).toEqual([])
        }).pipe(Effect.scoped, Effect.provide(Database.layer("sqlite::memory:"))),
      20_000,
    )
  }
})
