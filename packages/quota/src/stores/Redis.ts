/**
 * The Redis store: shared by every instance, atomic (one Lua script per
 * operation), timed by the Redis server's clock. Slots, queue places and
 * reservations are leases that the holder renews; an instance that dies stops
 * renewing and what it held comes back within one lease.
 */

import { Observed } from "@swarmgate/protocol"
import { Redis as SharedRedis } from "@swarmgate/store"
import { Clock, Effect, Redacted, type Scope } from "effect"
import { Redis } from "ioredis"
import { concurrencyWait, MICROS_PER_MILLI, type RateState } from "../internal/Algorithm"
import * as Scripts from "../internal/Scripts"
import {
  type AdmitOutcome,
  type Normalized,
  type SlotOutcome,
  type Store,
  StoreUnavailable,
  type StoreUsage,
} from "../internal/Store"

export interface RedisStoreOptions {
  readonly url: string | Redacted.Redacted
  /** Prepended to every key; instances that should share limits use the same prefix. */
  readonly prefix?: string | undefined
  /** How long a slot, queue place or reservation survives its holder's last renewal (renewals: every quarter of it). */
  readonly leaseMillis?: number | undefined
  /** A command that takes longer counts as a store failure. */
  readonly commandTimeoutMillis?: number | undefined
  /** How often a queued request asks whether its turn has come (a release on this instance wakes it at once). */
  readonly pollMillis?: number | undefined
}

export const DEFAULT_PREFIX = "swarmgate:quota:"
export const DEFAULT_LEASE_MILLIS = 15_000

type Reply = ReadonlyArray<unknown>

const keysOf = (prefix: string, subject: string, resource: string) => {
  const tag = `${prefix}{${encodeURIComponent(subject)}}`
  const res = encodeURIComponent(resource)
  return {
    rate: `${tag}:r:${res}`,
    pendingResource: `${tag}:p:${res}`,
    pendingSubject: `${tag}:p`,
    quota: `${tag}:q`,
    slots: `${tag}:s`,
    queue: `${tag}:w`,
    queueLeases: `${tag}:wl`,
    meta: `${tag}:m`,
  }
}

const limitArgs = (request: Normalized): Array<string> => {
  const args: Array<string> = [String(request.rates.length)]
  for (const r of request.rates) {
    args.push(r.name, String(r.limit), String(r.periodMicros), String(r.interval), String(r.tolerance))
  }
  args.push(String(request.quotas.length))
  for (const q of request.quotas) args.push(q.name, String(q.limit), q.period)
  args.push(String(request.concurrency?.limit ?? -1), String(request.concurrency?.queue ?? 0))
  return args
}

const rateStates = (request: Normalized, flat: ReadonlyArray<unknown>): Array<RateState> =>
  request.rates.map((rate, i) => ({
    name: rate.name,
    limit: rate.limit,
    remaining: Number(flat[2 * i]),
    resetMicros: Number(flat[2 * i + 1]),
  }))

const ewmaOf = (value: unknown) => {
  const n = Number(value)
  return Number.isFinite(n) && n >= 0 ? n : undefined
}

