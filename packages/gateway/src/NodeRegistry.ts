/**
 * Node registrations shared by every instance on one Redis. A registration
 * (or heartbeat, or drain) reaches the instance the load balancer picked; it
 * is written to a Redis hash and announced on a channel, and every instance
 * reconciles its own dispatcher with the hash — at once on the announcement,
 * and every `syncMillis` in case one was missed. Expiry stays the
 * dispatcher's: a node whose heartbeats stop is drained everywhere at the
 * expiry the last heartbeat set.
 *
 * The dispatcher is decorated, not replaced: `/admin/v1/nodes` and everything
 * else keep calling `register` and `drain` as on one instance.
 */
import { Dispatcher, NodesFile } from "@swarmgate/dispatch"
import { Redis as R } from "@swarmgate/store"
import { Cause, Clock, Effect, Either, Layer, type Redacted, Runtime, Schedule } from "effect"
import type { Redis } from "ioredis"

export interface NodeRegistryOptions {
  readonly url: string | Redacted.Redacted
  /** Instances that share nodes use the same prefix. */
  readonly prefix: string
  /** Reconciliation when no announcement arrived (a missed message, a restart). */
  readonly syncMillis?: number | undefined
}

interface Stored {
  readonly spec: NodesFile.NodeSpec
  readonly expiresAt: number
}

// Deletes an expired registration only if no heartbeat replaced it meanwhile.
const DELETE_IF_UNCHANGED = `
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end
return 0`

/** A stored registration, or undefined when the text is not one (damaged, or another version's). */
const parseStored = (raw: string): Stored | undefined => {
  let value: { readonly spec?: unknown; readonly expiresAt?: unknown }
  try {
    value = JSON.parse(raw)
  } catch {
    return undefined
  }
  if (typeof value !== "object" || value === null || typeof value.expiresAt !== "number") return undefined
  const spec = NodesFile.decodeNodeSpec(value.spec)
  return Either.isRight(spec) ? { spec: spec.right, expiresAt: value.expiresAt } : undefined
}

export const make = (inner: Dispatcher.DispatcherShape, options: NodeRegistryOptions) =>
  Effect.gen(function* () {
    const key = `${options.prefix}{nodes}:registered`
    const channel = `${options.prefix}nodes:changed`
    const redis: Redis = yield* R.connect(options.url, 1_000)
    const subscriber: Redis = yield* R.connect(options.url, 1_000)

    // Once every 10 s while it lasts (Redis away, an unreadable entry), not at every sync.
    const warn = R.throttledWarning(10_000)

    const sync = Effect.gen(function* () {
      const now = yield* Clock.currentTimeMillis
      const stored = yield* R.command(() => redis.hgetall(key))
      const shared = new Map<string, Stored>()
      const unreadable: Array<string> = []
      for (const [id, raw] of Object.entries(stored)) {
        const entry = parseStored(raw)
        if (entry === undefined) unreadable.push(id)
        else if (entry.expiresAt > now) shared.set(id, entry)
        else yield* R.command(() => redis.eval(DELETE_IF_UNCHANGED, 1, key, id, raw))
      }
      if (unreadable.length > 0)
        yield* warn(`nodes: shared registrations not readable, skipped: ${unreadable.join(", ")}`)
      const local = new Map((yield* inner.status).map((node) => [node.id, node]))
      for (const [id, entry] of shared) {
        const mine = local.get(id)
        // Same spec and expiry already here: nothing to do (register would only renew).
        if (mine?.state === "active" && mine.expiresAt === entry.expiresAt) continue
        yield* inner.register(entry.spec, entry.expiresAt - now)
      }
      for (const node of local.values()) {
        if (node.source === "registered" && node.state === "active" && !shared.has(node.id))
          yield* inner.drain(node.id)
      }
    })

    // Whatever one sync meets, the next still runs: a defect that ended the loop would leave this
    // instance deaf to other instances' registrations, silently.
    const syncLogged = sync.pipe(
      Effect.catchAll((e) => warn(`nodes: reading shared registrations failed: ${e.reason}`)),
      Effect.catchAllCause((cause) =>
        Cause.isInterruptedOnly(cause)
          ? Effect.failCause(cause)
          : Effect.logError("nodes: syncing shared registrations failed", cause),
      ),
    )

    const announce = (id: string) => R.command(() => redis.publish(channel, id)).pipe(Effect.ignore)

    // Announcements trigger a reconciliation; a burst of them collapses into one.
    let pending = false
    const runFork = Runtime.runFork(yield* Effect.runtime<never>())
    subscriber.on("message", () => {
      if (pending) return
      pending = true
      setTimeout(() => {
        pending = false
        runFork(syncLogged)
      }, 10)
    })
    yield* R.command(() => subscriber.subscribe(channel)).pipe(
      Effect.catchAll((e) =>
        Effect.logWarning(`nodes: not subscribed to registrations (${e.reason}); relying on periodic sync`),
      ),
    )

    yield* syncLogged
    yield* Effect.forkScoped(Effect.repeat(syncLogged, Schedule.spaced(options.syncMillis ?? 1_000)))

    return decorate(inner, {
      register: (spec, ttlMillis) =>
        Effect.flatMap(
          inner.register(spec, ttlMillis),
          (result): Effect.Effect<Dispatcher.RegisterResult> => {
            if (Either.isLeft(result)) return Effect.succeed(result)
            const expiresAt = result.right.node.expiresAt
            if (expiresAt === undefined) return Effect.succeed(result)
            const stored: Stored = { spec, expiresAt }
            return R.command(() => redis.hset(key, spec.id, JSON.stringify(stored))).pipe(
              Effect.zipRight(announce(spec.id)),
              Effect.catchAll((e) =>
                Effect.logWarning(`nodes: registration of ${spec.id} not shared (${e.reason}); local only`),
              ),
              Effect.as(result),
            )
          },
        ),
      drain: (nodeId) =>
        Effect.flatMap(inner.drain(nodeId), (status) => {
          if (status === undefined || status.source !== "registered") return Effect.succeed(status)
          return R.command(() => redis.hdel(key, nodeId)).pipe(
            Effect.zipRight(announce(nodeId)),
            Effect.catchAll((e) =>
              Effect.logWarning(`nodes: drain of ${nodeId} not shared (${e.reason}); local only`),
            ),
            Effect.as(status),
          )
        }),
    })
  })

/** `inner` with some of its operations replaced (once per layer). */
const decorate = (
  inner: Dispatcher.DispatcherShape,
  overrides: Pick<Dispatcher.DispatcherShape, "register" | "drain">,
): Dispatcher.DispatcherShape => ({ ...inner, ...overrides })

/** Decorates the `Dispatcher` in context so that its registrations are shared through Redis. */
export const layer = (
  options: NodeRegistryOptions,
): Layer.Layer<Dispatcher.Dispatcher, never, Dispatcher.Dispatcher> =>
  Layer.scoped(
    Dispatcher.Dispatcher,
    Effect.flatMap(Dispatcher.Dispatcher, (inner) => make(inner, options)),
  )
