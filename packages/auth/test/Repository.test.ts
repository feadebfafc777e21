import { SqlClient } from "@effect/sql"
import { describe, expect, it } from "@effect/vitest"
import { Database } from "@swarmgate/store"
import { Effect, Exit, Layer, Option, TestClock } from "effect"
import { hashKey, isWellFormed } from "../src/KeyFormat"
import { layer, NotFound, Repository } from "../src/Repository"

const TestLayer = layer.pipe(Layer.provideMerge(Database.layer("sqlite::memory:")))

const run = <A, E>(effect: Effect.Effect<A, E, Repository | SqlClient.SqlClient>) =>
  Effect.provide(Effect.zipRight(TestClock.setTime(1_000_000), effect), TestLayer)

const expectNotFound = <A, E>(
  effect: Effect.Effect<A, E, Repository>,
  entity: "account" | "key",
  id: string,
) => Effect.map(Effect.exit(effect), (exit) => expect(exit).toEqual(Exit.fail(new NotFound({ entity, id }))))

describe("Repository accounts", () => {
  it.effect("creates an active account with defaults", () =>
    run(
      Effect.gen(function* () {
        const repo = yield* Repository
        const account = yield* repo.createAccount({ name: "Acme" })
        expect(account).toEqual({
          id: expect.stringMatching(/^acct_[0-9a-f]{32}$/),
          name: "Acme",
          status: "active",
          paymentHold: false,
          balanceMicros: 0,
          monthlySpendLimitMicros: null,
          limits: {},
          createdAt: 1_000_000,
          email: null,
          emailVerified: true,
          closedAt: null,
        })
        expect(yield* repo.getAccount(account.id)).toEqual(account)
      }),
    ),
  )

  it.effect("stores balance, spend limit, limits and status, and records the opening credit", () =>
    run(
      Effect.gen(function* () {
        const repo = yield* Repository
        const account = yield* repo.createAccount({
          name: "Acme",
          balanceMicros: 5_000_000,
          monthlySpendLimitMicros: 100_000_000,
          limits: { rpm: 60, concurrency: 2 },
          status: "restricted",
        })
        expect(account).toMatchObject({
          status: "restricted",
          balanceMicros: 5_000_000,
          monthlySpendLimitMicros: 100_000_000,
          limits: { rpm: 60, concurrency: 2 },
        })
        const sql = yield* SqlClient.SqlClient
        const movements =
          yield* sql`SELECT kind, amount_micros FROM balance_movements WHERE account_id = ${account.id}`
        expect(movements).toEqual([{ kind: "credit", amount_micros: 5_000_000 }])
      }),
    ),
  )

  it.effect("lists accounts oldest first", () =>
    run(
      Effect.gen(function* () {
        const repo = yield* Repository
        const a = yield* repo.createAccount({ name: "A" })
        yield* TestClock.adjust(10)
        const b = yield* repo.createAccount({ name: "B" })
        expect((yield* repo.listAccounts()).map((x) => x.id)).toEqual([a.id, b.id])
      }),
    ),
  )

  it.effect("updates only the fields given", () =>
    run(
      Effect.gen(function* () {
        const repo = yield* Repository
        const account = yield* repo.createAccount({
          name: "Acme",
          monthlySpendLimitMicros: 7,
          limits: { rpm: 1 },
        })
        const held = yield* repo.updateAccount(account.id, { paymentHold: true })
        expect(held).toEqual({ ...account, paymentHold: true })
        const changed = yield* repo.updateAccount(account.id, {
          status: "suspended",
          monthlySpendLimitMicros: null,
          limits: { daily: 10 },
        })
        expect(changed).toEqual({
          ...account,
          paymentHold: true,
          status: "suspended",
          monthlySpendLimitMicros: null,
          limits: { daily: 10 },
        })
      }),
    ),
  )

  it.effect("adds credit and records a balance movement", () =>
    run(
      Effect.gen(function* () {
        const repo = yield* Repository
        const account = yield* repo.createAccount({ name: "Acme", balanceMicros: 1 })
        const credited = yield* repo.addCredit(account.id, 2_500_000)
        expect(credited.balanceMicros).toBe(2_500_001)
        const sql = yield* SqlClient.SqlClient
        const movements =
          yield* sql`SELECT amount_micros FROM balance_movements WHERE account_id = ${account.id}`
        expect(movements.map((m) => m.amount_micros).sort()).toEqual([1, 2_500_000])
      }),
    ),
  )

  it.effect("fails with NotFound for a missing account", () =>
    run(
      Effect.gen(function* () {
        const repo = yield* Repository
        yield* expectNotFound(repo.getAccount("acct_none"), "account", "acct_none")
        yield* expectNotFound(repo.updateAccount("acct_none", { status: "active" }), "account", "acct_none")
        yield* expectNotFound(repo.addCredit("acct_none", 1), "account", "acct_none")
        yield* expectNotFound(repo.createKey("acct_none", {}), "account", "acct_none")
        const sql = yield* SqlClient.SqlClient
        expect(yield* sql`SELECT * FROM balance_movements`).toEqual([])
      }),
    ),
  )
})

