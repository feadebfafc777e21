import { describe, expect, it } from "@effect/vitest"
import { Database } from "@swarmgate/store"
import { Effect, Either, Layer, TestClock } from "effect"
import { ApiKeys, type ApiKeysOptions, layer as apiKeysLayer, defaultOptions } from "../src/ApiKeys"
import { generateKey } from "../src/KeyFormat"
import { make as makeRepository, Repository } from "../src/Repository"

/** A fresh database per test and a repository that counts key lookups. */
const setup = (options: ApiKeysOptions = defaultOptions) => {
  const lookups = { count: 0 }
  const counting = Layer.effect(
    Repository,
    Effect.map(makeRepository, (repo) => ({
      ...repo,
      findByHash: (hash: string) =>
        Effect.suspend(() => {
          lookups.count++
          return repo.findByHash(hash)
        }),
    })),
  )
  const layer = apiKeysLayer(options).pipe(
    Layer.provideMerge(counting),
    Layer.provideMerge(Database.layer("sqlite::memory:")),
  )
  const run = <A, E>(effect: Effect.Effect<A, E, ApiKeys | Repository>) => Effect.provide(effect, layer)
  return { lookups, run }
}

const authenticate = (authorization: string | undefined) =>
  Effect.flatMap(ApiKeys, (keys) => Effect.either(keys.authenticate(authorization)))

const expectRefused = (authorization: string | undefined, tag: string, message?: RegExp) =>
  Effect.map(authenticate(authorization), (result) => {
    if (Either.isRight(result)) throw new Error(`expected ${tag}, got a principal`)
    expect(result.left._tag).toBe(tag)
    if (message) expect(result.left.message).toMatch(message)
  })

const expectAccepted = (authorization: string) =>
  Effect.map(authenticate(authorization), (result) => {
    if (Either.isLeft(result)) throw new Error(`expected a principal, got ${result.left._tag}`)
    return result.right
  })

/** An account and one key on it; `bearer` is the header value. */
const fixture = (key: { expiresAt?: number } = {}) =>
  Effect.gen(function* () {
    const repo = yield* Repository
    const account = yield* repo.createAccount({ name: "Acme" })
    const created = yield* repo.createKey(account.id, key)
    return { repo, account, key: created.key, bearer: `Bearer ${created.secret}` }
  })

