/**
 * The in-process store: exact for one instance, time from `Clock` (so
 * `TestClock` drives it), waiters woken the moment a slot frees.
 */
import { IdTable } from "@swarmgate/protocol"
import { Clock, Deferred, Effect, FiberId, Option } from "effect"
import {
  charge,
  concurrencyWait,
  MICROS_PER_MILLI,
  MICROS_PER_SECOND,
  nextEwma,
  periodEnd,
  periodIndex,
  rateState,
  rateWait,
} from "../internal/Algorithm"
import type { AdmitOutcome, Normalized, QuotaParams, SlotOutcome, Store, StoreUsage } from "../internal/Store"

/*
 * What is pending is counted, not kept as a set of permit ids: each request
 * would add and delete one in long-lived Sets, and a hash table under that
 * churn keeps requests alive through young collections (protocol/LinkedSet.ts).
 * The Quota service admits, commits and releases each permit once, and says
 * on release whether it committed (its flag and the commit here change
 * together, uninterruptibly: Quota.ts).
 */
interface ResourceState {
  readonly tat: Map<string, number>
  /** Admitted, not yet committed. */
  pending: number
}

interface Waiter {
  readonly permit: string
  readonly limit: number
  readonly deferred: Deferred.Deferred<void>
  granted: boolean
}

interface SubjectState {
  readonly resources: Map<string, ResourceState>
  /** Admitted, not yet committed: what the quotas hold back. */
  pending: number
  readonly counts: Map<string, { readonly index: number; readonly count: number; readonly end: number }>
  /** Permit → when it got its slot (µs): one added and one removed per request (protocol/IdTable.ts). */
  readonly slots: IdTable<number>
  readonly queue: Array<Waiter>
  ewma: number | undefined
}

const SWEEP_MICROS = 60_000 * MICROS_PER_MILLI

const nowMicros = Effect.map(Clock.currentTimeMillis, (ms) => ms * MICROS_PER_MILLI)