export const make = (options: RedisStoreOptions): Effect.Effect<Store, never, Scope.Scope> =>
  Effect.gen(function* () {
    const prefix = options.prefix ?? DEFAULT_PREFIX
    const leaseMillis = options.leaseMillis ?? DEFAULT_LEASE_MILLIS
    const leaseMicros = String(leaseMillis * MICROS_PER_MILLI)
    const pollMillis = options.pollMillis ?? 25
    // Commands fail at once while disconnected, so the failure policy decides instead of a growing backlog;
    // while Redis is away the failure policy answers, and ioredis keeps reconnecting.
    const redis = yield* SharedRedis.shared(options.url, options.commandTimeoutMillis ?? 1_000)

    const unavailable = (e: SharedRedis.RedisFailure) =>
      new StoreUnavailable({ reason: e.reason, cause: e.cause })
    const run = (
      script: Scripts.Script,
      keys: ReadonlyArray<string>,
      args: ReadonlyArray<string>,
      resendIf?: () => boolean,
    ) =>
      SharedRedis.run(redis, script, keys, args, unavailable, resendIf) as Effect.Effect<
        Reply,
        StoreUnavailable
      >

    // Local waiters are woken by local releases at once; others see them on their next poll.
    const waiters = new Map<string, Set<() => void>>()
    const wake = (subject: string) => {
      const set = waiters.get(subject)
      if (set === undefined) return
      waiters.delete(subject)
      for (const notify of set) notify()
    }
    const nap = (subject: string, millis: number) =>
      Effect.async<void>((resume) => {
        let set = waiters.get(subject)
        if (set === undefined) {
          set = new Set()
          waiters.set(subject, set)
        }
        let resumed = false
        const notify = () => {
          if (resumed) return
          resumed = true
          clearTimeout(timer)
          waiters.get(subject)?.delete(notify)
          resume(Effect.void)
        }
        const timer = setTimeout(notify, millis)
        set.add(notify)
        return Effect.sync(() => {
          resumed = true
          clearTimeout(timer)
          waiters.get(subject)?.delete(notify)
        })
      })

    const admitKeys = (request: Normalized) => {
      const k = keysOf(prefix, request.subject, request.resource)
      return [k.rate, k.pendingResource, k.pendingSubject, k.quota, k.slots, k.queue, k.queueLeases, k.meta]
    }
    const admitArgs = (request: Normalized, permit: string) => [permit, leaseMicros, ...limitArgs(request)]
    const admitOutcome = (request: Normalized, reply: Reply): AdmitOutcome => {
      const [status, first, second, flat] = reply as [string, string, string, Array<unknown>]
      const rates = rateStates(request, flat)
      switch (status) {
        case "rate":
          return { _tag: "RateLimited", rates, waitMicros: Number(first), limit: second }
        case "concurrency":
          return {
            _tag: "ConcurrencyLimited",
            rates,
            waitMicros: concurrencyWait(request.concurrency?.limit ?? 0, Number(first), ewmaOf(second)),
          }
        case "queued":
          return { _tag: "Queued", rates }
        default:
          return { _tag: "Admitted", rates }
      }
    }

    const admit = (request: Normalized, permit: string): Effect.Effect<AdmitOutcome, StoreUnavailable> =>
      Effect.map(run(Scripts.admit, admitKeys(request), admitArgs(request, permit)), (reply) =>
        admitOutcome(request, reply),
      )

    const awaitSlot = (
      request: Normalized,
      permit: string,
      maxWaitMillis: number,
    ): Effect.Effect<SlotOutcome, StoreUnavailable> => {
      const k = keysOf(prefix, request.subject, request.resource)
      const limit = request.concurrency?.limit ?? 0
      const poll = run(
        Scripts.poll,
        [k.slots, k.queue, k.queueLeases, k.meta, k.pendingResource, k.pendingSubject],
        [permit, leaseMicros, String(limit)],
      )
      return Effect.gen(function* () {
        const deadline = (yield* Clock.currentTimeMillis) + maxWaitMillis
        while (true) {
          const [status, ahead, ewma] = (yield* poll) as [string, string, string]
          if (status === "acquired") return { _tag: "Acquired" } as const
          const now = yield* Clock.currentTimeMillis
          if (status === "lost" || now >= deadline) {
            return {
              _tag: "TimedOut",
              waitMicros: concurrencyWait(limit, Number(ahead), ewmaOf(ewma)),
            } as const
          }
          yield* nap(request.subject, Math.min(pollMillis, deadline - now))
        }
      })
    }

    // A commit not sent yet travels with the release or renewal: `commitAgoMicros` after it was decided.
    const commitArgs = (request: Normalized, commitAgoMicros: number | undefined) =>
      commitAgoMicros === undefined
        ? [""]
        : [String(Math.max(0, Math.round(commitAgoMicros))), ...limitArgs(request)]

    const releaseKeys = (request: Normalized) => {
      const k = keysOf(prefix, request.subject, request.resource)
      return [k.slots, k.queue, k.queueLeases, k.meta, k.pendingResource, k.pendingSubject, k.rate, k.quota]
    }
    const releaseArgs = (
      request: Normalized,
      permit: string,
      committed: boolean,
      commitAgoMicros?: number,
    ) => [permit, committed ? "1" : "0", ...commitArgs(request, committed ? commitAgoMicros : undefined)]

    const release = (request: Normalized, permit: string, committed: boolean, commitAgoMicros?: number) =>
      run(
        Scripts.release,
        releaseKeys(request),
        releaseArgs(request, permit, committed, commitAgoMicros),
      ).pipe(Effect.zipRight(Effect.sync(() => wake(request.subject))))

    const send: Store["send"] = {
      admit: (request, permit) =>
        SharedRedis.sendNow(
          redis,
          Scripts.admit,
          admitKeys(request),
          admitArgs(request, permit),
          unavailable,
        ).map((reply) => admitOutcome(request, reply as Reply)),
      // Observable: a plain request's close reads the release by callback (no fiber waits for it).
      release: (request, permit, committed, commitAgoMicros) =>
        Observed.of(
          SharedRedis.sendNow(
            redis,
            Scripts.release,
            releaseKeys(request),
            releaseArgs(request, permit, committed, commitAgoMicros),
            unavailable,
          ).map(() => wake(request.subject)),
        ),
    }

    const renew = (
      request: Normalized,
      permit: string,
      committed: boolean,
      commitAgoMicros?: number,
      held?: () => boolean,
    ) => {
      const k = keysOf(prefix, request.subject, request.resource)
      return Effect.asVoid(
        run(
          Scripts.renew,
          [k.slots, k.meta, k.pendingResource, k.pendingSubject, k.rate, k.quota],
          [
            permit,
            leaseMicros,
            committed ? "1" : "0",
            request.concurrency === undefined ? "0" : "1",
            ...commitArgs(request, committed ? commitAgoMicros : undefined),
          ],
          held,
        ),
      )
    }

    const usage = (request: Normalized, resources: ReadonlyArray<string>) => {
      const k = keysOf(prefix, request.subject, request.resource)
      const keys = [k.pendingSubject, k.quota, k.slots, k.queueLeases]
      for (const resource of resources) {
        const r = keysOf(prefix, request.subject, resource)
        keys.push(r.rate, r.pendingResource)
      }
      return Effect.map(run(Scripts.usage, keys, limitArgs(request)), (reply): StoreUsage => {
        const [slots, queued, perResource, quotaStates] = reply as [
          number,
          number,
          Array<Array<unknown>>,
          Array<unknown>,
        ]
        return {
          concurrency: Number(slots),
          queued: Number(queued),
          rates: new Map(
            resources.map((resource, i) => [resource, rateStates(request, perResource[i] ?? [])]),
          ),
          quotas: request.quotas.map((quota, i) => ({
            name: quota.name,
            limit: quota.limit,
            remaining: Number(quotaStates[2 * i]),
            resetMicros: Number(quotaStates[2 * i + 1]),
          })),
        }
      })
    }

    const store: Store = {
      leaseMillis,
      admit,
      send,
      awaitSlot,
      release,
      renew,
      usage,
    }
    return store
  })

const globEscape = (text: string) => text.replace(/[*?[\]\\]/g, (c) => `\\${c}`)

/** Deletes every key under `prefix`: all limit state of the instances sharing it (tests, a reset). */
export const reset = (options: { readonly url: string | Redacted.Redacted; readonly prefix: string }) =>
  Effect.tryPromise({
    try: async () => {
      const url = Redacted.isRedacted(options.url) ? Redacted.value(options.url) : options.url
      const redis = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 1 })
      try {
        await redis.connect()
        let cursor = "0"
        let deleted = 0
        do {
          const [next, keys] = await redis.scan(
            cursor,
            "MATCH",
            `${globEscape(options.prefix)}*`,
            "COUNT",
            500,
          )
          cursor = next
          if (keys.length > 0) deleted += await redis.unlink(...keys)
        } while (cursor !== "0")
        return deleted
      } finally {
        redis.disconnect()
      }
    },
    catch: (cause) => new StoreUnavailable({ reason: String((cause as Error)?.message ?? cause), cause }),
  })