describe("ApiKeys", () => {
  it.effect("accepts an active key of an active account", () => {
    const { run } = setup()
    return run(
      Effect.gen(function* () {
        const { account, key, bearer } = yield* fixture()
        const principal = yield* expectAccepted(bearer)
        expect(principal.key).toEqual(key)
        expect(principal.account).toEqual(account)
        yield* expectAccepted(bearer.replace("Bearer", "bearer"))
      }),
    )
  })

  it.effect("refuses a missing, non-bearer or malformed key without looking it up", () => {
    const { lookups, run } = setup()
    return run(
      Effect.gen(function* () {
        const { bearer } = yield* fixture()
        const secret = bearer.slice("Bearer ".length)
        const last = secret.at(-1) === "0" ? "1" : "0"
        yield* expectRefused(undefined, "InvalidApiKey", /no bearer key/)
        yield* expectRefused("", "InvalidApiKey", /no bearer key/)
        yield* expectRefused(`Basic ${secret}`, "InvalidApiKey", /no bearer key/)
        yield* expectRefused(`Bearer ${secret} extra`, "InvalidApiKey", /no bearer key/)
        yield* expectRefused("Bearer sk-not-a-swarm-key", "InvalidApiKey", /malformed/)
        yield* expectRefused(`Bearer ${secret.slice(0, -1)}${last}`, "InvalidApiKey", /malformed/)
        yield* expectRefused(`Bearer ${secret.slice(0, -1)}`, "InvalidApiKey", /malformed/)
        expect(lookups.count).toBe(0)
      }),
    )
  })

  it.effect(
    "with the key cached, a one-character change is still refused as malformed, not looked up",
    () => {
      const { lookups, run } = setup()
      return run(
        Effect.gen(function* () {
          const { bearer } = yield* fixture()
          yield* expectAccepted(bearer)
          const secret = bearer.slice("Bearer ".length)
          for (const at of [secret.length - 1, "sk-swarm-".length, Math.floor(secret.length / 2)]) {
            const char = secret[at] === "0" ? "1" : "0"
            yield* expectRefused(
              `Bearer ${secret.slice(0, at)}${char}${secret.slice(at + 1)}`,
              "InvalidApiKey",
              /malformed/,
            )
          }
          yield* expectAccepted(bearer)
          expect(lookups.count).toBe(1)
        }),
      )
    },
  )

  it.effect("refuses a well-formed unknown key and caches the miss for the TTL", () => {
    const { lookups, run } = setup()
    return run(
      Effect.gen(function* () {
        const unknown = `Bearer ${generateKey().key}`
        yield* expectRefused(unknown, "InvalidApiKey", /not recognised/)
        yield* expectRefused(unknown, "InvalidApiKey", /not recognised/)
        expect(lookups.count).toBe(1)
        yield* TestClock.adjust(defaultOptions.cacheTtlMillis)
        yield* expectRefused(unknown, "InvalidApiKey", /not recognised/)
        expect(lookups.count).toBe(2)
      }),
    )
  })

  it.effect("refuses disabled, revoked and expired keys as invalid", () => {
    const { run } = setup()
    return run(
      Effect.gen(function* () {
        const repo = yield* Repository
        const account = yield* repo.createAccount({ name: "Acme" })
        const disabled = yield* repo.createKey(account.id, {})
        yield* repo.updateKey(disabled.key.id, { disabled: true })
        const revoked = yield* repo.createKey(account.id, {})
        yield* repo.revokeKey(revoked.key.id)
        yield* TestClock.setTime(10_000)
        const expired = yield* repo.createKey(account.id, { expiresAt: 10_000 })
        yield* expectRefused(`Bearer ${disabled.secret}`, "InvalidApiKey", /disabled/)
        yield* expectRefused(`Bearer ${revoked.secret}`, "InvalidApiKey", /revoked/)
        yield* expectRefused(`Bearer ${expired.secret}`, "InvalidApiKey", /expired/)
      }),
    )
  })

  it.effect("expires a cached key at its expiry time, not at the end of the cache TTL", () => {
    const { lookups, run } = setup({ ...defaultOptions, cacheTtlMillis: 60_000 })
    return run(
      Effect.gen(function* () {
        const { bearer } = yield* fixture({ expiresAt: 5_000 })
        yield* expectAccepted(bearer)
        yield* TestClock.adjust(4_999)
        yield* expectAccepted(bearer)
        yield* TestClock.adjust(1)
        yield* expectRefused(bearer, "InvalidApiKey", /expired/)
        expect(lookups.count).toBe(1)
      }),
    )
  })

  it.effect("refuses keys of suspended and restricted accounts with their own errors", () => {
    const { run } = setup()
    return run(
      Effect.gen(function* () {
        const repo = yield* Repository
        const suspended = yield* repo.createAccount({ name: "S", status: "suspended" })
        const restricted = yield* repo.createAccount({ name: "R", status: "restricted" })
        const s = yield* repo.createKey(suspended.id, {})
        const r = yield* repo.createKey(restricted.id, {})
        yield* expectRefused(`Bearer ${s.secret}`, "AccountSuspended")
        yield* expectRefused(`Bearer ${r.secret}`, "AccountRestricted")
      }),
    )
  })

  it.effect("serves a looked-up key from the cache and sees a direct change after the TTL", () => {
    const { lookups, run } = setup()
    return run(
      Effect.gen(function* () {
        const { repo, key, bearer } = yield* fixture()
        yield* expectAccepted(bearer)
        // Changed behind the service's back: no invalidation.
        yield* repo.revokeKey(key.id)
        yield* TestClock.adjust(defaultOptions.cacheTtlMillis - 1)
        yield* expectAccepted(bearer)
        expect(lookups.count).toBe(1)
        yield* TestClock.adjust(1)
        yield* expectRefused(bearer, "InvalidApiKey", /revoked/)
        expect(lookups.count).toBe(2)
      }),
    )
  })

  it.effect("applies a key change at once after invalidateKey", () => {
    const { run } = setup()
    return run(
      Effect.gen(function* () {
        const { repo, key, bearer } = yield* fixture()
        yield* expectAccepted(bearer)
        yield* repo.updateKey(key.id, { disabled: true })
        yield* Effect.flatMap(ApiKeys, (keys) => keys.invalidateKey(key.id))
        yield* expectRefused(bearer, "InvalidApiKey", /disabled/)
      }),
    )
  })

  it.effect("applies an account change to all its keys at once after invalidateAccount", () => {
    const { run } = setup()
    return run(
      Effect.gen(function* () {
        const { repo, account, bearer } = yield* fixture()
        const second = `Bearer ${(yield* repo.createKey(account.id, {})).secret}`
        yield* expectAccepted(bearer)
        yield* expectAccepted(second)
        yield* repo.updateAccount(account.id, { status: "suspended" })
        yield* Effect.flatMap(ApiKeys, (keys) => keys.invalidateAccount(account.id))
        yield* expectRefused(bearer, "AccountSuspended")
        yield* expectRefused(second, "AccountSuspended")
      }),
    )
  })

  it.effect("forgets every entry after invalidateAll", () => {
    const { lookups, run } = setup()
    return run(
      Effect.gen(function* () {
        const { bearer } = yield* fixture()
        yield* expectAccepted(bearer)
        yield* Effect.flatMap(ApiKeys, (keys) => keys.invalidateAll)
        yield* expectAccepted(bearer)
        expect(lookups.count).toBe(2)
      }),
    )
  })

  it.effect("tells a request's watcher when its key or its account changes, and no one else's", () => {
    const { run } = setup()
    return run(
      Effect.gen(function* () {
        const keys = yield* ApiKeys
        const calls: Array<string> = []
        const off = keys.watch("key_a", "acct_1", () => calls.push("a"))
        keys.watch("key_b", "acct_1", () => calls.push("b"))
        keys.watch("key_c", "acct_2", () => calls.push("c"))
        yield* keys.invalidateKey("key_a")
        expect(calls).toEqual(["a"])
        yield* keys.invalidateAccount("acct_1")
        expect(calls).toEqual(["a", "a", "b"])
        // A key id that is also an account id's text reaches only the watchers of that key.
        yield* keys.invalidateKey("acct_2")
        expect(calls).toEqual(["a", "a", "b"])
        off()
        yield* keys.invalidateAccount("acct_1")
        expect(calls).toEqual(["a", "a", "b", "b"])
        calls.length = 0
        // Everyone, once per id watched (key and account).
        yield* keys.invalidateAll
        expect(calls.sort()).toEqual(["b", "b", "c", "c"])
      }),
    )
  })

  it.effect("keeps at most maxCacheEntries entries, dropping the oldest", () => {
    const { lookups, run } = setup({ cacheTtlMillis: 60_000, maxCacheEntries: 1 })
    return run(
      Effect.gen(function* () {
        const { repo, account, bearer } = yield* fixture()
        const other = `Bearer ${(yield* repo.createKey(account.id, {})).secret}`
        yield* expectAccepted(bearer)
        yield* expectAccepted(bearer)
        expect(lookups.count).toBe(1)
        yield* expectAccepted(other)
        yield* expectAccepted(bearer)
        expect(lookups.count).toBe(3)
      }),
    )
  })
})
