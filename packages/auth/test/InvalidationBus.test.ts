/**
 * Two instances' key caches on one database and one Redis: a change announced
 * by one is seen by the other at once, though its cache would trust the old
 * answer for a minute.
 */
import { randomBytes } from "node:crypto"
import { describe, expect, it } from "@effect/vitest"
import { Database } from "@swarmgate/store"
import { Effect, Either, Layer } from "effect"
import * as ApiKeys from "../src/ApiKeys"
import * as InvalidationBus from "../src/InvalidationBus"
import { make as makeRepository, Repository } from "../src/Repository"

const url = process.env.TEST_REDIS_URL?.trim() || undefined
const required = process.env.SWARMGATE_REQUIRE_SERVICES === "1"
if (url === undefined && !required)
  console.warn("[skipped] InvalidationBus: TEST_REDIS_URL is not set, Redis tests skipped")

const outcome = (keys: ApiKeys.ApiKeysShape, bearer: string) =>
  Effect.map(
    Effect.either(keys.authenticate(bearer)),
    Either.match({ onLeft: (e) => e._tag, onRight: () => "ok" }),
  )

/** Polls in real time until `bearer` gets `expected` from `keys`; the milliseconds it took. */
const until = (keys: ApiKeys.ApiKeysShape, bearer: string, expected: string) =>
  Effect.gen(function* () {
    const start = Date.now()
    while ((yield* outcome(keys, bearer)) !== expected) {
      if (Date.now() - start > 2_000) return yield* Effect.die(new Error(`still not ${expected} after 2 s`))
      yield* Effect.sleep("5 millis")
    }
    return Date.now() - start
  })

describe.skipIf(url === undefined && !required)("InvalidationBus", () => {
  it.live(
    "a key revoked or an account suspended through one instance is refused by the other at once",
    () =>
      Effect.gen(function* () {
        if (url === undefined) throw new Error("TEST_REDIS_URL is required (SWARMGATE_REQUIRE_SERVICES=1)")
        const prefix = `test:bus:${randomBytes(6).toString("hex")}:`
        const repo = yield* Repository
        // A minute of cache: only the announcement can explain a change seen sooner.
        const instance = () =>
          Effect.flatMap(ApiKeys.make({ cacheTtlMillis: 60_000, maxCacheEntries: 1_000 }), (inner) =>
            InvalidationBus.make(inner, { url, prefix }),
          )
        const a = yield* instance()
        const b = yield* instance()
        const account = yield* repo.createAccount({ name: "bus" })
        const first = yield* repo.createKey(account.id, {})
        const second = yield* repo.createKey(account.id, {})
        const bearer = (secret: string) => `Bearer ${secret}`
        for (const keys of [a, b])
          for (const created of [first, second])
            expect(yield* outcome(keys, bearer(created.secret))).toBe("ok")

        yield* repo.revokeKey(first.key.id)
        yield* a.invalidateKey(first.key.id)
        expect(yield* until(b, bearer(first.secret), "InvalidApiKey")).toBeLessThan(1_000)
        // The other key of the account stays cached and accepted.
        expect(yield* outcome(b, bearer(second.secret))).toBe("ok")

        yield* repo.updateAccount(account.id, { status: "suspended" })
        yield* b.invalidateAccount(account.id)
        expect(yield* until(a, bearer(second.secret), "AccountSuspended")).toBeLessThan(1_000)
      }).pipe(
        Effect.scoped,
        Effect.provide(
          Layer.effect(Repository, makeRepository).pipe(
            Layer.provideMerge(Database.layer("sqlite::memory:")),
          ),
        ),
      ),
    20_000,
  )
})