describe("Repository keys", () => {
  it.effect("creates a key, returns its secret once and stores only its hash", () =>
    run(
      Effect.gen(function* () {
        const repo = yield* Repository
        const account = yield* repo.createAccount({ name: "Acme" })
        const { key, secret } = yield* repo.createKey(account.id, {
          name: "ci",
          spendLimitMicros: 3,
          expiresAt: 9_000_000,
        })
        expect(isWellFormed(secret)).toBe(true)
        expect(key).toEqual({
          id: expect.stringMatching(/^key_[0-9a-f]{32}$/),
          accountId: account.id,
          prefix: secret.slice(0, 12),
          name: "ci",
          disabled: false,
          revokedAt: null,
          expiresAt: 9_000_000,
          spendLimitMicros: 3,
          createdAt: 1_000_000,
        })
        const sql = yield* SqlClient.SqlClient
        const rows = yield* sql`SELECT * FROM api_keys`
        expect(rows).toHaveLength(1)
        expect(rows[0]!.key_hash).toBe(hashKey(secret))
        expect(JSON.stringify(rows)).not.toContain(secret)
        expect(yield* repo.getKey(key.id)).toEqual(key)
      }),
    ),
  )

  it.effect("lists the keys of one account", () =>
    run(
      Effect.gen(function* () {
        const repo = yield* Repository
        const a = yield* repo.createAccount({ name: "A" })
        const b = yield* repo.createAccount({ name: "B" })
        const k1 = yield* repo.createKey(a.id, {})
        yield* TestClock.adjust(1)
        const k2 = yield* repo.createKey(a.id, {})
        yield* repo.createKey(b.id, {})
        expect((yield* repo.listKeys(a.id)).map((k) => k.id)).toEqual([k1.key.id, k2.key.id])
        expect(yield* repo.listKeys("acct_none")).toEqual([])
      }),
    ),
  )

  it.effect("updates disabled and the spend limit", () =>
    run(
      Effect.gen(function* () {
        const repo = yield* Repository
        const account = yield* repo.createAccount({ name: "Acme" })
        const { key } = yield* repo.createKey(account.id, { spendLimitMicros: 5 })
        expect(yield* repo.updateKey(key.id, { disabled: true })).toEqual({ ...key, disabled: true })
        expect(yield* repo.updateKey(key.id, { disabled: false, spendLimitMicros: null })).toEqual({
          ...key,
          spendLimitMicros: null,
        })
      }),
    ),
  )

  it.effect("keeps the first revocation time: revocation is final", () =>
    run(
      Effect.gen(function* () {
        const repo = yield* Repository
        const account = yield* repo.createAccount({ name: "Acme" })
        const { key } = yield* repo.createKey(account.id, {})
        yield* TestClock.adjust(500)
        expect((yield* repo.revokeKey(key.id)).revokedAt).toBe(1_000_500)
        yield* TestClock.adjust(500)
        expect((yield* repo.revokeKey(key.id)).revokedAt).toBe(1_000_500)
        expect((yield* repo.updateKey(key.id, { disabled: false })).revokedAt).toBe(1_000_500)
      }),
    ),
  )

  it.effect("fails with NotFound for a missing key", () =>
    run(
      Effect.gen(function* () {
        const repo = yield* Repository
        yield* expectNotFound(repo.getKey("key_none"), "key", "key_none")
        yield* expectNotFound(repo.updateKey("key_none", { disabled: true }), "key", "key_none")
        yield* expectNotFound(repo.revokeKey("key_none"), "key", "key_none")
      }),
    ),
  )

  it.effect("finds a key and its account by hash", () =>
    run(
      Effect.gen(function* () {
        const repo = yield* Repository
        const account = yield* repo.createAccount({ name: "Acme" })
        const { key, secret } = yield* repo.createKey(account.id, {})
        expect(yield* repo.findByHash(hashKey(secret))).toEqual(Option.some({ key, account }))
        expect(yield* repo.findByHash(hashKey(`${secret}x`))).toEqual(Option.none())
      }),
    ),
  )
})