export const make = (): Effect.Effect<Store> =>
  Effect.sync(() => {
    const subjects = new Map<string, SubjectState>()

    const subjectOf = (subject: string): SubjectState => {
      let state = subjects.get(subject)
      if (state === undefined) {
        state = {
          resources: new Map(),
          pending: 0,
          counts: new Map(),
          slots: new IdTable(),
          queue: [],
          ewma: undefined,
        }
        subjects.set(subject, state)
      }
      return state
    }

    const resourceOf = (subject: SubjectState, resource: string): ResourceState => {
      let state = subject.resources.get(resource)
      if (state === undefined) {
        state = { tat: new Map(), pending: 0 }
        subject.resources.set(resource, state)
      }
      return state
    }

    const countOf = (subject: SubjectState | undefined, quota: QuotaParams, index: number) => {
      const stored = subject?.counts.get(quota.name)
      return stored !== undefined && stored.index === index ? stored.count : 0
    }

    const rateStates = (
      request: Normalized,
      resource: ResourceState | undefined,
      pending: number,
      now: number,
    ) => request.rates.map((rate) => rateState(rate, resource?.tat.get(rate.name) ?? 0, pending, now))

    const grant = (subject: SubjectState, now: number) => {
      while (subject.queue.length > 0) {
        const head = subject.queue[0]!
        if (subject.slots.size >= head.limit) return
        subject.queue.shift()
        subject.slots.set(head.permit, now)
        head.granted = true
        Deferred.unsafeDone(head.deferred, Effect.void)
      }
    }

    /** Drops state that no longer changes any decision: idle limiters, past periods. */
    const sweep = (now: number) => {
      for (const [name, subject] of subjects) {
        for (const [resource, state] of subject.resources) {
          if (state.pending > 0) continue
          if ([...state.tat.values()].every((tat) => tat <= now)) subject.resources.delete(resource)
        }
        for (const [quota, count] of subject.counts) if (count.end <= now) subject.counts.delete(quota)
        if (
          subject.resources.size === 0 &&
          subject.counts.size === 0 &&
          subject.pending === 0 &&
          subject.slots.size === 0 &&
          subject.queue.length === 0
        ) {
          subjects.delete(name)
        }
      }
    }

    // Swept from the request path, not a timer fiber: a timer would replay every period under TestClock jumps.
    let lastSweep = Number.NEGATIVE_INFINITY
    const maybeSweep = (now: number) => {
      if (now - lastSweep < SWEEP_MICROS) return
      lastSweep = now
      sweep(now)
    }

    /**
     * The admission decision at `now`, all or nothing. With `mayQueue` false, a
     * request that would wait in the queue changes nothing and gets `undefined`.
     */
    const admitAt = (
      request: Normalized,
      permit: string,
      now: number,
      mayQueue: boolean,
    ): AdmitOutcome | undefined => {
      maybeSweep(now)
      const existing = subjects.get(request.subject)
      const resource = existing?.resources.get(request.resource)
      const pending = resource?.pending ?? 0
      let wait = 0
      let limit = ""
      for (const rate of request.rates) {
        const w = rateWait(rate, resource?.tat.get(rate.name) ?? 0, pending, now)
        if (w > wait) {
          wait = w
          limit = rate.name
        }
      }
      const reserved = existing?.pending ?? 0
      for (const quota of request.quotas) {
        const index = periodIndex(quota.period, now)
        const count = countOf(existing, quota, index)
        if (count + reserved + 1 <= quota.limit) continue
        // Held back only by requests still in flight: they may yet be refunded.
        const w = count >= quota.limit ? periodEnd(quota.period, index) - now : MICROS_PER_SECOND
        if (w > wait) {
          wait = w
          limit = quota.name
        }
      }
      if (wait > 0) {
        return {
          _tag: "RateLimited",
          rates: rateStates(request, resource, pending, now),
          waitMicros: wait,
          limit,
        }
      }
      let queued: Waiter | undefined
      let slot = false
      const concurrency = request.concurrency
      if (concurrency !== undefined) {
        const used = existing?.slots.size ?? 0
        const waiting = existing?.queue.length ?? 0
        if (concurrency.limit > 0 && used + waiting < concurrency.limit) {
          slot = true
        } else if (concurrency.limit > 0 && waiting < concurrency.queue) {
          if (!mayQueue) return undefined
          queued = {
            permit,
            limit: concurrency.limit,
            deferred: Deferred.unsafeMake<void>(FiberId.none),
            granted: false,
          }
        } else {
          return {
            _tag: "ConcurrencyLimited",
            rates: rateStates(request, resource, pending, now),
            waitMicros: concurrencyWait(
              concurrency.limit,
              waiting + Math.max(0, used - concurrency.limit),
              existing?.ewma,
            ),
          }
        }
      }
      const subject = existing ?? subjectOf(request.subject)
      const state = resourceOf(subject, request.resource)
      state.pending++
      subject.pending++
      if (slot) subject.slots.set(permit, now)
      if (queued !== undefined) subject.queue.push(queued)
      const rates = rateStates(request, state, pending + 1, now)
      return queued === undefined ? { _tag: "Admitted", rates } : { _tag: "Queued", rates }
    }

    const admit = (request: Normalized, permit: string): Effect.Effect<AdmitOutcome> =>
      Effect.map(nowMicros, (now) => admitAt(request, permit, now, true)!)

    const awaitSlot = (
      request: Normalized,
      permit: string,
      maxWaitMillis: number,
    ): Effect.Effect<SlotOutcome> =>
      Effect.gen(function* () {
        const subject = subjects.get(request.subject)
        if (subject?.slots.has(permit)) return { _tag: "Acquired" }
        const waiter = subject?.queue.find((w) => w.permit === permit)
        if (subject === undefined || waiter === undefined) {
          return {
            _tag: "TimedOut",
            waitMicros: concurrencyWait(request.concurrency?.limit ?? 0, 0, subject?.ewma),
          }
        }
        const done = yield* Effect.timeout(Deferred.await(waiter.deferred), maxWaitMillis).pipe(Effect.option)
        if (Option.isSome(done) || waiter.granted) return { _tag: "Acquired" }
        const ahead = subject.queue.indexOf(waiter)
        const limit = waiter.limit
        return {
          _tag: "TimedOut",
          waitMicros: concurrencyWait(
            limit,
            Math.max(0, ahead) + Math.max(0, subject.slots.size - limit),
            subject.ewma,
          ),
        }
      })

    const commitAt = (request: Normalized, _permit: string, now: number) => {
      const subject = subjectOf(request.subject)
      const resource = resourceOf(subject, request.resource)
      for (const rate of request.rates) {
        if (rate.interval < 0) continue
        resource.tat.set(rate.name, charge(rate, resource.tat.get(rate.name) ?? 0, now))
      }
      for (const quota of request.quotas) {
        const index = periodIndex(quota.period, now)
        subject.counts.set(quota.name, {
          index,
          count: countOf(subject, quota, index) + 1,
          end: periodEnd(quota.period, index),
        })
      }
      resource.pending--
      subject.pending--
    }

    const commit = (request: Normalized, permit: string) =>
      Effect.map(nowMicros, (now) => commitAt(request, permit, now))

    const releaseAt = (request: Normalized, permit: string, committed: boolean, now: number) => {
      const subject = subjects.get(request.subject)
      if (subject === undefined) return
      const acquired = subject.slots.get(permit)
      if (acquired !== undefined) {
        subject.slots.delete(permit)
        // Refunded requests leave no trace, not even in the hold-time estimate.
        if (committed) subject.ewma = nextEwma(subject.ewma, now - acquired)
      } else {
        const at = subject.queue.findIndex((w) => w.permit === permit)
        if (at >= 0) subject.queue.splice(at, 1)
      }
      if (!committed) {
        const resource = subject.resources.get(request.resource)
        if (resource !== undefined) resource.pending--
        subject.pending--
      }
      grant(subject, now)
    }

    const release = (request: Normalized, permit: string, committed: boolean) =>
      Effect.map(nowMicros, (now) => releaseAt(request, permit, committed, now))

    const usage = (request: Normalized, resources: ReadonlyArray<string>): Effect.Effect<StoreUsage> =>
      Effect.map(nowMicros, (now) => {
        const subject = subjects.get(request.subject)
        const rates = new Map(
          resources.map((name) => {
            const resource = subject?.resources.get(name)
            return [name, rateStates(request, resource, resource?.pending ?? 0, now)] as const
          }),
        )
        const reserved = subject?.pending ?? 0
        return {
          concurrency: subject?.slots.size ?? 0,
          queued: subject?.queue.length ?? 0,
          rates,
          quotas: request.quotas.map((quota) => {
            const index = periodIndex(quota.period, now)
            return {
              name: quota.name,
              limit: quota.limit,
              remaining: Math.max(0, quota.limit - countOf(subject, quota, index) - reserved),
              resetMicros: periodEnd(quota.period, index) - now,
            }
          }),
        }
      })

    const store: Store = {
      leaseMillis: undefined,
      admit,
      awaitSlot,
      commit,
      release,
      renew: () => Effect.void,
      usage,
      now: {
        admit: (request, permit, now) => admitAt(request, permit, now, false),
        commit: commitAt,
        release: releaseAt,
      },
    }
    return store
  })
