/**
 * An ioredis connection for the gateway's own Redis use (node registrations,
 * readiness), handled as the quota store handles its own: commands fail at
 * once while disconnected rather than queueing behind an outage.
 */
import { Data, Effect, Redacted, type Scope } from "effect"
import { Redis } from "ioredis"

export class RedisFailure extends Data.TaggedError("RedisFailure")<{
  readonly reason: string
  readonly cause?: unknown
}> {}

export const connect = (
  url: string | Redacted.Redacted,
  commandTimeoutMillis: number,
): Effect.Effect<Redis, never, Scope.Scope> =>
  Effect.gen(function* () {
    const plain = Redacted.isRedacted(url) ? Redacted.value(url) : url
    const redis = yield* Effect.acquireRelease(
      Effect.sync(
        () =>
          new Redis(plain, {
            enableOfflineQueue: false,
            maxRetriesPerRequest: 1,
            commandTimeout: commandTimeoutMillis,
            connectTimeout: 2_000,
          }),
      ),
      (client) =>
        // Releases run uninterruptibly: the timeout can only cut an interruptible quit (one queued behind a reconnect).
        Effect.promise(() => client.quit().catch(() => undefined)).pipe(
          Effect.interruptible,
          Effect.timeout(1_000),
          Effect.ignore,
          Effect.ensuring(Effect.sync(() => client.disconnect())),
        ),
    )
    // Failures surface on the commands that meet them; the event alone is noise.
    redis.on("error", () => undefined)
    yield* Effect.async<void>((resume) => {
      if (redis.status === "ready") return resume(Effect.void)
      const done = () => {
        clearTimeout(timer)
        redis.off("ready", done)
        redis.off("error", done)
        resume(Effect.void)
      }
      const timer = setTimeout(done, 2_000)
      redis.once("ready", done)
      redis.once("error", done)
    })
    return redis
  })

const failure = (cause: unknown) =>
  new RedisFailure({ reason: String((cause as Error)?.message ?? cause), cause })

export const command = <A>(use: () => Promise<A>): Effect.Effect<A, RedisFailure> =>
  Effect.tryPromise({ try: use, catch: failure })
