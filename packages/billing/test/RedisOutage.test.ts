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

    /** A book behind a proxy that can cut Redis away, a 100,000 account, and a look at the shared book itself. */
    const bookBehindProxy = (name: string, extra: Partial<RedisBilling.RedisBillingOptions> = {}) =>
      Effect.gen(function* () {
        const redis = yield* Effect.promise(() => proxy(new URL(url)))
        const account = yield* seed(100_000)
        const b = yield* RedisBilling.make({
          ...options,
          commandTimeoutMillis: 200,
          url: redis.url(),
          prefix: `${prefix}${name}:`,
          ...extra,
        })
        const shared = new Redis(url)
        yield* Effect.addFinalizer(() => Effect.sync(() => shared.disconnect()))
        const book = `${prefix}${name}:{billing}:`
        /** The shared book itself, not the ledger's view that stands in while Redis is away. */
        const inRedis = Effect.promise(async () => ({
          balance: Number(await shared.hget(`${book}a:${account.accountId}`, "bal")),
          spentMonth: Number(await shared.hget(`${book}a:${account.accountId}`, "spm")),
          keySpent: Number(await shared.hget(`${book}k:${account.keyId}`, "spent")),
          holds: await shared.hlen(`${book}h`),
        }))
        return { redis, account, b, inRedis }
      })

    /** `bookBehindProxy`, a hold of 11,000 placed, then Redis cut. */
    const holdThenCut = (name: string, extra: Partial<RedisBilling.RedisBillingOptions> = {}) =>
      Effect.gen(function* () {
        const setup = yield* bookBehindProxy(name, extra)
        const hold = yield* setup.b.reserve(request(setup.account))
        yield* Effect.promise(setup.redis.cut)
        return { ...setup, hold }
      })

    it.live(
      "a settlement made while Redis is away is charged once it is back, within its hold's lease",
      () =>
        Effect.gen(function* () {
          const { redis, account, b, hold, inRedis } = yield* holdThenCut("late", { leaseMillis: 10_000 })
          // The request ran; its settlement cannot reach Redis.
          expect(
            yield* b.settle(hold.requestId, { completionTokens: 20, outcome: "completed" }),
          ).toBeUndefined()
          yield* Effect.promise(redis.restore)
          // 10 × 100 + 20 × 200, charged once Redis answers — long before the 10 s lease lapses.
          yield* eventually(
            Effect.map(inRedis, (book) => book.balance === 95_000 && book.holds === 0),
            5_000,
          )
          expect((yield* b.accountMoney([account.accountId])).get(account.accountId)).toEqual({
            availableMicros: 95_000,
            heldMicros: 0,
            spentMonthMicros: 5_000,
          })
          yield* b.flush
          expect((yield* ledgerOf(account.accountId)).usage.map((u) => u.cost)).toEqual([5_000])
          expect((yield* LedgerCheck.check).problems).toEqual([])
        }).pipe(Effect.scoped, Effect.provide(Database.layer("sqlite::memory:"))),
      20_000,
    )

    it.live(
      "a settlement kept past its hold's lease: once the hold is gone nothing moves, and book and ledger agree",
      () =>
        Effect.gen(function* () {
          const { redis, account, b, hold, inRedis } = yield* holdThenCut("lapsed")
          yield* b.settle(hold.requestId, { completionTokens: 20, outcome: "completed" })
          // Away for longer than the 300 ms lease: once back, the sweep and the late settlement race.
          yield* Effect.sleep(1_000)
          yield* Effect.promise(redis.restore)
          yield* eventually(
            Effect.map(inRedis, (book) => book.holds === 0),
            5_000,
          )
          const resolved = yield* inRedis
          // Past the late settlements' next round: a resolved hold is never charged again.
          yield* Effect.sleep(1_500)
          yield* b.flush
          expect(yield* inRedis).toEqual(resolved)
          // Charged once (95,000) or returned (100,000), and the ledger says the same.
          expect([100_000, 95_000]).toContain(resolved.balance)
          const ledger = yield* ledgerOf(account.accountId)
          expect(ledger.balance).toBe(resolved.balance)
          expect(ledger.usage.map((u) => u.cost)).toEqual(resolved.balance === 95_000 ? [5_000] : [])
          expect((yield* LedgerCheck.check).problems).toEqual([])
        }).pipe(Effect.scoped, Effect.provide(Database.layer("sqlite::memory:"))),
      20_000,
    )

    it.live(
      "a settlement of last month sent late counts in the month the account is in: never less spend than ran",
      () =>
        Effect.gen(function* () {
          const { redis, account, b, inRedis } = yield* bookBehindProxy("late-month", { leaseMillis: 10_000 })
          // This month: 5,000 spent.
          const now = Date.now()
          const first = yield* b.reserve(request(account))
          yield* b.settle(first.requestId, { completionTokens: 20, outcome: "completed" })
          // A request that ended last month (its settlement's own clock), settled while Redis is away.
          const sent = b.reserveSent!(request(account), now)
          const held = yield* sent.hold
          yield* Effect.promise(redis.cut)
          const lastMonth = Date.UTC(new Date(now).getUTCFullYear(), new Date(now).getUTCMonth(), 1) - 1_000
          yield* sent.resolve({ completionTokens: 20, outcome: "completed" }, lastMonth)
          yield* Effect.promise(redis.restore)
          yield* eventually(
            Effect.map(inRedis, (book) => book.balance === 90_000),
            5_000,
          )
          expect(held.amountMicros).toBe(11_000)
          // Charged, and counted against this month's spend limit too (as an instance whose clock is behind
          // would be): leaving it out would give the headroom back without its use.
          expect(yield* inRedis).toEqual({ balance: 90_000, spentMonth: 10_000, keySpent: 10_000, holds: 0 })
        }).pipe(Effect.scoped, Effect.provide(Database.layer("sqlite::memory:"))),
      20_000,
    )

    it.live(
      "open: a hold whose settlement failed lapses uncharged — the memory book may have spent its money",
      () =>
        Effect.gen(function* () {
          const { redis, account, b, hold, inRedis } = yield* holdThenCut("open-late", {
            leaseMillis: 10_000,
            onRedisFailure: "open",
          })
          yield* b.settle(hold.requestId, { completionTokens: 50, outcome: "completed" })
          // The memory book knows the ledger's 100,000, not the 11,000 held in Redis: it spends 99,000.
          for (let i = 0; i < 9; i++) {
            const during = yield* b.reserve(request(account))
            yield* b.settle(during.requestId, { completionTokens: 50, outcome: "completed" })
          }
          yield* b.flush
          yield* Effect.promise(redis.restore)
          // Back: the memory book's charges replayed; the failed settlement is not sent again
          // (past two rounds of the late settlements), so the balance stays at 1,000.
          yield* eventually(
            Effect.map(inRedis, (book) => book.balance === 1_000),
            10_000,
          )
          yield* Effect.sleep(2_500)
          yield* b.flush
          expect((yield* inRedis).balance).toBe(1_000)
          const ledger = yield* ledgerOf(account.accountId)
          expect(ledger.balance).toBe(1_000)
          expect(ledger.usage.map((u) => u.requestId)).not.toContain(hold.requestId)
          expect((yield* LedgerCheck.check).problems).toEqual([])
        }).pipe(Effect.scoped, Effect.provide(Database.layer("sqlite::memory:"))),
      20_000,
    )

    it.live(
      "open: holds against the instance's memory book, and its charges reach the shared book when Redis is back",
      () =>
        Effect.gen(function* () {
          const { redis, account, b, inRedis } = yield* bookBehindProxy("open", { onRedisFailure: "open" })
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
          yield* eventually(
            Effect.map(inRedis, (book) => book.balance === 88_000 && book.keySpent === 12_000),
            5_000,
          )
          const report = yield* LedgerCheck.check
          expect(report.problems).toEqual([])
        }).pipe(Effect.scoped, Effect.provide(Database.layer("sqlite::memory:"))),
      20_000,
    )
  }
})
