/**
 * Key and account changes reach every instance at once: the `ApiKeys` in
 * context is decorated so that each `invalidate…` call also publishes on a
 * Redis channel, and every instance subscribed to it drops the same entries
 * from its own cache. Whoever changes a key — the admin API of any instance,
 * or the CLI when it has `REDIS_URL` — publishes.
 *
 * Pub/sub is at most once: a message missed during a disconnect is covered by
 * dropping the whole cache when the subscription comes back, and in any case
 * by the cache's own TTL (1 s), which stays the bound when Redis is away.
 */

import { Redis as SharedRedis } from "@swarmgate/store"
import { Effect, Layer, Redacted, Runtime, type Scope } from "effect"
import type { Redis } from "ioredis"
import { ApiKeys, type ApiKeysShape } from "./ApiKeys"

export interface InvalidationBusOptions {
  readonly url: string | Redacted.Redacted
  /** Instances that share keys use the same prefix (the channel is `<prefix>auth:invalidate`). */
  readonly prefix: string
}

export const channelOf = (prefix: string) => `${prefix}auth:invalidate`

const connection = (url: string, subscriber: boolean): Effect.Effect<Redis, never, Scope.Scope> =>
  SharedRedis.scopedClient(
    url,
    // The subscriber keeps its commands for the reconnect (and resubscribes); the publisher fails fast.
    subscriber
      ? { maxRetriesPerRequest: null, connectTimeout: 2_000 }
      : { enableOfflineQueue: false, maxRetriesPerRequest: 1, commandTimeout: 1_000, connectTimeout: 2_000 },
  )

const waitReady = (client: Redis, millis: number) =>
  Effect.async<void>((resume) => {
    if (client.status === "ready") return resume(Effect.void)
    // Ready, or failing (Redis away): start either way; the TTL covers until it is back.
    const done = () => {
      clearTimeout(timer)
      client.off("ready", done)
      client.off("error", done)
      resume(Effect.void)
    }
    const timer = setTimeout(done, millis)
    client.once("ready", done)
    client.once("error", done)
  })

/** `k:<key id>`, `a:<account id>` or `*`. */
const apply = (inner: ApiKeysShape, message: string): Effect.Effect<void> => {
  if (message.startsWith("k:")) return inner.invalidateKey(message.slice(2))
  if (message.startsWith("a:")) return inner.invalidateAccount(message.slice(2))
  return inner.invalidateAll
}

export const make = (
  inner: ApiKeysShape,
  options: InvalidationBusOptions,
): Effect.Effect<ApiKeysShape, never, Scope.Scope> =>
  Effect.gen(function* () {
    const url = Redacted.isRedacted(options.url) ? Redacted.value(options.url) : options.url
    const channel = channelOf(options.prefix)
    const publisher = yield* connection(url, false)
    const subscriber = yield* connection(url, true)
    const runSync = Runtime.runSync(yield* Effect.runtime<never>())

    subscriber.on("message", (from: string, message: string) => {
      if (from === channel) runSync(apply(inner, message))
    })
    let subscribedOnce = false
    subscriber.on("ready", () => {
      // Back after a disconnect: messages may have been missed meanwhile.
      if (subscribedOnce) runSync(inner.invalidateAll)
    })
    subscriber.subscribe(channel).then(
      () => {
        subscribedOnce = true
      },
      () => undefined,
    )
    yield* Effect.all([waitReady(publisher, 2_000), waitReady(subscriber, 2_000)], { concurrency: 2 })

    const publish = (message: string) =>
      Effect.tryPromise(() => publisher.publish(channel, message)).pipe(
        Effect.catchAll(() =>
          Effect.logWarning(
            "auth: could not announce a key change; other instances see it within the cache TTL",
          ),
        ),
      )

    const service: ApiKeysShape = {
      authenticate: inner.authenticate,
      authenticateNow: inner.authenticateNow,
      watch: inner.watch,
      invalidateKey: (keyId) => Effect.zipRight(inner.invalidateKey(keyId), publish(`k:${keyId}`)),
      invalidateAccount: (accountId) =>
        Effect.zipRight(inner.invalidateAccount(accountId), publish(`a:${accountId}`)),
      invalidateAll: Effect.zipRight(inner.invalidateAll, publish("*")),
    }
    return service
  })

/** Decorates the `ApiKeys` in context with cross-instance invalidation over Redis. */
export const layer = (options: InvalidationBusOptions): Layer.Layer<ApiKeys, never, ApiKeys> =>
  Layer.scoped(
    ApiKeys,
    Effect.flatMap(ApiKeys, (inner) => make(inner, options)),
  )
