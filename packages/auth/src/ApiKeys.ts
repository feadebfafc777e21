/**
 * Bearer authentication: format and checksum first (no lookup for a malformed
 * key), then a cached lookup by SHA-256 hash, then key and account states.
 */
import { AccountRestricted, AccountSuspended, InvalidApiKey, LinkedSet } from "@swarmgate/protocol"
import { Context, Effect, Either, Layer, Option } from "effect"
import { keyState, type Principal } from "./Domain"
import { hashKey, hasKeyShape, isWellFormed, parseBearer } from "./KeyFormat"
import { Repository, RepositoryUnavailable } from "./Repository"

export interface ApiKeysOptions {
  /** How long a looked-up key (or a miss) is trusted; changes through `invalidate…` apply at once. */
  readonly cacheTtlMillis: number
  readonly maxCacheEntries: number
  /** A lookup slower than this fails as unavailable instead of holding the request (default 2 s). */
  readonly lookupTimeoutMillis?: number | undefined
  /** While lookups fail, a key found within this long keeps its last known state (default 60 s). */
  readonly staleIfErrorMillis?: number | undefined
}

export const defaultOptions: ApiKeysOptions = {
  cacheTtlMillis: 1_000,
  maxCacheEntries: 100_000,
  lookupTimeoutMillis: 2_000,
  staleIfErrorMillis: 60_000,
}

export type AuthError = InvalidApiKey | AccountSuspended | AccountRestricted

export interface ApiKeysShape {
  /**
   * `running`: the check of a request already under way (after a change to
   * its key or account), which a closing account lets finish.
   */
  readonly authenticate: (
    authorization: string | undefined,
    running?: boolean,
  ) => Effect.Effect<Principal, AuthError | RepositoryUnavailable>
  /**
   * `authenticate` of a new request by plain calls, where no lookup is
   * needed (a cached key, or one refused by its form); undefined when the
   * repository must be asked (then `authenticate`).
   */
  readonly authenticateNow: (
    authorization: string | undefined,
    now: number,
  ) => Either.Either<Principal, AuthError> | undefined
  /** Forget a key (by id) or every key of an account, after a change to them. */
  readonly invalidateKey: (keyId: string) => Effect.Effect<void>
  readonly invalidateAccount: (accountId: string) => Effect.Effect<void>
  readonly invalidateAll: Effect.Effect<void>
  /**
   * Calls `onChange` each time the key or its account is invalidated on this
   * instance — by the admin API here, or by another instance through the
   * invalidation bus — so that work running with it can look again (a revoked
   * key stops its running requests). Returns the removal.
   */
  readonly watch: (keyId: string, accountId: string, onChange: () => void) => () => void
}

export class ApiKeys extends Context.Tag("@swarmgate/auth/ApiKeys")<ApiKeys, ApiKeysShape>() {}

/** Ids whose watchers all left, after which the empty sets are dropped. */
const EMPTY_SWEEP = 1024

const invalidKey = (why: string, keySent = true) =>
  new InvalidApiKey({
    keySent,
    message: `Invalid API key: ${why}. Send 'Authorization: Bearer <key>' with an active key.`,
  })

const missing = invalidKey("no bearer key was sent", false)
const malformed = invalidKey("the key is malformed")
const unknown = invalidKey("the key is not recognised")

interface CacheEntry {
  readonly principal: Principal | undefined
  readonly expiresAt: number
}

