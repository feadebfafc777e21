/**
 * One ioredis connection, handled the same way by every package that talks to
 * Redis (the quota store, the billing book, the gateway's node registry and
 * readiness check): commands fail at once while disconnected (no backlog that
 * would turn into a burst of stale work after an outage), scripts by SHA with
 * a fallback to EVAL after a Redis restart.
 */
import { Data, Effect, Exit, Redacted, Scope } from "effect"
import { Redis, type RedisOptions } from "ioredis"

export class RedisFailure extends Data.TaggedError("RedisFailure")<{
  readonly reason: string
  readonly cause?: unknown
}> {}

/** A Lua script and the SHA-1 of its source. */
export interface Script {
  readonly source: string
  readonly sha: string
}

/**
 * An ioredis client with these options for the scope, closed with it: `quit`,
 * cut after 1 s, then `disconnect`. Connection errors are not thrown at the
 * client's events: they surface on the commands that meet them.
 */
export const scopedClient = (url: string, options: RedisOptions): Effect.Effect<Redis, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const client = new Redis(url, options)
      client.on("error", () => undefined)
      return client
    }),
    (client) =>
      // Releases run uninterruptibly: the timeout can only cut an interruptible quit (one queued behind a reconnect).
      Effect.promise(() => client.quit().catch(() => undefined)).pipe(
        Effect.interruptible,
        Effect.timeout(1_000),
        Effect.ignore,
        Effect.ensuring(Effect.sync(() => client.disconnect())),
      ),
  )

/**
 * A connection for the scope; a command that takes longer than `commandTimeoutMillis`
 * fails. Starts either way, after at most 2 s: while Redis is away its commands
 * fail with `RedisFailure`, and ioredis keeps reconnecting.
 */
