/**
 * Key lookups when the database fails or hangs: a hanging lookup gives up
 * after its timeout as `RepositoryUnavailable` (the gateway's 503), and a key
 * found within the stale window keeps working meanwhile — unless it was
 * invalidated.
 */
import { describe, expect, it } from "@effect/vitest"
import { Database } from "@swarmgate/store"
import { Effect, Either, Fiber, Layer, TestClock } from "effect"
import { ApiKeys, layer as apiKeysLayer, defaultOptions } from "../src/ApiKeys"
import { generateKey } from "../src/KeyFormat"
import { make as makeRepository, Repository, RepositoryUnavailable } from "../src/Repository"

/** A repository whose lookups can be switched to hang or fail. */
const setup = () => {
  const mode = { current: "ok" as "ok" | "hang" | "fail" }
  const faulty = Layer.effect(
    Repository,
    Effect.map(makeRepository, (repo) => ({
      ...repo,
      findByHash: (hash: string) =>
        Effect.suspend(() =>
          mode.current === "hang"
            ? Effect.never
            : mode.current === "fail"
              ? Effect.fail(new RepositoryUnavailable({ cause: "down" }))
              : repo.findByHash(hash),
        ),
    })),
  )
  const layer = apiKeysLayer(defaultOptions).pipe(
    Layer.provideMerge(faulty),
    Layer.provideMerge(Database.layer("sqlite::memory:")),
  )
  return {
    mode,
    run: <A, E>(effect: Effect.Effect<A, E, ApiKeys | Repository>) => Effect.provide(effect, layer),
  }
}

const fixture = Effect.gen(function* () {
  const repo = yield* Repository
  const account = yield* repo.createAccount({ name: "Acme" })
  const created = yield* repo.createKey(account.id, {})
  return { key: created.key, bearer: `Bearer ${created.secret}` }
})

const authenticate = (bearer: string) =>
  Effect.flatMap(ApiKeys, (keys) => Effect.either(keys.authenticate(bearer)))

const tagOf = (result: Either.Either<unknown, { readonly _tag: string }>) =>
  Either.isRight(result) ? "Principal" : result.left._tag

describe("ApiKeys when the database fails", () => {
  it.effect("a hanging lookup gives up after the lookup timeout", () => {
    const { mode, run } = setup()
    return run(
      Effect.gen(function* () {
        const { bearer } = yield* fixture
        mode.current = "hang"
        const fiber = yield* Effect.fork(authenticate(bearer))
        yield* TestClock.adjust((defaultOptions.lookupTimeoutMillis ?? 0) - 1)
        expect(fiber.unsafePoll()).toBeNull()
        yield* TestClock.adjust(1)
        expect(tagOf(yield* Fiber.join(fiber))).toBe("RepositoryUnavailable")
      }),
    )
  })

  it.effect(
    "a key found a moment ago keeps working while lookups fail or hang, within the stale window",
    () => {
      const { mode, run } = setup()
      return run(
        Effect.gen(function* () {
          const { bearer } = yield* fixture
          expect(tagOf(yield* authenticate(bearer))).toBe("Principal")
          yield* TestClock.adjust(defaultOptions.cacheTtlMillis + 1)
          mode.current = "fail"
          expect(tagOf(yield* authenticate(bearer))).toBe("Principal")
          mode.current = "hang"
          const fiber = yield* Effect.fork(authenticate(bearer))
          yield* TestClock.adjust(defaultOptions.lookupTimeoutMillis ?? 0)
          expect(tagOf(yield* Fiber.join(fiber))).toBe("Principal")
          // Past the window the last known state is no longer trusted.
          mode.current = "fail"
          yield* TestClock.adjust(defaultOptions.staleIfErrorMillis ?? 0)
          expect(tagOf(yield* authenticate(bearer))).toBe("RepositoryUnavailable")
        }),
      )
    },
  )

  it.effect("an invalidated key is never served from the stale entry", () => {
    const { mode, run } = setup()
    return run(
      Effect.gen(function* () {
        const { key, bearer } = yield* fixture
        expect(tagOf(yield* authenticate(bearer))).toBe("Principal")
        yield* Effect.flatMap(ApiKeys, (keys) => keys.invalidateKey(key.id))
        mode.current = "fail"
        expect(tagOf(yield* authenticate(bearer))).toBe("RepositoryUnavailable")
      }),
    )
  })

  it.effect("an unknown key is not served from a negative entry: 503, not 401", () => {
    const { mode, run } = setup()
    return run(
      Effect.gen(function* () {
        yield* fixture
        const unknown = `Bearer ${generateKey().key}`
        expect(tagOf(yield* authenticate(unknown))).toBe("InvalidApiKey")
        yield* TestClock.adjust(defaultOptions.cacheTtlMillis + 1)
        mode.current = "fail"
        expect(tagOf(yield* authenticate(unknown))).toBe("RepositoryUnavailable")
      }),
    )
  })
})