export const make = (options: ApiKeysOptions = defaultOptions) =>
  Effect.gen(function* () {
    const repository = yield* Repository
    // Map keeps insertion order, so the first entry is the oldest: a cheap bounded cache.
    const cache = new Map<string, CacheEntry>()

    const remember = (hash: string, principal: Principal | undefined, now: number) => {
      if (cache.size >= options.maxCacheEntries) {
        const oldest = cache.keys().next()
        if (!oldest.done) cache.delete(oldest.value)
      }
      cache.set(hash, { principal, expiresAt: now + options.cacheTtlMillis })
    }

    const lookupTimeout = options.lookupTimeoutMillis ?? 2_000
    const staleIfError = options.staleIfErrorMillis ?? 60_000

    /** A cache miss (or an expired entry): the repository, with the stale entry kept for its outages. */
    const lookup = (hash: string, now: number) => {
      const hit = cache.get(hash)
      return repository.findByHash(hash).pipe(
        // A stalled database must not hold requests indefinitely; the stuck query is abandoned, not awaited.
        Effect.either,
        Effect.disconnect,
        Effect.timeoutFail({
          duration: lookupTimeout,
          onTimeout: () => new RepositoryUnavailable({ cause: `no answer within ${lookupTimeout} ms` }),
        }),
        Effect.flatMap(Either.match({ onLeft: Effect.fail, onRight: Effect.succeed })),
        Effect.map((found) => {
          const principal = Option.getOrUndefined(found)
          remember(hash, principal, now)
          return principal
        }),
        // While the database is away, a key known a moment ago keeps working; changes made through
        // the admin API drop it from the cache, so a revoked key is never served this way.
        Effect.catchTag("RepositoryUnavailable", (error) =>
          hit?.principal !== undefined && now - hit.expiresAt < staleIfError
            ? Effect.succeed(hit.principal)
            : Effect.fail(error),
        ),
      )
    }

    const check = (
      principal: Principal | undefined,
      now: number,
      running: boolean,
    ): Either.Either<Principal, AuthError> => {
      if (principal === undefined) return Either.left(unknown)
      const state = keyState(principal.key, now)
      if (state !== "active") return Either.left(invalidKey(`the key is ${state}`))
      switch (principal.account.status) {
        case "active":
          // A running request outlives an address change; new ones wait for the verification.
          return principal.account.emailVerified || running
            ? Either.right(principal)
            : Either.left(
                new AccountRestricted({
                  message:
                    "This account is restricted: its email address is not verified yet. Follow the link in the verification mail.",
                }),
              )
        case "suspended":
          return Either.left(new AccountSuspended({ message: "This account is suspended." }))
        case "restricted":
          return Either.left(
            new AccountRestricted({ message: "This account is restricted by its operator." }),
          )
        case "closing":
          return running
            ? Either.right(principal)
            : Either.left(new AccountRestricted({ message: "This account is being closed." }))
        case "closed":
          // Closing revokes every key; this covers a key read before that.
          return Either.left(invalidKey("the account is closed"))
      }
    }

    /** What the cache (or the checksum) decides by itself; undefined when the repository must be asked. */
    const decide = (
      key: string,
      hash: string,
      now: number,
      running: boolean,
    ): Either.Either<Principal, AuthError> | undefined => {
      const hit = cache.get(hash)
      if (hit !== undefined && hit.expiresAt > now) return check(hit.principal, now, running)
      if (!isWellFormed(key)) return Either.left(malformed)
      return undefined
    }

    // Watchers by key id and by account id: the ids themselves, no name made per request to watch.
    // Each request adds and removes one: linked sets, and an id's set stays when it empties (dropped
    // in a sweep once many have), so no hash table churns per request (protocol/LinkedSet.ts).
    type Watchers = Map<string, LinkedSet<() => void>>
    const keyWatchers: Watchers = new Map()
    const accountWatchers: Watchers = new Map()
    let emptied = 0
    const sweepEmpty = () => {
      emptied = 0
      for (const watchers of [keyWatchers, accountWatchers])
        for (const [id, set] of watchers) if (set.size === 0) watchers.delete(id)
    }
    // Copied before calling: a watcher may stop watching (or start) while told.
    const notify = (watchers: Watchers, id: string) => {
      for (const onChange of watchers.get(id)?.values() ?? []) onChange()
    }
    const notifyAll = () => {
      const found = [...keyWatchers.values(), ...accountWatchers.values()].flatMap((set) => set.values())
      for (const onChange of found) onChange()
    }
    const watchOn = (watchers: Watchers, id: string, onChange: () => void) => {
      let set = watchers.get(id)
      if (set === undefined) {
        set = new LinkedSet()
        watchers.set(id, set)
      }
      const link = set.add(onChange)
      let watching = true
      return () => {
        if (!watching) return
        watching = false
        set.remove(link)
        if (set.size === 0 && ++emptied >= EMPTY_SWEEP) sweepEmpty()
      }
    }

    const dropWhere = (match: (p: Principal) => boolean, watchers: Watchers, id: string) =>
      Effect.sync(() => {
        for (const [hash, entry] of cache)
          if (entry.principal !== undefined && match(entry.principal)) cache.delete(hash)
        notify(watchers, id)
      })

    const service: ApiKeysShape = {
      authenticate: (authorization, running = false) => {
        const key = parseBearer(authorization)
        if (key === undefined) return Either.left(missing)
        // The shape before hashing; the checksum only where the cache does not know the key: the
        // cache holds only keys that passed it (a miss is looked up only then), ~0.5 µs a request.
        if (!hasKeyShape(key)) return Either.left(malformed)
        return Effect.clockWith((clock) => {
          const now = clock.unsafeCurrentTimeMillis()
          const hash = hashKey(key)
          // A cache hit is decided here, in the step that reads the clock.
          return (
            decide(key, hash, now, running) ??
            Effect.flatMap(lookup(hash, now), (p) => check(p, now, running))
          )
        })
      },
      authenticateNow: (authorization, now) => {
        const key = parseBearer(authorization)
        if (key === undefined) return Either.left(missing)
        if (!hasKeyShape(key)) return Either.left(malformed)
        return decide(key, hashKey(key), now, false)
      },
      invalidateKey: (keyId) => dropWhere((p) => p.key.id === keyId, keyWatchers, keyId),
      invalidateAccount: (accountId) =>
        dropWhere((p) => p.account.id === accountId, accountWatchers, accountId),
      invalidateAll: Effect.sync(() => {
        cache.clear()
        notifyAll()
      }),
      watch: (keyId, accountId, onChange) => {
        const offKey = watchOn(keyWatchers, keyId, onChange)
        const offAccount = watchOn(accountWatchers, accountId, onChange)
        return () => {
          offKey()
          offAccount()
        }
      },
    }
    return service
  })

export const layer = (options: ApiKeysOptions = defaultOptions) => Layer.effect(ApiKeys, make(options))