export const connect = (
  url: string | Redacted.Redacted,
  commandTimeoutMillis: number,
): Effect.Effect<Redis, never, Scope.Scope> =>
  Effect.gen(function* () {
    const redis = yield* scopedClient(Redacted.isRedacted(url) ? Redacted.value(url) : url, {
      enableOfflineQueue: false,
      maxRetriesPerRequest: 1,
      commandTimeout: commandTimeoutMillis,
      connectTimeout: 2_000,
    })
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

const sharedClients = new Map<
  string,
  { readonly redis: Redis; readonly scope: Scope.CloseableScope; users: number }
>()

/**
 * `connect`, shared in this process by every user of the same URL and
 * timeout, closed with its last user's scope; scripts sent in the same turn
 * of the event loop go out in one write (`run`, `send`: `corkTurn`). The
 * quota store and the billing book use it, so that a request's admission and
 * hold, and later its release and settlement, each cost one round trip when
 * sent together.
 */
export const shared = (
  url: string | Redacted.Redacted,
  commandTimeoutMillis: number,
): Effect.Effect<Redis, never, Scope.Scope> => {
  const key = `${commandTimeoutMillis} ${Redacted.isRedacted(url) ? Redacted.value(url) : url}`
  return Effect.acquireRelease(
    Effect.suspend(() => {
      const existing = sharedClients.get(key)
      if (existing !== undefined) {
        existing.users++
        return Effect.succeed(existing)
      }
      return Effect.flatMap(Scope.make(), (scope) =>
        Effect.map(Scope.extend(connect(url, commandTimeoutMillis), scope), (redis) => {
          // Another user may have connected while this one waited for its connection.
          const raced = sharedClients.get(key)
          if (raced !== undefined) {
            raced.users++
            Effect.runFork(Scope.close(scope, Exit.void))
            return raced
          }
          const entry = { redis, scope, users: 1 }
          sharedClients.set(key, entry)
          return entry
        }),
      )
    }),
    (entry) =>
      Effect.suspend(() => {
        entry.users--
        if (entry.users > 0) return Effect.void
        if (sharedClients.get(key) === entry) sharedClients.delete(key)
        return Scope.close(entry.scope, Exit.void)
      }),
  ).pipe(Effect.map((entry) => entry.redis))
}

const failure = (cause: unknown) =>
  new RedisFailure({ reason: String((cause as Error)?.message ?? cause), cause })

/** The sockets corked until the end of this turn of the event loop. */
const corked = new WeakSet<object>()

/**
 * Holds what is written to `redis`'s socket until the end of this turn of the
 * event loop (`setImmediate`, as ioredis's auto-pipelining waited), then
 * sends it in one write: a request's admission and hold (sent in one
 * synchronous run), and whatever the other requests of the same turn sent.
 * Auto-pipelining did it with a `Pipeline` per turn — an object with its own
 * promise, a per-instance accessor that kept its commands alive through young
 * collections (~3 KB promoted per round), a `nextTick` per reply; corking the
 * socket costs none of that. Uncorking at `nextTick` instead (each
 * synchronous run its own write) cost ~40 % more CPU per scaled-out request
 * in `writev` at 32 connections. What changes: a command's timeout now also
 * counts its wait for the end of the turn (ioredis starts it at the call).
 */
const corkTurn = (redis: Redis) => {
  const stream = (redis as unknown as { stream?: { cork?: () => void; uncork?: () => void } }).stream
  if (stream === undefined || typeof stream.cork !== "function" || corked.has(stream)) return
  stream.cork()
  corked.add(stream)
  setImmediate(() => {
    corked.delete(stream)
    stream.uncork?.()
  })
}

/**
 * Sends a script by its SHA at the call, and the source when Redis does not
 * know it (`NOSCRIPT`) — a round trip later, so only while `resendIf` (when
 * given) still says so (the reply is then `null`); `done` gets the outcome,
 * a failure as `mapFailure`'s error (a throwing mapper: a defect).
 */
const evalScript = <E>(
  redis: Redis,
  script: Script,
  keys: ReadonlyArray<string>,
  args: ReadonlyArray<string | number>,
  mapFailure: (failure: RedisFailure) => E,
  resendIf: (() => boolean) | undefined,
  /** What a reply becomes (by default the reply itself). */
  replied: ((reply: unknown) => Exit.Exit<unknown, E>) | undefined,
  done: (outcome: Exit.Exit<unknown, E>) => void,
): void => {
  const fail = (cause: unknown) => {
    let error: E
    try {
      error = mapFailure(failure(cause))
    } catch (thrown) {
      return done(Exit.die(thrown))
    }
    done(Exit.fail(error))
  }
  const succeed = (reply: unknown) => done(replied === undefined ? Exit.succeed(reply) : replied(reply))
  try {
    corkTurn(redis)
    redis.evalsha(script.sha, keys.length, ...keys, ...args).then(succeed, (error: unknown) => {
      if (!String((error as Error)?.message).startsWith("NOSCRIPT")) return fail(error)
      if (resendIf !== undefined && !resendIf()) return succeed(null)
      try {
        corkTurn(redis)
        redis.eval(script.source, keys.length, ...keys, ...args).then(succeed, fail)
      } catch (thrown) {
        fail(thrown)
      }
    })
  } catch (thrown) {
    fail(thrown)
  }
}

/**
 * Runs a script (sent when the Effect runs), with the `NOSCRIPT` fallback and
 * failure mapping of `evalScript`. One `Effect.async` over ioredis's promise:
 * no async function and no mapping step per command.
 */
export const run = <E = RedisFailure>(
  redis: Redis,
  script: Script,
  keys: ReadonlyArray<string>,
  args: ReadonlyArray<string | number>,
  mapFailure: (failure: RedisFailure) => E = (f) => f as E,
  resendIf?: () => boolean,
): Effect.Effect<unknown, E> =>
  Effect.async<unknown, E>((resume) =>
    evalScript(redis, script, keys, args, mapFailure, resendIf, undefined, resume),
  )

/**
 * A command's reply on its way: waited for as an Effect (`wait`), or
 * observed by plain calls (`observe`), as a caller on no fiber does. Every
 * reader sees the same outcome.
 */
export class Reply<A, E> {
  private outcome: Exit.Exit<A, E> | undefined = undefined
  private waiting: Array<(outcome: Exit.Exit<A, E>) => void> | undefined = undefined
  /** Waits for the reply (at once if it came already). Made when asked for: most replies are only observed. */
  get wait(): Effect.Effect<A, E> {
    return Effect.async<A, E>((resume) => this.observe(resume))
  }

  /** Calls `then` with the outcome once it is in (at once if it is). */
  observe(then: (outcome: Exit.Exit<A, E>) => void): void {
    if (this.outcome !== undefined) then(this.outcome)
    else if (this.waiting === undefined) this.waiting = [then]
    else this.waiting.push(then)
  }

  /**
   * The outcome, once; what waits for it is told — every observer, even
   * after one threw (a finalizer may be among them). Observers on the
   * request path turn their own throws into the request's defect; one that
   * still throws is a bug, reported on stderr, never the connection's
   * unhandled rejection (which would end the process).
   */
  settle(outcome: Exit.Exit<A, E>): void {
    if (this.outcome !== undefined) return
    this.outcome = outcome
    const waiting = this.waiting
    this.waiting = undefined
    if (waiting === undefined) return
    for (const then of waiting) {
      try {
        then(outcome)
      } catch (error) {
        console.error("swarmgate: a Redis reply's observer threw (a bug):", error)
      }
    }
  }

  /** The same reply read by `f`, by a plain call (a throw: a defect). */
  map<B>(f: (a: A) => B): Reply<B, E> {
    const mapped = new Reply<B, E>()
    this.observe((outcome) => {
      if (Exit.isFailure(outcome)) return mapped.settle(Exit.failCause(outcome.cause))
      let value: B
      try {
        value = f(outcome.value)
      } catch (thrown) {
        return mapped.settle(Exit.die(thrown))
      }
      mapped.settle(Exit.succeed(value))
    })
    return mapped
  }
}

/**
 * `run`, sent now: the script leaves at the call — with whatever else is sent
 * in the same tick, in one write — and the `Reply` returned is waited for or
 * observed (at once if it came already). So a caller can send several
 * commands before it waits for any, without forking a fiber for each. The
 * command is sent once whether or not anything reads the reply.
 */
export const sendNow = <E = RedisFailure>(
  redis: Redis,
  script: Script,
  keys: ReadonlyArray<string>,
  args: ReadonlyArray<string | number>,
  mapFailure: (failure: RedisFailure) => E = (f) => f as E,
  resendIf?: () => boolean,
  /** Called with the reply as it arrives, whether or not anything waits for it (a throw: a defect). */
  onReply?: (reply: unknown) => void,
): Reply<unknown, E> => {
  const sent = new Reply<unknown, E>()
  const reply =
    onReply === undefined
      ? undefined
      : (value: unknown): Exit.Exit<unknown, E> => {
          try {
            onReply(value)
            return Exit.succeed(value)
          } catch (thrown) {
            return Exit.die(thrown)
          }
        }
  evalScript(redis, script, keys, args, mapFailure, resendIf, reply, (result) => sent.settle(result))
  return sent
}

/**
 * A warning logger that lets one message through per `intervalMillis` and drops the rest: while
 * Redis is away, every sweep, sync or request would otherwise log the same outage.
 */
export const throttledWarning = (intervalMillis: number) => {
  let warnedAt = Number.NEGATIVE_INFINITY
  return (message: string): Effect.Effect<void> =>
    Effect.suspend(() => {
      if (Date.now() - warnedAt < intervalMillis) return Effect.void
      warnedAt = Date.now()
      return Effect.logWarning(message)
    })
}

/** One ioredis call; its rejection becomes a `RedisFailure`. */
export const command = <A>(use: () => Promise<A>): Effect.Effect<A, RedisFailure> =>
  Effect.tryPromise({ try: use, catch: failure })
